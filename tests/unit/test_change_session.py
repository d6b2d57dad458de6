"""The change session (``rollout.change.commands.session.ChangeSession``) over fakes: the Lease is
held before the first journal entry and released after the last, the cluster mirror writes only
between them, a second owner is refused before anything is written, the Lease's interrupt
reaches the engine, everything is released however the block ends; the session journals
nothing of its own (an engine run in it journals what it journals on a bare context); and the
read-only commands open the record without it.

The lab proves the same paths against the real API server's Lease
(``tests/lab/test_owner_lab.py``, ``tests/lab/test_crash_lab.py``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout.change.commands import session as session_mod
from rollout.change.commands.change_options import ChangeOptions
from rollout.change.commands.progress import Progress
from rollout.change.commands.session import ChangeSession, RunSetup, settle
from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, continue_change, rollback, run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.strategy import Strategy
from rollout.change.record.change_outcomes import ChangeOutcome
from rollout.change.record.journal import CHANGE_STEP, Entry, Journal
from rollout.change.record.replay import ChangeStatus, replay, status_of
from rollout.errors import LockHeldError, RolloutError
from rollout.interrupt import Interrupt, StopReason
from rollout.models import Phase
from tests.unit.fakes_change import FakeCluster, FakeRunner, fake_context, make_change, make_node

NODES = ["n1", "n2", "n3"]
OPTS = ChangeOptions(lock_namespace="ns")
SETUP = RunSetup(Path("inventory.ini"), DrainPolicy())

Log = list[tuple[str, ...]]


class Lease:
    """One Lease shared by the locks of several would-be owners (the cluster's)."""

    def __init__(self) -> None:
        self.holder: str | None = None


class RecordingLock:
    """An owner's lock on a shared :class:`Lease`: refuses while another holds it, and writes
    what it does into ``log``, beside the mirror's writes."""

    def __init__(self, lease: Lease, name: str, log: Log) -> None:
        self.lease, self.name, self.log = lease, name, log
        self.interrupt = Interrupt()

    def acquire(self, change_id: str) -> None:
        if self.lease.holder not in (None, self.name):
            raise LockHeldError(f"another change holds the cluster lock: {self.lease.holder}")
        self.lease.holder = self.name
        self.log.append(("acquire", change_id))

    def release(self) -> None:
        if self.lease.holder == self.name:
            self.lease.holder = None
        self.log.append(("release",))

    def report(self, outcome: str, message: str) -> None:
        self.log.append(("report", outcome))

    def serve_records(self, write: Any) -> None:
        self.serving = write  # entries handed over: tests/unit/test_owner_records.py


class RecordingMirror:
    """The cluster mirror: each entry it is given goes into ``log`` (``held``: the Lease's
    holder at that moment)."""

    def __init__(self, lease: Lease, log: Log) -> None:
        self.lease, self.log = lease, log

    def entry(self, journal: Journal, entry: Entry) -> None:
        self.log.append(("mirror", entry.step, entry.phase.value, str(self.lease.holder)))

    def backup(self, journal: Journal, node: str, digest: str, content: bytes) -> None:
        self.log.append(("backup", node, str(self.lease.holder)))


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A state directory, a Lease, a log, the mirror and the context over fakes."""
    monkeypatch.setenv("ROLLOUT_STATE_DIR", str(tmp_path / "state"))
    lease, log = Lease(), []
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    runner = FakeRunner(cluster)

    def mirrored(journal: Journal, api: Any, ns: str, say: Callable[[str], None]) -> Journal:
        log.append(("attach", journal.change_id))
        journal.mirror = RecordingMirror(lease, log)
        return journal

    monkeypatch.setattr(session_mod, "mirrored", mirrored)
    built: list[Context] = []

    def context(
        journal: Journal,
        setup: RunSetup,
        opts: ChangeOptions,
        progress: Progress | None,
        say: Callable[[str], None],
    ) -> Context:
        ctx: Context = fake_context(cluster, runner, journal, kind=None)
        built.append(ctx)
        return ctx

    yield {"lease": lease, "log": log, "context": context, "built": built, "runner": runner}


def _session(world: dict[str, Any], name: str = "me", journal: Journal | None = None) -> Any:
    lock = RecordingLock(world["lease"], name, world["log"])
    return ChangeSession(
        None, lock, OPTS, SETUP, journal=journal, say=lambda _m: None, context=world["context"]
    )


def _apply(ctx: Context, canary_only: bool = True) -> ChangeStatus:
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), canary_only)
    return run_change(ctx, {n: make_change(n) for n in NODES}, batches, NoGate(), canary_only)


def test_the_lease_is_held_before_the_first_entry_and_released_after_the_last(
    world: dict[str, Any],
) -> None:
    log: Log = world["log"]
    with _session(world) as s:
        change, journal = s.change_id, s.journal
        assert world["lease"].holder == "me"
        status = s.run(lambda: _apply(s.ctx))
    assert status.outcome is ChangeOutcome.HELD
    entries = journal.entries()
    assert log[0] == ("acquire", change) and log[1] == ("attach", change)
    assert log[-1] == ("release",)
    mirrored = [e for e in log if e[0] == "mirror"]
    # every entry went to the cluster record, in order, while this process held the Lease
    assert [(m[1], m[2]) for m in mirrored] == [(e.step, e.phase.value) for e in entries]
    assert {m[3] for m in mirrored} == {"me"}
    assert world["lease"].holder is None


def test_the_mirror_is_detached_before_the_lease_is_released(world: dict[str, Any]) -> None:
    log: Log = world["log"]
    with _session(world) as s:
        journal, ctx = s.journal, s.ctx
        s.run(lambda: _apply(ctx))
    count = len(log)
    # an append after the session (this process no longer owns the change) stays local
    journal.append("note", Phase.DONE, now=ctx.clock.now())
    ctx.journal.append("note", Phase.DONE, now=ctx.clock.now())
    assert len(log) == count
    assert journal.mirror is None and ctx.journal.mirror is None
    with pytest.raises(RuntimeError, match="not open"):
        _ = s.ctx


def test_a_second_owner_is_refused_before_anything_is_written(world: dict[str, Any]) -> None:
    log: Log = world["log"]
    with _session(world, "me") as s:
        mine = s.journal
        other = _session(world, "bob", journal=mine)
        with pytest.raises(LockHeldError, match="me"), other:
            pytest.fail("the second owner ran")
        assert world["lease"].holder == "me"  # the first owner still owns it
        assert mine.mirror is not None  # and still mirrors its change
        status = s.run(lambda: _apply(s.ctx))
    assert status.outcome is ChangeOutcome.HELD
    assert not any(e == ("attach", mine.change_id) for e in log[2:])  # no second attach
    # a refused new change leaves no journal behind
    changes = mine.dir.parent
    before = sorted(p.name for p in changes.iterdir())
    world["lease"].holder = "bob"
    with pytest.raises(LockHeldError), _session(world, "me"):
        pytest.fail("ran without the Lease")
    assert sorted(p.name for p in changes.iterdir()) == before
    assert len(world["built"]) == 1  # no context was built for either refusal


def test_the_leases_interrupt_reaches_the_engine_and_the_requester_is_told(
    world: dict[str, Any],
) -> None:
    log: Log = world["log"]
    with _session(world) as s:
        assert s.ctx.interrupt is s.lock.interrupt is s.interrupt
        # a rollback handed over on the Lease before the run: forward work stops, rolls back
        s.lock.interrupt.request(StopReason(by="alice@h pid 9", request_id="r1"))
        status = s.run(lambda: _apply(s.ctx, canary_only=False))
    assert status.outcome is ChangeOutcome.ROLLED_BACK
    assert "alice" in status.message
    assert ("report", "rolled-back") in log
    assert log.index(("report", "rolled-back")) < log.index(("release",))


@pytest.mark.parametrize("raised", [RolloutError("the API server went away"), KeyboardInterrupt()])
def test_everything_is_released_when_the_work_raises(
    world: dict[str, Any], raised: BaseException
) -> None:
    log: Log = world["log"]
    seen: list[ChangeStatus] = []

    def work() -> ChangeStatus:
        s.journal.append(CHANGE_STEP, Phase.BEGIN, now=s.ctx.clock.now(), data={"nodes": ["n1"]})
        raise raised

    with pytest.raises(type(raised)), _session(world) as s:
        journal = s.journal
        s.run(work, seen.append)
    assert log[-1] == ("release",) and world["lease"].holder is None
    assert journal.mirror is None
    # ``failed`` sees the status of an error (RolloutError), not of a KeyboardInterrupt
    assert len(seen) == (1 if isinstance(raised, RolloutError) else 0)


def test_a_failure_while_opening_releases_the_lease(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_a: Any) -> Context:
        raise RolloutError("cannot read the inventory")

    lock = RecordingLock(world["lease"], "me", world["log"])
    session = ChangeSession(None, lock, OPTS, SETUP, say=lambda _m: None, context=broken)
    with pytest.raises(RolloutError, match="inventory"), session:
        pytest.fail("ran without a context")
    assert world["log"][-1] == ("release",) and world["lease"].holder is None


def _shape(entries: list[Entry]) -> list[tuple[Any, ...]]:
    """An entry without its time: what the journal says, in order."""
    return [(e.step, e.phase, e.node, e.path, e.data) for e in entries]


def test_the_session_journals_nothing_of_its_own(world: dict[str, Any], tmp_path: Path) -> None:
    """apply (run_change), promote (continue_change) and rollback run in a session journal
    exactly what they journal on a bare context, entry for entry."""

    def engine(ctx: Context) -> None:
        held = _apply(ctx)  # the canary
        rest = make_batches(["n2", "n3"], [], Strategy(max_unavailable=1), False)
        continue_change(ctx, {n: make_change(n) for n in NODES}, rest, NoGate(), held.info)
        rollback(ctx, ["n1"], force=True)

    bare_cluster = FakeCluster({n: make_node(n) for n in NODES})
    bare = fake_context(bare_cluster, FakeRunner(bare_cluster), Journal.create(tmp_path, "c"))
    engine(bare)
    with _session(world) as s:
        engine(s.ctx)
        journal = s.journal
    got, want = _shape(journal.entries()), _shape(bare.journal.entries())
    assert got == want and len(got) > 30
    assert replay(journal.entries()).outcome is ChangeOutcome.ROLLED_BACK


def test_settle_runs_work_on_an_existing_change_in_its_session(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """resume and rollback's path: the journal opened first, then the session under the
    Lease (LeaseLock stands in), the engine's rollback with the Lease's interrupt."""
    with _session(world) as s:
        s.run(lambda: _apply(s.ctx))
        journal = s.journal
    log: Log = world["log"]
    lock = RecordingLock(world["lease"], "me", log)
    monkeypatch.setattr("rollout.change.commands.session.existing_journal", lambda *a, **k: journal)
    monkeypatch.setattr("rollout.kube.leases.LeaseLock", lambda api, ns: lock)
    seen: list[Interrupt] = []

    def work(ctx: Context, _lock: Any) -> ChangeStatus:
        seen.append(ctx.interrupt)
        assert world["lease"].holder == "me"
        return rollback(ctx)

    start = len(log)
    status = settle(
        None, journal.change_id, work, OPTS, inventory="inv.ini", context=world["context"]
    )
    assert status.outcome is ChangeOutcome.ROLLED_BACK and seen == [lock.interrupt]
    assert log[start] == ("acquire", journal.change_id) and log[-1] == ("release",)
    assert status_of(journal).outcome is ChangeOutcome.ROLLED_BACK


@pytest.fixture
def local_change(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, Path]:
    """A change journaled here, no cluster at hand, and a session or Lease that fails the test
    if anything opens it."""
    monkeypatch.setenv("ROLLOUT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-kubeconfig"))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    ctx = fake_context(cluster, FakeRunner(cluster), Journal.create(tmp_path / "state", "c1"))
    _apply(ctx)

    def refused(*_a: Any, **_k: Any) -> Any:
        raise AssertionError("a read-only command took the Lease")

    monkeypatch.setattr(ChangeSession, "__enter__", refused)
    monkeypatch.setattr("rollout.kube.leases.LeaseLock.acquire", refused)
    return "c1", ctx.journal.file


@pytest.mark.parametrize(
    "args",
    [
        ["status", "-o", "json"],
        ["report", "-o", "json"],
        ["resume", "--dry-run", "-o", "json"],
    ],
)
def test_read_only_commands_open_the_record_without_the_session(
    local_change: tuple[str, Path], args: list[str]
) -> None:
    from rollout.cli import cli

    change, file = local_change
    before = file.read_bytes()
    r = CliRunner().invoke(cli, [*args, "--change", change])
    assert r.exit_code == 0, r.output
    assert change in r.output
    assert file.read_bytes() == before  # nothing journaled


def test_settle_reads_the_record_once_the_lease_is_held(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Between settle's first look at the change and its Lease, the owner on another machine
    rolls the canary back, appends that to the cluster record and lets go: the session acts on
    the record as it is under the Lease (the node restored), never on the cache read before."""
    import shutil

    cluster = FakeCluster({n: make_node(n) for n in NODES})
    record = Journal.create(tmp_path / "other-machine", "c1")  # the cluster record
    other = fake_context(cluster, FakeRunner(cluster), record, kind=None)
    _apply(other)  # the canary n1 applied, the change held
    cache = tmp_path / "state" / "changes" / "c1"

    def existing_journal(change: str | None, *_a: Any, **_k: Any) -> Journal:
        # the cache brought up to the cluster record (what ``sync_change`` does)
        shutil.copytree(record.dir, cache, dirs_exist_ok=True)
        return Journal.open(tmp_path / "state", "c1")

    class HandedOnLock(RecordingLock):
        """The other machine's owner appends and releases just before this Lease is taken."""

        def acquire(self, change_id: str) -> None:
            rollback(other, ["n1"])
            super().acquire(change_id)

    lock = HandedOnLock(world["lease"], "me", world["log"])
    monkeypatch.setattr("rollout.change.commands.session.existing_journal", existing_journal)
    monkeypatch.setattr("rollout.kube.leases.LeaseLock", lambda api, ns: lock)
    seen: list[ChangeStatus] = []

    def work(ctx: Context, _lock: Any) -> ChangeStatus:
        seen.append(status_of(ctx.journal))
        return rollback(ctx)

    status = settle(None, "c1", work, OPTS, inventory="inv.ini", context=world["context"])
    assert seen[0].outcome is ChangeOutcome.ROLLED_BACK, seen[0]
    assert seen[0].nodes["n1"].state.value == "restored"
    assert status.outcome is ChangeOutcome.ROLLED_BACK
    assert world["runner"].restored == []  # n1 not restored a second time
