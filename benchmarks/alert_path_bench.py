"""First rejection -> rollback start: the alert path vs the gate's own watch path, in one run.

Run as root on a machine with the lab and monitoring binaries (scripts/setup builds both)::

    .venv/bin/python benchmarks/alert_path_bench.py [--trials 2]

What runs: one lab (real control plane) with ``--monitoring`` (Prometheus, Alertmanager,
``rollout serve``; scrape and evaluation 2 s, group_wait 2 s) and, per trial, two fresh nodes:

* **gate path**: ``rollout apply --canary`` with a ``gate:`` (soak 20 s, interval 1 s); while the
  gate soaks, a Deployment asking for 6 GPUs (a node has 8, a NUMA node 4) lands on the canary; the
  kubelet rejects it; the gate fails the canary and rolls it back;
* **alert path**: the same apply with a workload that fits (the gate passes, the change holds);
  then the 6-GPU Deployment lands on the canary; the kubelet rejects it, Prometheus scrapes,
  ``KubeletTopologyAffinityRejections`` (``for: 1m``) fires, Alertmanager posts, ``rollout serve``
  rolls the change back.

Latency = the change's ``trigger`` journal record (written the moment the rollback is decided) -
the kubelet's first rejection (its Warning Event is named ``<pod>.<UnixNano hex>``). Printed raw,
with medians and the ratio.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rollout.change.record.journal import Journal
from rollout.lab.cluster import Lab
from rollout.lab.monitoring import INTERVALS
from tests.lab import changekit as ck
from tests.lab.test_gate import (
    _deployment,
    _first_rejection,
    _gate_plan,
    _rejected,
    _ts,
)


def _namespace(lab: Lab, name: str) -> str:
    body = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    code, out = lab.api.request("POST", "/api/v1/namespaces", body)
    assert code == 201, out
    ck.wait_for(
        lambda: (
            lab.api.request("GET", f"/api/v1/namespaces/{name}/serviceaccounts/default")[0] == 200
        ),
        30,
        "the default ServiceAccount",
    )
    return name


def _apply_then(
    lab: Lab, plan: Path, inv: Path, state: Path, node: str, during_soak: Any
) -> subprocess.CompletedProcess[str]:
    """``apply --canary`` in the background; when the canary is uncordoned, ``during_soak()``."""
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    proc = ck.start_cli(args, ck.env(lab, state))
    try:

        def canary_up() -> bool:
            if proc.poll() is not None:  # apply ended before the soak: say why
                raise RuntimeError(f"apply exited {proc.returncode}: {proc.communicate()}")
            return ck.journal_has(state, node, "uncordon", "done")

        ck.wait_for(canary_up, 400, "the canary", 0.2)
        during_soak()
        out, err = proc.communicate(timeout=400)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


def _trigger(state: Path, change: str) -> Any:
    recs = [e for e in Journal.open(state, change).entries() if e.step == "trigger"]
    return recs[0] if recs else None


def gate_path(lab: Lab, node: str, work: Path, state: Path, ns: str) -> float:
    inv = ck.inventory(lab, [node], [node], work / f"{node}.ini")
    plan = _gate_plan(work / f"{node}.yaml", [node], soak="20s")
    r = _apply_then(lab, plan, inv, state, node, lambda: _deployment(lab, ns, "misfit", node, 6))
    assert r.returncode == 5, r.stderr[-2000:]
    change = json.loads(r.stdout)["change"]
    trig = _trigger(state, change)
    assert trig is not None and trig.data["trigger"] == "gate"
    return _ts(trig) - _first_rejection(lab, ns)


def alert_path(lab: Lab, node: str, work: Path, state: Path, ns: str) -> float:
    inv = ck.inventory(lab, [node], [node], work / f"{node}.ini")
    plan = _gate_plan(work / f"{node}.yaml", [node], soak="8s", probes=True, minAdmissions=2)
    r = _apply_then(lab, plan, inv, state, node, lambda: _deployment(lab, ns, "fit", node, 2))
    assert r.returncode == 0, r.stderr[-2000:]
    change = json.loads(r.stdout)["change"]
    _deployment(lab, ns, "misfit", node, 6)
    ck.wait_for(lambda: _rejected(lab, ns), 45, "the first rejection")
    trig = ck.wait_for(lambda: _trigger(state, change), 180, "the alert's trigger", 0.5)
    assert trig.data["trigger"] == "alert", trig.data
    return _ts(trig) - _first_rejection(lab, ns)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="alert-bench-"))
    state = work / "state"
    lab = Lab(f"ab{int(time.time()) % 100000}", work / "lab")
    lab.start_control_plane()
    rows: list[tuple[int, float, float]] = []
    try:
        lab.start_monitoring(state_dir=state)
        for t in range(1, args.trials + 1):
            g, a = f"{lab.name}-g{t}", f"{lab.name}-a{t}"
            lab.machines.add_nodes([g, a], ["kubeadm"])
            lg = gate_path(lab, g, work, state, _namespace(lab, f"bench-g{t}"))
            la = alert_path(lab, a, work, state, _namespace(lab, f"bench-a{t}"))
            rows.append((t, lg, la))
            print(f"trial {t}: gate path {lg:.2f}s, alert path {la:.2f}s", flush=True)
            lab.machines.remove_nodes([g, a])
    finally:
        lab.down()
    print("\ntrial | gate path (s) | alert path (s)")
    for t, lg, la in rows:
        print(f"{t:5} | {lg:13.2f} | {la:14.2f}")
    mg = statistics.median(r[1] for r in rows)
    ma = statistics.median(r[2] for r in rows)
    print(f"median | {mg:12.2f} | {ma:14.2f}   ratio alert/gate {ma / mg:.1f}x")
    print(
        "alert path bounds: scrape {scrape_interval:g}s + evaluation {evaluation_interval:g}s "
        "+ for: 60s + group_wait {group_wait:g}s".format(**INTERVALS)
    )


if __name__ == "__main__":
    main()
