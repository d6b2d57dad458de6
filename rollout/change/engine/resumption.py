"""Finishing an interrupted change: every node in flight settled, the gate a crash cut short.

Why its own module: ``rollout resume`` reads the journal a killed process left and decides, per
node, whether to finish the forward path or restore (:func:`settle_node`), and which gate the
interrupted command still owed (:func:`unfinished_gate`); the batches it had not started then run
through the same loop as ``apply`` and ``promote`` (``orchestrator.continue_change``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum

from rollout.change.engine.context import Context
from rollout.change.engine.forward import apply_and_verify
from rollout.change.engine.orchestrator import (
    GATE_STEP,
    UnfinishedGate,
    end_change,
    gate_points,
    rollback_targets,
)
from rollout.change.engine.parallel import in_parallel, wrap
from rollout.change.engine.restore import restore_node, restore_nodes
from rollout.change.kinds.registry import kind_of
from rollout.change.plan.batches import Batch
from rollout.change.record.change_outcomes import ChangeOutcome, StopCause
from rollout.change.record.entries import GateRecord, TriggerRecord, step_failed
from rollout.change.record.journal import Entry, Kind
from rollout.change.record.replay import (
    ChangeStatus,
    NodeStatus,
    owed_rollback,
    replay,
    status_of,
)
from rollout.errors import NodeFilesChangedError
from rollout.models import WRITE_PHASE, WRITES, NodeState, Phase, Step, StepPath
from rollout.verdicts import Verdict, VerdictStatus


def unfinished_gate(entries: Sequence[Entry], has_gate: bool) -> UnfinishedGate | None:
    """The gate an interrupted change owes before anything else may go on (pure).

    The gate points are those of the command that was interrupted: ``apply`` gates once over the
    canary after its last canary batch (a plan without a gate journals a Successful verdict
    too); ``promote`` gates after each promoted batch when the plan has a gate. The latest gate
    point whose nodes are all applied is owed when it has no ``gate`` verdict (the soak was cut:
    soak again), or when its verdict is not Successful (the command died before acting on it).
    None: the change has ended, or no gate is owed.
    """
    status = replay(entries)
    if status.outcome != ChangeOutcome.RUNNING:
        return None
    info = status.info
    canary = info.canary
    promotion = info.promotion
    ran = promotion.batches if promotion else info.batches
    batches = [Batch(tuple(b), bool(set(canary) & set(b))) for b in ran]
    points = list(gate_points(batches, canary, bool(promotion), has_gate).values())
    verdicts = {
        g.nodes: g
        for g in (
            GateRecord.read(e.data)
            for e in entries
            if e.step == GATE_STEP and e.phase is Phase.DONE
        )
    }
    triggers = [
        t
        for t in (TriggerRecord.read(e.data) for e in entries if e.step == Kind.TRIGGER)
        if t.trigger == "gate"
    ]
    for point in reversed(points):
        if not point or any(
            n not in status.nodes or status.nodes[n].state is not NodeState.APPLIED for n in point
        ):
            continue
        recorded = verdicts.get(point)
        if recorded is None:
            return UnfinishedGate(point, point == canary)
        outcome = VerdictStatus(recorded.status)
        if outcome is VerdictStatus.SUCCESSFUL:
            return None
        failed = (triggers[-1].nodes or ()) if triggers else ()
        verdict = Verdict(outcome, recorded.reason, failed_nodes=failed)
        return UnfinishedGate(point, point == canary, verdict)
    return None


class Settle(Enum):
    """What ``resume`` does with one node (:func:`settle_action`); the value says it in words."""

    LEAVE = "leave it"
    APPLY_AGAIN = "run apply again, verify, uncordon (restore on failure)"
    VERIFY = "verify, uncordon (restore on failure)"
    RESTORE_AGAIN = "run the restore again"
    RESTORE = "restore the original files, restart the kubelet, uncordon"
    UNDO_CORDON = "restore: nothing written, undo the cordon"


def settle_action(s: NodeStatus) -> Settle:
    """The decision :func:`settle_node` carries out, and ``resume --dry-run`` shows (pure)."""
    if s.state in (NodeState.PENDING, NodeState.APPLIED, NodeState.RESTORED):
        return Settle.LEAVE
    if s.state is NodeState.APPLYING and s.files_touched and s.phase is not Phase.FAILED:
        rerun = (s.step in WRITES and s.phase is Phase.BEGIN) or s.step in WRITE_PHASE
        return Settle.APPLY_AGAIN if rerun else Settle.VERIFY
    if s.state is NodeState.RESTORING:
        return Settle.RESTORE_AGAIN
    return Settle.RESTORE if s.files_touched else Settle.UNDO_CORDON


def settle_node(ctx: Context, s: NodeStatus) -> None:
    """Finish or undo one node after a crash (the decision ``resume`` makes per node).

    * nothing touched, applied or restored: leave it;
    * forward path, files not written yet, or a forward step failed: restore (undo the cordon);
    * forward path in the apply step: run apply again (idempotent), verify, uncordon;
      past apply: verify, uncordon; a failure there restores the node; a compare-and-swap that
      refuses the apply wrote nothing, so only the cordon is undone and NodeFilesChangedError
      is raised, as on the forward path;
    * restore path (or a failed restore): run the restore again.
    """
    action = settle_action(s)
    if action is Settle.LEAVE:
        return
    if action in (Settle.APPLY_AGAIN, Settle.VERIFY):
        change = kind_of(ctx).rebuild(ctx, s, for_restore=False)
        try:
            apply_and_verify(ctx, change, run_apply=action is Settle.APPLY_AGAIN)
            return
        except Exception as e:
            err = wrap(e)
            current = status_of(ctx.journal).nodes[s.node]
            step = current.step or Step.VERIFY
            if current.phase is not Phase.FAILED:  # a refused apply journaled its own failure
                ctx.record(s.node, step, Phase.FAILED, StepPath.FORWARD, step_failed(str(err)))
            ctx.on_event(f"{s.node}: {step.value} failed on resume: {err}; restoring the node")
            s = status_of(ctx.journal).nodes[s.node]
        restore_node(ctx, s)
        if isinstance(err, NodeFilesChangedError):  # as the forward path says it (forward.py)
            raise NodeFilesChangedError(
                f"node {s.node}: {step.value} failed: {err}; only the cordon was undone; "
                "plan the change again from the new files"
            )
        return
    restore_node(ctx, s)


def resume(ctx: Context, end: bool = True) -> ChangeStatus:
    """Settle every node of an interrupted change: each ends applied, restored, or untouched.

    ``end`` False: the change's ``resumed`` end is not journaled (the caller goes on with the
    change and ends it itself; a crash before that leaves the change running, so the next
    ``resume`` goes on too).

    Returns:
        The change's status: resumed (or still running with ``end`` False); resume-failed when a
        node could not be settled; stopped when the only failures were compare-and-swaps that
        refused a re-run apply (nothing written, cordons undone).
    """
    status = status_of(ctx.journal)
    todo = [s for s in status.nodes.values() if settle_action(s) is not Settle.LEAVE]
    ctx.on_event(f"resuming {status.change}: {', '.join(s.node for s in todo) or 'nothing to do'}")
    _, errors = in_parallel(
        [s.node for s in todo], lambda n: settle_node(ctx, status.nodes[n]), ctx.forks
    )
    if errors:
        what = "; ".join(str(e) for e in errors.values())
        if all(isinstance(e, NodeFilesChangedError) for e in errors.values()):
            # nothing written anywhere, only cordons undone: the change stops as apply's does
            cause = StopCause.FILES_CHANGED
            return end_change(ctx, ChangeOutcome.STOPPED, what, Phase.FAILED, cause)
        return end_change(ctx, ChangeOutcome.RESUME_FAILED, what, Phase.FAILED, StopCause.RESUME)
    return end_resumed(ctx) if end else status_of(ctx.journal)


def end_resumed(ctx: Context) -> ChangeStatus:
    """Journal the end of a resume that had nothing more to run."""
    return end_change(ctx, ChangeOutcome.RESUMED, "every node settled")


@dataclass(frozen=True)
class PendingRollback:
    """A rollback the interrupted process had begun and not finished (see
    :func:`unfinished_rollback`).

    Attributes:
        nodes: the nodes it restores (None: every node of the change).
        force: whether files edited after our write are overwritten (``rollback --force``).
        by: who asked, for a rollback handed to the change's owner (None: ``rollout rollback``).
    """

    nodes: tuple[str, ...] | None
    force: bool = False
    by: str | None = None


def unfinished_rollback(entries: Sequence[Entry]) -> PendingRollback | None:
    """The rollback an interrupted change still owes (pure), or None.

    Owed while the change has no end: when its latest ``begin`` is a rollback's
    (``rollout rollback``, its ``ChangeBegin.rollback``), or when the owner
    journaled a handed-over rollback request (``request``) after it and died before ending
    (:func:`rollout.change.record.replay.owed_rollback`, the rule the restore's force policy
    is read by too).
    """
    owed = owed_rollback(entries)
    return None if owed is None else PendingRollback(owed.nodes, owed.force, owed.by)


def resume_rollback(ctx: Context, pending: PendingRollback) -> ChangeStatus:
    """Finish an interrupted rollback: the nodes it names restored (those already restored are
    not touched again), every other node in flight settled as :func:`resume` settles it. Its
    restores are forced as the rollback was asked: ``Context.force_restore`` reads the ``force``
    it journaled by :func:`unfinished_rollback`'s rule; nothing here decides it again.

    Returns:
        The ended status: rolled back, or rollback-failed when a node could not be restored or
        settled.
    """
    status = status_of(ctx.journal)
    named = set(pending.nodes or status.nodes)
    others = [
        n
        for n, s in status.nodes.items()
        if n not in named
        and s.state not in (NodeState.PENDING, NodeState.APPLIED, NodeState.RESTORED)
    ]
    _, errors = in_parallel(others, lambda n: settle_node(ctx, status.nodes[n]), ctx.forks)
    status = status_of(ctx.journal)
    targets = rollback_targets(status, pending.nodes)
    ctx.on_event(f"finishing the rollback: {', '.join(targets) or 'nothing left to restore'}")
    errors.update(restore_nodes(ctx, [status.nodes[n] for n in targets]))
    what = f"rolled back on request of {pending.by}" if pending.by else "rollback"
    pending_cause = StopCause.ROLLBACK  # a rollback finished: resume exits as rollback does
    if errors:
        what += " (finished by resume); failed: " + "; ".join(str(e) for e in errors.values())
        return end_change(ctx, ChangeOutcome.ROLLBACK_FAILED, what, Phase.FAILED, pending_cause)
    done = [n for n, s in status.nodes.items() if n in named and s.state is not NodeState.PENDING]
    what += f" finished by resume; restored: {', '.join(done)}"
    return end_change(ctx, ChangeOutcome.ROLLED_BACK, what, cause=pending_cause)


_WRITES = frozenset(s.value for s in WRITES)


def rerun_nodes(entries: Sequence[Entry]) -> set[str]:
    """The nodes an interrupted apply / promote had cut before writing any file, by a crash
    (pure): their forward path began, their ``apply`` never began, no step of theirs failed, and
    no rollback is owed. ``resume`` undoes their cordon and runs them again in their batch.

    The answer is the same before that undo and after it (the node is then restored, its
    forward path still unwritten), so a resume killed between the two is finished by the next.
    """
    status = replay(entries)
    if status.outcome != ChangeOutcome.RUNNING or unfinished_rollback(entries) is not None:
        return set()
    forward: set[str] = set()
    excluded: set[str] = set()
    for e in entries:
        if e.node is None:
            continue
        if e.phase is Phase.FAILED or (e.step in _WRITES and e.path is not StepPath.RESTORE):
            excluded.add(e.node)
        if e.path is not StepPath.RESTORE:
            forward.add(e.node)
    settled_or_cut = (NodeState.APPLYING, NodeState.RESTORING, NodeState.RESTORED)
    return {
        n
        for n in forward - excluded
        if n in status.nodes and status.nodes[n].state in settled_or_cut
    }


def _ends_restored(s: NodeStatus) -> bool:
    """Whether the node ends restored after :func:`settle_node` (a verify that fails on resume
    restores it too; that is not foreseen here)."""
    return s.state is NodeState.RESTORED or settle_action(s) in (
        Settle.RESTORE_AGAIN,
        Settle.RESTORE,
        Settle.UNDO_CORDON,
    )


@dataclass(frozen=True)
class ResumePreview:
    """What ``rollout resume`` would do with a change (:func:`resume_preview`).

    Attributes:
        change: the change id.
        outcome: the change's outcome now (``running`` for an interrupted one).
        rollback: the rollback owed (None: none); ``resume`` then finishes it, never going on.
        nodes: node -> (state now, what resume would do), for every node not left as it is.
        rerun: nodes cut before any file was written, run again in their batch.
        gate: the gate owed first (its nodes), or None.
        batches: the batches that would run after (nodes still pending, or rerun), in order;
            empty when a node had failed forward (the interrupted command would have stopped).
        stops: why no later batch would run, when one would not.
    """

    change: str
    outcome: str
    rollback: PendingRollback | None
    nodes: dict[str, tuple[str, str]]
    rerun: tuple[str, ...]
    gate: tuple[str, ...] | None
    batches: tuple[tuple[str, ...], ...]
    stops: str = ""

    def to_dict(self) -> dict[str, object]:
        rb = self.rollback
        return {
            "change": self.change,
            "outcome": self.outcome,
            "rollback": None
            if rb is None
            else {"nodes": list(rb.nodes) if rb.nodes else None, "force": rb.force, "by": rb.by},
            "nodes": [{"node": n, "state": st, "action": a} for n, (st, a) in self.nodes.items()],
            "rerun": list(self.rerun),
            "gate": list(self.gate) if self.gate is not None else None,
            "batches": [list(b) for b in self.batches],
            "stops": self.stops or None,
        }


def resume_preview(entries: Sequence[Entry], change: str, has_gate: bool) -> ResumePreview:
    """What ``rollout resume`` would do, decided from the journal alone as it decides (pure;
    ``has_gate``: the recorded plan has a gate). Nothing is read from nodes: a node's files are
    compared with the journal when resume runs, not here."""
    status = replay(entries, change)
    acts = {
        n: (s.state.value, act.value)
        for n, s in status.nodes.items()
        if (act := settle_action(s)) is not Settle.LEAVE
    }
    running = status.outcome == ChangeOutcome.RUNNING
    pending = unfinished_rollback(entries) if running else None
    cut = tuple(sorted(rerun_nodes(entries))) if running and pending is None else ()
    if pending is not None:
        for n in rollback_targets(status, pending.nodes):
            acts[n] = (status.nodes[n].state.value, "restore (the rollback owed)")
        return ResumePreview(
            change, status.outcome.value, pending, acts, (), None, (), "a rollback is owed"
        )
    if not running:
        why = f"the change has ended ({status.outcome.value}): nothing more starts"
        return ResumePreview(change, status.outcome.value, None, acts, (), None, (), why)
    failed = [n for n, s in status.nodes.items() if n not in cut and _ends_restored(s)]
    if failed:
        why = f"a node failed forward ({', '.join(sorted(failed))}): the command would have stopped"
        return ResumePreview(change, status.outcome.value, None, acts, cut, None, (), why)
    batches = tuple(
        b
        for b in (
            tuple(n for n in batch if status.nodes[n].state is NodeState.PENDING or n in cut)
            for batch in status.info.batches
        )
        if b
    )
    regate = unfinished_gate(entries, has_gate)
    gate = tuple(regate.nodes) if regate is not None else None
    return ResumePreview(change, status.outcome.value, None, acts, cut, gate, batches)
