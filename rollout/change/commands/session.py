"""The change session: what ``apply``, ``promote``, ``resume`` and ``rollback`` build around the
engine, below the CLI.

Why here and not in ``rollout.cli``: ``rollout watch`` and ``rollout serve`` roll back in
process through :func:`roll_back`, exactly as ``rollout rollback`` does, so there is one rollback
path whoever pulls the trigger and no command line to spawn and parse. The CLI parses options,
calls this module and prints; nothing here prints to stdout (progress and notices go to the
``Progress`` and ``say`` callables the caller passes).

The adapters are built here, once, by :class:`ChangeSession`: the Lease lock
(``rollout.kube.leases``), the journal and its cluster mirror (``rollout.change.record.opening``),
the playbook runner (``rollout.change.engine.node_runner``), the engine's
:class:`~rollout.change.engine.context.Context` with the Lease's interrupt. Read-only commands open
the record with ``rollout.change.record.opening.existing_journal`` and never build a session.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from rollout.change.commands.change_options import ChangeOptions
from rollout.change.commands.progress import Progress
from rollout.change.engine.context import Context, KindSteps
from rollout.change.kinds.registry import recorded_kind
from rollout.change.plan.drain_rules import DrainOverrides, DrainPolicy
from rollout.change.plan.schema import Plan, recorded_plan
from rollout.change.record.change_outcomes import ENDED_BY_ROLLBACK, ChangeOutcome
from rollout.change.record.entries import DrainOverridesUsed
from rollout.change.record.journal import Journal, Kind
from rollout.change.record.opening import existing_journal, mirrored, to_stderr
from rollout.change.record.replay import ChangeStatus, status_of
from rollout.errors import ExternalError, InputError, LockHeldError, PreflightError, RolloutError
from rollout.fanout import DEFAULT_FORKS
from rollout.interrupt import Interrupt
from rollout.protocols import Gate, Lock
from rollout.retrying import Poll

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.change.preflight.checking import Prepared
    from rollout.kube.client import Api
    from rollout.kube.lease_objects import RecordRequest


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


class OwnerLock(Lock, Protocol):
    """The Lease as a session holds it: the :class:`~rollout.protocols.Lock` and the interrupt
    its watch sets when a rollback is handed over or the Lease is lost
    (``rollout.kube.leases.LeaseLock``)."""

    @property
    def interrupt(self) -> Interrupt:
        """Set by the Lease's watch; the engine stops forward work on it."""
        ...

    def serve_records(self, write: Callable[[RecordRequest], None] | None) -> None:
        """Write the entries other processes hand over with ``write`` (None: no longer)."""
        ...


def open_context(
    api: Api,
    journal: Journal,
    inventory: Path,
    drain: DrainPolicy,
    verify_timeout: float,
    progress: Progress | None = None,
    hostvars: Mapping[str, Mapping[str, Any]] | None = None,
    forks: int = DEFAULT_FORKS,
    say: Callable[[str], None] = to_stderr,
) -> Context:
    """The orchestrator's context; with ``progress``, every journal entry and event feeds it
    (without, events go to ``say``); ``hostvars``: the inventory's variables when the caller has
    read them already; ``forks``: at most this many nodes at once (``--forks``). The kind of
    change is the one the journal's ``begin`` names (a new change: the kubelet-config change;
    the caller sets another). :class:`ChangeSession` builds it; nothing else needs to."""
    from rollout.change.commands.progress import ObservedJournal
    from rollout.change.engine.node_runner import PlaybookNodeRunner
    from rollout.kube.cluster import KubeCluster

    on_event = progress.event if progress is not None else say
    return Context(
        cluster=KubeCluster(api),
        runner=PlaybookNodeRunner(
            journal.dir / "ansible", inventory, on_event, hostvars=hostvars, forks=forks
        ),
        clock=SystemClock(),
        journal=journal if progress is None else ObservedJournal(journal, progress.entry),
        drain=drain,
        verify_timeout_s=verify_timeout,
        on_event=on_event,
        forks=forks,
        kind=recorded_kind(status_of(journal).info),
    )


@dataclass(frozen=True)
class RunSetup:
    """What a session's engine context is built from, known before the Lease is taken.

    Attributes:
        inventory: the inventory file the playbooks run with.
        drain: the drain policy (the plan's strategy, with the drain flags' allowances).
        hostvars: the inventory's variables when the caller has read them (None: read later).
        kind: the kind of change (None: the one the journal's ``begin`` names; a new journal
            names none: the kubelet-config change).
    """

    inventory: Path
    drain: DrainPolicy
    hostvars: Mapping[str, Mapping[str, Any]] | None = None
    kind: KindSteps | None = None


SetupOf = Callable[[Journal], RunSetup]
"""A session's :class:`RunSetup` read from the change's journal as the session opens it, under the
Lease (``resume``, ``rollback``: the inventory and drain allowances the change recorded)."""


ContextFactory = Callable[
    [Journal, RunSetup, ChangeOptions, "Progress | None", Callable[[str], None]], Context
]
"""Builds the engine's context over the mirrored journal (default: :func:`open_context` with the
cluster through ``api`` and the playbook runner); unit tests pass one over fakes."""


class ChangeSession:
    """One change's session, as a context manager: what every command that changes nodes
    (``apply``, ``promote``, ``resume``, ``rollback``, ``migrate``, and the rollbacks ``watch``
    and ``serve`` run in process) holds while the engine runs, assembled in one place.

    On entry, in this order: the Lease is taken for the change (one owner: ``LockHeldError``
    when a live process has it, and nothing else happens); the journal is created (a new
    change, ``journal`` None), the existing one taken as given, or opened by ``opener`` now that
    the Lease is held (the cache brought up to the cluster record then: a process that owned the
    change a moment before wrote its last entries there); the cluster mirror is attached to it
    (each later append and backup is also written into the cluster record); the entries other
    processes hand to the owner (``rollout watch``'s verdicts, ``rollout serve``'s triggers:
    ``rollout.change.commands.owner_records``) are written into it from then on; the engine's
    context is built over it with the Lease's interrupt installed (a rollback handed over or the
    Lease lost stops forward work), unless ``setup`` is None (a session that only writes the
    record); ``setup`` may be read from that journal (a :data:`SetupOf`: ``resume`` and
    ``rollback`` run with what the change recorded, read under the Lease). On exit, however
    the block ends (an outcome, an error, ``KeyboardInterrupt``): handed entries are no longer
    taken, the mirror is detached, then the Lease is released, so this process writes the
    cluster record only while it owns the change, and no entry is journaled in the session
    before the Lease is taken or after it is released (``tests/unit/test_change_session.py``).

    Read-only commands (``status``, ``report``, ``runbook``, ``resume --dry-run``) open the
    record with :func:`rollout.change.record.opening.existing_journal` and never build a session:
    they take no Lease and journal nothing.

    Attributes:
        lock: the Lease. journal: the change's journal, mirrored (entries journaled here do not
        feed ``progress``). ctx: the engine's context (its journal feeds ``progress``).
        change_id: the change's id (a new change's is chosen on entry).
    """

    def __init__(
        self,
        api: Api,
        lock: OwnerLock,
        opts: ChangeOptions,
        setup: RunSetup | SetupOf | None,
        *,
        journal: Journal | None = None,
        progress: Progress | None = None,
        say: Callable[[str], None] = to_stderr,
        context: ContextFactory | None = None,
        opener: tuple[str, Callable[[str], Journal]] | None = None,
    ) -> None:
        self.api, self.lock, self.opts, self.setup = api, lock, opts, setup
        self.progress, self.say = progress, say
        self._given = journal
        self._opener = opener
        self._context = context or self._open_context
        self.change_id: str | None = journal.change_id if journal is not None else None
        if opener is not None:
            self.change_id = opener[0]
        self._journal: Journal | None = None
        self._ctx: Context | None = None
        self._held = False

    def _open_context(
        self,
        journal: Journal,
        setup: RunSetup,
        opts: ChangeOptions,
        progress: Progress | None,
        say: Callable[[str], None],
    ) -> Context:
        return open_context(
            self.api,
            journal,
            setup.inventory,
            setup.drain,
            opts.verify_timeout,
            progress,
            setup.hostvars,
            opts.forks,
            say,
        )

    @property
    def journal(self) -> Journal:
        """The change's journal, mirrored into the cluster record (only inside the block)."""
        if self._journal is None:
            raise RuntimeError("the change session is not open")
        return self._journal

    @property
    def ctx(self) -> Context:
        """The engine's context (only inside the block)."""
        if self._ctx is None:
            raise RuntimeError("the change session is not open")
        return self._ctx

    @property
    def interrupt(self) -> Interrupt:
        """The Lease's interrupt: what the gate's soak and the engine's waits stop on."""
        return self.lock.interrupt

    def __enter__(self) -> ChangeSession:
        from rollout.change.record.journal import new_change_id, state_dir

        change_id = self.change_id or new_change_id(datetime.now(UTC))
        self.lock.acquire(change_id)
        self._held, self.change_id = True, change_id
        try:
            journal, created = self._given, False
            if journal is None and self._opener is not None:
                journal = self._opener[1](change_id)
            elif journal is None:
                journal, created = Journal.create(state_dir(), change_id), True
            self._journal = mirrored(journal, self.api, self.opts.lock_namespace, self.say)
            if created:
                self.say(f"change {change_id}: journal {journal.file}")
            self.lock.serve_records(self._write_handed)
            setup = self.setup(journal) if callable(self.setup) else self.setup
            if setup is not None:
                ctx = self._context(self._journal, setup, self.opts, self.progress, self.say)
                ctx.interrupt = self.lock.interrupt
                if setup.kind is not None:
                    ctx.kind = setup.kind
                self._ctx = ctx
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write_handed(self, req: RecordRequest) -> None:
        """An entry another process handed to this owner, into the change's mirrored record."""
        from rollout.change.record.journal import Handed
        from rollout.models import Phase

        journal = self._journal
        if journal is None:
            raise RuntimeError("the change session is not open")
        journal.append(
            req.step,
            Phase.DONE,
            now=datetime.now(UTC),
            data=req.data,
            handed=Handed(req.id, req.by),
        )

    def close(self) -> None:
        """Take no more handed entries, detach the mirror, then release the Lease
        (idempotent)."""
        try:
            if self._held:
                self.lock.serve_records(None)
            for journal in (self._journal, self._ctx.journal if self._ctx else None):
                if journal is not None:
                    journal.flush_mirror()  # a deferred ``done`` an error left last
                    journal.mirror = None
        finally:
            self._ctx, self._journal = None, None
            if self._held:
                self._held = False
                self.lock.release()

    def run(
        self,
        call: Callable[[], ChangeStatus],
        failed: Callable[[ChangeStatus], None] | None = None,
    ) -> ChangeStatus:
        """Run the engine call ``call`` under the Lease (:func:`reported`: a requester waiting
        on the Lease is told how a rolled-back change ended; ``failed`` sees the status when
        ``call`` raises)."""
        return reported(self.journal, self.lock, call, failed)


def reported(
    journal: Journal,
    lock: Lock,
    run: Callable[[], ChangeStatus],
    failed: Callable[[ChangeStatus], None] | None = None,
) -> ChangeStatus:
    """Run the engine call ``run`` and tell a requester waiting on the Lease how the change
    ended when it was rolled back (``LeaseLock.report``).

    The engine returns how the change ended; an error it raises is not an outcome (an API call
    failed, bad input): the change's status then goes to ``failed`` (``-o json`` prints it)
    and the error is re-raised (its exit code)."""

    def tell(status: ChangeStatus) -> ChangeStatus:
        if status.outcome in ENDED_BY_ROLLBACK:
            lock.report(status.outcome.value, status.message)
        return status

    try:
        return tell(run())
    except RolloutError:
        final = tell(status_of(journal))
        if failed is not None:
            failed(final)
        raise


def intent_digest(plan: Plan) -> str:
    """sha256 of the plan's kubelet intent and per-node overrides: what ``promote`` checks is
    unchanged since the canary."""
    intent = {
        "kubelet": plan.kubelet,
        "distribution": plan.distribution,
        "method": plan.method,
        "nodes": {h: asdict(o) for h, o in plan.nodes.items()},
    }
    blob = json.dumps(intent, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class FactsGathering:
    """Every inventory host's facts, gathered in a thread from the moment the inventory is read
    (over plain ssh that is mostly waiting on the nodes, so the API client's import and the
    Lease check go on meanwhile)."""

    def __init__(self, inv: Inventory, forks: int = DEFAULT_FORKS) -> None:
        from rollout.ansible.runner import AnsibleRunner

        self._tmp = tempfile.TemporaryDirectory(prefix="rollout-preflight-")
        self.dir = Path(self._tmp.name) / "facts"
        self._runner = AnsibleRunner(Path(self._tmp.name) / "runner", forks=forks)
        self._got: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._gather, args=(inv,), daemon=True)
        self._thread.start()

    def _gather(self, inv: Inventory) -> None:
        try:
            self._got["raw"] = self._runner.gather_facts(
                inv.path, list(inv.hosts), self.dir, inv.hostvars
            )
        except BaseException as e:  # re-raised in the caller's thread by result()
            self._got["error"] = e

    def result(self) -> Any:
        self._thread.join()
        if "error" in self._got:
            raise self._got["error"]
        return self._got["raw"]

    def close(self) -> None:
        self._thread.join()
        self._tmp.cleanup()


def run_preflight(
    plan: Plan,
    inv: Inventory,
    api: Api,
    canary: bool,
    accept: bool = False,
    facts: FactsGathering | None = None,
    forks: int = DEFAULT_FORKS,
    force: bool = False,
    overrides: DrainOverrides | None = None,
    settled: Collection[str] = (),
    force_serving: bool = False,
) -> Prepared:
    """Gather the nodes' facts (or use ``facts``, already under way) and run every preflight
    check (``rollout.change.preflight.checking.prepare``); ``accept``: predicted rejections of
    running pods are not refusals; ``force``: nor are the device refusals (``--force REASON``);
    ``overrides``: what the drains may lose (``rollout.change.plan.drain_rules.DrainOverrides``);
    ``settled``: nodes the change already moved; ``force_serving``: a model-serving canary in
    progress is not a refusal (``--force-serving REASON``)."""
    from rollout.change.preflight.checking import ClusterReader, prepare

    reader = ClusterReader(api, {inv.node_of(h) for h in inv.hosts})
    # the API reads that do not need the facts go on while the nodes answer
    reads = threading.Thread(target=reader.prefetch, daemon=True)
    reads.start()
    facts = facts or FactsGathering(inv, forks)
    try:
        tenancy = None
        if plan.tenancy:
            from rollout.change.tenancy.audit import audit_plan_tenancy

            tenancy = audit_plan_tenancy(plan.tenancy, api)  # while the nodes answer
        raw = facts.result()
        reads.join()
        return prepare(
            plan,
            inv,
            reader,
            raw,
            facts.dir,
            canary,
            accept,
            force,
            overrides or DrainOverrides(),
            settled,
            force_serving,
            tenancy,
        )
    finally:
        reads.join()
        facts.close()


OVERRIDES_STEP = Kind.DRAIN_OVERRIDES
"""The journal entry ``apply`` and ``promote`` write when drain flags were given (``flags``,
``pods``); ``resume`` and ``rollback`` run on with the same allowances."""


def journaled_overrides(journal: Journal) -> DrainOverrides:
    """The drain overrides every part of the change was started with (their union)."""
    flags = {
        f
        for e in journal.entries()
        if e.step == OVERRIDES_STEP
        for f in DrainOverridesUsed.read(e.data).flags
    }
    return DrainOverrides.from_flags(flags)


def info_path(journal: Journal, key: str, given: str | None) -> Path:
    """``given``, else the path the change's ``begin`` recorded under ``key``.

    Raises:
        InputError: neither is there.
    """
    value = given or status_of(journal).info.path_of(key)
    if not value:
        raise InputError(f"no {key} recorded for change {journal.change_id}; pass it")
    return Path(str(value))


Work = Callable[[Context, Lock], ChangeStatus]
"""What a session runs under the Lease: the engine call, given the context and the lock."""


def settle(
    api: Api,
    change: str,
    work: Work,
    opts: ChangeOptions,
    *,
    inventory: str | None = None,
    progress: Progress | None = None,
    failed: Callable[[ChangeStatus], None] | None = None,
    say: Callable[[str], None] = to_stderr,
    context: ContextFactory | None = None,
) -> ChangeStatus:
    """Run ``work`` on an existing change in its :class:`ChangeSession` (``resume``,
    ``rollback``): the journal fetched from or brought up to the cluster record once the Lease
    is held (an owner on another machine may have appended to it and let go a moment before:
    ``tests/unit/test_change_session.py::test_settle_reads_the_record_once_the_lease_is_held``),
    the inventory and drain allowances the change recorded. The change is looked up once before
    the Lease too, so an unknown change or a missing inventory takes no Lease.

    ``failed`` sees the change's status when ``work`` raises (``-o json`` prints it);
    ``context``: the session's context factory (default: the cluster and the playbooks).

    Returns:
        The change's status as ``work`` ended it.

    Raises:
        LockHeldError: a live process owns the change.
        RolloutError: what ``work`` raised (the exit code).
    """
    from rollout.kube.leases import LeaseLock

    # which change, that it exists and names its inventory, before any Lease is taken (bad
    # input takes nothing); what the session acts on is read again under the Lease (opened)
    known = existing_journal(change, api, opts.lock_namespace, say)
    change_id = known.change_id

    def opened(change_id: str) -> Journal:
        # read again once the Lease is held: an owner on another machine that let the change go
        # a moment before wrote its last entries (a node restored, a request handed over) into
        # the cluster record, and this session must act on them
        return existing_journal(change_id, api, opts.lock_namespace, say)

    def setup(journal: Journal) -> RunSetup:
        inv = info_path(journal, "inventory", inventory)
        plan = recorded_plan(status_of(journal).info, journal.change_id)
        drain = plan.strategy.drain if plan is not None else DrainPolicy()
        allowed = journaled_overrides(journal)  # what the change's drains were allowed to lose
        drain = replace(
            drain,
            delete_unmanaged=allowed.delete_unmanaged,
            delete_emptydir_data=allowed.delete_emptydir_data,
        )
        return RunSetup(inv, drain)

    setup(known)
    lock = LeaseLock(api, opts.lock_namespace)
    with ChangeSession(
        api,
        lock,
        opts,
        setup,
        opener=(change_id, opened),
        progress=progress,
        say=say,
        context=context,
    ) as session:
        if progress is not None:
            progress.nodes(tuple(status_of(session.journal).nodes))
        return session.run(lambda: work(session.ctx, lock), failed)


@dataclass(frozen=True, kw_only=True)
class RollbackRequest(ChangeOptions):
    """What ``rollout rollback`` (or the gate's trigger) asks for, with the options of
    :class:`~rollout.change.commands.change_options.ChangeOptions`.

    Args:
        change: the change id.
        nodes: only these nodes (empty: every node the change touched).
        requested_by: who asks, as the change's owner reports it.
        force: overwrite node files edited after this change wrote them.
        wait: when a live process owns the change, wait for its report (else return at once,
            ``handed-over``).
        wait_timeout: seconds to wait for that report.
        inventory: the inventory (default: the one the change recorded).
    """

    change: str
    nodes: Sequence[str] = ()
    requested_by: str = ""
    force: bool = False
    wait: bool = True
    wait_timeout: float = 1800.0
    inventory: str | None = None


@dataclass(frozen=True)
class RollbackResult:
    """How a rollback request ended.

    ``outcome``: ``rolled-back`` / ``rollback-failed`` (run here or reported by the owner), or
    ``handed-over`` (the owner has it; not waited for). ``handed_to``, ``request``,
    ``requested_at``: set when the request went to the change's owner. ``status``: the change's
    status when this process ran the rollback. ``covered_by``: the owner that took the Lease
    while this process reached for it and was rolling the nodes back already (no request
    written; its outcome when waited for, else ``handed-over``).
    """

    change: str
    outcome: ChangeOutcome
    message: str = ""
    handed_to: str | None = None
    request: str | None = None
    nodes: Sequence[str] | None = None
    force: bool = False
    requested_at: float | None = None
    status: ChangeStatus | None = None
    covered_by: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: the change's status when run here, else the hand-over's record."""
        if self.status is not None and self.handed_to is None:
            return self.status.to_dict()
        doc: dict[str, Any] = {
            "change": self.change,
            "handedTo": self.handed_to,
            "request": self.request,
            "nodes": list(self.nodes) if self.nodes else None,
            "force": self.force,
            "requestedAt": self.requested_at,
            "outcome": self.outcome.value,
        }
        if self.outcome is not ChangeOutcome.HANDED_OVER:
            doc["message"] = self.message
        if self.covered_by is not None:
            doc["coveredBy"] = self.covered_by
            doc["message"] = self.message
        return doc


ONE_OWNER_HERE = threading.Lock()
"""One :func:`roll_back` (or one record write under the Lease,
``rollout.change.commands.owner_records``) at a time in a process: the Lease's holder identity is
the process (``user@host pid N``), so two sessions side by side in one ``rollout serve`` would
each take the other's Lease for their own. The second waits for the first, then finds the Lease
free (or handed to a new owner) as a second process would."""


def roll_back(
    api: Api,
    req: RollbackRequest,
    *,
    progress: Progress | None = None,
    failed: Callable[[ChangeStatus], None] | None = None,
    say: Callable[[str], None] = to_stderr,
) -> RollbackResult:
    """Put the change's nodes back: handed to the change's owner while a live process holds its
    Lease (it stops forward work, rolls back and reports), else run here under the Lease.

    Returns:
        The result; a rollback the owner reported as failed is ``rollback-failed`` (the caller
        decides the exit code: ``rollout.change.record.change_outcomes.ROLLBACK_EXIT``).

    When the Lease was free at the hand-over and another process took it for the same change
    before this one could (two ``rollout serve`` replicas given one alert), the request goes to
    that new owner, or, when the change's record shows it rolling back every node asked for
    already, the request is covered by its rollback (nothing written; with ``wait``, its
    outcome once it lets the Lease go); a new owner rolling back other nodes is waited for,
    then the rollback runs here
    (``tests/unit/test_rollback_race.py``).

    Raises:
        LockHeldError: another process holds the Lease for another change.
        NodeOperationError: the rollback run here failed on a node (its status went to
            ``failed``).
    """
    with ONE_OWNER_HERE:
        return _roll_back(api, req, progress, failed, say)


def _roll_back(
    api: Api,
    req: RollbackRequest,
    progress: Progress | None,
    failed: Callable[[ChangeStatus], None] | None,
    say: Callable[[str], None],
) -> RollbackResult:
    from rollout.change.engine.orchestrator import rollback
    from rollout.kube.handover import hand_over, wait_outcome
    from rollout.kube.lease_objects import holder_identity

    by = req.requested_by or holder_identity()
    requested_at = time.time()
    nodes = list(req.nodes) or None
    for _ in range(LEASE_RACES):
        handed = hand_over(api, req.lock_namespace, req.change, nodes, by, req.force)
        if handed is not None:
            say(
                f"change {req.change} is owned by {handed.owner}: rollback handed to it "
                f"(request {handed.request.id}{', --force' if handed.request.force else ''})"
            )
            if handed.request.force != req.force:
                say(
                    "warning: joined a pending request "
                    + ("with --force" if handed.request.force else "without --force")
                    + "; the first request decides whether edited files are overwritten"
                )
            result = RollbackResult(
                change=req.change,
                outcome=ChangeOutcome.HANDED_OVER,
                handed_to=handed.owner,
                request=handed.request.id,
                nodes=list(handed.request.nodes) if handed.request.nodes else None,
                force=handed.request.force,
                requested_at=requested_at,
            )
            if not req.wait:
                return result
            report = wait_outcome(api, req.lock_namespace, handed, req.wait_timeout, say)
            if report is not None:
                outcome = _reported(report.get("outcome"))
                return replace(result, outcome=outcome, message=str(report.get("message") or ""))
            say(
                f"{handed.owner} released the change without acting on the request; "
                "rolling back here"
            )

        def work(ctx: Context, _lock: Lock) -> ChangeStatus:
            return rollback(ctx, nodes, req.force)  # force: over files edited after our write

        try:
            status = settle(
                api,
                req.change,
                work,
                req,
                inventory=req.inventory,
                progress=progress,
                failed=failed,
                say=say,
            )
        except LockHeldError:
            covered = _taken_meanwhile(api, req, nodes, requested_at, say)
            if covered is not None:
                return covered
            continue  # the new owner is handed the request, or the Lease is free again
        return RollbackResult(
            change=req.change, outcome=status.outcome, message=status.message, status=status
        )
    raise LockHeldError(
        f"the Lease of change {req.change} changed hands {LEASE_RACES} times while this "
        "rollback reached for it; try again"
    )


LEASE_RACES = 5
"""How many times :func:`roll_back` finds the Lease free, then taken before its own session
took it, before it gives up (each time it hands over to the new owner or waits for it)."""


def _taken_meanwhile(
    api: Api,
    req: RollbackRequest,
    nodes: Sequence[str] | None,
    requested_at: float,
    say: Callable[[str], None],
) -> RollbackResult | None:
    """The Lease was free at the hand-over, then another process took it before this session
    could: whose is it now?

    Returns:
        The result when the new owner is rolling back every node asked for already (covered;
        with ``req.wait``, its outcome once it let go); None when the caller looks again (hand
        the request to the new owner, or take the Lease now free).

    Raises:
        LockHeldError: the Lease is held for another change (as :func:`hand_over` says it).
    """
    from rollout.change.record.replay import owed_rollback
    from rollout.kube.lease_objects import (
        CHANGE_ANNOTATION,
        NAME,
        annotations_of,
        live_holder,
        read_lease,
    )

    lease = read_lease(api, req.lock_namespace)
    holder = live_holder(lease, datetime.now(UTC))
    if lease is None or holder is None:
        return None  # let go again: take it
    theirs = annotations_of(lease).get(CHANGE_ANNOTATION)
    if theirs != req.change:
        raise LockHeldError(
            f"the cluster lock (Lease {req.lock_namespace}/{NAME}) is held by {holder} for "
            f"change {theirs or 'unknown'}, not {req.change}; nothing was changed"
        )
    journal = existing_journal(req.change, api, req.lock_namespace, say)
    owed = owed_rollback(journal.entries())
    if owed is None:
        say(f"change {req.change} was taken by {holder} meanwhile: handing the rollback to it")
        return None  # an owner going forward: hand_over gives it the request
    asked = set(nodes or status_of(journal).nodes)
    if owed.nodes is not None and not asked <= set(owed.nodes):
        # its rollback would answer a request without restoring the others: let it end first
        say(f"{holder} is rolling back {', '.join(owed.nodes)} of {req.change}; waiting for it")
        _wait_let_go(api, req.lock_namespace, holder, req.wait_timeout)
        return None
    what = ", ".join(sorted(asked)) or "every node"
    message = f"{holder} is rolling back {what} of change {req.change} already"
    say(f"{message}: the rollback is covered by its")
    result = RollbackResult(
        change=req.change,
        outcome=ChangeOutcome.HANDED_OVER,
        message=message,
        handed_to=holder,
        nodes=list(nodes) if nodes else None,
        force=req.force,
        requested_at=requested_at,
        covered_by=holder,
    )
    if not req.wait:
        return result
    _wait_let_go(api, req.lock_namespace, holder, req.wait_timeout)
    ended = status_of(existing_journal(req.change, api, req.lock_namespace, say))
    if ended.outcome not in ENDED_BY_ROLLBACK:  # it let go without ending its rollback
        return None
    return replace(result, outcome=ended.outcome, message=ended.message)


LET_GO = Poll.every(0.5)
"""How often :func:`_wait_let_go` reads the Lease."""


def _wait_let_go(api: Api, namespace: str, holder: str, timeout_s: float) -> None:
    """Wait until ``holder`` no longer holds the Lease live.

    Raises:
        ExternalError: ``timeout_s`` passed first.
    """
    from rollout.kube.lease_objects import live_holder, read_lease

    started = time.monotonic()
    while live_holder(read_lease(api, namespace), datetime.now(UTC)) == holder:
        waited = time.monotonic() - started
        if waited > timeout_s:
            raise ExternalError(f"{holder} did not let the change go within {timeout_s:.0f}s")
        time.sleep(LET_GO.interval(waited))


def _reported(value: Any) -> ChangeOutcome:
    """The outcome an owner reported on the Lease; one this version does not know reads as
    ``rollback-failed`` (it is not a rollback that completed)."""
    try:
        return ChangeOutcome(str(value))
    except ValueError:
        return ChangeOutcome.ROLLBACK_FAILED


GateFactory = Callable[[Plan, "Inventory", "frozenset[tuple[str, str]] | None"], Gate]
"""Builds the gate a resumed change runs where the interrupted command would have: given the
recorded plan, the inventory and the admission preview's predicted rejections. The CLI's
``gate_for``: the gate layer sits above this one."""


def resume_change(
    ctx: Context, api: Api, inventory: str | None, make_gate: GateFactory
) -> ChangeStatus:
    """``rollout resume`` under the Lease: finish every node in flight, then what the change
    owes. A change that had ended (held, completed, stopped) gets its nodes settled and nothing
    started; a rollback under way is finished, never gone forward from; otherwise a gate the
    crash cut short is soaked again and the batches not started are run, with the gate where
    the interrupted command would have run it.

    The journal was fetched or refreshed from the cluster record (:func:`settle`): a machine
    that never saw the change resumes it too.

    Raises:
        PreflightError: the recorded plan renders another intent than the change started with.
        NodeOperationError: a node could not be settled, or the gate failed a later batch.
    """
    from rollout.change.engine.resumption import resume, resume_rollback, unfinished_rollback
    from rollout.change.record.replay import replay

    before = replay(ctx.journal.entries(), ctx.journal.change_id)
    if before.outcome != ChangeOutcome.RUNNING:
        return resume(ctx)  # it had ended (held, completed, stopped): nothing more to start
    pending = unfinished_rollback(ctx.journal.entries())
    if pending is not None:  # a rollback was under way: finish it, never go forward
        return resume_rollback(ctx, pending)
    # the change stays running until it goes on or ends here: a crash in between leaves it to
    # the next resume, which goes on with it
    settled = resume(ctx, end=False)
    return _resume_later_batches(ctx, api, before, settled, inventory, make_gate)


def _resume_later_batches(
    ctx: Context,
    api: Api,
    before: ChangeStatus,
    settled: ChangeStatus,
    inventory: str | None,
    make_gate: GateFactory,
) -> ChangeStatus:
    """The batches an interrupted apply / promote had not started: rendered again from the plan
    (its intent checked unchanged), the gate where that command would have run it."""
    from rollout.ansible.hosts import read_inventory
    from rollout.change.engine.orchestrator import continue_change, gate_points
    from rollout.change.engine.resumption import end_resumed, rerun_nodes, unfinished_gate
    from rollout.change.plan.batches import Batch
    from rollout.change.plan.schema import load_plan
    from rollout.kubelet.admission.node_preview import predicted_rejections
    from rollout.models import NodeState

    info = before.info
    # a node the crash caught on the forward path before any file was written (no step failed):
    # resume undid its cordon; the interrupted command would have gone on with it, so resume
    # runs it again in its batch (also when an earlier resume undid the cordon and was killed)
    cut = rerun_nodes(ctx.journal.entries())
    if any(
        s.state in (NodeState.RESTORED, NodeState.FAILED) and n not in cut
        for n, s in settled.nodes.items()
    ):
        # a node failed forward: the interrupted command would have stopped
        return end_resumed(ctx)
    pending = [
        [n for n in b if settled.nodes[n].state is NodeState.PENDING or n in cut]
        for b in info.batches
    ]
    todo = [b for b in pending if b]
    plan = recorded_plan(info, before.change)
    # a gate the crash cut short (or whose verdict was not acted on) is settled first; another
    # kind's gate needs no gate section (a migration's: the DRA pool's signals, after each
    # promoted batch as promote runs it)
    own_gate = ctx.kind is not None and ctx.kind.name != "kubelet-config"
    has_gate = own_gate or (plan is not None and plan.has_gate)
    regate = unfinished_gate(ctx.journal.entries(), has_gate)
    if not todo and regate is None:
        return end_resumed(ctx)
    if plan is None:
        # names what is missing
        plan = load_plan(str(info_path(ctx.journal, "plan", None))).for_change(info)
    if info.intent_sha256 and info.intent_sha256 != intent_digest(plan):
        raise PreflightError(
            f"the plan {plan.path} renders another intent than change {before.change} "
            "started with; its settled nodes stay as they are, the rest is not started"
        )
    inv = read_inventory(info_path(ctx.journal, "inventory", inventory))
    # a change started with --force over device refusals carries that consent to its resume
    forced = any(e.step == Kind.PREFLIGHT_FORCED for e in ctx.journal.entries())
    # and one started with --force-serving, that consent (apply's entry, promote's record)
    serving_forced = any(e.step == Kind.SERVING_FORCED for e in ctx.journal.entries()) or bool(
        info.promotion and info.promotion.forced_serving
    )
    moved = {n for n, s in settled.nodes.items() if s.state is not NodeState.PENDING}
    if ctx.kind is not None and ctx.kind.name != "kubelet-config":  # another kind's own works
        from rollout.change.kinds.allocation_path import claims_consent, works_of

        works = works_of(plan, inv, claims_consent(ctx.journal.entries()))
        gate = make_gate(plan, inv, None)
        canary = set(info.canary)
        batches = [Batch(tuple(b), bool(canary & set(b))) for b in todo]
        gate_at = gate_points(batches, info.canary, bool(info.promotion), has_gate)
        return continue_change(
            ctx,
            {n: works[n] for b in todo for n in b},
            batches,
            gate,
            replace(info, resumed=True),
            gate_at=gate_at,
            canary_only=info.canary_only,
            regate=regate,
        )
    prepared = (
        run_preflight(
            plan,
            inv,
            api,
            False,
            forks=ctx.forks,
            force=forced,
            overrides=journaled_overrides(ctx.journal),
            settled=moved - set(cut),
            force_serving=serving_forced,
        )
        if todo
        else None
    )
    canary = set(info.canary)
    batches = [Batch(tuple(b), bool(canary & set(b))) for b in todo]
    gate_at = gate_points(batches, info.canary, bool(info.promotion), has_gate)
    predicted = predicted_rejections(prepared.previews) if prepared is not None else None
    gate = make_gate(plan, inv, predicted)
    if todo:
        ctx.on_event(f"resuming the batches not started: {', '.join(n for b in todo for n in b)}")
    return continue_change(
        ctx,
        prepared.changes if prepared is not None else {},
        batches,
        gate,
        replace(info, resumed=True),
        gate_at=gate_at,
        canary_only=info.canary_only,
        regate=regate,
    )
