"""In the lab, through the CLI: a staged plan (``restricted``, then ``single-numa-node``) whose
gate requires the benchmark (``gate.bench``).

The benchmark is a stand-in, ``tests/fixtures/bench/scenario_bench.py``: real timed CPU and memory
work on the node, bound by ``rollout bench``'s machinery to the GPU's NUMA node and to the other
one, whose amount of work per run the test sets in a scenario file: per topology policy (read
from the node's kubelet configuration) and binding. So "no aligned advantage", "an aligned
advantage" and "a regression under single-numa-node" are inputs, and every verdict is still
computed from measured numbers. Its results are marked simulated; the plans accept them
(``acceptSimulated: true``).

The node shape is two NUMA nodes of one CPU each (CPU 0 and CPU 1, which every machine this runs
on has), as in ``test_bench_lab.py``. Each test keeps its change record in its own namespace
(``--lock-namespace``), so the two histories of the same plan do not see each other.
"""

from __future__ import annotations

import json
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.change.record.journal import FAILPOINT_ENV, Journal
from rollout.lab.cluster import Lab
from rollout.lab.hardware import NodeShape
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab

TWO_NUMA_ONE_CPU_EACH = NodeShape(
    sockets=2, cores_per_socket=1, threads_per_core=1, gpus_per_numa=1
)
STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "scenario_bench.py"
NO_ADVANTAGE = {"*": {"local": 1, "remote": 1}}
ADVANTAGE = {"*": {"local": 1, "remote": 4}}


def _plan(path: Path, scenario: Path) -> Path:
    path.write_text(
        f"""\
apiVersion: rollout.dev/v1alpha1
kind: RolloutPlan
metadata:
  name: lab-tighten
kubelet:
  cpuManagerPolicy: static
  reservedSystemCPUs: "0"
  topologyManagerScope: pod
stages:
  - name: restricted
    kubelet:
      topologyManagerPolicy: restricted
  - name: single-numa-node
    kubelet:
      topologyManagerPolicy: single-numa-node
strategy:
  canaryGroup: canary
  maxUnavailable: 1
  drain:
    timeout: 20s
    backoffCap: 1s
gate:
  soak: 3s
  window: 30s
  interval: 1s
  minAdmissions: 1
  baseline: none
  probes: true
  bench:
    command: {sys.executable} {STANDIN}
    env:
      BENCH_SCENARIO: {scenario}
    timeout: 60s
    acceptSimulated: true
    maxP99Regression: 200%
    maxBandwidthRegression: 90%  # copies on a shared 2-core machine vary 3x run to run
    alignedMargin: 30%
"""
    )
    return path


def _setup(
    lab: Lab, lab_nodes: Any, ns: str, tmp_path: Path, scenario: dict[str, Any], count: int = 1
) -> tuple[str, list[str], dict[str, str], Path]:
    """Lab nodes (the first the canary), the scenario file, and the apply command line."""
    names = lab_nodes(count, shape=TWO_NUMA_ONE_CPU_EACH).names
    node = names[0]
    inv = ck.inventory(lab, names, [node], tmp_path / "inv.ini")
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps(scenario))
    plan = _plan(tmp_path / "plan.yaml", sc)
    apply = ["apply", "--plan", str(plan), "-i", str(inv), "--lock-namespace", ns, "--yes"]
    return node, [*apply, "-o", "json"], ck.env(lab, tmp_path / "state"), sc


def _verdict(state: Path, change: str) -> dict[str, Any]:
    (v,) = [e.data for e in Journal.open(state, change).entries() if e.step == "bench-verdict"]
    return v


def _apply(apply: list[str], env: dict[str, str]) -> str:
    """``apply`` without ``--canary``: the canary batch, its soak and bench, then the rest; a
    Successful gate promotes the change itself (``completed``)."""
    r = ck.cli(apply, env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["outcome"] == "completed", out
    return str(out["change"])


@pytest.mark.timeout(300)
def test_restricted_is_promoted_and_single_numa_node_held_without_an_aligned_advantage(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    node, apply, env, _ = _setup(lab, lab_nodes, namespace, tmp_path, NO_ADVANTAGE, count=2)
    state = tmp_path / "state"
    # stage 1: apply --canary (the canary benched before and after the change), then promote
    r = ck.cli([*apply, "--canary"], env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    change = json.loads(r.stdout)["change"]
    assert json.loads(r.stdout)["outcome"] == "held"
    assert "running stage 1/2 (restricted): first stage" in r.stderr
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "restricted"
    r = ck.cli(["promote", "--change", change, "--lock-namespace", namespace, "--yes"], env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    entries = Journal.open(state, change).entries()
    benches = [(e.data.get("label"), e.data["node"]) for e in entries if e.step == "bench"]
    assert benches == [("before", node), ("after", node)]
    v = _verdict(state, change)
    assert v["regression"]["outcome"] == "Successful", v["regression"]["reason"]
    assert v["tightening"]["outcome"] == "Failed" and not v["allowsTightening"]
    assert "no aligned advantage" in v["tightening"]["reason"]

    st = ck.cli(["status", "--change", change, "--lock-namespace", namespace], env)
    assert st.returncode == 0, st.stderr
    assert "stage 1/2 (restricted)" in st.stdout and "aligned advantage: Failed" in st.stdout

    rep = ck.cli(
        ["report", "--change", change, "--lock-namespace", namespace, "-o", "markdown"], env
    )
    assert rep.returncode == 0, rep.stderr
    assert "Stage 1/2 (`restricted`) of plan `lab-tighten`" in rep.stdout
    assert "- aligned advantage: **Failed**: aligned-advantage:" in rep.stdout
    assert f"**{node}** (before the change): pass" in rep.stdout
    assert f"**{node}** (after the change): pass" in rep.stdout

    before = ck.snapshot(lab, node)
    r = ck.cli([*apply, "--canary"], env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])  # refused, nothing changed
    assert (
        "stage 2/2 (single-numa-node) held: stage 1/2 (restricted)'s benchmark does not allow "
        f"tightening (change {change}, aligned advantage Failed)"
    ) in r.stderr
    assert ck.snapshot(lab, node) == before
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "restricted"
    print(f"two stages, held: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(400)
def test_single_numa_node_proceeds_on_an_aligned_advantage_and_a_regression_rolls_it_back(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    node, apply, env, sc = _setup(lab, lab_nodes, namespace, tmp_path, ADVANTAGE)
    state = tmp_path / "state"
    first = _apply(apply, env)
    assert _verdict(state, first)["allowsTightening"] is True
    restricted = ck.snapshot(lab, node)

    # stage 2 starts; under single-numa-node the stand-in does 8x the work: a regression
    sc.write_text(json.dumps({"single-numa-node": {"local": 8, "remote": 8}, **ADVANTAGE}))
    r = ck.cli(apply, env)
    assert r.returncode == 5, (r.returncode, r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["outcome"] == "rolled-back", out
    assert "stage 1/2 (restricted) promoted, tightening allowed" in r.stderr
    v = _verdict(state, out["change"])
    assert v["regression"]["outcome"] == "Failed", v["regression"]
    assert "limit +200%" in v["regression"]["reason"]
    triggers = [e.data for e in Journal.open(state, out["change"]).entries() if e.step == "trigger"]
    assert [t.get("source") for t in triggers] == ["bench"], triggers
    assert ck.snapshot(lab, node) == restricted  # back on stage 1's files, byte for byte
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "restricted"

    # without the regression, the same plan's stage 2 runs and is promoted
    sc.write_text(json.dumps(ADVANTAGE))
    second = _apply(apply, env)
    assert _verdict(state, second)["regression"]["outcome"] == "Successful"
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "single-numa-node"
    r = ck.cli(apply, env)
    assert r.returncode == 3 and "every stage of plan lab-tighten is promoted" in r.stderr
    print(f"two stages, proceeded: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(300)
def test_resume_of_a_canary_cut_at_its_gate_runs_the_bench_gate_and_a_regression_rolls_back(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    """``apply --canary`` killed as its gate begins (``ROLLOUT_FAILPOINT=gate:begin``), after the
    canary was benched before the change and applied: ``resume`` owes that gate and runs it as
    apply wired it, the soak then the benchmark against the journaled ``before`` bench (a plain
    soak would pass). Under ``restricted`` the stand-in does 8x the work: Failed, rolled back."""
    started = time.monotonic()
    node, apply, env, _ = _setup(
        lab, lab_nodes, namespace, tmp_path, {"restricted": {"local": 8, "remote": 8}, "*": {}}
    )
    state = tmp_path / "state"
    before = ck.snapshot(lab, node)
    r = ck.cli([*apply, "--canary"], {**env, FAILPOINT_ENV: "gate:begin"})
    assert r.returncode == -signal.SIGKILL, (r.returncode, r.stderr[-3000:])
    journal = ck.latest_journal(state)
    assert journal is not None
    change = journal.change_id
    steps = [(e.step, e.data.get("label")) for e in journal.entries() if e.step == "bench"]
    assert steps == [("bench", "before")], steps  # the after bench is the gate's, not run yet
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "restricted"

    r = ck.cli(["resume", "--change", change, "--lock-namespace", namespace, "--yes"], env)
    assert r.returncode == 5, (r.returncode, r.stderr[-3000:])
    entries = Journal.open(state, change).entries()
    labels = [e.data.get("label") for e in entries if e.step == "bench"]
    assert labels == ["before", "after"], labels
    v = _verdict(state, change)
    assert v["regression"]["outcome"] == "Failed", v["regression"]
    triggers = [e.data for e in entries if e.step == "trigger"]
    assert [t.get("source") for t in triggers] == ["bench"], triggers
    assert ck.snapshot(lab, node) == before  # restored byte for byte
    assert ck.configz(lab, node).get("topologyManagerPolicy") != "restricted"
    print(f"resume with the bench gate: {time.monotonic() - started:.1f}s")
