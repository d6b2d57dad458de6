#!/usr/bin/env bash
# Build the lab's monitoring stack (prometheus, promtool, alertmanager) from the Go module proxy.
# Idempotent: does nothing when the version-keyed bin dir already holds every binary. The bin dir
# is printed as the LAST line of stdout: BIN=$(tools/build-monitoring-binaries.sh | tail -1)
#
# Versions are pinned by the wrapper modules' go.mod/go.sum (tools/prombin, tools/ambin; one each,
# so each binary builds with its own upstream's dependency versions, not a merge of both).
# No web UI is built:
#   - prometheus: without the `builtinassets` tag web/ui serves from disk (absent here: the UI
#     pages 404, the HTTP API is unaffected);
#   - alertmanager: ui/web.go has `//go:embed app/dist`, which the published module lacks (it is
#     built by npm in upstream's Makefile), so we build from a copy of the module source with a
#     one-page placeholder in app/dist, via a temporary -modfile with a directory replace.
# Only the Kubernetes service discovery is compiled in (tags remove_all_sd,enable_kubernetes_sd).
#
# Environment:
#   ROLLOUT_MONITORING_BIN  existing dir with prometheus, promtool, alertmanager: used as is
#   ROLLOUT_LAB_CACHE       cache root (default ~/.cache/rollout-lab)
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
log() { echo "[build-monitoring-binaries $(date +%H:%M:%S)] $*" >&2; }

if [ -n "${ROLLOUT_MONITORING_BIN:-}" ]; then
  for b in prometheus promtool alertmanager; do
    [ -x "$ROLLOUT_MONITORING_BIN/$b" ] || { log "ERROR: $ROLLOUT_MONITORING_BIN/$b missing"; exit 1; }
  done
  cd "$ROLLOUT_MONITORING_BIN" && pwd
  exit 0
fi

modver() { sed -n "s#^[[:space:]]*$1 \(v[^ ]*\).*#\1#p" "$2" | head -1; }
PROM=$(modver github.com/prometheus/prometheus "$HERE/prombin/go.mod")
AM=$(modver github.com/prometheus/alertmanager "$HERE/ambin/go.mod")
[ -n "$PROM" ] && [ -n "$AM" ] || { log "ERROR: cannot read the pinned versions"; exit 1; }
# prometheus' Go module v0.3XY.Z is Prometheus 3.XY.Z
PROM_RELEASE=$(echo "$PROM" | sed -E 's/^v0\.3([0-9]{2})\.([0-9]+)$/3.\1.\2/; s/^3\.0([0-9])/3.\1/')
ROOT=${ROLLOUT_LAB_CACHE:-$HOME/.cache/rollout-lab}/monitoring-prometheus-$PROM-alertmanager-$AM
BIN=$ROOT/bin

missing=()
for b in prometheus promtool alertmanager; do [ -x "$BIN/$b" ] || missing+=("$b"); done
if [ ${#missing[@]} -eq 0 ]; then
  log "all binaries present in $BIN"
  echo "$BIN"
  exit 0
fi
log "building: ${missing[*]} (prometheus $PROM = $PROM_RELEASE, alertmanager $AM) into $BIN"
mkdir -p "$BIN"
TMP=$(mktemp -d "$ROOT/.build.XXXXXX")
trap 'chmod -R u+w "$TMP" 2>/dev/null; rm -rf "$TMP"' EXIT

export CGO_ENABLED=0 GOFLAGS="${GOFLAGS:-} -mod=readonly"
stamp() { # $1 version: prometheus/common's version package, as upstream's promu does
  local v=github.com/prometheus/common/version
  echo "-s -w -X $v.Version=$1 -X $v.Revision=module-proxy -X $v.Branch=release -X $v.BuildUser=rollout -X $v.BuildDate=19700101-00:00:00"
}
t0=$(date +%s)
step() { local s=$1; shift; local a; a=$(date +%s); "$@"; log "$s done in $(( $(date +%s) - a ))s"; }
need() { local b; for b in "$@"; do [[ " ${missing[*]} " == *" $b "* ]] && return 0; done; return 1; }

if need prometheus promtool; then
  (cd "$HERE/prombin" && step "prometheus + promtool build" go build -trimpath \
     -tags remove_all_sd,enable_kubernetes_sd -ldflags "$(stamp "$PROM_RELEASE")" -o "$TMP/" \
     github.com/prometheus/prometheus/cmd/prometheus github.com/prometheus/prometheus/cmd/promtool)
  mv -f "$TMP/prometheus" "$TMP/promtool" "$BIN/"  # kept even if alertmanager fails below
fi
if need alertmanager; then
  SRC=$(cd "$HERE/ambin" && go mod download -json github.com/prometheus/alertmanager \
        | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
  [ -d "$SRC" ] || { log "ERROR: alertmanager module source not found"; exit 1; }
  cp -r "$SRC" "$TMP/alertmanager-src"
  chmod -R u+w "$TMP/alertmanager-src"
  for ui in elm mantine; do
    mkdir -p "$TMP/alertmanager-src/ui/app/dist/$ui"
    printf '<!doctype html><title>Alertmanager</title><p>Web UI not built (rollout lab: API only, /api/v2).</p>\n' \
      > "$TMP/alertmanager-src/ui/app/dist/$ui/index.html"
  done
  cp "$HERE/ambin/go.mod" "$TMP/am.mod"; cp "$HERE/ambin/go.sum" "$TMP/am.sum"
  (cd "$HERE/ambin" && go mod edit -modfile="$TMP/am.mod" \
     -replace="github.com/prometheus/alertmanager=$TMP/alertmanager-src")
  (cd "$HERE/ambin" && step "alertmanager build" go build -modfile="$TMP/am.mod" -trimpath \
     -ldflags "$(stamp "${AM#v}")" -o "$TMP/alertmanager" github.com/prometheus/alertmanager/cmd/alertmanager)
  rm -rf "$TMP/alertmanager-src" "$TMP/am.mod" "$TMP/am.sum"
fi
for b in "$TMP"/*; do [ -e "$b" ] && mv -f "$b" "$BIN/"; done
"$BIN/prometheus" --version >&2 || true
"$BIN/alertmanager" --version >&2 || true
log "total build time $(( $(date +%s) - t0 ))s"
echo "$BIN"
