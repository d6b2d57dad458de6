"""Preflight's per-node work for 1,000 nodes: render and lint exactly as ``rollout apply`` does
(``rollout.change.preflight.node_change.node_change``: the node's files from the facts module's
record, render, effective config, validation against the node's CPUs/NUMA, the node change with its
compare-and-swap digests), CPU time.

    .venv/bin/python benchmarks/preflight_bench.py [N]
"""

from __future__ import annotations

import base64
import hashlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout.ansible.hosts import Inventory  # noqa: E402
from rollout.change.plan.schema import load_plan  # noqa: E402
from rollout.change.preflight.node_change import node_change  # noqa: E402
from rollout.lab.inventory import LAB_INTENT  # noqa: E402

FIXTURE = REPO / "tests/fixtures/kubelet/kubeadm-var-lib-kubelet-config.yaml"


def main(n: int = 1000) -> None:
    raw = b"".join(
        line
        for line in FIXTURE.read_bytes().splitlines(True)
        if not line.startswith(b"# [fixture]")
    )
    path = "/var/lib/kubelet/config.yaml"
    record = {
        "sha256": hashlib.sha256(raw).hexdigest(),
        "mode": "0644",
        "owner": "root",
        "group": "root",
        "content_b64": base64.b64encode(raw).decode(),
    }
    facts = {
        "distribution": "kubeadm",
        "kubeletVersion": "v1.34.2",
        "onlineCPUs": "0-63",
        "sockets": 2,
        "threadsPerCore": 2,
        "numaNodes": [{"id": 0, "cpus": "0-15,32-47"}, {"id": 1, "cpus": "16-31,48-63"}],
        "gpus": [],
        "kubeletFiles": [path],
        "kubeletFileMeta": {path: record},
    }
    with tempfile.TemporaryDirectory() as tmp:
        plan_file = Path(tmp) / "plan.yaml"
        lines = [
            "apiVersion: rollout.dev/v1alpha1",
            "kind: RolloutPlan",
            "metadata:",
            "  name: bench",
            *LAB_INTENT,
            "strategy:",
            "  canaryGroup: canary",
        ]
        plan_file.write_text("\n".join(lines) + "\n")
        plan = load_plan(plan_file)
        hosts = tuple(f"n{i}" for i in range(n))
        inv = Inventory(Path(tmp) / "inv.ini", hosts, {"canary": hosts[:1]}, {})
        per: list[float] = []
        t0 = time.process_time()
        for h in hosts:
            s = time.process_time()
            _, _, errors, _ = node_change(plan, inv, h, facts, Path(tmp))
            assert not errors, errors
            per.append(time.process_time() - s)
        total = time.process_time() - t0
    print(f"nodes: {n}")
    print(
        f"render + lint (preparing.node_change): total {total:.3f} s CPU, "
        f"median {statistics.median(per) * 1e3:.3f} ms/node"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 1000)
