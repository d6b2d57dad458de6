#!/usr/bin/env bash
# Build the real kubelet of the lab's version (tools/k8sbin/K8S_VERSION) and the two small
# programs a real-kubelet lab node needs (tools/labnodebin: fakecri, fakedeviceplugin), from the
# Go module proxy. Idempotent: does nothing when the version-keyed bin dir already holds them.
# The bin dir is printed as the LAST line of stdout: BIN=$(tools/build-lab-kubelet.sh | tail -1)
#
# Environment:
#   ROLLOUT_LAB_KUBELET_BIN   existing dir with kubelet, fakecri, fakedeviceplugin: used as is
#   ROLLOUT_LAB_CACHE         cache root (default ~/.cache/rollout-lab)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[build-lab-kubelet $(date +%H:%M:%S)] $*" >&2; }
WANT=(kubelet fakecri fakedeviceplugin)

if [ -n "${ROLLOUT_LAB_KUBELET_BIN:-}" ]; then
  for b in "${WANT[@]}"; do
    [ -x "$ROLLOUT_LAB_KUBELET_BIN/$b" ] || { log "ERROR: $ROLLOUT_LAB_KUBELET_BIN/$b missing or not executable"; exit 1; }
  done
  log "using prebuilt binaries in $ROLLOUT_LAB_KUBELET_BIN"
  cd "$ROLLOUT_LAB_KUBELET_BIN" && pwd
  exit 0
fi

K8S=$(cat "$HERE/k8sbin/K8S_VERSION")
MINOR=$(echo "$K8S" | cut -d. -f2)
W=$HERE/labnodebin
PINNED=$(cd "$W" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
if [ "$PINNED" != "$K8S" ]; then
  log "ERROR: tools/labnodebin/go.mod pins k8s.io/kubernetes $PINNED but the lab's version is $K8S"
  log "       (copy the replace list from tools/k8sbin/go.mod and run 'go mod tidy' in tools/labnodebin)"
  exit 1
fi
# the fakes are keyed by their sources too, so a change to them rebuilds them (not the kubelet)
STAMP=$(cat "$W"/go.mod "$W"/go.sum "$W"/*/*.go | sha256sum | cut -c1-12)
ROOT=${ROLLOUT_LAB_CACHE:-$HOME/.cache/rollout-lab}/kubelet-$K8S
BIN=$ROOT/bin
missing=()
[ -x "$BIN/kubelet" ] || missing+=(kubelet)
if [ "$(cat "$BIN/.fakes-stamp" 2>/dev/null)" != "$STAMP" ] || [ ! -x "$BIN/fakecri" ] || [ ! -x "$BIN/fakedeviceplugin" ]; then
  missing+=(fakecri fakedeviceplugin)
fi
if [ ${#missing[@]} -eq 0 ]; then
  log "all binaries present in $BIN"
  echo "$BIN"
  exit 0
fi
log "building: ${missing[*]} (k8s $K8S) into $BIN"
mkdir -p "$BIN"
TMP=$(mktemp -d "$ROOT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
LDF="-s -w"
for k in client-go/pkg/version component-base/version; do
  LDF="$LDF -X k8s.io/$k.gitVersion=$K8S -X k8s.io/$k.gitMajor=1 -X k8s.io/$k.gitMinor=$MINOR -X k8s.io/$k.gitTreeState=clean"
done
t0=$(date +%s)
pkgs=()
for b in "${missing[@]}"; do
  case $b in
    kubelet) pkgs+=(k8s.io/kubernetes/cmd/kubelet) ;;
    *) pkgs+=("./$b") ;;
  esac
done
(cd "$W" && go mod download && go build -trimpath -tags selinux,notest,grpcnotrace -ldflags "$LDF" -o "$TMP/" "${pkgs[@]}")
for b in "$TMP"/*; do [ -e "$b" ] && mv -f "$b" "$BIN/"; done
echo "$STAMP" > "$BIN/.fakes-stamp"
"$BIN/kubelet" --version >&2 || true
log "total build time $(( $(date +%s) - t0 ))s"
echo "$BIN"
