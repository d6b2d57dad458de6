"""Replay: a change's journal entries turned into every node's state.

:func:`replay` is a pure function of the entries (:mod:`rollout.change.record.journal` writes and
reads them), so what ``status`` shows and what ``resume`` decides are the same thing.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rollout.change.record.change_outcomes import ChangeOutcome, StopCause
from rollout.change.record.entries import (
    BenchVerdict,
    ChangeBegin,
    ChangeEnd,
    EvidenceRecord,
    NodeStep,
    RequestRecord,
    RollbackAsked,
    TriggerRecord,
    record_of,
)
from rollout.change.record.journal import (
    CHANGE_STEP,
    EVIDENCE_STEP,
    Entry,
    Journal,
    Kind,
    gc_paused,
)
from rollout.errors import InputError
from rollout.models import WRITES, FileBackup, NodeState, Phase, Step, StepPath

TRIGGER_STEP = Kind.TRIGGER.value


@dataclass(frozen=True)
class NodeStatus:
    """A node's state, replayed from the journal.

    Attributes:
        node: Node name.
        state: see :class:`NodeState`.
        step: the last step journaled for the node (None: none yet).
        phase: that step's phase.
        path: that step's path.
        prior_cordoned: whether the node was cordoned before we touched it (None: not recorded).
        we_cordoned: whether this change cordoned it (so only then do we uncordon).
        backups: the original files, with hashes (empty until the backup step is done).
        prior_config: the kubelet settings ``/configz`` showed before the change.
        prior_allocatable: device allocatable before the change (``nvidia.com/gpu`` etc.).
        prior_slices: the node's DRA ResourceSlices before the change (driver -> slice uid ->
            device count; verify waits for them after a kubelet restart).
        files_touched: the apply step began, so node files may differ from the backups.
        record: what the change writes on the node (paths, blob hashes, service, checkpoints),
            so resume and rollback can rebuild it without the plan.
        message: the last failure message, if any.
    """

    node: str
    state: NodeState = NodeState.PENDING
    step: Step | None = None
    phase: Phase | None = None
    path: StepPath | None = None
    prior_cordoned: bool | None = None
    we_cordoned: bool = False
    backups: tuple[FileBackup, ...] = ()
    prior_config: Mapping[str, Any] = field(default_factory=dict)
    prior_allocatable: Mapping[str, str] = field(default_factory=dict)
    prior_slices: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    files_touched: bool = False
    message: str = ""
    record: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (what ``status -o json`` prints per node)."""
        return {
            "node": self.node,
            "state": self.state.value,
            "step": self.step.value if self.step else None,
            "phase": self.phase.value if self.phase else None,
            "path": self.path.value if self.path else None,
            "priorCordoned": self.prior_cordoned,
            "weCordoned": self.we_cordoned,
            "filesTouched": self.files_touched,
            "backups": [
                {"path": b.path, "existed": b.existed, "sha256": b.sha256} for b in self.backups
            ],
            "message": self.message,
        }


@dataclass
class TriggerStatus:
    """One trigger as ``status`` shows it: what asked for a rollback (``trigger``: gate, alert,
    watch), when (``at``), for which ``nodes`` (None: every node), with the alert's ``id``,
    ``alert``, ``fingerprint`` and the ``reason`` when recorded; once the rollback it started
    ended, its ``outcome``, when (``ended``) and the ``detail``."""

    trigger: str | None
    at: str
    id: str | None = None
    alert: str | None = None
    fingerprint: str | None = None
    reason: str | None = None
    nodes: tuple[str, ...] | None = None
    outcome: str | None = None
    ended: str | None = None
    detail: str = ""
    started: bool = False  # the trigger's own record was read (not only how it ended)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready (what ``status -o json`` prints per trigger)."""
        out: dict[str, Any] = {"trigger": self.trigger, "at": self.at}
        if self.started:
            out.update(
                {
                    k: v
                    for k, v in (
                        ("id", self.id),
                        ("alert", self.alert),
                        ("fingerprint", self.fingerprint),
                        ("reason", self.reason),
                    )
                    if v is not None
                }
            )
            out["nodes"] = None if self.nodes is None else list(self.nodes)
        if self.ended is not None:
            out.update(outcome=self.outcome, ended=self.ended, detail=self.detail)
        return out


@dataclass(frozen=True)
class ChangeStatus:
    """The whole change, replayed.

    Attributes:
        change: change id.
        nodes: node name -> status, in the order the change listed them.
        outcome: ``running`` (no end recorded: in progress or crashed), or the recorded outcome
            (``completed``, ``held``, ``stopped``, ``rolled-back``, ...).
        message: the change-level message.
        info: what the last change-level ``begin`` recorded (plan, batches, canary).
        evidence: label -> the last evidence collection of that label (``overall``, ``nodes``,
            ``file``, each check's result, or the ``error``).
        cause: why it ended as it did, when the end recorded it (the exit code of ``stopped``).
        triggers: what asked for a rollback, in journal order (the gate's verdict, an alert
            ``rollout serve`` received): ``trigger``, ``at``, ``nodes``, ``reason``, and for an
            alert its ``id``, ``alert`` and, once the rollback it started ended, ``outcome``.
        bench: the last ``bench-verdict`` (``gate.bench``): each verdict's outcome and reason,
            and whether it allows the next stage to tighten; None without one.
    """

    change: str
    nodes: Mapping[str, NodeStatus]
    outcome: ChangeOutcome = ChangeOutcome.RUNNING
    message: str = ""
    info: ChangeBegin = field(default_factory=ChangeBegin)
    evidence: Mapping[str, EvidenceRecord] = field(default_factory=dict)
    cause: StopCause | None = None
    triggers: tuple[TriggerStatus, ...] = ()
    bench: BenchVerdict | None = None

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary."""
        return {
            "change": self.change,
            "outcome": self.outcome,
            "cause": self.cause,
            "message": self.message,
            "promotion": self.info.promotion.data() if self.info.promotion else None,
            "nodes": [s.to_dict() for s in self.nodes.values()],
            "evidence": {k: v.summary() for k, v in self.evidence.items()},
            "triggers": [t.to_dict() for t in self.triggers],
            "stage": self.info.stage.data() if self.info.stage else None,
            "bench": self.bench.summary() if self.bench else None,
        }


def replay(entries: Iterable[Entry], change: str = "") -> ChangeStatus:
    """Every node's state after the given entries (pure).

    Rules: any forward ``begin`` makes a node ``applying``; the forward ``uncordon`` done makes it
    ``applied``; any restore-path ``begin`` makes it ``restoring``; the restore-path ``uncordon``
    done makes it ``restored``; a restore-path ``failed`` makes it ``failed``. Cordon entries
    carry the prior cordon state; backup entries carry the files' hashes.
    """
    p = Projection()
    with gc_paused():  # acyclic allocations only (see journal.gc_paused)
        for e in entries:
            p.add(e)
    return p.status(change)


class Projection:
    """:func:`replay` kept up entry by entry: the change's status after every entry added so far.

    Why: the engine asks for the change's status after each step of each node; replaying the
    whole journal every time made a change O(nodes^2). ``add`` is the fold step of ``replay``,
    so ``Projection`` over any entries equals ``replay`` of them
    (``tests/unit/test_journal.py::test_the_live_projection_equals_a_full_replay``).
    """

    def __init__(self) -> None:
        self.count = 0
        self.generation = 0  # the journal's generation it folded (Journal.generation)
        self.change = ""
        # each node's fields, folded in place entry by entry; a NodeStatus is built only when
        # one is asked for (``nodes``, ``status``), once per node changed since the last ask
        self._fields: dict[str, dict[str, Any]] = {}
        self._nodes: dict[str, NodeStatus] = {}
        self._dirty: set[str] = set()
        self.outcome, self.message = ChangeOutcome.RUNNING, ""
        self.cause: StopCause | None = None
        self.info = ChangeBegin()
        self.evidence: dict[str, EvidenceRecord] = {}
        # trigger id (or the record's position, for a gate's) -> what it asked and how it ended
        self.triggers: dict[str, TriggerStatus] = {}
        self.bench: BenchVerdict | None = None

    def add(self, e: Entry) -> None:
        self.count += 1
        self.change = self.change or e.change
        if e.node is None:
            if e.step == EVIDENCE_STEP:
                ev = EvidenceRecord.read(e.data)
                self.evidence[ev.label] = ev
            elif e.step == TRIGGER_STEP:
                self._trigger(e)
            elif e.step == Kind.BENCH_VERDICT:
                self.bench = BenchVerdict.read(e.data)
            elif e.step == CHANGE_STEP and e.phase is Phase.BEGIN:
                self.info = ChangeBegin.read(e.data)
                self.outcome, self.cause = ChangeOutcome.RUNNING, None
                for n in self.info.nodes:
                    self._fields_of(n)
            elif e.step == CHANGE_STEP:
                self.outcome = outcome_of(e)
                self.message = ChangeEnd.read(e.data).message
                self.cause = cause_of(e)
            return
        f = self._fields_of(e.node)
        u = _changes(f, e)
        if u is not None:
            f.update(u)
            self._dirty.add(e.node)

    def _trigger(self, e: Entry) -> None:
        """A ``trigger`` record: a new trigger, or (``outcome``) how the one of that id ended."""
        d = TriggerRecord.read(e.data)
        key = d.id or f"#{len(self.triggers)}"
        t = self.triggers.get(key)
        if t is None:
            t = self.triggers[key] = TriggerStatus(trigger=d.trigger, at=e.ts)
        if d.ends:
            t.outcome, t.ended, t.detail = d.outcome, e.ts, d.detail
            return
        t.started = True  # a field a later record of the same id leaves out is kept
        t.id = d.id if d.id is not None else t.id
        t.alert = d.alert if d.alert is not None else t.alert
        t.fingerprint = d.fingerprint if d.fingerprint is not None else t.fingerprint
        t.reason = d.reason if d.reason is not None else t.reason
        t.nodes = d.nodes

    def _fields_of(self, node: str) -> dict[str, Any]:
        f = self._fields.get(node)
        if f is None:
            fresh = NodeStatus(node=node)
            f = self._fields[node] = dict(fresh.__dict__)
            self._nodes[node] = fresh  # first seen, first listed: the order replay keeps
        return f

    @property
    def nodes(self) -> dict[str, NodeStatus]:
        """Every node's status after the entries added so far, in the order first seen."""
        for n in self._dirty:
            self._nodes[n] = _from_fields(self._fields[n])
        self._dirty.clear()
        return self._nodes

    def status(self, change: str = "") -> ChangeStatus:
        return ChangeStatus(
            change=change or self.change,
            nodes=dict(self.nodes),
            outcome=self.outcome,
            message=self.message,
            info=self.info,
            evidence=dict(self.evidence),
            cause=self.cause,
            triggers=tuple(replace(t) for t in self.triggers.values()),
            bench=self.bench,
        )


_LIVE: weakref.WeakKeyDictionary[Journal, Projection] = weakref.WeakKeyDictionary()
_LIVE_LOCK = threading.Lock()


def status_of(journal: Journal) -> ChangeStatus:
    """The change's status now: the journal's live projection, brought up to its last entry
    (only the entries appended since the last call are read and folded). Thread-safe: the
    node threads of a batch share a journal."""
    with _LIVE_LOCK:
        p = _LIVE.get(journal)
        new = journal.entries_since(p.count if p else 0)
        if p is None or p.generation != journal.generation:  # new, or the file was replaced
            p = _LIVE[journal] = Projection()
            p.generation = journal.generation
            new = journal.entries_since(0)
        for e in new:
            p.add(e)
        return p.status(journal.change_id)


_STEPS = {s.value: s for s in Step}


def apply_entry(s: NodeStatus, e: Entry) -> NodeStatus:
    """The node's status after ``e`` (pure: ``s`` is not changed)."""
    u = _changes(s.__dict__, e)
    return s if u is None else _copy_with(s, u)


def _changes(s: Mapping[str, Any], e: Entry) -> dict[str, Any] | None:
    """What ``e`` changes in a node's status fields ``s`` (None: nothing, an entry from a newer
    version whose step this one does not know: the state we know is kept)."""
    step = _STEPS.get(e.step)
    if step is None:
        return None
    path = e.path or StepPath.FORWARD
    phase = e.phase
    # every change of this entry gathered first, the status copied once: replaying a
    # 5,000-node change is 70,000 entries (tests/unit/test_journal.py::test_replay_states)
    u: dict[str, Any] = {"step": step, "phase": phase, "path": path}
    # the payload is read (NodeStep) only by the entries that carry what a status keeps: most
    # entries carry nothing of it, and a 5,000-node change replays 70,000 of them
    if step is Step.PREFLIGHT and phase is Phase.DONE:
        d = NodeStep(e.data)
        u["prior_config"] = d.configz
        u["prior_allocatable"] = d.allocatable
        u["prior_slices"] = d.slices
    elif step is Step.CORDON:
        d = NodeStep(e.data)
        if phase is Phase.BEGIN and s["prior_cordoned"] is None:
            u["prior_cordoned"] = d.prior_cordoned
        if phase is Phase.DONE and d.cordoned_by_us:
            u["we_cordoned"] = True
    elif step is Step.UNCORDON and phase is Phase.DONE and NodeStep(e.data).uncordoned:
        u["we_cordoned"] = False
    elif step is Step.BACKUP and phase is Phase.DONE:
        d = NodeStep(e.data)
        u["backups"] = d.backups
        u["record"] = d.record
    elif step in WRITES and phase is Phase.BEGIN:
        u["files_touched"] = True
    elif step in WRITES and phase is Phase.FAILED and NodeStep(e.data).nothing_written:
        u["files_touched"] = False  # compare-and-swap refused: nothing was written
    elif phase is Phase.DONE and path is StepPath.FORWARD:
        record = record_of(e.data)  # another kind's record (``KindSteps.prepare``)
        if record is not None:
            u["record"] = record
    if phase is Phase.FAILED:
        u["message"] = NodeStep(e.data).message
    if path is StepPath.FORWARD:
        if step is Step.UNCORDON and phase is Phase.DONE:
            u["state"] = NodeState.APPLIED
        # RESTORED: a node cut before any write, its cordon undone by resume, runs again
        elif s["state"] in (NodeState.PENDING, NodeState.APPLYING, NodeState.RESTORED):
            u["state"] = NodeState.APPLYING
    elif phase is Phase.FAILED:
        u["state"] = NodeState.FAILED
    elif step is Step.UNCORDON and phase is Phase.DONE:
        u["state"] = NodeState.RESTORED
        u["files_touched"] = False
    else:
        u["state"] = NodeState.RESTORING
    return u


def _from_fields(fields: Mapping[str, Any]) -> NodeStatus:
    """A ``NodeStatus`` holding a copy of every field in ``fields`` (the projection's fold)."""
    out = object.__new__(NodeStatus)
    out.__dict__.update(fields)
    return out


def _copy_with(s: NodeStatus, changes: Mapping[str, Any]) -> NodeStatus:
    """``dataclasses.replace`` without its per-call field checks (``NodeStatus`` has no
    ``__post_init__``; ``test_replay_states`` and the property that a projection equals a full
    replay hold either way)."""
    out = object.__new__(NodeStatus)
    out.__dict__.update(s.__dict__)
    out.__dict__.update(changes)
    return out


def cause_of(entry: Entry) -> StopCause | None:
    """The cause a change-level end records; None when it records none, or one this version
    does not know (its exit code is then the outcome's alone)."""
    cause = ChangeEnd.read(entry.data).cause
    try:
        return None if cause is None else StopCause(cause)
    except ValueError:
        return None


@dataclass(frozen=True)
class OwedRollback:
    """The rollback a running change is in (see :func:`owed_rollback`).

    Attributes:
        nodes: the nodes it restores (None: every node of the change).
        force: whether its restores overwrite node files edited after this change wrote them
            (``rollout rollback --force``, also handed over to the owner).
        by: who asked, for a rollback handed to the change's owner (None: ``rollout rollback``).
    """

    nodes: tuple[str, ...] | None
    force: bool = False
    by: str | None = None


def owed_rollback(entries: Iterable[Entry]) -> OwedRollback | None:
    """The rollback the change is in, as its journal says (pure): None when it is in none.

    While the change has no end (a change-level ``done`` / ``failed``) after its latest
    ``begin``: that ``begin``'s rollback when it is a rollback's (``rollout rollback``:
    :class:`~rollout.change.record.entries.RollbackAsked`), else the rollbacks handed to the
    owner (``request``: :class:`~rollout.change.record.entries.RequestRecord`) journaled since
    that ``begin`` (their nodes together, None when one names every node; forced when one
    is; ``by``: the first one's).

    This is the one rule for a restore's force policy: a restore overwrites files edited after
    our write only while the change is in a rollback whose journaled ask says ``--force``
    (``rollout.change.engine.context.Context.force_restore`` reads it here as each restore
    write starts). Each asker journals its ``force`` before any restore it governs, so a
    ``--force`` handed over mid-run takes effect from its ``request`` entry on (the nodes in
    flight, restored before it, are not forced); a resumed rollback keeps the force it was
    journaled with; every other restore (a failed node's, the gate's, ``resume`` settling a
    node, a change that has ended) keeps the node step's compare-and-swap.
    """
    running = True  # as replay: a journal with no begin yet is running
    asked: RollbackAsked | None = None
    requests: list[RequestRecord] = []
    for e in entries:
        if e.node is not None:
            continue
        if e.step == Kind.REQUEST:
            requests.append(RequestRecord.read(e.data))
        elif e.step == CHANGE_STEP and e.phase is Phase.BEGIN:
            running, asked, requests = True, ChangeBegin.read(e.data).rollback, []
        elif e.step == CHANGE_STEP:
            running = outcome_of(e) == ChangeOutcome.RUNNING
    if not running:
        return None
    if asked is not None:
        return OwedRollback(asked.nodes, asked.force)
    if not requests:
        return None
    named = [r.nodes or () for r in requests]
    nodes = None if not all(named) else tuple(dict.fromkeys(x for n in named for x in n))
    return OwedRollback(nodes, any(r.force for r in requests), requests[0].by)


def outcome_of(entry: Entry) -> ChangeOutcome:
    """The outcome a change-level ``done`` or ``failed`` entry records; one without an outcome
    (no version of rollout wrote one) reads as ``stopped`` when failed, else ``completed``."""
    recorded = ChangeEnd.read(entry.data).outcome
    if recorded is None:
        return ChangeOutcome.STOPPED if entry.phase is Phase.FAILED else ChangeOutcome.COMPLETED
    try:
        return ChangeOutcome(recorded)
    except ValueError:
        raise InputError(
            f"change {entry.change}: journal outcome {recorded!r} is not one this version of "
            f"rollout knows ({', '.join(ChangeOutcome)}); use the version that wrote it"
        ) from None
