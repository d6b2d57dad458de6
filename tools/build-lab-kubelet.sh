#!/usr/bin/env bash
# Build the real kubelet and the two small programs a real-kubelet lab node needs
# (tools/labnodebin: fakecri, fakedeviceplugin), from the Go module proxy. Idempotent: does nothing
# when the version-keyed bin dir already holds them.
# The bin dir is printed as the LAST line of stdout: BIN=$(tools/build-lab-kubelet.sh | tail -1)
#
# Usage: tools/build-lab-kubelet.sh [VERSION]
#   VERSION   a full kubelet version (v1.35.4); default: the lab's (tools/k8sbin/K8S_VERSION).
#             The lab's version builds from the committed wrapper module tools/labnodebin; another
#             version builds from a wrapper module generated in its cache dir (the staging replace
#             list read from that version's go.mod on the proxy, as tools/update-k8s-replaces.sh
#             does). The fakes always build from tools/labnodebin (CRI v1 and device plugin
#             v1beta1 are the same for every kubelet the lab runs).
#
# Environment:
#   ROLLOUT_LAB_KUBELET_BIN   existing dir with kubelet, fakecri, fakedeviceplugin of the lab's
#                             version: used as is (ignored for another VERSION)
#   ROLLOUT_LAB_CACHE         cache root (default ~/.cache/rollout-lab)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[build-lab-kubelet $(date +%H:%M:%S)] $*" >&2; }
WANT=(kubelet fakecri fakedeviceplugin)

K8S=$(cat "$HERE/k8sbin/K8S_VERSION")
VER=${1:-$K8S}
if ! [[ $VER =~ ^v1\.[0-9]+\.[0-9]+$ ]]; then
  log "ERROR: kubelet version '$VER' is not of the form v1.MINOR.PATCH"
  exit 2
fi

if [ -n "${ROLLOUT_LAB_KUBELET_BIN:-}" ] && [ "$VER" = "$K8S" ]; then
  for b in "${WANT[@]}"; do
    [ -x "$ROLLOUT_LAB_KUBELET_BIN/$b" ] || { log "ERROR: $ROLLOUT_LAB_KUBELET_BIN/$b missing or not executable"; exit 1; }
  done
  log "using prebuilt binaries in $ROLLOUT_LAB_KUBELET_BIN"
  cd "$ROLLOUT_LAB_KUBELET_BIN" && pwd
  exit 0
fi

MINOR=$(echo "$VER" | cut -d. -f2)
W=$HERE/labnodebin
PINNED=$(cd "$W" && go list -m -f '{{.Version}}' k8s.io/kubernetes)
if [ "$PINNED" != "$K8S" ]; then
  log "ERROR: tools/labnodebin/go.mod pins k8s.io/kubernetes $PINNED but the lab's version is $K8S"
  log "       (copy the replace list from tools/k8sbin/go.mod and run 'go mod tidy' in tools/labnodebin)"
  exit 1
fi
# the fakes are keyed by their sources too, so a change to them rebuilds them (not the kubelet)
STAMP=$(cat "$W"/go.mod "$W"/go.sum "$W"/*/*.go | sha256sum | cut -c1-12)
ROOT=${ROLLOUT_LAB_CACHE:-$HOME/.cache/rollout-lab}/kubelet-$VER
BIN=$ROOT/bin
kubelet=0 fakes=0
[ -x "$BIN/kubelet" ] || kubelet=1
if [ "$(cat "$BIN/.fakes-stamp" 2>/dev/null)" != "$STAMP" ] || [ ! -x "$BIN/fakecri" ] || [ ! -x "$BIN/fakedeviceplugin" ]; then
  fakes=1
fi
if [ $kubelet = 0 ] && [ $fakes = 0 ]; then
  log "all binaries present in $BIN"
  echo "$BIN"
  exit 0
fi
mkdir -p "$BIN"
TMP=$(mktemp -d "$ROOT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export CGO_ENABLED=0
FLAGS=(-trimpath -tags selinux,notest,grpcnotrace)
LDF="-s -w"
for k in client-go/pkg/version component-base/version; do
  LDF="$LDF -X k8s.io/$k.gitVersion=$VER -X k8s.io/$k.gitMajor=1 -X k8s.io/$k.gitMinor=$MINOR -X k8s.io/$k.gitTreeState=clean"
done
t0=$(date +%s)
MOD=$W
if [ $kubelet = 1 ] && [ "$VER" != "$K8S" ]; then
  # a wrapper module for this version, generated once in its cache dir
  MOD=$ROOT/mod
  if [ ! -f "$MOD/.done" ]; then
    log "generating the wrapper module for k8s.io/kubernetes $VER in $MOD"
    rm -rf "$MOD.tmp" && mkdir -p "$MOD.tmp"
    (
      cd "$MOD.tmp"
      go mod init rollout.invalid/labkubelet >/dev/null 2>&1
      GOMOD=$(go mod download -json "k8s.io/kubernetes@$VER" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
      STAGING=v0.${VER#v1.}
      n=0
      for m in $(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$GOMOD"); do
        go mod edit -replace="$m=$m@$STAGING"
        n=$((n+1))
      done
      log "pinned $n staging modules to $STAGING"
      go mod edit -go="$(sed -n 's/^go //p' "$GOMOD")"
      go get -tool "k8s.io/kubernetes/cmd/kubelet@$VER"
      go mod tidy
      touch .done
    )
    rm -rf "$MOD" && mv "$MOD.tmp" "$MOD"
  fi
fi
if [ $kubelet = 1 ]; then
  log "building: kubelet $VER into $BIN"
  (cd "$MOD" && go mod download && go build -mod=readonly "${FLAGS[@]}" -ldflags "$LDF" -o "$TMP/" k8s.io/kubernetes/cmd/kubelet)
fi
if [ $fakes = 1 ]; then
  log "building: fakecri fakedeviceplugin into $BIN"
  (cd "$W" && go mod download && go build -mod=readonly "${FLAGS[@]}" -ldflags "-s -w" -o "$TMP/" ./fakecri ./fakedeviceplugin)
fi
for b in "$TMP"/*; do [ -e "$b" ] && mv -f "$b" "$BIN/"; done
echo "$STAMP" > "$BIN/.fakes-stamp"
"$BIN/kubelet" --version >&2 || true
log "total build time $(( $(date +%s) - t0 ))s"
echo "$BIN"
