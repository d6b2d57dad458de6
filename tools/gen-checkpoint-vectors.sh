#!/usr/bin/env bash
# Regenerate tests/fixtures/kubelet/checkpoints-v1.37.2/ from the kubelet's own checkpoint code:
# tools/ckptvectors (k8s.io/kubernetes v1.37.2) writes cpu_manager_state in V4 (and the V2/V3
# structs), memory_manager_state in V3, and reads every file there as a 1.37.2 kubelet does;
# tools/ckptvectors/k136 (v1.36.3) reads the same files as a 1.36 kubelet (a rollback).
# Needs go and the Go module proxy; the binaries go to a temporary directory, never the repo.
# Usage: tools/gen-checkpoint-vectors.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=$HERE/../tests/fixtures/kubelet/checkpoints-v1.37.2
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
(cd "$HERE/ckptvectors" && CGO_ENABLED=0 go build -trimpath -o "$TMP/k137" .)
(cd "$HERE/ckptvectors/k136" && CGO_ENABLED=0 go build -trimpath -o "$TMP/k136" .)
rm -rf "$OUT" && mkdir -p "$OUT/write" "$OUT/read"
G="PodLevelResourceManagers=true,InPlacePodVerticalScalingExclusiveCPUs=true"
spec() { echo "$2" > "$TMP/$1.json"; echo "$TMP/$1.json"; }
ENTRIES=$(spec entries '{"defaultCpuSet":"0-1,4-7","entries":{"uid-1":{"app":"2-3"}}}')
POOL=$(spec pool '{"defaultCpuSet":"0-7"}')
EMPTY=$(spec empty '{}')
GATED=$(spec gated '{"defaultCpuSet":"0-1,6-7","entries":{"uid-1":{"app":"2-3"}},"podEntries":{"uid-2":"4-5"},"baselines":{"uid-1":{"app":"2"}}}')
W=$OUT/write
# what the 1.37.2 kubelet writes (NewCheckpointState, then the setters)
"$TMP/k137" cpu-write none "$EMPTY" > "$W/cpu-v4-none.json" 2>/dev/null
"$TMP/k137" cpu-write static "$POOL" > "$W/cpu-v4-static-pool.json" 2>/dev/null
"$TMP/k137" cpu-write static "$ENTRIES" > "$W/cpu-v4-static-entries.json" 2>/dev/null
"$TMP/k137" -gates "$G" cpu-write static "$GATED" > "$W/cpu-v4-static-gated.json" 2>/dev/null
# the older layouts, by 1.37.2's V2 / V3 MarshalCheckpoint (what 1.36 writes with the
# PodLevelResourceManagers gate off / on)
"$TMP/k137" cpu-write-v2 static "$ENTRIES" > "$W/cpu-v2-static-entries.json" 2>/dev/null
"$TMP/k137" cpu-write-v3 static "$GATED" > "$W/cpu-v3-static-gated.json" 2>/dev/null
MEM=$(spec mem '{"machineState":{"0":{"numberOfAssignments":1,"memoryMap":{"memory":{"total":2048,"systemReserved":512,"allocatable":1536,"reserved":512,"free":1024}},"cells":[0]},"1":{"numberOfAssignments":0,"memoryMap":{"memory":{"total":2048,"systemReserved":0,"allocatable":2048,"reserved":0,"free":2048}},"cells":[1]}},"entries":{"uid-1":{"app":[{"numaAffinity":[0],"type":"memory","size":512}]}}}')
"$TMP/k137" mem-write Static "$MEM" > "$W/memory-v3-static.json" 2>/dev/null
"$TMP/k137" mem-write None "$EMPTY" > "$W/memory-v3-none.json" 2>/dev/null
# files for the readers: the written ones plus damaged and older ones
python3 - "$W" "$OUT/read" <<'PY'
import json, shutil, sys
from pathlib import Path
w, r = Path(sys.argv[1]), Path(sys.argv[2])
for p in w.glob("cpu-*.json"):
    shutil.copy(p, r / p.name)
v4 = json.loads((w / "cpu-v4-static-entries.json").read_text())
def put(name, doc):
    (r / name).write_text(doc if isinstance(doc, str) else json.dumps(doc, separators=(",", ":")))
put("cpu-v4-bad-datachecksum.json", {**v4, "dataChecksum": 1234})
put("cpu-v4-zero-datachecksum.json", {**v4, "dataChecksum": 0})
put("cpu-v4-no-datachecksum.json", {k: v for k, v in v4.items() if k != "dataChecksum"})
put("cpu-v4-bad-data.json", {**v4, "data": "{"})
put("cpu-v4-data-not-object.json", {**v4, "data": "[1]"})
put("cpu-v4-data-number.json", {**v4, "data": 7})
put("cpu-v4-data-number-no-datachecksum.json", {k: v for k, v in {**v4, "data": 7}.items() if k != "dataChecksum"})
put("cpu-v4-bad-inline-checksum.json", {**v4, "checksum": 1234})
put("cpu-v4-inline-none.json", {**v4, "policyName": "none", "defaultCpuSet": "", "entries": {}})
put("cpu-v4-bad-inline-entries.json", {**v4, "entries": "x"})
v2 = json.loads((w / "cpu-v2-static-entries.json").read_text())
put("cpu-v2-bad-checksum.json", {**v2, "checksum": 1234})
put("cpu-v2-zero-checksum.json", {**v2, "checksum": 0})
put("cpu-v1-static.json", {"policyName": "static", "defaultCpuSet": "0-1,4-7", "entries": {"ctr-id": "2-3"}, "checksum": 0})
put("cpu-not-json.json", "{")
v3 = json.loads((w / "cpu-v3-static-gated.json").read_text())
put("cpu-v3-bad-checksum.json", {**v3, "checksum": 1234})
put("cpu-v3-zero-checksum.json", {**v3, "checksum": 0})
for p in w.glob("memory-*.json"):
    shutil.copy(p, r / p.name)
PY
# a V4 whose data carries a cpuset the kubelet cannot parse (the kubelet will not write one)
python3 - "$OUT/read/cpu-v4-bad-entry-cpuset.json" <<'PY'
import json, sys
# checksum.New(string) is FNV-1a 32 of "(string)" + the text (pkg/util/hash DeepHashObject)
def fnv(t):
    h = 0x811C9DC5
    for b in t.encode():
        h = ((h ^ b) * 0x01000193) & 0xFFFFFFFF
    return h
data = json.dumps({"policyName": "static", "defaultCpuSet": "0-1,4-7", "entries": {"uid-1": {"app": "2-x"}}}, separators=(",", ":"))
open(sys.argv[1], "w").write(json.dumps({"policyName": "static", "defaultCpuSet": "0-1,4-7", "checksum": 0, "data": data, "dataChecksum": fnv("(string)" + data)}, separators=(",", ":")))
PY
R=$OUT/read
CPU=$(ls "$R"/cpu-*.json)
MEMF=$(ls "$R"/memory-*.json)
for k in k137 k136; do
  "$TMP/$k" cpu-read static $CPU > "$OUT/$k-cpu-static.jsonl" 2>/dev/null
  "$TMP/$k" cpu-read none $CPU > "$OUT/$k-cpu-none.jsonl" 2>/dev/null
  "$TMP/$k" -gates "$G" cpu-read static $CPU > "$OUT/$k-cpu-static-gated.jsonl" 2>/dev/null
  "$TMP/$k" mem-read Static $MEMF > "$OUT/$k-memory-static.jsonl" 2>/dev/null
done
echo "wrote $OUT" >&2
