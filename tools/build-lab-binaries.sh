#!/usr/bin/env bash
# Build the lab's real control plane (etcd, kube-apiserver, kube-controller-manager,
# kube-scheduler, kubectl) from the Go module proxy. Idempotent: does nothing when
# the version-keyed bin dir already holds every binary. The bin dir is printed as
# the LAST line of stdout, so callers can do: BIN=$(tools/build-lab-binaries.sh | tail -1)
#
# Environment:
#   ROLLOUT_LAB_BIN / KUBEBUILDER_ASSETS  existing dir with etcd + kube-apiserver (+ kcm, scheduler):
#                                         used as is, nothing is built
#   ROLLOUT_LAB_CACHE                     cache root (default ~/.cache/rollout-lab)
#   ROLLOUT_LAB_KUBECTL=0                 skip kubectl (the lab itself does not need it)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[build-lab-binaries $(date +%H:%M:%S)] $*" >&2; }

for d in "${ROLLOUT_LAB_BIN:-}" "${KUBEBUILDER_ASSETS:-}"; do
  if [ -n "$d" ]; then
    for b in etcd kube-apiserver; do
      [ -x "$d/$b" ] || { log "ERROR: $d/$b missing or not executable"; exit 1; }
    done
    log "using prebuilt binaries in $d"
    cd "$d" && pwd
    exit 0
  fi
done

K8S=$(cat "$HERE/k8sbin/K8S_VERSION")
ETCD=$(cat "$HERE/etcdbin/ETCD_VERSION")
MINOR=$(echo "$K8S" | cut -d. -f2)
ROOT=${ROLLOUT_LAB_CACHE:-$HOME/.cache/rollout-lab}/k8s-$K8S-etcd-$ETCD
BIN=$ROOT/bin
K8S_CMDS=(kube-apiserver kube-controller-manager kube-scheduler)
WANT=(etcd "${K8S_CMDS[@]}")
[ "${ROLLOUT_LAB_KUBECTL:-1}" = 0 ] || WANT+=(kubectl)

missing=()
for b in "${WANT[@]}"; do [ -x "$BIN/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  log "all binaries present in $BIN"
  echo "$BIN"
  exit 0
fi
log "building: ${missing[*]} (k8s $K8S, etcd $ETCD) into $BIN"
mkdir -p "$BIN"
TMP=$(mktemp -d "$ROOT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
LDF="-s -w"
for k in client-go/pkg/version component-base/version; do
  LDF="$LDF -X k8s.io/$k.gitVersion=$K8S -X k8s.io/$k.gitMajor=1 -X k8s.io/$k.gitMinor=$MINOR -X k8s.io/$k.gitTreeState=clean"
done
TAGS=selinux,notest,grpcnotrace
t0=$(date +%s)
step() { local s=$1; shift; local a; a=$(date +%s); "$@"; log "$s done in $(( $(date +%s) - a ))s"; }

need() { local b; for b in "$@"; do [[ " ${missing[*]} " == *" $b "* ]] && return 0; done; return 1; }

if need "${K8S_CMDS[@]}" kubectl; then
  (cd "$HERE/k8sbin" && step "k8s module download" go mod download)
fi
if need etcd; then
  (cd "$HERE/etcdbin" && step "etcd module download" go mod download)
  (cd "$HERE/etcdbin" && step "etcd build" go build -trimpath \
     -ldflags "-s -w -X go.etcd.io/etcd/api/v3/version.GitSHA=$ETCD" -o "$TMP/etcd" go.etcd.io/etcd/server/v3)
fi
if need "${K8S_CMDS[@]}"; then
  # one go build for all control-plane binaries: the packages they share compile once
  pkgs=(); for c in "${K8S_CMDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  (cd "$HERE/k8sbin" && step "k8s control plane build (${K8S_CMDS[*]})" \
     go build -trimpath -tags "$TAGS" -ldflags "$LDF" -o "$TMP/" "${pkgs[@]}")
fi
if need kubectl; then
  # separate step (same GOCACHE, so shared packages are not recompiled) so its marginal cost is visible
  (cd "$HERE/k8sbin" && step "kubectl build" \
     go build -trimpath -tags "$TAGS" -ldflags "$LDF" -o "$TMP/kubectl" k8s.io/kubernetes/cmd/kubectl)
fi
for b in "$TMP"/*; do [ -e "$b" ] && mv -f "$b" "$BIN/"; done
"$BIN/kube-apiserver" --version >&2 || true
"$BIN/etcd" --version >&2 || true
log "total build time $(( $(date +%s) - t0 ))s"
echo "$BIN"
