#!/usr/bin/env bash
# Build the lab's real DRA driver, the kubelet plugin of sigs.k8s.io/dra-example-driver
# (cmd/dra-example-kubeletplugin), from the Go module proxy. Idempotent: does nothing when the
# version-keyed bin dir already holds it. The bin dir is printed as the LAST line of stdout:
# BIN=$(tools/build-lab-dra-driver.sh | tail -1)
#
# The version is pinned exactly by tools/drabin/go.mod, a wrapper module of its own with
# `tool sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin` (the proxy refuses @latest
# and the version list for this module, so a bump is an explicit `go get ...@vX.Y.Z` there). It keeps
# the driver's own dependency versions (k8s.io/* v0.36.2 for v0.4.0): building it inside
# tools/labnodebin would move two indirect dependencies of the lab's kubelet.
#
# Environment:
#   ROLLOUT_LAB_DRA_BIN   existing dir with a dra-example-kubeletplugin binary: used as is
#   ROLLOUT_LAB_CACHE     cache root (default ~/.cache/rollout-lab)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[build-lab-dra-driver $(date +%H:%M:%S)] $*" >&2; }
NAME=dra-example-kubeletplugin

if [ -n "${ROLLOUT_LAB_DRA_BIN:-}" ]; then
  [ -x "$ROLLOUT_LAB_DRA_BIN/$NAME" ] || { log "ERROR: $ROLLOUT_LAB_DRA_BIN/$NAME missing or not executable"; exit 1; }
  log "using the prebuilt driver in $ROLLOUT_LAB_DRA_BIN"
  cd "$ROLLOUT_LAB_DRA_BIN" && pwd
  exit 0
fi

VER=$(sed -n 's#^[[:space:]]*sigs.k8s.io/dra-example-driver \(v[^ ]*\).*#\1#p' "$HERE/drabin/go.mod" | head -1)
[ -n "$VER" ] || { log "ERROR: cannot read the pinned dra-example-driver version from $HERE/drabin/go.mod"; exit 1; }
ROOT=${ROLLOUT_LAB_CACHE:-$HOME/.cache/rollout-lab}/dra-example-driver-$VER
BIN=$ROOT/bin
if [ -x "$BIN/$NAME" ]; then
  log "$NAME $VER present in $BIN"
  echo "$BIN"
  exit 0
fi
log "building $NAME $VER into $BIN"
mkdir -p "$BIN"
TMP=$(mktemp -d "$ROOT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
t0=$(date +%s)
(cd "$HERE/drabin" && go mod download)
log "module download done in $(( $(date +%s) - t0 ))s"
t1=$(date +%s)
(cd "$HERE/drabin" && go build -trimpath -ldflags "-s -w" -o "$TMP/$NAME" "sigs.k8s.io/dra-example-driver/cmd/$NAME")
log "$NAME build done in $(( $(date +%s) - t1 ))s"
mv -f "$TMP/$NAME" "$BIN/$NAME"
log "total build time $(( $(date +%s) - t0 ))s"
echo "$BIN"
