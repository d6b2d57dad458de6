"""The change path on real-kubelet nodes vs simulated ones, side by side in one run.

Run as root on a machine with the lab binaries and the real kubelet::

    .venv/bin/python benchmarks/real_change_bench.py [--rounds 3]

Method: one control plane; two kubeadm nodes of each kind (``sim-1``, ``sim-2``, ``real-1``,
``real-2``), the first of each pair the canary. Per round, for each kind in turn (sim, real):

* **restart -> healthz**: ``systemctl restart`` of the canary's kubelet unit (the shim), then
  poll ``/healthz`` through the API server's node proxy until ``ok``: what every apply and
  restore waits for;
* **apply + rollback**: ``rollout apply --canary --yes`` of the lab plan (static CPU manager
  reserving 0,32, single-numa-node at pod scope, no gate) then ``rollout rollback``, both through
  the CLI as a subprocess, wall time of each.

Prints each sample, then medians and the real/sim ratio. The kinds alternate inside each round so
that the machine's load (shared with other builds and tests) hits both alike.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck


def _healthz(lab: Lab, node: str) -> bool:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/healthz", timeout=2)
    return code == 200 and body == "ok"


def _restart(lab: Lab, node: str) -> float:
    unit = lab.nodes[node].node.unit
    t = time.monotonic()
    r = lab.machines.node_exec(node, "systemctl", "restart", unit)
    assert r.returncode == 0, r.stderr
    time.sleep(0.2)  # the old process answers until it is gone
    ck.wait_for(lambda: _healthz(lab, node), 120, f"{node} healthz", every=0.1)
    return time.monotonic() - t


def _apply_rollback(lab: Lab, names: list[str], work: Path) -> tuple[float, float]:
    work.mkdir(parents=True)
    inv = ck.inventory(lab, names, names[:1], work / "inv.ini")
    inv.write_text(
        inv.read_text().replace(
            ck.FAST_VARS, "rollout_kubelet_healthz_retries=120\nrollout_kubelet_healthz_delay=1\n"
        )
    )
    plan = ck.plan(work / "plan.yaml", dict.fromkeys(names, "kubeadm"))
    env = ck.env(lab, work / "state")
    t = time.monotonic()
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    applied = time.monotonic() - t
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    t = time.monotonic()
    r = ck.cli(["rollback", "--change", change, "--yes"], env)
    rolled = time.monotonic() - t
    assert r.returncode == 0, r.stderr[-3000:]
    return applied, rolled


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    root = Path(tempfile.mkdtemp(prefix="real-change-bench-"))
    lab = Lab(f"rcb{os.getpid()}", root / "lab")
    lab.start_control_plane()
    kinds = ("sim", "real")
    pairs = {k: [f"{k}-1", f"{k}-2"] for k in kinds}
    samples: dict[str, dict[str, list[float]]] = {
        k: {"restart": [], "apply": [], "rollback": []} for k in kinds
    }
    try:
        for k in kinds:
            lab.machines.add_nodes(pairs[k], ["kubeadm"], kubelet=k, timeout=120)
        for rnd in range(args.rounds):
            for k in kinds:
                s = samples[k]
                s["restart"].append(_restart(lab, pairs[k][0]))
                a, b = _apply_rollback(lab, pairs[k], root / f"{k}-{rnd}")
                s["apply"].append(a)
                s["rollback"].append(b)
                print(
                    f"round {rnd + 1} {k:4}: restart->healthz {s['restart'][-1]:6.2f} s  "
                    f"apply {a:6.1f} s  rollback {b:6.1f} s  (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
    finally:
        lab.down()
    print("\nmedians              sim       real   real/sim")
    for key, label in (
        ("restart", "restart->healthz"),
        ("apply", "apply --canary"),
        ("rollback", "rollback"),
    ):
        s, r = statistics.median(samples["sim"][key]), statistics.median(samples["real"][key])
        print(f"{label:18} {s:8.2f}  {r:8.2f}  {r / s:8.2f}")


if __name__ == "__main__":
    main()
