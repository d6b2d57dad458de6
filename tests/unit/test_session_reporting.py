"""The session's Lease handling over a Lock double (``rollout.protocols.Lock``), through
:class:`rollout.change.commands.session.ChangeSession`: the Lease is released however the work ends,
and a requester waiting on it is told how a rolled-back change ended, whether the engine returned
that end or raised after journaling it."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.change.commands import session as session_mod
from rollout.change.commands.change_options import ChangeOptions
from rollout.change.commands.session import ChangeSession, RunSetup, reported
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.record.change_outcomes import ChangeOutcome, StopCause
from rollout.change.record.journal import CHANGE_STEP, Journal
from rollout.change.record.replay import ChangeStatus, status_of
from rollout.errors import LockHeldError, RolloutError
from rollout.interrupt import Interrupt
from rollout.models import Phase
from tests.unit.fakes_change import FakeCluster, FakeRunner, fake_context

NOW = datetime(2026, 12, 4, tzinfo=UTC)


class RecordingLock:
    """A Lock that records what the session did with it; ``held_by`` refuses the acquire."""

    def __init__(self, held_by: str | None = None) -> None:
        self.held_by = held_by
        self.calls: list[tuple[str, ...]] = []
        self.interrupt = Interrupt()

    def acquire(self, change_id: str) -> None:
        if self.held_by is not None:
            raise LockHeldError(f"held by {self.held_by}")
        self.calls.append(("acquire", change_id))

    def release(self) -> None:
        self.calls.append(("release",))

    def report(self, outcome: str, message: str) -> None:
        self.calls.append(("report", outcome, message))

    def serve_records(self, write: Any) -> None:
        self.serving = write  # entries handed over: tests/unit/test_owner_records.py


@pytest.fixture(autouse=True)
def _no_cluster_mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(session_mod, "mirrored", lambda journal, *_a: journal)


def holding(lock: RecordingLock, journal: Journal) -> ChangeSession:
    """The change's session over fakes, on ``journal``."""

    def context(j: Journal, *_a: Any) -> Any:
        cluster = FakeCluster({})
        return fake_context(cluster, FakeRunner(cluster), j)

    setup = RunSetup(Path("inventory.ini"), DrainPolicy())
    return ChangeSession(None, lock, ChangeOptions(), setup, journal=journal, context=context)


def _journal(tmp_path: Path) -> Journal:
    journal = Journal.create(tmp_path, "c1")
    journal.append(CHANGE_STEP, Phase.BEGIN, now=NOW, data={"nodes": ["n1"]})
    return journal


def _end(journal: Journal, outcome: ChangeOutcome, message: str) -> ChangeStatus:
    data = {"outcome": outcome.value, "message": message, "cause": StopCause.REQUESTED.value}
    journal.append(CHANGE_STEP, Phase.FAILED, now=NOW, data=data)
    return status_of(journal)


def test_a_rolled_back_end_is_reported_to_the_requester_and_a_held_one_is_not(
    tmp_path: Path,
) -> None:
    journal, lock = _journal(tmp_path), RecordingLock()
    with holding(lock, journal):
        got = reported(journal, lock, lambda: _end(journal, ChangeOutcome.ROLLED_BACK, "by a"))
    assert got.outcome is ChangeOutcome.ROLLED_BACK
    assert lock.calls == [("acquire", "c1"), ("report", "rolled-back", "by a"), ("release",)]
    running, quiet = _journal(tmp_path / "running"), RecordingLock()
    reported(running, quiet, lambda: status_of(running))  # not ended: nothing to tell anyone
    assert quiet.calls == []


def test_an_error_after_the_end_was_journaled_still_reports_it_and_hands_the_status_over(
    tmp_path: Path,
) -> None:
    journal, lock = _journal(tmp_path), RecordingLock()
    seen: list[ChangeStatus] = []

    def work() -> ChangeStatus:
        _end(journal, ChangeOutcome.ROLLBACK_FAILED, "n1 unreachable")
        raise RolloutError("the API server went away")

    with pytest.raises(RolloutError, match="went away"), holding(lock, journal):
        reported(journal, lock, work, seen.append)
    assert ("report", "rollback-failed", "n1 unreachable") in lock.calls
    assert lock.calls[-1] == ("release",)  # released on the way out
    assert [s.outcome for s in seen] == [ChangeOutcome.ROLLBACK_FAILED]


def test_a_lease_held_elsewhere_runs_nothing(tmp_path: Path) -> None:
    lock, ran = RecordingLock(held_by="bob@h pid 7"), []
    with pytest.raises(LockHeldError, match="bob"), holding(lock, _journal(tmp_path)):
        ran.append(True)
    assert ran == [] and lock.calls == []
