#!/usr/bin/env bash
# Regenerate tools/etcdbin/go.mod for an etcd server version: tools/etcdbin/update.sh v3.6.8
set -euo pipefail
V=${1:?usage: $0 v3.6.x}
cd "$(dirname "$0")"
[ -f go.mod ] || go mod init rollout.invalid/tools/etcdbin
GOMOD=$(go mod download -json "go.etcd.io/etcd/server/v3@$V" | python3 -c 'import json,sys;print(json.load(sys.stdin)["GoMod"])')
go mod edit -go="$(sed -n 's/^go //p' "$GOMOD")"
go get -tool "go.etcd.io/etcd/server/v3@$V"
go mod tidy
echo "$V" > ETCD_VERSION
echo "now set ETCD_VERSION = \"$V\" in rollout/lab/controlplane.py (tests/lab/test_controlplane.py checks it)" >&2
