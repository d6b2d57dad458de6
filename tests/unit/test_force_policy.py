"""The restore's force policy is decided once, from the journal: a restore overwrites a node file
edited after this change wrote it only while the change is in a rollback whose journaled ask says
``--force`` (``rollout.change.record.replay.owed_rollback``, read by ``Context.force_restore`` as
each restore write starts; no code sets it). Pinned here with the fakes: a ``--force`` handed over
mid-run forces the restores after its ``request`` entry and not the node in flight before it; a
forced rollback killed part way is resumed forced; an unforced rollback leaves a drifted file
alone and fails, and a later ``rollback --force`` puts it back. The lab proves the same through
the CLI (tests/lab/test_node_cas.py, tests/lab/test_owner_lab.py). Runtime: about 1 s.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, rollback, run_change
from rollout.change.engine.resumption import resume_rollback, unfinished_rollback
from rollout.change.plan.batches import make_batches
from rollout.change.plan.strategy import Strategy
from rollout.change.record.journal import Journal
from rollout.change.record.replay import OwedRollback, owed_rollback, replay
from rollout.interrupt import Interrupt, StopReason
from rollout.models import NodeChange, NodeState
from rollout.protocols import RestoreFile, RunResult
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    NEW,
    OLD,
    FakeCluster,
    FakeRunner,
    Killed,
    fake_context,
    make_change,
    make_node,
)
from tests.unit.test_owner import SoakThenRequest

NODES = ["n1", "n2", "n3"]
OPS = StopReason(by="ops@laptop pid 7", request_id="r1", force=True)


class CasRunner(FakeRunner):
    """The node step's compare-and-swap on restore: a node whose file is not what the change
    wrote (edited since) is refused, nothing written, unless the restore is forced. Each call's
    force is recorded (``forced``) as the engine decided it."""

    def restore_many(
        self,
        items: Sequence[tuple[NodeChange, Sequence[RestoreFile]]],
        change_id: str,
        force: bool = False,
    ) -> dict[str, RunResult]:
        self.forced.extend((c.node, force) for c, _ in items)
        out: dict[str, RunResult] = {}
        for c, files in items:
            if not force and self.cluster.nodes[c.node].files.get(CONF) != NEW:
                msg = f"node {c.node}: file(s) changed on the node since our write: {CONF}"
                out[c.node] = RunResult(False, msg, refused=True)
            else:
                out[c.node] = self.restore(c, change_id, files)
        return out


class RequestAfterWrite(CasRunner):
    """A request (``--force`` handed over) arrives while ``node``'s new files are on it and its
    kubelet is not yet healthy: the node is in flight (written, verify waiting) when forward
    work stops."""

    def __init__(self, cluster: FakeCluster, interrupt: Interrupt, node: str) -> None:
        super().__init__(cluster)
        self.interrupt, self.node = interrupt, node

    def apply(self, change: NodeChange, change_id: str, backup_dir: str) -> RunResult:
        result = super().apply(change, change_id, backup_dir)
        if change.node == self.node:
            self.cluster.nodes[change.node].healthy = False  # verify waits: the stop cuts it
            self.interrupt.request(OPS)
        return result


def _setup(tmp_path: Path, runner: type[CasRunner] = CasRunner) -> tuple[Context, FakeCluster]:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    journal = Journal.create(tmp_path, "20260101T000000Z-abc")
    ctx: Context = fake_context(cluster, runner(cluster), journal)
    return ctx, cluster


def _run(ctx: Context, gate: object = None) -> Any:
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), False)
    changes = {n: make_change(n) for n in NODES}
    return run_change(ctx, changes, batches, gate or NoGate(), False)  # type: ignore[arg-type]


def _runner(ctx: Context) -> CasRunner:
    assert isinstance(ctx.runner, CasRunner)
    return ctx.runner


def _die(*_args: Any, **_kw: Any) -> Any:
    raise Killed


def test_no_code_sets_the_force_policy_the_journal_decides_it(tmp_path: Path) -> None:
    ctx, _ = _setup(tmp_path)
    with pytest.raises(AttributeError):
        ctx.force_restore = True  # type: ignore[misc]
    assert ctx.force_restore is False  # a change with no rollback asked
    _run(ctx)
    assert ctx.force_restore is False  # completed: no rollback, the compare-and-swap holds


def test_a_forced_request_mid_run_forces_the_restores_after_its_entry_only(
    tmp_path: Path,
) -> None:
    """The node in flight is restored as forward work stops, before the owner journals the
    request: not forced (as before the rule). The nodes the request rolls back: forced."""
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    journal = Journal.create(tmp_path, "20260101T000000Z-abc")
    ctx: Context = fake_context(cluster, FakeRunner(cluster), journal)
    runner = RequestAfterWrite(cluster, ctx.interrupt, "n2")
    ctx.runner = runner
    ended(_run(ctx), 5, "rolled back on request of ops@laptop pid 7")
    assert runner.forced == [("n2", False), ("n1", True)]
    entries = ctx.journal.entries()
    (request,) = [i for i, e in enumerate(entries) if e.step == "request"]
    assert owed_rollback(entries[:request]) is None  # before the entry: nothing forced
    assert owed_rollback(entries[: request + 1]) == OwedRollback(None, True, OPS.by)
    status = replay(entries)
    assert {n: s.state for n, s in status.nodes.items()} == {
        "n1": NodeState.RESTORED,
        "n2": NodeState.RESTORED,
        "n3": NodeState.PENDING,
    }
    assert ctx.force_restore is False  # the change ended: no later restore is forced


def test_a_forced_rollback_killed_part_way_is_resumed_forced(tmp_path: Path) -> None:
    ctx, cluster = _setup(tmp_path)
    _run(ctx)
    cluster.nodes["n2"].files[CONF] = b"edited by hand\n"  # drifted after our write
    ctx.runner.restore_many = _die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        rollback(ctx, force=True)
    pending = unfinished_rollback(ctx.journal.entries())
    assert pending is not None and pending.force

    again = fake_context(FakeCluster(cluster.nodes), None, ctx.journal)
    again.runner = CasRunner(again.cluster)
    assert again.force_restore is True  # a new process: the journal says forced
    ended(resume_rollback(again, pending), 0, "finished by resume")
    assert _runner(again).forced == [(n, True) for n in NODES]
    assert cluster.nodes["n2"].files[CONF] == OLD  # the edit overwritten, as asked


def test_a_handed_over_forced_request_the_owner_died_in_is_resumed_forced(
    tmp_path: Path,
) -> None:
    ctx, cluster = _setup(tmp_path)
    ctx.runner.restore_many = _die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        _run(ctx, SoakThenRequest(ctx.interrupt, OPS))
    pending = unfinished_rollback(ctx.journal.entries())
    assert pending is not None and pending.force and pending.by == OPS.by

    cluster.nodes["n1"].files[CONF] = b"edited by hand\n"
    again = fake_context(FakeCluster(cluster.nodes), None, ctx.journal)
    again.runner = CasRunner(again.cluster)
    ended(resume_rollback(again, pending), 0, f"on request of {OPS.by}")
    assert _runner(again).forced == [("n1", True)]
    assert cluster.nodes["n1"].files[CONF] == OLD


def test_an_unforced_rollback_refuses_a_drifted_file_and_a_forced_one_restores_it(
    tmp_path: Path,
) -> None:
    ctx, cluster = _setup(tmp_path)
    _run(ctx)
    edited = b"edited by hand\n"
    cluster.nodes["n2"].files[CONF] = edited
    ended(rollback(ctx), 5, "since our write")
    assert _runner(ctx).forced == [(n, False) for n in NODES]
    assert cluster.nodes["n2"].files[CONF] == edited  # refused: nothing written
    status = replay(ctx.journal.entries())
    assert status.outcome == "rollback-failed"
    assert status.nodes["n1"].state is NodeState.RESTORED
    assert status.nodes["n2"].state is NodeState.FAILED

    _runner(ctx).forced.clear()
    ended(rollback(ctx, ["n2"], force=True), 0)
    assert _runner(ctx).forced == [("n2", True)]
    assert cluster.nodes["n2"].files[CONF] == OLD
    assert ctx.force_restore is False  # that rollback ended: the next restore is not forced


# --- the node step gets the decided force on both paths; an inventory's value decides nothing ---

PLAIN = {"ansible_python_interpreter": "/usr/bin/python3", "ansible_host": "10.0.0.1"}


def _restore_items() -> list[tuple[NodeChange, list[RestoreFile]]]:
    return [(make_change("n1"), [RestoreFile(CONF, OLD, "0644", "root", "root")])]


@pytest.mark.parametrize("force", [False, True])
def test_the_restore_playbook_gets_the_decided_force_as_an_extra_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, force: bool
) -> None:
    """Extra variables beat the inventory's in Ansible: ``rollout_kubelet_force`` is passed on
    every restore run, false too, so an inventory that sets it true forces nothing (the lab
    runs the real playbook: tests/lab/test_node_cas.py)."""
    from rollout.ansible.outcomes import HostResult, PlaybookResult
    from rollout.change.engine.node_runner import FORCE_VAR, PlaybookNodeRunner

    seen: list[Any] = []

    def restore(inventory: Path, change_id: str, payloads: Any, on_event: Any, extra: Any) -> Any:
        seen.append(extra)
        return PlaybookResult("restore.yml", "successful", 0, {"n1": HostResult("n1", "ok")}, 0)

    runner = PlaybookNodeRunner(tmp_path, tmp_path / "inv.ini", direct_restore=False)
    monkeypatch.setattr(runner.ansible, "restore", restore)
    assert runner.restore_many(_restore_items(), "c1", force=force)["n1"].ok
    assert seen == [{FORCE_VAR: force}]


@pytest.mark.parametrize("force", [False, True])
def test_a_restore_over_plain_ssh_gets_the_decided_force_not_the_inventorys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, force: bool
) -> None:
    from rollout.ansible import direct
    from rollout.change.engine.node_runner import FORCE_VAR, PlaybookNodeRunner

    seen: dict[str, Any] = {}

    def run_all(calls: Any, *_a: Any, **_kw: Any) -> dict[str, dict[str, Any]]:
        seen.update({h: dict(args) for h, (_t, args) in calls.items()})
        return {h: {"changed": True} for h in calls}

    monkeypatch.setattr(direct, "run_all", run_all)
    hostvars = {"n1": {**PLAIN, FORCE_VAR: True, "rollout_kubelet_healthz_retries": 7}}
    runner = PlaybookNodeRunner(tmp_path, tmp_path / "inv.ini", hostvars=hostvars)
    assert runner.restore_many(_restore_items(), "c1", force=force)["n1"].ok
    assert seen["n1"]["action"] == "restore" and seen["n1"]["force"] is force
    assert seen["n1"]["healthz_retries"] == 7  # the other role variables still reach it
