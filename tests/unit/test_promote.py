"""Promote: a held canary continued in the same change (journal, backups), the gate after each
batch, refusals, and one rollback of the whole change afterwards. Fakes; the lab proves the same
through the CLI (tests/lab/test_promote_lab.py)."""

from __future__ import annotations

from pathlib import Path

from rollout.change.commands.promote_change import last_gate, promote_refusal
from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import continue_change, rollback, run_change
from rollout.change.plan.batches import Batch, make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.strategy import Strategy
from rollout.change.record.entries import ChangeBegin
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.models import NodeState, Phase
from rollout.verdicts import VerdictStatus
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    OLD,
    FakeClock,
    FakeCluster,
    FakeRunner,
    ScriptedGate,
    make_change,
    make_node,
)

NODES = ["n1", "n2", "n3", "n4"]
REST = [Batch(("n3",), False), Batch(("n4",), False)]


def _held(tmp_path: Path, gate: VerdictStatus = VerdictStatus.SUCCESSFUL) -> Context:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    ctx = Context(
        cluster=cluster,
        runner=FakeRunner(cluster),
        clock=FakeClock(),
        journal=Journal.create(tmp_path, "20260101T000000Z-abc"),
        drain=DrainPolicy(timeout_s=5, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
    )
    batches = make_batches(NODES, ["n1", "n2"], Strategy(max_unavailable=2), True)
    changes = {n: make_change(n) for n in NODES}
    run_change(ctx, changes, batches, ScriptedGate(gate), True, info=ChangeBegin(plan="p.yaml"))
    return ctx


def _info(ctx: Context) -> dict[str, object]:
    st = replay(ctx.journal.entries())
    return {
        **st.info.data(),
        "nodes": NODES,
        "promotion": {"by": "me", "batches": [["n3"], ["n4"]]},
    }


def test_promote_applies_the_rest_in_the_same_change_with_the_gate_after_each_batch(
    tmp_path: Path,
) -> None:
    ctx = _held(tmp_path)
    status = replay(ctx.journal.entries())
    assert status.outcome == "held" and promote_refusal(status, last_gate(ctx.journal)) is None
    gate = ScriptedGate(VerdictStatus.SUCCESSFUL)
    changes = {n: make_change(n) for n in NODES}
    final = continue_change(ctx, changes, REST, gate, ChangeBegin.read(_info(ctx)))
    assert final.outcome == "completed"
    assert gate.seen == [["n3"], ["n4"]]  # after each batch, over that batch
    assert {n: s.state for n, s in final.nodes.items()} == dict.fromkeys(NODES, NodeState.APPLIED)
    assert final.to_dict()["promotion"]["by"] == "me"
    assert final.info.plan == "p.yaml"  # the canary's record kept
    # one rollback restores every node of the change, canary and fleet
    done = rollback(ctx)
    assert {s.state for s in done.nodes.values()} == {NodeState.RESTORED}
    cluster = ctx.cluster
    assert all(cluster.nodes[n].files == {CONF: OLD} for n in NODES)  # type: ignore[attr-defined]


def test_a_failed_gate_after_a_promoted_batch_restores_that_batch_and_stops(
    tmp_path: Path,
) -> None:
    ctx = _held(tmp_path)
    changes = {n: make_change(n) for n in NODES}
    ended(
        continue_change(
            ctx, changes, REST, ScriptedGate(VerdictStatus.FAILED), ChangeBegin.read(_info(ctx))
        ),
        5,
        "gate failed batch 1",
    )
    st = replay(ctx.journal.entries())
    assert st.nodes["n3"].state is NodeState.RESTORED
    assert st.nodes["n4"].state is NodeState.PENDING
    assert st.nodes["n1"].state is NodeState.APPLIED  # the canary stays as it was


def test_promote_is_refused_unless_the_canary_is_applied_and_passed(tmp_path: Path) -> None:
    ctx = _held(tmp_path / "a", VerdictStatus.INCONCLUSIVE)
    why = promote_refusal(replay(ctx.journal.entries()), last_gate(ctx.journal))
    assert why is not None and "not Successful (Inconclusive" in why
    ctx = _held(tmp_path / "b")
    rollback(ctx, ["n2"])
    why = promote_refusal(replay(ctx.journal.entries()), last_gate(ctx.journal))
    assert why is not None and "the canary is not applied (n2: restored)" in why
    running = Journal.create(tmp_path / "c", "x")
    data = {"nodes": ["n1"], "batches": [["n1"]]}
    running.append("change", Phase.BEGIN, now=FakeClock().now(), data=data)
    why = promote_refusal(replay(running.entries()), None)
    assert why is not None and "rollout resume" in why


def test_report_shows_the_promotion(tmp_path: Path) -> None:
    from rollout.evidence.report import build_report, render

    ctx = _held(tmp_path)
    changes = {n: make_change(n) for n in NODES}
    info = {**_info(ctx), "promotion": {"by": "me", "at": "t", "batches": [["n3"], ["n4"]]}}
    continue_change(ctx, changes, REST, None, ChangeBegin.read(info))
    report = build_report(ctx.journal.entries(), (), "not collected")
    md = render(report, "markdown")
    assert "| Promotion | by me at t: n3; n4 |\n| Evidence |" in md
    assert report.as_dict()["promotion"]["batches"] == [["n3"], ["n4"]]
    assert "<th>Promotion</th><td>by me at t: n3; n4</td>" in render(report, "html")
