"""One writer per change's record, over fakes (the lab proves it against the real API server:
``tests/lab/test_owner_records_lab.py``):

* every journal entry names its writer, and a handed one who asked; journals written before
  that still read;
* the record requests on the Lease: written, read back, moved to done;
* the owner's session takes handed entries only while its mirror is attached, writing them
  with the request's id and requester;
* a process that is not the owner hands an entry over while the change has an owner, takes the
  Lease for it when nobody does, looks again (on ``Poll``'s schedule) while a rollback in this
  process is taking the Lease, never writes an entry twice when the owner wrote it just before
  letting go, and gives up at its bound;
* a rollback or a new owner waits out a Lease held only to write a record.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.change.commands import owner_records as orec
from rollout.change.commands import session as session_mod
from rollout.change.commands.change_options import ChangeOptions
from rollout.change.commands.owner_records import LOOK_AGAIN, OwnerRecords
from rollout.change.commands.session import ONE_OWNER_HERE, ChangeSession
from rollout.change.record.journal import Entry, Handed, Journal
from rollout.errors import ExternalError, LockHeldError
from rollout.identity import process_identity
from rollout.interrupt import Interrupt
from rollout.kube import lease_objects as lo
from rollout.kube.lease_objects import (
    HELD_FOR_ANNOTATION,
    RecordRequest,
    past_record_writer,
    record_requests,
    records_done,
    with_records,
)
from rollout.models import Phase
from tests.unit.fakes_change import RecordingClock

NOW = datetime(2026, 12, 6, 12, tzinfo=UTC)
CHANGE = "20261206T120000Z-abcdef"


# ------------------------------------------------------------------ the entries name their writer


def test_every_entry_names_its_writer_and_a_handed_one_who_asked(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, CHANGE)
    own = j.append("verdict", Phase.DONE, now=NOW, data={"outcome": "Failed"})
    handed = j.append("trigger", Phase.DONE, now=NOW, handed=Handed("r1", "ops@b pid 7"))
    assert own.writer == handed.writer == process_identity()
    assert own.handed is None and handed.handed == Handed("r1", "ops@b pid 7")
    again = Journal.open(tmp_path, CHANGE).entries()
    assert [(e.writer, e.handed) for e in again] == [
        (own.writer, None),
        (own.writer, handed.handed),
    ]
    assert json.loads(handed.to_json())["handed"] == {"id": "r1", "by": "ops@b pid 7"}


def test_a_journal_written_before_writers_were_named_still_reads(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, CHANGE)
    line = {"v": 1, "ts": NOW.isoformat(), "change": CHANGE, "step": "change", "phase": "begin"}
    j.file.write_text(json.dumps(line) + "\n")
    (e,) = j.entries()
    assert e.writer is None and e.handed is None and e.step == "change"


# ------------------------------------------------------------------ the requests on the Lease


def test_record_requests_round_trip_and_move_to_done() -> None:
    a = RecordRequest("a", "me", "verdict", {"outcome": "Failed"})
    b = RecordRequest("b", "you", "trigger", {"nodes": ["n1"]})
    ann = with_records({"other": "x"}, [a, b], [])
    assert record_requests(ann) == [a, b] and records_done(ann) == [] and ann["other"] == "x"
    done = with_records(ann, [b], ["a"])
    assert record_requests(done) == [b] and records_done(done) == ["a"]
    cleared = with_records(done, [], ["a", "b"])
    assert lo.RECORD_REQUEST_ANNOTATION not in cleared and records_done(cleared) == ["a", "b"]
    many = with_records({}, [], [str(i) for i in range(100)])
    assert records_done(many) == [str(i) for i in range(100 - lo.RECORDS_KEPT, 100)]
    # what cannot be read is no request
    assert record_requests({lo.RECORD_REQUEST_ANNOTATION: "not json"}) == []
    assert record_requests({lo.RECORD_REQUEST_ANNOTATION: '[{"id": "x"}, 3]'}) == []


def _lease(held_for: str | None, holder: str = "ops@elsewhere pid 9") -> dict[str, Any]:
    renewed = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    ann = {lo.CHANGE_ANNOTATION: CHANGE}
    if held_for:
        ann[HELD_FOR_ANNOTATION] = held_for
    return {
        "metadata": {"resourceVersion": "1", "annotations": ann},
        "spec": {"holderIdentity": holder, "leaseDurationSeconds": 30, "renewTime": renewed},
    }


def test_a_lease_held_to_write_a_record_is_waited_out(monkeypatch: pytest.MonkeyPatch) -> None:
    reads = [_lease("record"), _lease("record"), None]
    monkeypatch.setattr(lo, "read_lease", lambda _api, _ns: reads.pop(0))
    clock = RecordingClock()
    got = past_record_writer(
        None, "ns", _lease("record"), sleep=clock.sleep, monotonic=clock.monotonic
    )
    assert got is None and clock.slept == [0.05, 0.05]  # RECORD_HOLD_POLL's fast looks
    owner = _lease(None)  # a real owner is handed requests at once, never waited for
    assert past_record_writer(None, "ns", owner) is owner


def test_a_record_writer_that_stays_is_refused_at_the_bound(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(lo, "read_lease", lambda _api, _ns: _lease("record"))
    clock = RecordingClock()
    with pytest.raises(LockHeldError, match="to write the change's record for over 15s"):
        past_record_writer(
            None, "ns", _lease("record"), sleep=clock.sleep, monotonic=clock.monotonic
        )
    assert 15.0 <= clock.t <= 15.0 + lo.RECORD_HOLD_POLL.slow_s


# ------------------------------------------------------------------ the owner's session


class ServingLock:
    """The owner's Lease: hands over what ``serve_records`` is given, for the test to call."""

    def __init__(self, log: list[str]) -> None:
        self.log = log
        self.interrupt = Interrupt()
        self.write: Callable[[RecordRequest], None] | None = None

    def acquire(self, change_id: str) -> None:
        self.log.append("acquire")

    def release(self) -> None:
        self.log.append("release")

    def report(self, outcome: str, message: str) -> None:
        pass

    def serve_records(self, write: Callable[[RecordRequest], None] | None) -> None:
        self.write = write
        self.log.append("serve" if write else "unserve")


def test_the_owner_writes_handed_entries_only_while_its_mirror_is_attached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log: list[str] = []
    journal = Journal.create(tmp_path, CHANGE)

    class Mirror:
        def entry(self, journal: Journal, entry: Entry) -> None:
            log.append(f"mirror {entry.step}")

        def backup(self, *_a: Any) -> None:
            pass

    def mirrored(j: Journal, *_a: Any) -> Journal:
        log.append("attach")
        j.mirror = Mirror()
        return j

    monkeypatch.setattr(session_mod, "mirrored", mirrored)
    lock = ServingLock(log)
    session = ChangeSession(None, lock, ChangeOptions(), None, journal=journal)
    with session:
        assert lock.write is not None
        lock.write(RecordRequest("r1", "ops@b pid 7", "verdict", {"outcome": "Failed"}))
    assert log == ["acquire", "attach", "serve", "mirror verdict", "unserve", "release"]
    (e,) = journal.entries()
    assert e.handed == Handed("r1", "ops@b pid 7") and e.writer == process_identity()
    assert e.data == {"outcome": "Failed"} and e.phase is Phase.DONE
    with pytest.raises(RuntimeError, match="not open"):
        session.ctx  # noqa: B018 (a session that only writes the record builds no context)


# ------------------------------------------------------------------ a process that is not the owner


class Script:
    """``hand_over_record`` / ``wait_recorded`` / the write under the Lease, scripted."""

    def __init__(self, holders: list[str | None], listed: list[bool]) -> None:
        self.holders, self.listed = holders, listed
        self.handed: list[RecordRequest] = []
        self.written: list[RecordRequest] = []

    def hand_over(self, _api: Any, _ns: str, change: str, req: RecordRequest) -> Any:
        holder = self.holders.pop(0) if self.holders else None
        if holder is None:
            return None
        self.handed.append(req)
        return ("handed", holder)

    def wait(self, *_a: Any, **_k: Any) -> bool:
        return self.listed.pop(0)


@pytest.fixture
def script(monkeypatch: pytest.MonkeyPatch) -> Callable[..., Script]:
    from rollout.kube import handover

    def make(holders: list[str | None], listed: list[bool], takes: list[bool]) -> Script:
        s = Script(holders, listed)
        monkeypatch.setattr(handover, "hand_over_record", s.hand_over)
        monkeypatch.setattr(handover, "wait_recorded", s.wait)

        def write_here(self: OwnerRecords, req: RecordRequest) -> bool:
            ok = takes.pop(0)
            if ok:
                s.written.append(req)
            return ok

        monkeypatch.setattr(OwnerRecords, "_write_here", write_here)
        return s

    return make


def test_an_entry_is_handed_to_the_live_owner(script: Callable[..., Script]) -> None:
    s = script(["apply@a pid 1"], [True], [])
    assert OwnerRecords(None, "ns", CHANGE)("verdict", {"outcome": "Failed"}) == "handed"
    (req,) = s.handed
    assert req.step == "verdict" and req.by == process_identity() and not s.written


def test_an_owner_that_lets_go_first_leaves_the_write_to_this_process(
    script: Callable[..., Script],
) -> None:
    s = script(["apply@a pid 1", None], [False], [True])
    assert OwnerRecords(None, "ns", CHANGE)("trigger", {}) == "written"
    assert s.written == s.handed  # the same request, so a write the owner made is not repeated


def test_while_this_processs_rollback_takes_the_lease_it_looks_again(
    script: Callable[..., Script],
) -> None:
    s = script([None, None, None, "me@here pid 2"], [True], [False, False, False])
    clock = RecordingClock()
    rec = OwnerRecords(None, "ns", CHANGE, sleep=clock.sleep, monotonic=clock.monotonic)
    assert rec("trigger", {}) == "handed"
    assert clock.slept == [LOOK_AGAIN.interval(0.0), LOOK_AGAIN.interval(0.05), 0.05]
    assert len(s.handed) == 1


def test_it_gives_up_at_its_bound(script: Callable[..., Script]) -> None:
    script([None] * 1000, [], [False] * 1000)
    clock = RecordingClock()
    rec = OwnerRecords(
        None, "ns", CHANGE, timeout_s=3.0, sleep=clock.sleep, monotonic=clock.monotonic
    )
    with pytest.raises(ExternalError, match="was not written within 3s"):
        rec("verdict", {})
    assert 3.0 <= clock.t < 3.0 + LOOK_AGAIN.slow_s


def test_the_write_under_the_lease_skips_an_entry_the_owner_wrote(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner wrote the handed entry, then let the Lease go before it listed it as done: the
    requester, taking the Lease, finds the request's id in the record and writes nothing."""
    monkeypatch.setattr(session_mod, "mirrored", lambda journal, *_a: journal)
    journal = Journal.create(tmp_path, CHANGE)
    journal.append("verdict", Phase.DONE, now=NOW, handed=Handed("r1", process_identity()))
    monkeypatch.setattr(orec, "existing_journal", lambda *_a, **_k: journal)
    log: list[str] = []

    class Lock(ServingLock):
        def __init__(self, *_a: Any, **_k: Any) -> None:
            super().__init__(log)

    from rollout.kube import leases

    monkeypatch.setattr(leases, "LeaseLock", Lock)
    rec = OwnerRecords(None, "ns", CHANGE)
    assert rec._write_here(RecordRequest("r1", process_identity(), "verdict", {})) is True
    assert len(journal.entries()) == 1 and log[0] == "acquire" and log[-1] == "release"
    assert rec._write_here(RecordRequest("r2", process_identity(), "verdict", {})) is True
    assert [e.handed for e in journal.entries()] == [Handed("r1", process_identity()), None]
    # a rollback in this process holds the owner's place: no Lease is taken meanwhile
    with ONE_OWNER_HERE:
        assert rec._write_here(RecordRequest("r3", process_identity(), "verdict", {})) is False
    assert len(journal.entries()) == 2
