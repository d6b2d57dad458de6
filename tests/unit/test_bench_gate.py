"""The plan's ``gate.bench`` in the engine (``rollout.bench.canary_gate.BenchGate``): once the
soak passes the canary is benched again; a regression restores it as a Failed verdict does, a
bench that cannot decide holds, and the decision is journaled for status, report and stages.
The engine and the journal are real; the node and the bench runs are fakes (the lab test
``tests/lab/test_stages_lab.py`` runs the real bench on real nodes)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from rollout.bench.canary_gate import BenchGate, Results
from rollout.change.engine.orchestrator import run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.gate_section import BenchPolicy
from rollout.change.plan.strategy import Strategy
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.models import NodeState
from rollout.verdicts import VerdictStatus
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    OLD,
    FakeCluster,
    FakeRunner,
    ScriptedGate,
    fake_context,
    make_change,
    make_node,
)
from tests.unit.test_performance import rec

NODES = ["n1", "n2"]
POLICY = BenchPolicy(command="./bench.sh", max_p99_regression=0.2)


class Bench:
    """Canned after-results, as ``CanaryBench.run`` returns them."""

    def __init__(self, after: Results) -> None:
        self.policy, self.after = POLICY, after
        self.req = type("Req", (), {"describe": lambda _self: "./bench.sh"})()
        self.runs: list[tuple[list[str], str]] = []

    def describe(self) -> str:
        return "./bench.sh"

    def run(self, nodes: Sequence[str], label: str, change: str | None = None) -> Results:
        self.runs.append((list(nodes), label))
        got = {n: self.after[n] for n in nodes if n in self.after}
        return {n: r if isinstance(r, str) else {**r, "node": n} for n, r in got.items()}


def _run(tmp_path: Path, after: Results, soak: VerdictStatus = VerdictStatus.SUCCESSFUL) -> Any:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    ctx = fake_context(cluster, FakeRunner(cluster), Journal.create(tmp_path, "c1"))
    bench = Bench(after)
    before: Results = {"n1": rec((10.0, 25.0))}
    gate = BenchGate(ScriptedGate(soak), ctx.journal, bench, before)  # type: ignore[arg-type]
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), True)
    status = run_change(ctx, {n: make_change(n) for n in NODES}, batches, gate, True)
    return ctx, status, cluster, bench


def test_a_p99_regression_fails_the_gate_and_restores_the_canary(tmp_path: Path) -> None:
    ctx, status, cluster, bench = _run(tmp_path, {"n1": rec((13.0, 25.0))})
    text = ended(status, 5)
    assert "bench-regression: n1, NVIDIA-H100: P99 10 -> 13 ms (+30.0%, limit +20%)" in text
    assert status.nodes["n1"].state is NodeState.RESTORED
    assert cluster.nodes["n1"].files == {CONF: OLD}
    assert bench.runs == [(["n1"], "after")]
    entries = ctx.journal.entries()
    (trigger,) = [e for e in entries if e.step == "trigger"]
    assert trigger.data["source"] == "bench" and trigger.data["nodes"] == ["n1"]
    (verdict,) = [e.data for e in entries if e.step == "bench-verdict"]
    assert verdict["regression"]["outcome"] == "Failed"
    benches = [(e.data["node"], e.data.get("label")) for e in entries if e.step == "bench"]
    assert benches == [("n1", "after")]
    assert replay(entries).to_dict()["bench"]["regression"]["outcome"] == "Failed"  # status


def test_a_bench_that_cannot_run_holds_the_canary(tmp_path: Path) -> None:
    ctx, status, _, _ = _run(tmp_path, {"n1": "ssh: connect to host n1: Connection refused"})
    assert status.outcome == "held" and status.nodes["n1"].state is NodeState.APPLIED
    assert "gate Error" in status.message and "Connection refused" in status.message
    assert not [e for e in ctx.journal.entries() if e.step == "trigger"]
    (failed,) = [e for e in ctx.journal.entries() if e.step == "bench"]
    assert failed.phase.value == "failed" and "Connection refused" in failed.data["error"]


def test_no_regression_holds_the_canary_as_a_successful_gate_does(tmp_path: Path) -> None:
    ctx, status, _, _ = _run(tmp_path, {"n1": rec((10.5, 25.0), remote=(20.0, 10.0))})
    assert status.outcome == "held" and "canary applied; holding" in status.message
    s = replay(ctx.journal.entries())
    assert s.bench is not None and s.bench.regression.outcome == "Successful"
    assert s.bench.allows_tightening is True  # aligned 10.5 ms vs mismatched 20 ms


def test_a_soak_that_did_not_pass_runs_no_bench(tmp_path: Path) -> None:
    _, status, _, bench = _run(tmp_path, {"n1": rec((99.0, 1.0))}, VerdictStatus.INCONCLUSIVE)
    assert status.outcome == "held" and bench.runs == []


def test_rollout_serve_exports_each_changes_bench_verdicts(tmp_path: Path) -> None:
    from rollout.gate.owning import export_node_states
    from rollout.gate.serve import GateMetrics

    _run(tmp_path, {"n1": rec((10.0, 25.0))})  # no regression, no aligned advantage
    metrics = GateMetrics()
    export_node_states(tmp_path)(metrics)
    text = metrics.exposition().decode()
    for check, outcome in (("regression", "Successful"), ("aligned-advantage", "Failed")):
        line = f'rollout_bench_verdict{{change="c1",check="{check}",outcome="{outcome}",stage=""}}'
        assert f"{line} 1.0" in text, text


def test_resume_wires_the_bench_gate_with_the_journaled_before_but_not_for_a_promote(
    tmp_path: Path,
) -> None:
    """``rollout resume``'s gate (``resumed_gate``): the apply's canary gate benches against the
    ``before`` benches the apply journaled; a promote's gates never bench; no gate.bench, no
    bench gate. The lab proves it end to end
    (``tests/lab/test_stages_lab.py::test_resume_of_a_canary_cut_at_its_gate_runs_the_bench_gate_and_a_regression_rolls_back``)."""
    from datetime import UTC, datetime

    from rollout.bench.canary_gate import resumed_gate
    from rollout.change.record.journal import CHANGE_STEP, Kind
    from rollout.models import Phase

    now = datetime(2026, 12, 6, 10, tzinfo=UTC)
    j = Journal.create(tmp_path / "a", "c1")
    j.append(CHANGE_STEP, Phase.BEGIN, now=now, data={"nodes": NODES, "canary": ["n1"]})
    j.append(
        Kind.BENCH, Phase.DONE, now=now, data={**rec((10.0, 25.0)), "node": "n1", "label": "before"}
    )
    soak = ScriptedGate(VerdictStatus.SUCCESSFUL)
    got = resumed_gate(soak, POLICY, j, None, None, True, lambda _m: None)  # type: ignore[arg-type]
    assert isinstance(got, BenchGate) and got.gate is soak and got.group
    assert list(got.before) == ["n1"] and got.before["n1"]["label"] == "before"  # type: ignore[index]
    assert resumed_gate(soak, None, j, None, None, True, print) is soak  # type: ignore[arg-type]
    p = Journal.create(tmp_path / "p", "c2")
    p.append(
        CHANGE_STEP, Phase.BEGIN, now=now, data={"nodes": NODES, "promotion": {"batches": [["n2"]]}}
    )
    assert resumed_gate(soak, POLICY, p, None, None, True, print) is soak  # type: ignore[arg-type]
