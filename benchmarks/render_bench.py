"""Render for 1,000 nodes, each with its own reservedSystemCPUs, from the real kubeadm config.yaml.

Measures CPU time (time.process_time) of ``render`` (in-place method: parse, text edit, effective
config before and after, conflict checks) against a naive alternative in the same run: a ruamel.yaml
round-trip load + edit + dump per node (the straightforward way to
keep comments).

    .venv/bin/python benchmarks/render_bench.py [N]
"""

from __future__ import annotations

import io
import statistics
import sys
import time
from pathlib import Path

from ruamel.yaml import YAML

from rollout.kubelet.intent import build_intent
from rollout.kubelet.loading import node_from_files
from rollout.kubelet.render import render

FIXTURE = (
    Path(__file__).resolve().parents[1]
    / "tests/fixtures/kubelet/kubeadm-var-lib-kubelet-config.yaml"
)


def main(n: int = 1000) -> None:
    raw = b"".join(
        line
        for line in FIXTURE.read_bytes().splitlines(True)
        if not line.startswith(b"# [fixture]")
    )
    nodes = [node_from_files("kubeadm", {"/var/lib/kubelet/config.yaml": raw}) for _ in range(n)]
    intents = [build_intent({"reservedSystemCPUs": f"0,{i % 128 + 1}"}) for i in range(n)]

    per: list[float] = []
    t0 = time.process_time()
    for node, intent in zip(nodes, intents, strict=True):
        s = time.process_time()
        render(node, intent, "inplace")
        per.append(time.process_time() - s)
    ours = time.process_time() - t0

    yaml = YAML()
    naive_per: list[float] = []
    t0 = time.process_time()
    for intent in intents:
        s = time.process_time()
        doc = yaml.load(raw)
        doc.update(intent.fields)
        buf = io.StringIO()
        yaml.dump(doc, buf)
        naive_per.append(time.process_time() - s)
    naive = time.process_time() - t0

    print(f"nodes: {n}")
    print(
        f"render (text edit + effective before/after): total {ours:.3f} s CPU, "
        f"median {statistics.median(per) * 1e3:.3f} ms/node"
    )
    print(
        f"naive ruamel round-trip load+dump only:     total {naive:.3f} s CPU, "
        f"median {statistics.median(naive_per) * 1e3:.3f} ms/node"
    )
    print(f"ratio naive/render: {naive / ours:.1f}x")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
