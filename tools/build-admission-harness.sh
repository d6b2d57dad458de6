#!/usr/bin/env bash
# Build the admission differential harness (tools/admissiondiff): one Go program that runs pod
# admission through the kubelet's own Topology Manager, CPU manager static policy and Memory
# Manager static policy of the lab's Kubernetes version (tools/k8sbin/K8S_VERSION). Idempotent:
# the binary is cached under ~/.cache/rollout-lab, keyed by the version and a hash of the
# harness's source and go.mod/go.sum. The binary's path is printed as the LAST line of stdout.
#
# Environment: ROLLOUT_LAB_CACHE  cache root (default ~/.cache/rollout-lab)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[build-admission-harness $(date +%H:%M:%S)] $*" >&2; }
K8S=$(cat "$HERE/k8sbin/K8S_VERSION")
SUM=$(cat "$HERE/admissiondiff/main.go" "$HERE/admissiondiff/go.mod" "$HERE/admissiondiff/go.sum" | sha256sum | cut -c1-12)
DIR=${ROLLOUT_LAB_CACHE:-$HOME/.cache/rollout-lab}/admissiondiff-$K8S-$SUM
BIN=$DIR/admissiondiff
if [ -x "$BIN" ]; then
  log "harness present: $BIN"
  echo "$BIN"
  exit 0
fi
mkdir -p "$DIR"
TMP=$(mktemp -d "$DIR/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
t0=$(date +%s)
log "building the admission harness against k8s.io/kubernetes $K8S"
(cd "$HERE/admissiondiff" && CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly" \
  go build -trimpath -ldflags "-s -w" -o "$TMP/admissiondiff" .)
mv -f "$TMP/admissiondiff" "$BIN"
log "built in $(( $(date +%s) - t0 ))s"
echo "$BIN"
