#!/usr/bin/env bash
# Regenerate tools/k8sbin/go.mod for a Kubernetes version, using only the Go module proxy.
# Usage: tools/update-k8s-replaces.sh v1.36.3
# k8s.io/kubernetes requires every staging module at v0.0.0 and maps them with
# "replace ... => ./staging/src/..." which is ignored for dependencies; we pin each
# staging module to its published v0.<minor>.<patch> tag instead. The staging list is
# read from the go.mod the proxy serves, never typed by hand.
set -euo pipefail
K8S=${1:?usage: $0 v1.X.Y}
STAGING=v0.${K8S#v1.}
HERE=$(cd "$(dirname "$0")" && pwd)
W=$HERE/k8sbin
mkdir -p "$W"
cd "$W"
[ -f go.mod ] || go mod init rollout.invalid/tools/k8sbin
GOMOD=$(go mod download -json "k8s.io/kubernetes@$K8S" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
STAGING_MODS=$(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$GOMOD")
# drop k8s.io replaces that are no longer staging modules; existing ones are updated in place
for m in $(go mod edit -json | python3 -c 'import json,sys;[print(r["Old"]["Path"]) for r in (json.load(sys.stdin).get("Replace") or []) if r["Old"]["Path"].startswith("k8s.io/")]'); do
  grep -qx "$m" <<<"$STAGING_MODS" || go mod edit -dropreplace="$m"
done
n=0
for m in $STAGING_MODS; do
  go mod edit -replace="$m=$m@$STAGING"
  n=$((n+1))
done
echo "pinned $n staging modules to $STAGING" >&2
go mod edit -go="$(sed -n 's/^go //p' "$GOMOD")"
go get -tool "k8s.io/kubernetes/cmd/kube-apiserver@$K8S" "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S" \
  "k8s.io/kubernetes/cmd/kube-scheduler@$K8S" "k8s.io/kubernetes/cmd/kubectl@$K8S"
go mod tidy
echo "$K8S" > K8S_VERSION
echo "now set K8S_VERSION = \"$K8S\" in rollout/lab/controlplane.py (tests/lab/test_controlplane.py checks it)" >&2
