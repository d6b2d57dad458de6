#!/usr/bin/env bash
# Build kwok (the controller that plays the kubelet of fake Nodes, `rollout lab up --kwok-nodes N`)
# from the Go module proxy. Idempotent: does nothing when the version-keyed bin dir already holds
# it. The bin dir is printed as the LAST line of stdout: BIN=$(tools/build-lab-kwok.sh | tail -1)
#
# The version is pinned by tools/kwokbin/go.mod (a wrapper module with `tool
# sigs.k8s.io/kwok/cmd/kwok`); its k8s.io modules are raised to the control plane's (v0.36.3, as in
# tools/k8sbin), so the packages it shares with the control plane come from the same Go build cache.
#
# Environment:
#   ROLLOUT_LAB_KWOK_BIN  existing dir with a kwok binary: used as is, nothing is built
#   ROLLOUT_LAB_CACHE     cache root (default ~/.cache/rollout-lab)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[build-lab-kwok $(date +%H:%M:%S)] $*" >&2; }

if [ -n "${ROLLOUT_LAB_KWOK_BIN:-}" ]; then
  [ -x "$ROLLOUT_LAB_KWOK_BIN/kwok" ] || { log "ERROR: $ROLLOUT_LAB_KWOK_BIN/kwok missing"; exit 1; }
  cd "$ROLLOUT_LAB_KWOK_BIN" && pwd
  exit 0
fi

KWOK=$(sed -n 's#^[[:space:]]*sigs.k8s.io/kwok \(v[^ ]*\).*#\1#p' "$HERE/kwokbin/go.mod" | head -1)
[ -n "$KWOK" ] || { log "ERROR: cannot read the pinned kwok version from $HERE/kwokbin/go.mod"; exit 1; }
ROOT=${ROLLOUT_LAB_CACHE:-$HOME/.cache/rollout-lab}/kwok-$KWOK
BIN=$ROOT/bin
if [ -x "$BIN/kwok" ]; then
  log "kwok present in $BIN"
  echo "$BIN"
  exit 0
fi
log "building kwok $KWOK into $BIN"
mkdir -p "$BIN"
TMP=$(mktemp -d "$ROOT/.build.XXXXXX")
trap 'rm -rf "$TMP"' EXIT
export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
t0=$(date +%s)
(cd "$HERE/kwokbin" && go mod download)
log "module download done in $(( $(date +%s) - t0 ))s"
t1=$(date +%s)
(cd "$HERE/kwokbin" && go build -trimpath -ldflags "-s -w" -o "$TMP/kwok" sigs.k8s.io/kwok/cmd/kwok)
log "kwok build done in $(( $(date +%s) - t1 ))s"
mv -f "$TMP/kwok" "$BIN/kwok"
"$BIN/kwok" --version >&2 || true
log "total build time $(( $(date +%s) - t0 ))s"
echo "$BIN"
