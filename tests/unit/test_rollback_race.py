"""``roll_back`` when the Lease was free at the hand-over and another process took it before this
one's session could (two ``rollout serve`` replicas given one alert): the request goes to the
new owner, is covered by the new owner's rollback of the same nodes, or fails when the Lease was
taken for another change.

The Lease, the hand-over and the session are fakes at ``roll_back``'s seams (the Lease as the API
server returns it, ``hand_over``, ``settle``); the change's record is a real journal. The race
between two real processes is ``tests/lab/test_cluster_record_lab.py::
test_two_serve_replicas_given_the_same_alert_roll_back_once``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.change.commands import session as session_mod
from rollout.change.commands.session import RollbackRequest, roll_back
from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, end_change, run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.strategy import Strategy
from rollout.change.record.change_outcomes import ChangeOutcome, StopCause
from rollout.change.record.entries import RollbackAsked
from rollout.change.record.journal import CHANGE_STEP, Journal
from rollout.change.record.replay import status_of
from rollout.errors import LockHeldError
from rollout.gate.trigger import COVERED, KubeTarget, trigger_rollback
from rollout.kube.handover import HandOver
from rollout.kube.lease_objects import CHANGE_ANNOTATION
from rollout.kube.lease_objects import RollbackRequest as Handed
from rollout.models import Phase
from rollout.retrying import Poll
from tests.unit.fakes_change import FakeCluster, FakeRunner, fake_context, make_change, make_node

NODES = ["n1", "n2"]
OTHER = "ops@other-host pid 4242"  # the other replica, on another machine


def _lease(change: str) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    return {
        "metadata": {"annotations": {CHANGE_ANNOTATION: change}, "resourceVersion": "7"},
        "spec": {"holderIdentity": OTHER, "leaseDurationSeconds": 15, "renewTime": now},
    }


class Seams:
    """The fakes: ``leases`` the Lease as read in turn (the last one stays), ``handed`` what
    ``hand_over`` answers in turn (None: nobody owns the change), ``session`` how many times
    ``settle`` was called (each raises the lost race), ``records`` the record as read in turn
    (each read calls the next)."""

    def __init__(
        self,
        leases: list[Any],
        handed: list[HandOver | None],
        records: list[Callable[[], Journal]],
    ) -> None:
        self.leases, self.handed, self.records = leases, handed, records
        self.hand_overs = 0
        self.sessions = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def hand_over(*_a: Any, **_k: Any) -> HandOver | None:
            self.hand_overs += 1
            return self.handed.pop(0) if len(self.handed) > 1 else self.handed[0]

        def settle(*_a: Any, **_k: Any) -> Any:
            self.sessions += 1
            raise LockHeldError(f"another process holds the cluster lock: holder {OTHER}")

        def read_lease(*_a: Any) -> Any:
            return self.leases.pop(0) if len(self.leases) > 1 else self.leases[0]

        def existing_journal(*_a: Any, **_k: Any) -> Journal:
            return (self.records.pop(0) if len(self.records) > 1 else self.records[0])()

        monkeypatch.setattr("rollout.kube.handover.hand_over", hand_over)
        monkeypatch.setattr(session_mod, "settle", settle)
        monkeypatch.setattr("rollout.kube.lease_objects.read_lease", read_lease)
        monkeypatch.setattr(session_mod, "existing_journal", existing_journal)
        monkeypatch.setattr(session_mod, "LET_GO", Poll.every(0.0))


def _record(tmp_path: Path, name: str, rolling_back: Sequence[str] | None = ()) -> Context:
    """Change c1 with its canary n1 applied and held; then a rollback of ``rolling_back`` begun
    (None: of every node; its ``begin``, as ``orchestrator.rollback`` journals it first)."""
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    ctx = fake_context(cluster, FakeRunner(cluster), Journal.create(tmp_path / name, "c1"))
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), True)
    run_change(ctx, {n: make_change(n) for n in NODES}, batches, NoGate(), True)
    if rolling_back != ():
        asked = RollbackAsked(tuple(rolling_back) if rolling_back else None, False)
        begin = replace(status_of(ctx.journal).info, rollback=asked)
        ctx.journal.append(CHANGE_STEP, Phase.BEGIN, now=datetime.now(UTC), data=begin.data())
    made: Context = ctx
    return made


def _read(ctx: Context) -> Callable[[], Journal]:
    return lambda: ctx.journal


def _request(**kw: Any) -> RollbackRequest:
    return RollbackRequest(change="c1", nodes=("n1",), requested_by="alert c0ffee", **kw)


def test_the_request_goes_to_the_owner_that_took_the_lease_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken for the same change by an owner going forward: handed to it, not failed."""
    to_new = HandOver(Handed("r1", "alert c0ffee", ("n1",)), OTHER, "8")
    seams = Seams([_lease("c1")], [None, to_new], [_read(_record(tmp_path, "held"))])
    seams.install(monkeypatch)
    said: list[str] = []
    result = roll_back(None, _request(wait=False), say=said.append)  # type: ignore[arg-type]
    assert result.outcome is ChangeOutcome.HANDED_OVER and result.handed_to == OTHER
    assert result.request == "r1" and result.covered_by is None
    assert (seams.hand_overs, seams.sessions) == (2, 1)
    assert any(f"taken by {OTHER} meanwhile" in m for m in said), said


def test_a_trigger_is_covered_by_the_new_owners_rollback_of_the_same_nodes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Taken for the same change by the other replica, whose record shows it rolling n1 back:
    the trigger is covered (no request written, nothing run here), as ``rollout serve`` says."""
    seams = Seams([_lease("c1")], [None], [_read(_record(tmp_path, "rolling", ["n1"]))])
    seams.install(monkeypatch)
    kube = KubeTarget(None, None, "ns", _api=[object()])
    assert trigger_rollback("c1", ["n1"], "alert c0ffee", kube, wait=False) == COVERED
    assert (seams.hand_overs, seams.sessions) == (1, 1)


def test_a_covered_rollback_waited_for_ends_as_the_new_owners_rollback_ended(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rollout rollback`` waits: the new owner's rollback of every node, then its outcome."""
    other = _record(tmp_path, "rolling", None)  # the new owner's rollback of every node

    def ended() -> Journal:  # read once it let go: the rollback ended
        end_change(other, ChangeOutcome.ROLLED_BACK, "restored: n1", cause=StopCause.ROLLBACK)
        return other.journal

    # the Lease: taken (the race), still held while waited on, then let go
    seams = Seams([_lease("c1"), _lease("c1"), None], [None], [_read(other), ended])
    seams.install(monkeypatch)
    result = roll_back(None, _request(wait=True, wait_timeout=30), say=lambda _m: None)  # type: ignore[arg-type]
    assert result.covered_by == OTHER and result.outcome is ChangeOutcome.ROLLED_BACK
    assert (seams.hand_overs, seams.sessions) == (1, 1)


def test_a_lease_taken_for_another_change_fails_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seams = Seams([_lease("c2")], [None], [_read(_record(tmp_path, "held"))])
    seams.install(monkeypatch)
    with pytest.raises(LockHeldError, match="for change c2, not c1"):
        roll_back(None, _request(wait=False), say=lambda _m: None)  # type: ignore[arg-type]
    assert (seams.hand_overs, seams.sessions) == (1, 1)
