"""A crash during the gate's soak: ``resume`` soaks again before anything else goes on (or holds,
or acts on a verdict the dead process journaled but never acted on). Fakes; the lab proves the
same through the CLI (tests/lab/test_crash_lab.py, the ``gate:begin`` case)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import UnfinishedGate, continue_change, run_change
from rollout.change.engine.resumption import resume, unfinished_gate
from rollout.change.plan.batches import Batch, make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.strategy import Strategy
from rollout.change.record.entries import ChangeBegin
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.models import NodeState, Phase
from rollout.protocols import OneSoak
from rollout.verdicts import Verdict, VerdictStatus
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    OLD,
    FakeClock,
    FakeCluster,
    FakeRunner,
    Killed,
    ScriptedGate,
    make_change,
    make_node,
)

NODES = ["n1", "n2", "n3", "n4"]
REST = [Batch(("n3",), False), Batch(("n4",), False)]


class DyingGate(OneSoak):
    """Dies in the middle of its soak."""

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        raise Killed


def _crashed_in_soak(tmp_path: Path, canary_only: bool) -> Context:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    ctx = Context(
        cluster=cluster,
        runner=FakeRunner(cluster),
        clock=FakeClock(),
        journal=Journal.create(tmp_path, "20260101T000000Z-abc"),
        drain=DrainPolicy(timeout_s=5, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
    )
    batches = make_batches(NODES, ["n1", "n2"], Strategy(max_unavailable=1), canary_only)
    changes = {n: make_change(n) for n in NODES}
    with pytest.raises(Killed):
        run_change(ctx, changes, batches, DyingGate(), canary_only)  # type: ignore[arg-type]
    return ctx


@pytest.mark.parametrize("canary_only", [True, False])
def test_a_soak_cut_by_a_crash_is_owed_and_soaked_again_before_later_batches(
    tmp_path: Path, canary_only: bool
) -> None:
    ctx = _crashed_in_soak(tmp_path, canary_only)
    entries = ctx.journal.entries()
    assert [e.phase for e in entries if e.step == "gate"] == [Phase.BEGIN]  # soak began, no verdict
    owed = unfinished_gate(entries, has_gate=True)
    assert owed == UnfinishedGate(("n1", "n2"), canary=True)
    resume(ctx)  # nothing in flight: the canary is applied
    gate = ScriptedGate(VerdictStatus.SUCCESSFUL)
    info = ChangeBegin.read({**replay(ctx.journal.entries()).info.data(), "resumed": True})
    rest = [] if canary_only else REST
    final = continue_change(
        ctx,
        {n: make_change(n) for n in NODES},
        rest,
        gate,
        info,
        gate_at={},
        canary_only=canary_only,
        regate=owed,
    )
    assert gate.seen == [["n1", "n2"]]  # soaked again over the canary, before anything else
    if canary_only:
        assert final.outcome == "held" and "canary applied; holding" in final.message
    else:
        assert final.outcome == "completed"
        assert final.nodes["n4"].state is NodeState.APPLIED
    assert unfinished_gate(ctx.journal.entries(), has_gate=True) is None  # settled


def test_a_regate_that_does_not_pass_holds_and_starts_nothing(tmp_path: Path) -> None:
    ctx = _crashed_in_soak(tmp_path, canary_only=False)
    owed = unfinished_gate(ctx.journal.entries(), has_gate=True)
    info = ChangeBegin.read({**replay(ctx.journal.entries()).info.data(), "resumed": True})
    gate = ScriptedGate(VerdictStatus.INCONCLUSIVE)
    changes = {n: make_change(n) for n in NODES}
    final = continue_change(ctx, changes, REST, gate, info, gate_at={}, regate=owed)
    assert final.outcome == "held"
    assert final.nodes["n3"].state is NodeState.PENDING  # no later batch started


def test_a_failed_verdict_the_dead_process_never_acted_on_restores_the_canary(
    tmp_path: Path,
) -> None:
    ctx = _crashed_in_soak(tmp_path, canary_only=False)
    data = {"status": "Failed", "reason": "rejections", "nodes": ["n1", "n2"]}
    ctx.journal.append("gate", Phase.DONE, now=FakeClock().now(), data=data)  # then it died
    owed = unfinished_gate(ctx.journal.entries(), has_gate=True)
    assert owed is not None and owed.verdict is not None
    assert owed.verdict.status is VerdictStatus.FAILED
    info = ChangeBegin.read({**replay(ctx.journal.entries()).info.data(), "resumed": True})
    gate = ScriptedGate(VerdictStatus.SUCCESSFUL)
    changes = {n: make_change(n) for n in NODES}
    ended(
        continue_change(ctx, changes, REST, gate, info, gate_at={}, regate=owed),
        5,
        "gate failed the canary: rejections",
    )
    assert gate.seen == []  # acted on the recorded verdict: no new soak
    st = replay(ctx.journal.entries())
    assert st.outcome == "rolled-back"
    assert {n: s.state for n, s in st.nodes.items()} == {
        "n1": NodeState.RESTORED,
        "n2": NodeState.RESTORED,
        "n3": NodeState.PENDING,
        "n4": NodeState.PENDING,
    }
    cluster = ctx.cluster
    assert cluster.nodes["n1"].files == {CONF: OLD}  # type: ignore[attr-defined]


def test_nothing_is_owed_once_the_change_ended_or_the_gate_passed(tmp_path: Path) -> None:
    ctx = _crashed_in_soak(tmp_path, canary_only=True)
    j = ctx.journal
    ok = {"status": "Successful", "reason": "ok", "nodes": ["n1", "n2"]}
    j.append("gate", Phase.DONE, now=FakeClock().now(), data=ok)
    assert unfinished_gate(j.entries(), has_gate=True) is None  # passed; only the end was lost
    j.append("change", Phase.DONE, now=FakeClock().now(), data={"outcome": "held"})
    assert unfinished_gate(j.entries(), has_gate=True) is None


def test_a_promotion_owes_the_gate_of_its_last_applied_batch_only_with_a_plan_gate(
    tmp_path: Path,
) -> None:
    ctx = _crashed_in_soak(tmp_path, canary_only=True)
    j = ctx.journal
    now = FakeClock().now()
    ok = {"status": "Successful", "reason": "ok", "nodes": ["n1", "n2"]}
    j.append("gate", Phase.DONE, now=now, data=ok)
    j.append("change", Phase.DONE, now=now, data={"outcome": "held"})
    info = ChangeBegin.read(
        {
            **replay(j.entries()).info.data(),
            "promotion": {"by": "me", "batches": [["n3"], ["n4"]]},
        }
    )
    with pytest.raises(Killed):
        continue_change(ctx, {n: make_change(n) for n in NODES}, REST, DyingGate(), info)  # type: ignore[arg-type]
    assert unfinished_gate(j.entries(), has_gate=True) == UnfinishedGate(("n3",), canary=False)
    assert unfinished_gate(j.entries(), has_gate=False) is None  # promote gates only with one
