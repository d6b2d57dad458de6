"""A rollback journals its start, so a rollback killed part way is an unfinished change that
``resume`` finishes (every node it names restored); and a node cut before any file was written
is run again by a resume even when an earlier resume undid its cordon and was killed. Fakes; the
lab proves both through the CLI (tests/lab/test_crash_lab.py, the ``rollback@*`` and
``resume-cut@uncordon:*`` cases)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, continue_change, rollback, run_change
from rollout.change.engine.resumption import (
    PendingRollback,
    rerun_nodes,
    resume,
    resume_rollback,
    unfinished_rollback,
)
from rollout.change.plan.batches import Batch, make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.strategy import Strategy
from rollout.change.record.journal import CHANGE_STEP, Journal
from rollout.change.record.replay import replay
from rollout.interrupt import StopReason
from rollout.models import NodeState, Phase
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    OLD,
    FakeClock,
    FakeCluster,
    FakeRunner,
    Killed,
    make_change,
    make_node,
)
from tests.unit.test_owner import SoakThenRequest

NODES = ["n1", "n2", "n3", "n4"]
ALICE = StopReason(by="alice@laptop pid 42", request_id="r1")


def _ctx(journal: Journal, cluster: FakeCluster) -> Context:
    return Context(
        cluster=cluster,
        runner=FakeRunner(cluster),
        clock=FakeClock(),
        journal=journal,
        drain=DrainPolicy(timeout_s=600, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
    )


def _setup(tmp_path: Path) -> tuple[Context, FakeCluster]:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    return _ctx(Journal.create(tmp_path, "20260101T000000Z-abc"), cluster), cluster


def _run(ctx: Context, gate: object = None, canary_only: bool = False) -> Any:
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), canary_only)
    changes = {n: make_change(n) for n in NODES}
    return run_change(ctx, changes, batches, gate or NoGate(), canary_only)  # type: ignore[arg-type]


def _die(*_args: Any, **_kw: Any) -> Any:
    raise Killed


def _states(ctx: Context) -> dict[str, NodeState]:
    return {n: s.state for n, s in replay(ctx.journal.entries()).nodes.items()}


def test_rollback_journals_its_start_with_the_change_info_and_what_it_restores(
    tmp_path: Path,
) -> None:
    ctx, _ = _setup(tmp_path)
    _run(ctx)
    batches = [list(b) for b in replay(ctx.journal.entries()).info.batches]
    rollback(ctx, ["n2", "n3"], force=True)
    begins = [e for e in ctx.journal.entries() if e.step == CHANGE_STEP and e.phase is Phase.BEGIN]
    assert begins[-1].data["rollback"] == {"nodes": ["n2", "n3"], "force": True}
    assert begins[-1].data["batches"] == batches  # status, report and resume keep the change
    status = replay(ctx.journal.entries())
    assert status.outcome == "rolled-back"
    assert unfinished_rollback(ctx.journal.entries()) is None  # it ended: nothing owed


@pytest.mark.parametrize("where", ["cordon", "restore"])
def test_a_rollback_killed_part_way_is_finished_by_resume(tmp_path: Path, where: str) -> None:
    ctx, cluster = _setup(tmp_path)
    _run(ctx)
    if where == "cordon":  # before any node's files went back
        cluster.cordon = _die  # type: ignore[method-assign]
    else:  # in the shared restore run
        ctx.runner.restore_many = _die  # type: ignore[attr-defined]
    with pytest.raises(Killed):
        rollback(ctx)
    pending = unfinished_rollback(ctx.journal.entries())
    assert pending == PendingRollback(None, False)
    assert rerun_nodes(ctx.journal.entries()) == set()  # a rollback never goes forward

    cluster = FakeCluster(cluster.nodes)  # a new process: working cluster and runner
    again = _ctx(ctx.journal, cluster)
    status = resume_rollback(again, pending)
    assert status.outcome == "rolled-back"
    assert "finished by resume" in status.message
    assert set(_states(again).values()) == {NodeState.RESTORED}
    for n in NODES:
        assert cluster.nodes[n].files == {CONF: OLD}, n
        assert not cluster.nodes[n].info.unschedulable, n


def test_a_handed_over_rollback_the_owner_died_in_is_finished_by_resume(tmp_path: Path) -> None:
    ctx, cluster = _setup(tmp_path)
    ctx.runner.restore_many = _die  # type: ignore[attr-defined]
    with pytest.raises(Killed):
        _run(ctx, SoakThenRequest(ctx.interrupt, ALICE))
    pending = unfinished_rollback(ctx.journal.entries())
    assert pending == PendingRollback(None, False, "alice@laptop pid 42")

    again = _ctx(ctx.journal, FakeCluster(cluster.nodes))
    status = resume_rollback(again, pending)
    assert status.outcome == "rolled-back"
    assert "on request of alice@laptop pid 42" in status.message
    assert _states(again) == {
        "n1": NodeState.RESTORED,
        "n2": NodeState.PENDING,
        "n3": NodeState.PENDING,
        "n4": NodeState.PENDING,
    }


def test_a_failed_restore_in_a_resumed_rollback_ends_it_rollback_failed(tmp_path: Path) -> None:
    ctx, cluster = _setup(tmp_path)
    _run(ctx)
    ctx.runner.restore_many = _die  # type: ignore[attr-defined]
    with pytest.raises(Killed):
        rollback(ctx, ["n1", "n2"])
    pending = unfinished_rollback(ctx.journal.entries())
    assert pending == PendingRollback(("n1", "n2"), False)
    again = _ctx(ctx.journal, cluster)
    again.runner = FakeRunner(cluster, fail_restore=["n2"])
    ended(resume_rollback(again, pending), 5, "restore of node n2 failed")
    status = replay(ctx.journal.entries())
    assert status.outcome == "rollback-failed"
    assert status.nodes["n1"].state is NodeState.RESTORED
    assert status.nodes["n3"].state is NodeState.APPLIED  # not named: left as it was


class _DrainDies(FakeCluster):
    """Dies at the first eviction: the node is cordoned and draining, its files untouched."""

    def evict(self, pod: Any, grace_period_s: int | None) -> Any:
        raise Killed


def test_a_node_cut_before_its_files_is_run_again_even_after_a_resume_undid_its_cordon(
    tmp_path: Path,
) -> None:
    cluster = _DrainDies({n: make_node(n) for n in NODES})
    ctx = _ctx(Journal.create(tmp_path, "20260101T000000Z-abc"), cluster)
    with pytest.raises(Killed):
        _run(ctx)
    assert rerun_nodes(ctx.journal.entries()) == {"n1"}
    # the first resume undoes the cordon (and would be killed before running n1 again)
    resume(_ctx(ctx.journal, FakeCluster(cluster.nodes)), end=False)
    assert _states(ctx)["n1"] is NodeState.RESTORED
    assert rerun_nodes(ctx.journal.entries()) == {"n1"}  # the next resume still runs it again


class _VerifyDies(FakeCluster):
    """Dies in verify (the second read of /configz, after preflight's): files written."""

    reads = 0

    def configz(self, node: str) -> Any:
        self.reads += 1
        if self.reads > 1:
            raise Killed
        return super().configz(node)


def test_no_node_is_run_again_after_a_failure_or_a_write(tmp_path: Path) -> None:
    ctx, cluster = _setup(tmp_path)
    ctx.runner = FakeRunner(cluster, refuse=["n1"])  # n1's apply fails: the change stops
    ended(_run(ctx), 5)
    assert rerun_nodes(ctx.journal.entries()) == set()  # it ended, and n1 failed

    cluster = _VerifyDies({n: make_node(n) for n in NODES})
    ctx = _ctx(Journal.create(tmp_path / "written", "20260101T000000Z-abc"), cluster)
    with pytest.raises(Killed):
        _run(ctx)
    assert replay(ctx.journal.entries()).nodes["n1"].files_touched
    assert rerun_nodes(ctx.journal.entries()) == set()  # its files were written: resume finishes


class _ApplyDies(FakeRunner):
    """Dies in the apply run (its files may be written)."""

    def apply_many(self, changes: Any, change_id: str) -> Any:
        raise Killed


def test_a_cut_node_killed_again_while_it_runs_again_is_finished_by_the_next_resume(
    tmp_path: Path,
) -> None:
    """The first resume undid the cut node's cordon and ran it again; killed in that run's
    apply, the node is applying again (not restored), so the next resume finishes it."""
    cluster = _DrainDies({n: make_node(n) for n in NODES})
    ctx = _ctx(Journal.create(tmp_path, "20260101T000000Z-abc"), cluster)
    with pytest.raises(Killed):
        _run(ctx)
    plain = FakeCluster(cluster.nodes)
    first = _ctx(ctx.journal, plain)
    resume(first, end=False)  # the cordon undone: restored
    first.runner = _ApplyDies(plain)
    with pytest.raises(Killed):  # ... then run again, and killed at its write
        _run_again(first, ["n1"])
    n1 = replay(ctx.journal.entries()).nodes["n1"]
    assert (n1.state, n1.files_touched) == (NodeState.APPLYING, True)
    assert rerun_nodes(ctx.journal.entries()) == set()  # resume finishes it, no third run
    resume(_ctx(ctx.journal, plain), end=False)
    assert _states(ctx)["n1"] is NodeState.APPLIED
    assert not plain.nodes["n1"].info.unschedulable


def _run_again(ctx: Context, nodes: list[str]) -> Any:
    info = replay(ctx.journal.entries()).info
    batches = [Batch(tuple(nodes), True)]
    changes = {n: make_change(n) for n in nodes}
    return continue_change(ctx, changes, batches, None, replace(info, resumed=True))
