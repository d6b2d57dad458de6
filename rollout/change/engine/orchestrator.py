"""The change loop: batches, the gate after the canary, a handed-over rollback, ``rollback``.

Why this shape: each node step is journaled before and after it runs (``forward.py``), so any
interruption leaves a record that says exactly what to finish or undo (``resumption.py``); any
failure on a node restores that node (``restore.py``) and stops the rollout before another
batch is touched; the canary batch ends at a :class:`~rollout.protocols.Gate` (the rejection-rate
gate plugs in there). The loop sees the world only through the Protocols in
``rollout.protocols``, so its decisions are unit-tested with fakes and proven end to end in the
lab.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime
from typing import Any

from rollout.change.engine.context import Context, RestoreBracket
from rollout.change.engine.forward import apply_batch
from rollout.change.engine.restore import restore_nodes
from rollout.change.kinds.registry import kind_name, kind_of
from rollout.change.plan.batches import Batch
from rollout.change.plan.windows import Decision
from rollout.change.record.change_outcomes import ChangeOutcome, StopCause
from rollout.change.record.entries import (
    ChangeBegin,
    ChangeEnd,
    GateRecord,
    RequestRecord,
    RollbackAsked,
)
from rollout.change.record.journal import CHANGE_STEP, Kind
from rollout.change.record.replay import ChangeStatus, status_of
from rollout.errors import (
    InputError,
    NodeFilesChangedError,
    PreflightError,
    RolloutError,
)
from rollout.fanout import waves
from rollout.interrupt import StopReason, StopRequested
from rollout.models import NodeState, Phase, StepPath
from rollout.protocols import Gate, OneSoak
from rollout.verdicts import Verdict, VerdictStatus

GATE_STEP = Kind.GATE
"""The step name of gate entries (node is None): ``begin`` when the soak starts (``nodes``),
``done`` with the verdict (``status``, ``reason``, ``nodes``)."""

REQUEST_STEP = Kind.REQUEST
"""The step name of the entry the owner journals when a rollback is handed to it (node None:
``by``, ``nodes``, ``request``, ``force``) before it restores anything."""


class NoGate(OneSoak):
    """The default gate: lets the rollout go on (``--canary`` still holds after the canary)."""

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        """Always Successful, saying why."""
        return Verdict(VerdictStatus.SUCCESSFUL, "no gate configured")


def summary(status: ChangeStatus) -> str:
    """Every node's state, one per line (what failure messages and ``status`` print)."""
    lines = []
    for s in status.nodes.values():
        where = ""
        if s.step and s.phase:
            where = f" ({(s.path or StepPath.FORWARD).value} {s.step.value} {s.phase.value})"
        cordon = " [was cordoned before]" if s.prior_cordoned else ""
        msg = f": {s.message}" if s.message and s.state is not NodeState.APPLIED else ""
        lines.append(f"  {s.node}: {s.state.value}{where}{cordon}{msg}")
    return "\n".join(lines)


def end_change(
    ctx: Context,
    outcome: ChangeOutcome,
    message: str,
    phase: Phase = Phase.DONE,
    cause: StopCause | None = None,
) -> ChangeStatus:
    """Journal the change's end (its outcome, message and cause) and return its status; the
    kind's work at a change's end first (``RestoreBracket.change_end``: a claim freeze left
    applied is removed, whoever ends the change)."""
    kind = kind_of(ctx)
    if isinstance(kind, RestoreBracket):
        kind.change_end(ctx)
    end = ChangeEnd(outcome.value, message, cause.value if cause is not None else None)
    ctx.journal.append(CHANGE_STEP, phase, now=ctx.clock.now(), data=end.data())
    return status_of(ctx.journal)


_PREFIX: Mapping[tuple[ChangeOutcome, StopCause | None], str] = {
    (ChangeOutcome.STOPPED, StopCause.NODE_FAILED): "rollout stopped: ",
    (ChangeOutcome.STOPPED, StopCause.FILES_CHANGED): "rollout stopped: ",
    (ChangeOutcome.ROLLBACK_FAILED, StopCause.ROLLBACK): "rollback failed: ",
    (ChangeOutcome.RESUME_FAILED, StopCause.RESUME): "resume failed: ",
}


def failure_text(status: ChangeStatus) -> str:
    """What a command that ended with ``status`` says on stderr when it exits non-zero: the
    change's message, then every node's state (pure)."""
    prefix = _PREFIX.get((status.outcome, status.cause), "")
    return f"{prefix}{status.message}\nnode states:\n{summary(status)}"


def run_change(
    ctx: Context,
    changes: Mapping[str, Any],
    batches: Sequence[Batch],
    gate: Gate,
    canary_only: bool,
    info: ChangeBegin | None = None,
    forward: Callable[[datetime], Decision] | None = None,
) -> ChangeStatus:
    """Apply the change batch by batch; the gate decides after the last canary batch.

    ``forward`` (``rollout.change.plan.windows.guard``) is asked before each batch: refused before
    the first,
    the change does not start (PreflightError, nothing journaled); refused later, the batch in
    flight has finished and the change holds. Its decision (and any forced reason) is journaled.

    Returns:
        The change's status as it ended: completed, held; stopped (a node failed and was
        restored, a node's files changed, the Lease was lost) or rolled back (the gate failed
        the canary, or a rollback was handed over), with the cause recorded.

    Raises:
        PreflightError: the change window refused the first batch (nothing journaled).
    """
    window = forward(ctx.clock.now()) if forward else None
    if window is not None and not window.allowed:
        raise PreflightError(window.reason)
    nodes = [n for b in batches for n in b.nodes]
    nodes += [n for n in changes if n not in nodes]  # untouched by --canary, listed as pending
    info = info or ChangeBegin()
    begin = replace(
        info,
        kind=kind_name(kind_of(ctx)) or info.kind,
        nodes=tuple(nodes),
        batches=tuple(tuple(b.nodes) for b in batches),
        canary=tuple(n for b in batches if b.canary for n in b.nodes),
        canary_only=canary_only,
        window=window.as_dict() if window else info.window,
    )
    ctx.journal.append(CHANGE_STEP, Phase.BEGIN, now=ctx.clock.now(), data=begin.data())
    gate_at = gate_points(batches, begin.canary, promoted=False, has_gate=True)
    try:
        return _batches(ctx, changes, batches, gate, canary_only, gate_at, forward)
    except StopRequested as e:
        return _stopped(ctx, e.reason)


def continue_change(
    ctx: Context,
    changes: Mapping[str, Any],
    batches: Sequence[Batch],
    gate: Gate | None,
    info: ChangeBegin,
    forward: Callable[[datetime], Decision] | None = None,
    gate_at: Mapping[int, Sequence[str]] | None = None,
    canary_only: bool = False,
    regate: UnfinishedGate | None = None,
) -> ChangeStatus:
    """Run more batches in an existing change (``promote``, and ``resume`` of later batches).

    A change-level ``begin`` with ``info`` (the whole change's nodes and batches, and what
    started this part) is journaled first, so ``status`` shows it; then the batches, with the
    ``gate`` after each one when there is one (or after the batches ``gate_at`` names, over the
    nodes it names; with ``canary_only`` the change holds after the last of them; ``regate``, a
    gate a crash cut short, is settled first: see :func:`unfinished_gate`). Same rules as
    :func:`run_change`: a node failure restores it and stops, a handed-over rollback or a lost
    Lease stops forward work.

    Returns:
        The change's status as it ended, as :func:`run_change`'s.
    """
    begin = replace(info, kind=kind_name(kind_of(ctx)) or info.kind)
    ctx.journal.append(CHANGE_STEP, Phase.BEGIN, now=ctx.clock.now(), data=begin.data())
    if gate_at is None:
        gate_at = gate_points(batches, (), promoted=True, has_gate=gate is not None)
    try:
        return _batches(
            ctx, changes, batches, gate or NoGate(), canary_only, gate_at, forward, regate
        )
    except StopRequested as e:
        return _stopped(ctx, e.reason)


def _batches(
    ctx: Context,
    changes: Mapping[str, Any],
    batches: Sequence[Batch],
    gate: Gate,
    canary_only: bool,
    gate_at: Mapping[int, Sequence[str]],
    forward: Callable[[datetime], Decision] | None,
    regate: UnfinishedGate | None = None,
) -> ChangeStatus:
    """The batch loop: the gate runs after batch ``i`` over ``gate_at[i]``; with
    ``canary_only`` the change holds after the last gate. Raises StopRequested once forward work
    must stop.

    ``regate``: a gate the interrupted command had begun (or was due to begin) and not acted on,
    settled before the first batch (``resume``): soaked again, or its recorded verdict acted on.
    """
    if regate is not None:
        which = "the canary" if regate.canary else "the last batch"
        again = "soaking again" if regate.verdict is None else "acting on its recorded verdict"
        ctx.on_event(f"gate over {', '.join(regate.nodes)} was cut short by a crash: {again}")
        held = _gate(ctx, gate, list(regate.nodes), which, regate.verdict)
        if held is not None:
            return held
        if canary_only and not gate_at:
            return end_change(
                ctx, ChangeOutcome.HELD, f"canary applied; holding (gate: {_last_reason(ctx)})"
            )
    for i, batch in enumerate(batches):
        ctx.interrupt.check()
        if forward is not None and i > 0 and not (window := forward(ctx.clock.now())).allowed:
            return end_change(
                ctx, ChangeOutcome.HELD, f"change window closed; holding: {window.reason}"
            )
        _ahead(ctx, batches[i + 1].nodes if i + 1 < len(batches) else ())
        failures = _apply_in_waves(ctx, changes, batch.nodes, f"batch {i + 1}/{len(batches)}")
        ctx.interrupt.check()  # the batch's failures are the interrupt's doing: settle below
        if failures:
            what = "; ".join(str(e) for e in failures.values())
            files = all(isinstance(e, NodeFilesChangedError) for e in failures.values())
            cause = StopCause.FILES_CHANGED if files else StopCause.NODE_FAILED
            return end_change(ctx, ChangeOutcome.STOPPED, what, Phase.FAILED, cause)
        if i not in gate_at:
            continue
        which = "the canary" if batch.canary else f"batch {i + 1}"
        held = _gate(ctx, gate, list(gate_at[i]), which)
        if held is not None:
            return held
        if canary_only and i == max(gate_at):
            return end_change(
                ctx, ChangeOutcome.HELD, f"canary applied; holding (gate: {_last_reason(ctx)})"
            )
    ctx.interrupt.check()
    return end_change(ctx, ChangeOutcome.COMPLETED, f"{len(changes)} node(s) applied")


def _ahead(ctx: Context, later: Sequence[str]) -> None:
    """As a batch begins, the caller hears which nodes the next batch holds (none: this batch
    is the last; ``Context.next_batch``). Nothing changes on a node here; a failure only means
    that what the caller would open ahead opens later."""
    try:
        ctx.next_batch(tuple(later))
    except Exception as e:  # an optimisation: never a reason to stop the change
        ctx.on_event(f"warning: could not ready the next batch ahead: {e}")


def _apply_in_waves(
    ctx: Context, changes: Mapping[str, Any], nodes: Sequence[str], name: str
) -> Mapping[str, RolloutError]:
    """Apply one batch; a batch wider than ``ctx.forks`` runs in consecutive waves of at most
    that many nodes (``rollout.fanout.waves``), each wave's nodes through their whole forward
    path before the next wave starts, and the progress display says so. A wave with a failed
    node ends the batch: the later waves' nodes stay pending (untouched), as a later batch's do.

    Returns:
        The failed nodes of the last wave run (empty: every node applied and verified).
    """
    parts = waves(list(nodes), ctx.forks)
    if len(parts) <= 1:
        ctx.on_event(f"{name}: {', '.join(nodes)}")
        return apply_batch(ctx, [changes[n] for n in nodes])
    ctx.on_event(
        f"{name}: {len(nodes)} node(s) in {len(parts)} waves of at most {ctx.forks} "
        f"(--forks {ctx.forks})"
    )
    for j, wave in enumerate(parts):
        if j:
            ctx.interrupt.check()
        ctx.on_event(f"{name} wave {j + 1}/{len(parts)}: {', '.join(wave)}")
        failures = apply_batch(ctx, [changes[n] for n in wave])
        if failures:
            return failures
    return {}


def _gate(
    ctx: Context,
    gate: Gate,
    nodes: Sequence[str],
    which: str,
    recorded: Verdict | None = None,
) -> ChangeStatus | None:
    """Soak the gate over ``nodes`` (journaled ``gate`` begin, then the verdict as ``gate`` done)
    and act on the verdict: Failed restores the nodes it names and ends the change rolled back,
    anything else but Successful holds; either returns the ended status. None: go on. With
    ``recorded``, a verdict the interrupted command journaled but had not acted on is acted on
    without soaking again.

    Raises:
        StopRequested: forward work must stop (a handed-over rollback, a lost Lease).
    """
    if recorded is None:
        verdict = _soak(ctx, nodes, lambda: gate.evaluate(ctx.journal.change_id, nodes))
    else:
        verdict = recorded
    ctx.on_event(f"gate: {verdict.status.value}: {verdict.reason}")
    if verdict.status is VerdictStatus.FAILED:
        status = status_of(ctx.journal)
        targets = _targets(status, nodes, verdict)
        errors = _restore_many(ctx, targets, status)
        restored = list(targets)
        # onFailure: rollback-affected: the soak goes on over the nodes not rolled back, until
        # it ends; a rejection there rolls that node back too
        while gate.soaks_on() and ctx.interrupt.reason() is None:
            rest = [n for n in nodes if n not in restored]
            if not rest:
                break
            watch = functools.partial(gate.keep_watching, ctx.journal.change_id, rest)
            again = _soak(ctx, rest, watch)
            ctx.on_event(f"gate: {again.status.value}: {again.reason}")
            if again.status is not VerdictStatus.FAILED:
                break
            status = status_of(ctx.journal)
            also = _targets(status, rest, again)
            errors.update(_restore_many(ctx, also, status))
            restored += also
        what = f"gate failed {which}: {verdict.reason}; restored {', '.join(restored)}"
        if errors:
            what += "; restore failed: " + "; ".join(str(e) for e in errors.values())
        if ctx.interrupt.reason() is not None:  # a request came meanwhile: settle it too
            raise StopRequested(ctx.interrupt.reason())  # type: ignore[arg-type]
        if workload := gate.after_rollback(ctx.journal.change_id, restored):
            what += f"; {workload}"
        return end_change(ctx, ChangeOutcome.ROLLED_BACK, what, Phase.FAILED, StopCause.GATE_FAILED)
    ctx.interrupt.check()
    if verdict.status is not VerdictStatus.SUCCESSFUL:
        return end_change(
            ctx, ChangeOutcome.HELD, f"gate {verdict.status.value}: {verdict.reason}; holding"
        )
    return None


def _soak(ctx: Context, nodes: Sequence[str], run: Callable[[], Verdict]) -> Verdict:
    """One soak over ``nodes``, journaled as ``gate`` begin, then done with its verdict."""
    soak = GateRecord(tuple(nodes))
    ctx.journal.append(GATE_STEP, Phase.BEGIN, now=ctx.clock.now(), data=soak.data())
    verdict = run()
    done = replace(soak, status=verdict.status.value, reason=verdict.reason)
    ctx.journal.append(GATE_STEP, Phase.DONE, now=ctx.clock.now(), data=done.data())
    return verdict


def _targets(status: ChangeStatus, nodes: Sequence[str], verdict: Verdict) -> list[str]:
    """The nodes a Failed verdict restores: those it names (its onFailure policy: the node pool,
    which may reach past ``nodes`` to earlier batches, or the affected nodes), all of ``nodes``
    when it names none; never a node already restored or never touched."""
    named = [n for n in status.nodes if n in verdict.failed_nodes] or list(nodes)
    return [
        n
        for n in named
        if n in status.nodes
        and status.nodes[n].state not in (NodeState.RESTORED, NodeState.PENDING)
    ]


def node_pool(status: ChangeStatus) -> list[str]:
    """The node pool a Failed gate restores under ``onFailure: rollback-group``: every node of
    the change on the new config (the canary, and the batches promoted so far; not the nodes
    never touched nor those already restored) (pure)."""
    return [
        n for n, s in status.nodes.items() if s.state not in (NodeState.PENDING, NodeState.RESTORED)
    ]


def _last_reason(ctx: Context) -> str:
    done = [e for e in ctx.journal.entries() if e.step == GATE_STEP and e.phase is Phase.DONE]
    return GateRecord.read(done[-1].data).reason if done else ""


def gate_points(
    batches: Sequence[Batch], canary: Sequence[str], promoted: bool, has_gate: bool
) -> dict[int, tuple[str, ...]]:
    """Where the gate runs (pure): batch index -> the nodes it soaks over, as the command that
    runs ``batches`` places it. ``apply`` (``promoted`` False) gates once, after its last canary
    batch, over the whole ``canary`` (also without a ``gate`` section: the default gate journals
    a Successful verdict there); ``promote`` gates after each batch, over that batch, when the
    change has a gate (``has_gate``), else never. The one derivation: ``apply``, ``promote``,
    ``resume`` and the gate a crash cut short
    (:func:`rollout.change.engine.resumption.unfinished_gate`) all read it from here."""
    if promoted:
        return {i: tuple(b.nodes) for i, b in enumerate(batches)} if has_gate else {}
    last = max((i for i, b in enumerate(batches) if b.canary), default=None)
    return {last: tuple(canary)} if last is not None else {}


@dataclass(frozen=True)
class UnfinishedGate:
    """A gate the interrupted command owed and had not acted on (see :func:`unfinished_gate`).

    Attributes:
        nodes: the nodes the gate is over.
        canary: whether it is the canary's gate.
        verdict: the verdict it journaled but had not acted on (None: no verdict: soak again).
    """

    nodes: tuple[str, ...]
    canary: bool
    verdict: Verdict | None = None


def _stopped(ctx: Context, reason: StopReason) -> ChangeStatus:
    """Forward work stopped (the nodes in flight are already restored): roll back on a request,
    or end on a lost Lease.

    A request's node set may grow while the rollback runs (more requests joined it): every node
    named is restored once, nodes already restored are not touched again.

    Returns:
        The ended status: rolled back (or rollback-failed) on request of ``reason.by``, or
        stopped when the Lease was lost (nothing new started).
    """
    if reason.lost:
        what = f"lost the cluster lock: {reason.by}; started nothing new, nodes in flight restored"
        return end_change(ctx, ChangeOutcome.STOPPED, what, Phase.FAILED, StopCause.LEASE_LOST)
    ctx.on_event(f"rollback requested by {reason.by}: stopping forward work")
    ctx.journal.append(
        REQUEST_STEP,
        Phase.DONE,
        now=ctx.clock.now(),
        data=RequestRecord(
            by=reason.by,
            nodes=tuple(reason.nodes) if reason.nodes else None,
            request=reason.request_id,
            seen_at=reason.at,
            force=reason.force,  # ``--force`` handed over: the restores below read it here
        ).data(),
    )
    done: set[str] = set()
    errors: dict[str, RolloutError] = {}
    while True:
        current = ctx.interrupt.reason() or reason
        if current.lost:
            break  # restore nothing more; the rollback so far is journaled
        status = status_of(ctx.journal)
        wanted = current.nodes or tuple(status.nodes)
        targets = [
            n
            for n in wanted
            if n in status.nodes
            and n not in done
            and status.nodes[n].state not in (NodeState.PENDING, NodeState.RESTORED)
        ]
        done.update(wanted)
        if not targets:
            break
        ctx.on_event(f"rolling back: {', '.join(targets)}")
        errors.update(_restore_many(ctx, targets, status))
    what = f"rolled back on request of {reason.by}"
    outcome = ChangeOutcome.ROLLED_BACK
    if errors:
        what += "; restore failed: " + "; ".join(str(e) for e in errors.values())
        outcome = ChangeOutcome.ROLLBACK_FAILED
    return end_change(ctx, outcome, what, Phase.FAILED, StopCause.REQUESTED)


def _restore_many(
    ctx: Context, nodes: Sequence[str], status: ChangeStatus
) -> dict[str, RolloutError]:
    return restore_nodes(ctx, [status.nodes[n] for n in nodes])


def rollback_targets(status: ChangeStatus, nodes: Sequence[str] | None) -> list[str]:
    """The nodes a rollback of ``nodes`` (None: all) still has to restore (pure)."""
    return [
        n
        for n, s in status.nodes.items()
        if (not nodes or n in nodes) and s.state not in (NodeState.PENDING, NodeState.RESTORED)
    ]


def rollback(ctx: Context, nodes: Sequence[str] | None = None, force: bool = False) -> ChangeStatus:
    """Restore the given nodes (default: every node this change touched).

    A change-level ``begin`` is journaled first (the change's info, its ``rollback``
    (:class:`~rollout.change.record.entries.RollbackAsked`) naming ``nodes`` and ``force``): a
    rollback killed part way is then an unfinished change that ``rollout resume`` finishes, as it
    finishes an apply; the restores read their force policy from that entry
    (``Context.force_restore``).

    Returns:
        The ended status: rolled back, or rollback-failed when a restore failed (the others
        still ran).

    Raises:
        InputError: a named node is not part of the change.
    """
    status = status_of(ctx.journal)
    if nodes:
        unknown = [n for n in nodes if n not in status.nodes]
        if unknown:
            raise InputError(
                f"node(s) {', '.join(unknown)} not part of change {status.change}; "
                f"its nodes: {', '.join(status.nodes)}"
            )
    asked = RollbackAsked(tuple(nodes) if nodes else None, force)  # read by every restore below
    begin = replace(status.info, rollback=asked)
    ctx.journal.append(CHANGE_STEP, Phase.BEGIN, now=ctx.clock.now(), data=begin.data())
    targets = rollback_targets(status, nodes)
    ctx.on_event(f"rolling back: {', '.join(targets) or 'nothing to restore'}")
    errors = _restore_many(ctx, targets, status)
    if errors:
        what = "; ".join(str(e) for e in errors.values())
        return end_change(
            ctx, ChangeOutcome.ROLLBACK_FAILED, what, Phase.FAILED, StopCause.ROLLBACK
        )
    restored = f"restored: {', '.join(targets) or 'none'}"
    return end_change(ctx, ChangeOutcome.ROLLED_BACK, restored, cause=StopCause.ROLLBACK)
