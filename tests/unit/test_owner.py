"""One owner per change, in the orchestrator: a rollback handed to the owner, or a lost Lease, stops
forward work at once; the owner restores what is in flight and rolls back what was asked, each node
once. (The hand-over through a real Lease is proven by tests/lab/test_owner_lab.py.)"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.strategy import Strategy
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.interrupt import Interrupt, StopReason, StopRequested
from rollout.models import NodeState
from rollout.protocols import OneSoak
from rollout.verdicts import Verdict, VerdictStatus
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    OLD,
    FakeClock,
    FakeCluster,
    FakeRunner,
    make_change,
    make_node,
)

NODES = ["n1", "n2", "n3", "n4"]
ALICE = StopReason(by="alice@laptop pid 42", request_id="r1")


def _setup(tmp_path: Path, blocked: Sequence[str] = ()) -> tuple[Context, FakeCluster, FakeRunner]:
    cluster = FakeCluster({n: make_node(n) for n in NODES}, blocked=blocked)
    runner = FakeRunner(cluster)
    ctx = Context(
        cluster=cluster,
        runner=runner,
        clock=FakeClock(),
        journal=Journal.create(tmp_path, "20260101T000000Z-abc"),
        drain=DrainPolicy(timeout_s=600, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
    )
    return ctx, cluster, runner


def _run(
    ctx: Context, gate: object = None, canary_only: bool = False, unavailable: int = 1
) -> object:
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=unavailable), canary_only)
    changes = {n: make_change(n) for n in NODES}
    return run_change(ctx, changes, batches, gate or NoGate(), canary_only)  # type: ignore[arg-type]


class SoakThenRequest(OneSoak):
    """A gate whose soak is interrupted by a request arriving after ``after`` seconds."""

    def __init__(self, interrupt: Interrupt, reason: StopReason, after: int = 3) -> None:
        self.interrupt, self.reason, self.after = interrupt, reason, after
        self.slept = 0

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        while True:  # a 10-minute soak: only the interrupt ends it early
            if self.slept == self.after:
                self.interrupt.request(self.reason)
            self.interrupt.sleep(0)
            self.slept += 1
            if self.slept > 600:
                return Verdict(VerdictStatus.SUCCESSFUL, "soaked")


def test_request_during_soak_stops_the_change_and_rolls_back_the_canary(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path)
    gate = SoakThenRequest(ctx.interrupt, ALICE)
    ended(_run(ctx, gate), 5, "rolled back on request of alice@laptop pid 42")
    assert gate.slept == 3  # the soak ended at the request, not at its end
    status = replay(ctx.journal.entries())
    assert status.outcome == "rolled-back"
    assert status.nodes["n1"].state is NodeState.RESTORED
    assert cluster.nodes["n1"].files == {CONF: OLD}
    for n in ("n2", "n3", "n4"):  # no new batch after the request
        assert status.nodes[n].state is NodeState.PENDING
        assert ("cordon", n) not in cluster.calls
    assert runner.restored == ["n1"]


class RequestWhileDraining(FakeClock):
    """A drain that never ends (a PDB): the request arrives after ``after`` seconds of it."""

    def __init__(self, ctx_interrupt: Interrupt, reason: StopReason, after: float) -> None:
        super().__init__()
        self.interrupt, self.reason, self.after = ctx_interrupt, reason, after

    def sleep(self, seconds: float) -> None:
        super().sleep(seconds)
        if self.t >= self.after and self.interrupt.reason() is None:
            self.interrupt.request(self.reason)


def test_request_during_a_drain_interrupts_it_and_restores_the_node(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path, blocked=["default/n1-p0"])
    ctx.clock = RequestWhileDraining(ctx.interrupt, ALICE, after=5)
    ended(_run(ctx), 5, "rolled back on request of alice")
    assert ctx.clock.t < 10  # type: ignore[attr-defined]  # not the drain's 600 s timeout
    status = replay(ctx.journal.entries())
    assert status.nodes["n1"].state is NodeState.RESTORED
    assert not cluster.nodes["n1"].info.unschedulable  # our cordon undone
    assert runner.applied == []  # no file was written anywhere
    assert all(status.nodes[n].state is NodeState.PENDING for n in ("n2", "n3", "n4"))


def test_request_naming_nodes_restores_only_those_and_starts_nothing_new(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path)
    # batches of one: n1 (canary), n2, n3, n4; the request arrives once n2 is applied
    original = runner.apply

    def apply(change, change_id, backup_dir):  # type: ignore[no-untyped-def]
        result = original(change, change_id, backup_dir)
        if change.node == "n2":
            ctx.interrupt.request(StopReason(by="bob@h pid 7", nodes=("n1",), request_id="r2"))
        return result

    runner.apply = apply  # type: ignore[method-assign]
    ended(_run(ctx), 5, "rolled back on request of bob@h pid 7")
    status = replay(ctx.journal.entries())
    assert status.nodes["n1"].state is NodeState.RESTORED
    # n2 was in flight and its verify passed at once: finished, and not named, so left applied;
    # n3 and n4 never started
    assert status.nodes["n2"].state is NodeState.APPLIED
    assert status.nodes["n3"].state is NodeState.PENDING
    assert status.nodes["n4"].state is NodeState.PENDING
    assert ("cordon", "n3") not in cluster.calls
    assert runner.restored == ["n1"]


def test_requests_joining_while_the_rollback_runs_restore_each_node_once(tmp_path: Path) -> None:
    ctx, _, runner = _setup(tmp_path)
    gate = SoakThenRequest(ctx.interrupt, StopReason(by="a", nodes=("n1",), request_id="r"), 1)
    original = runner.restore

    def restore(change, change_id, files):  # type: ignore[no-untyped-def]
        # a second requester joins (every node) while the first node is being restored
        ctx.interrupt.request(StopReason(by="b", nodes=None, request_id="r"))
        ctx.interrupt.request(StopReason(by="c", nodes=("n1",), request_id="r"))
        return original(change, change_id, files)

    runner.restore = restore  # type: ignore[method-assign]
    ended(_run(ctx, gate, unavailable=2), 5, "rolled back on request of a")
    assert runner.restored == ["n1"]  # the only node ever changed, restored once
    assert replay(ctx.journal.entries()).outcome == "rolled-back"


def test_lost_lease_stops_forward_work_restores_in_flight_and_keeps_applied(
    tmp_path: Path,
) -> None:
    ctx, cluster, runner = _setup(tmp_path, blocked=["default/n2-p0"])
    ctx.clock = RequestWhileDraining(
        ctx.interrupt, StopReason(by="could not renew the Lease for 30s", lost=True), after=5
    )
    ended(_run(ctx), 4, "lost the cluster lock")
    status = replay(ctx.journal.entries())
    assert status.outcome == "stopped"
    assert status.nodes["n1"].state is NodeState.APPLIED  # finished before: left as it is
    assert status.nodes["n2"].state is NodeState.RESTORED  # in flight: restored
    assert not cluster.nodes["n2"].info.unschedulable
    assert status.nodes["n3"].state is NodeState.PENDING
    assert runner.restored == []  # its files were never written: only our cordon undone


def test_interrupt_wakes_a_sleeper_and_keeps_lost_over_a_request() -> None:
    it = Interrupt()
    woken: list[bool] = []
    it.add_waker(lambda: woken.append(True))
    it.request(StopReason(by="x", nodes=("a",), request_id="1"))
    it.request(StopReason(by="y", nodes=("b",), request_id="2"))
    it.request(StopReason(by="lease", lost=True))
    r = it.reason()
    assert r is not None and r.lost and r.by == "x" and r.nodes is None and r.request_id == "1"
    assert woken == [True, True, True]
    with pytest.raises(StopRequested):
        it.sleep(3600)  # returns at once: the flag is set


@pytest.mark.parametrize("force", [True, False])
def test_a_handed_over_rollback_keeps_the_requesters_force(tmp_path: Path, force: bool) -> None:
    """``rollout rollback --force`` handed to the owner restores with force, as the command
    itself would have; without it, the owner's restore is not forced either (the webhook's)."""
    ctx, cluster, _ = _setup(tmp_path)
    runner = FakeRunner(cluster)
    ctx.runner = runner
    gate = SoakThenRequest(ctx.interrupt, StopReason(by="ops", request_id="r9", force=force))
    ended(_run(ctx, gate), 5, "rolled back on request of ops")
    assert runner.forced == [("n1", force)]
    (request,) = [e for e in ctx.journal.entries() if e.step == "request"]
    assert request.data.get("force", False) is force


def test_a_joining_request_does_not_change_the_first_requests_force() -> None:
    it = Interrupt()
    it.request(StopReason(by="a", nodes=("n1",), request_id="r", force=False))
    it.request(StopReason(by="b", nodes=("n2",), request_id="r", force=True))
    reason = it.reason()
    assert reason is not None and reason.force is False and reason.nodes == ("n1", "n2")
