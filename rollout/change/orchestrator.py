"""The apply / rollback / resume loop: cordon, drain, write, restart, verify, uncordon, journaled.

Why this shape: each node step is journaled before and after it runs, so any interruption leaves a
record that says exactly what to finish or undo; where the node step goes over plain ssh each node
of a batch runs its whole forward path on its own (a batch takes its slowest node's drain +
restart + verify), else the nodes of a batch share one apply playbook run (Ansible's start-up paid
once per batch) while every other step, and every outcome, stays per node; any failure on a
node restores that node (``restoring.py``) and stops the rollout before another batch is touched;
the canary batch ends at a :class:`~rollout.protocols.Gate` (the rejection-rate gate plugs in
there). The loop sees the world
only through the Protocols in ``rollout.protocols``, so its decisions are unit-tested with fakes and
proven end to end in the lab.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rollout.change.draining import drain
from rollout.change.journal import CHANGE_STEP, ChangeStatus, Entry, NodeStatus, replay
from rollout.change.planning import Batch, device_resources
from rollout.change.restoring import (
    Context,
    change_from_record,
    change_record,
    in_parallel,
    restore_node,
    restore_nodes,
    run_many,
    wrap,
)
from rollout.change.verifying import WATCHED, config_subset, verify
from rollout.change.windows import Decision
from rollout.errors import (
    InputError,
    LeaseLostError,
    NodeFilesChangedError,
    NodeOperationError,
    PreflightError,
    RolloutError,
)
from rollout.interrupt import StopReason, StopRequested
from rollout.models import (
    FileBackup,
    NodeChange,
    NodeState,
    Path,
    Phase,
    Step,
    Verdict,
    VerdictStatus,
)
from rollout.protocols import Gate, RunResult

GATE_STEP = "gate"
"""The step name of gate entries (node is None): ``begin`` when the soak starts (``nodes``),
``done`` with the verdict (``status``, ``reason``, ``nodes``)."""


class NoGate:
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
            where = f" ({(s.path or Path.FORWARD).value} {s.step.value} {s.phase.value})"
        cordon = " [was cordoned before]" if s.prior_cordoned else ""
        msg = f": {s.message}" if s.message and s.state is not NodeState.APPLIED else ""
        lines.append(f"  {s.node}: {s.state.value}{where}{cordon}{msg}")
    return "\n".join(lines)


def _prepare(ctx: Context, change: NodeChange) -> dict[str, str]:
    """The forward steps before any file is written: preflight, cordon, drain, backup.

    Returns:
        The node's device allocatable before the change (what verify compares with).
    """
    node = change.node
    rec = ctx.record
    rec(node, Step.PREFLIGHT, Phase.BEGIN, Path.FORWARD)
    info = ctx.cluster.node(node)
    keys = tuple(dict.fromkeys((*WATCHED, *change.expected)))
    prior = config_subset(ctx.cluster.configz(node), keys)
    devices = device_resources(info.allocatable)
    rec(node, Step.PREFLIGHT, Phase.DONE, Path.FORWARD, {"configz": prior, "allocatable": devices})

    ctx.interrupt.check()
    rec(node, Step.CORDON, Phase.BEGIN, Path.FORWARD, {"priorCordoned": info.unschedulable})
    ours = not info.unschedulable
    if ours:
        ctx.cluster.cordon(node)
    rec(node, Step.CORDON, Phase.DONE, Path.FORWARD, {"cordonedByUs": ours})
    ctx.on_event(f"{node}: cordoned" if ours else f"{node}: already cordoned; will stay so")

    ctx.interrupt.check()
    rec(node, Step.DRAIN, Phase.BEGIN, Path.FORWARD)
    report = drain(ctx.cluster, node, ctx.drain, ctx.forward_clock, ctx.on_event)
    rec(node, Step.DRAIN, Phase.DONE, Path.FORWARD, {"evicted": list(report.evicted)})
    ctx.on_event(f"{node}: drained ({len(report.evicted)} pod(s) evicted)")

    ctx.interrupt.check()
    rec(node, Step.BACKUP, Phase.BEGIN, Path.FORWARD, {"paths": list(change.touched)})
    backups = []
    for path in change.touched:
        content = change.before.get(path)
        mode, owner, group = change.before_meta.get(path, ("0644", "root", "root"))
        if content is None:
            backups.append(FileBackup(path, existed=False))
        else:
            digest = ctx.journal.save_backup(node, content)
            backups.append(FileBackup(path, True, digest, mode, owner, group))
    blobs = {p: ctx.journal.save_backup(node, c) for p, c in change.files.items()}
    rec(
        node,
        Step.BACKUP,
        Phase.DONE,
        Path.FORWARD,
        {"files": [vars(b) for b in backups], "change": change_record(change, blobs)},
    )
    return devices


def _fail_and_restore(
    ctx: Context, failures: Mapping[str, RolloutError]
) -> dict[str, NodeOperationError | NodeFilesChangedError]:
    """Journal each node's failed forward step, then restore those nodes together.

    Returns:
        One error per node saying which step failed and whether its restore held.
    """
    steps: dict[str, Step] = {}
    status = replay(ctx.journal.entries())
    for node, err in failures.items():
        current = status.nodes.get(node, NodeStatus(node))
        step = current.step or Step.PREFLIGHT
        if current.phase is not Phase.FAILED:
            ctx.record(node, step, Phase.FAILED, Path.FORWARD, {"message": str(err)})
        steps[node] = step
        ctx.on_event(f"{node}: {step.value} failed: {err}; restoring the node")
    status = replay(ctx.journal.entries())
    restore_errors = restore_nodes(ctx, [status.nodes[n] for n in failures])
    out: dict[str, NodeOperationError | NodeFilesChangedError] = {}
    for node, err in failures.items():
        what = f"node {node}: {steps[node].value} failed: {err}"
        if node in restore_errors:
            out[node] = NodeOperationError(f"{what}; and then {restore_errors[node]}")
        elif isinstance(err, NodeFilesChangedError):
            out[node] = NodeFilesChangedError(
                f"{what}; only the cordon was undone; plan the change again from the new files"
            )
        else:
            out[node] = NodeOperationError(f"{what}; node restored")
    return out


def apply_batch(
    ctx: Context, changes: Sequence[NodeChange]
) -> dict[str, NodeOperationError | NodeFilesChangedError]:
    """The forward path on the nodes of one batch; every node that fails is restored.

    When the runner says a run per node costs no more than a shared one (``per_node``: the node
    step goes over plain ssh), each node goes through its whole forward path in its own thread
    (:func:`_pipelined`): a node drained early is written and restarted while another still
    drains, so a batch takes its slowest node's drain + restart + verify, not the slowest drain
    plus the slowest restart plus the slowest verify.

    Otherwise, per node and in parallel: preflight, cordon, drain, backup (a node failing here is
    restored at once: its files were never touched). Then one apply playbook run for every node
    that got there, each node's ``apply`` journaled ``begin`` before the run and ``done`` /
    ``failed`` from its own outcome (an unreachable node fails alone). Then per node and in
    parallel: verify, uncordon. The nodes that failed apply or verify are restored together.

    Returns:
        The failed nodes, each with a NodeOperationError saying which step failed and whether
        the restore held (empty: every node applied and verified).
    """
    by_node = {c.node: c for c in changes}
    order = list(by_node)
    cheap = getattr(ctx.runner, "per_node", None)
    if callable(cheap) and cheap([c.host for c in changes]):
        return _pipelined(ctx, by_node)

    def prepare(node: str) -> dict[str, str]:
        try:
            ctx.interrupt.check()  # no new node once forward work must stop
        except StopRequested as e:
            raise NodeOperationError(f"node {node}: not started: {e}") from e
        try:
            return _prepare(ctx, by_node[node])
        except Exception as e:  # any failure, even an unexpected one, must restore the node
            raise _fail_and_restore(ctx, {node: wrap(e)})[node] from e

    devices, errors = in_parallel(order, prepare)
    ready = [n for n in order if n in devices]
    late: dict[str, RolloutError] = {}
    if ready and (reason := ctx.interrupt.reason()) is not None:
        late.update({n: StopRequested(reason) for n in ready})  # files untouched: restore
        ready = []
    if ready:
        for node in ready:
            _apply_begin(ctx, by_node[node])
        results = run_many(
            ready,
            lambda: ctx.runner.apply_many([by_node[n] for n in ready], ctx.journal.change_id),
        )
        for node in ready:
            if (err := _apply_outcome(ctx, node, results[node])) is not None:
                late[node] = err
        applied = [n for n in ready if n not in late]
        _, verify_errors = in_parallel(
            applied, lambda n: _verify_and_uncordon(ctx, by_node[n], devices[n])
        )
        late.update(verify_errors)
    if late:
        errors.update(_fail_and_restore(ctx, {n: late[n] for n in order if n in late}))
    return {n: _as_node_error(errors[n]) for n in order if n in errors}


def _apply_begin(ctx: Context, c: NodeChange) -> None:
    ctx.record(c.node, Step.APPLY, Phase.BEGIN, Path.FORWARD)
    ctx.on_event(f"{c.node}: writing {len(c.files)} file(s) and restarting {c.service}")


def _apply_outcome(ctx: Context, node: str, r: RunResult) -> RolloutError | None:
    """Journal one node's apply outcome; the error to restore it with, or None."""
    if r.ok:
        done = {"changed": r.changed, **({"nodeStep": dict(r.timings)} if r.timings else {})}
        ctx.record(node, Step.APPLY, Phase.DONE, Path.FORWARD, done)
        return None
    if r.refused:  # compare-and-swap: nothing written; the restore only uncordons
        ctx.record(
            node,
            Step.APPLY,
            Phase.FAILED,
            Path.FORWARD,
            {"message": r.message, "filesWritten": False},
        )
        return NodeFilesChangedError(r.message)
    return NodeOperationError(f"apply playbook failed on {node}: {r.message}")


def _pipelined(
    ctx: Context, by_node: Mapping[str, NodeChange]
) -> dict[str, NodeOperationError | NodeFilesChangedError]:
    """Each node of the batch through preflight, cordon, drain, backup, apply (a run of its
    own), verify and uncordon in its own thread; a node that fails is restored at once, in its
    thread, while the others go on. Same journal entries, same rules as the shared run: no
    node's apply begins once forward work must stop (its files untouched, it is restored)."""

    def node_path(node: str) -> None:
        c = by_node[node]
        try:
            ctx.interrupt.check()  # no new node once forward work must stop
        except StopRequested as e:
            raise NodeOperationError(f"node {node}: not started: {e}") from e
        try:
            devices = _prepare(ctx, c)
            ctx.interrupt.check()  # files untouched: a stop now restores the node
            _apply_begin(ctx, c)
            result = run_many([node], lambda: ctx.runner.apply_many([c], ctx.journal.change_id))
            if (err := _apply_outcome(ctx, node, result[node])) is not None:
                raise err
            _verify_and_uncordon(ctx, c, devices)
        except Exception as e:  # any failure, even an unexpected one, must restore the node
            raise _fail_and_restore(ctx, {node: wrap(e)})[node] from e

    order = list(by_node)
    _, errors = in_parallel(order, node_path)
    return {n: _as_node_error(errors[n]) for n in order if n in errors}


def _as_node_error(e: RolloutError) -> NodeOperationError | NodeFilesChangedError:
    if isinstance(e, NodeOperationError | NodeFilesChangedError):
        return e
    return NodeOperationError(str(e))


def apply_node(ctx: Context, change: NodeChange) -> None:
    """The forward path on one node (a batch of one); on any failure, restore the node and raise.

    Raises:
        NodeOperationError: a step failed; the message says which, and whether the restore held.
    """
    failures = apply_batch(ctx, [change])
    if change.node in failures:
        raise failures[change.node]


def _verify_and_uncordon(ctx: Context, change: NodeChange, devices: Mapping[str, str]) -> None:
    """Verify, and uncordon if we cordoned: the tail of the forward path."""
    node = change.node
    ctx.record(node, Step.VERIFY, Phase.BEGIN, Path.FORWARD, {"expected": dict(change.expected)})
    verify(ctx.cluster, node, change.expected, devices, ctx.forward_clock, ctx.verify_timeout_s)
    ctx.record(node, Step.VERIFY, Phase.DONE, Path.FORWARD)
    status = replay(ctx.journal.entries()).nodes[node]
    ours = status.we_cordoned
    ctx.record(node, Step.UNCORDON, Phase.BEGIN, Path.FORWARD, {"weCordoned": ours})
    if ours:
        ctx.cluster.uncordon(node)
    ctx.record(node, Step.UNCORDON, Phase.DONE, Path.FORWARD, {"uncordoned": ours})
    ctx.on_event(f"{node}: applied and verified" + ("" if ours else "; left cordoned as it was"))


def _apply_and_verify(
    ctx: Context, change: NodeChange, devices: Mapping[str, str], run_apply: bool = True
) -> None:
    """Apply (optionally), verify, and uncordon if we cordoned: the tail resume finishes."""
    node = change.node
    if run_apply:
        _apply_begin(ctx, change)
        result = run_many([node], lambda: ctx.runner.apply_many([change], ctx.journal.change_id))[
            node
        ]
        if not result.ok:
            raise NodeOperationError(f"apply playbook failed on {node}: {result.message}")
        ctx.record(node, Step.APPLY, Phase.DONE, Path.FORWARD, {"changed": result.changed})
    _verify_and_uncordon(ctx, change, devices)


def _end(ctx: Context, outcome: str, message: str, phase: Phase = Phase.DONE) -> ChangeStatus:
    ctx.journal.append(
        CHANGE_STEP, phase, now=ctx.clock.now(), data={"outcome": outcome, "message": message}
    )
    return replay(ctx.journal.entries())


def run_change(
    ctx: Context,
    changes: Mapping[str, NodeChange],
    batches: Sequence[Batch],
    gate: Gate,
    canary_only: bool,
    info: Mapping[str, Any] | None = None,
    forward: Callable[[datetime], Decision] | None = None,
) -> ChangeStatus:
    """Apply the change batch by batch; the gate decides after the last canary batch.

    ``forward`` (``rollout.change.windows.guard``) is asked before each batch: refused before the
    first,
    the change does not start (PreflightError, nothing journaled); refused later, the batch in
    flight has finished and the change holds. Its decision (and any forced reason) is journaled.

    Returns:
        The change's status when it completed or holds.

    Raises:
        NodeOperationError: a node failed (it was restored) or the gate failed the canary (the
            canary was restored); the message ends with every node's state.
    """
    window = forward(ctx.clock.now()) if forward else None
    if window is not None and not window.allowed:
        raise PreflightError(window.reason)
    nodes = [n for b in batches for n in b.nodes]
    nodes += [n for n in changes if n not in nodes]  # untouched by --canary, listed as pending
    ctx.journal.append(
        CHANGE_STEP,
        Phase.BEGIN,
        now=ctx.clock.now(),
        data={
            **(info or {}),
            "nodes": nodes,
            "batches": [list(b.nodes) for b in batches],
            "canary": [n for b in batches if b.canary for n in b.nodes],
            "canaryOnly": canary_only,
            **({"window": window.as_dict()} if window else {}),
        },
    )
    canary = [n for b in batches if b.canary for n in b.nodes]
    last = max((i for i, b in enumerate(batches) if b.canary), default=None)
    gate_at = {last: canary} if last is not None else {}
    try:
        return _batches(ctx, changes, batches, gate, canary_only, gate_at, forward)
    except StopRequested as e:
        return _stopped(ctx, e.reason)


def continue_change(
    ctx: Context,
    changes: Mapping[str, NodeChange],
    batches: Sequence[Batch],
    gate: Gate | None,
    info: Mapping[str, Any],
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

    Raises:
        NodeOperationError: as :func:`run_change`.
    """
    ctx.journal.append(CHANGE_STEP, Phase.BEGIN, now=ctx.clock.now(), data=dict(info))
    if gate_at is None:
        gate_at = {i: tuple(b.nodes) for i, b in enumerate(batches)} if gate is not None else {}
    try:
        return _batches(
            ctx, changes, batches, gate or NoGate(), canary_only, gate_at, forward, regate
        )
    except StopRequested as e:
        return _stopped(ctx, e.reason)


def _batches(
    ctx: Context,
    changes: Mapping[str, NodeChange],
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
            return _end(ctx, "held", f"canary applied; holding (gate: {_last_reason(ctx)})")
    for i, batch in enumerate(batches):
        ctx.interrupt.check()
        if forward is not None and i > 0 and not (window := forward(ctx.clock.now())).allowed:
            return _end(ctx, "held", f"change window closed; holding: {window.reason}")
        ctx.on_event(f"batch {i + 1}/{len(batches)}: {', '.join(batch.nodes)}")
        failures = apply_batch(ctx, [changes[n] for n in batch.nodes])
        ctx.interrupt.check()  # the batch's failures are the interrupt's doing: settle below
        if failures:
            what = "; ".join(str(e) for e in failures.values())
            status = _end(ctx, "stopped", what, Phase.FAILED)
            text = f"rollout stopped: {what}\nnode states:\n{summary(status)}"
            if all(isinstance(e, NodeFilesChangedError) for e in failures.values()):
                raise NodeFilesChangedError(text)
            raise NodeOperationError(text)
        if i not in gate_at:
            continue
        which = "the canary" if batch.canary else f"batch {i + 1}"
        held = _gate(ctx, gate, list(gate_at[i]), which)
        if held is not None:
            return held
        if canary_only and i == max(gate_at):
            return _end(ctx, "held", f"canary applied; holding (gate: {_last_reason(ctx)})")
    ctx.interrupt.check()
    return _end(ctx, "completed", f"{len(changes)} node(s) applied")


def _gate(
    ctx: Context,
    gate: Gate,
    nodes: Sequence[str],
    which: str,
    recorded: Verdict | None = None,
) -> ChangeStatus | None:
    """Soak the gate over ``nodes`` (journaled ``gate`` begin, then the verdict as ``gate`` done)
    and act on the verdict: Failed restores the nodes it names and raises, anything else but
    Successful holds (returns the held status). None: go on. With ``recorded``, a verdict the
    interrupted command journaled but had not acted on is acted on without soaking again.

    Raises:
        NodeOperationError: the gate failed; the nodes it named were restored.
        StopRequested: forward work must stop (a handed-over rollback, a lost Lease).
    """
    if recorded is None:
        ctx.journal.append(GATE_STEP, Phase.BEGIN, now=ctx.clock.now(), data={"nodes": nodes})
        verdict = gate.evaluate(ctx.journal.change_id, nodes)
        ctx.journal.append(
            GATE_STEP,
            Phase.DONE,
            now=ctx.clock.now(),
            data={"status": verdict.status.value, "reason": verdict.reason, "nodes": nodes},
        )
    else:
        verdict = recorded
    ctx.on_event(f"gate: {verdict.status.value}: {verdict.reason}")
    if verdict.status is VerdictStatus.FAILED:
        # the gate names what to restore (its onFailure policy); by default all of its nodes
        targets = [n for n in nodes if n in verdict.failed_nodes] or list(nodes)
        status = replay(ctx.journal.entries())
        targets = [n for n in targets if status.nodes[n].state is not NodeState.RESTORED]
        errors = _restore_many(ctx, targets, status)
        what = f"gate failed {which}: {verdict.reason}; restored {', '.join(targets)}"
        if errors:
            what += "; restore failed: " + "; ".join(str(e) for e in errors.values())
        if ctx.interrupt.reason() is not None:  # a request came meanwhile: settle it too
            raise StopRequested(ctx.interrupt.reason())  # type: ignore[arg-type]
        status = _end(ctx, "rolled-back", what, Phase.FAILED)
        raise NodeOperationError(f"{what}\nnode states:\n{summary(status)}")
    ctx.interrupt.check()
    if verdict.status is not VerdictStatus.SUCCESSFUL:
        return _end(ctx, "held", f"gate {verdict.status.value}: {verdict.reason}; holding")
    return None


def _last_reason(ctx: Context) -> str:
    done = [e for e in ctx.journal.entries() if e.step == GATE_STEP and e.phase is Phase.DONE]
    return str(done[-1].data.get("reason", "")) if done else ""


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
    if status.outcome != "running":
        return None
    info = status.info
    canary = tuple(info.get("canary", ()))
    promotion = info.get("promotion")
    if promotion:
        points = [tuple(b) for b in promotion.get("batches", ())] if has_gate else []
    else:
        points = [canary] if canary else []
    verdicts = {
        tuple(e.data.get("nodes") or ()): e
        for e in entries
        if e.step == GATE_STEP and e.phase is Phase.DONE
    }
    triggers = [e for e in entries if e.step == "trigger" and e.data.get("trigger") == "gate"]
    for point in reversed(points):
        if not point or any(
            n not in status.nodes or status.nodes[n].state is not NodeState.APPLIED for n in point
        ):
            continue
        recorded = verdicts.get(point)
        if recorded is None:
            return UnfinishedGate(point, point == canary)
        outcome = VerdictStatus(str(recorded.data.get("status")))
        if outcome is VerdictStatus.SUCCESSFUL:
            return None
        failed = tuple(triggers[-1].data.get("nodes") or ()) if triggers else ()
        verdict = Verdict(outcome, str(recorded.data.get("reason", "")), failed_nodes=failed)
        return UnfinishedGate(point, point == canary, verdict)
    return None


def _stopped(ctx: Context, reason: StopReason) -> ChangeStatus:
    """Forward work stopped (the nodes in flight are already restored): roll back on a request,
    or end on a lost Lease.

    A request's node set may grow while the rollback runs (more requests joined it): every node
    named is restored once, nodes already restored are not touched again.

    Raises:
        NodeOperationError: the rollback ran (``rolled back on request of ...``), or failed.
        LeaseLostError: the Lease was lost; nothing new was started.
    """
    if reason.lost:
        what = f"lost the cluster lock: {reason.by}; started nothing new, nodes in flight restored"
        final = _end(ctx, "stopped", what, Phase.FAILED)
        raise LeaseLostError(f"{what}\nnode states:\n{summary(final)}")
    ctx.on_event(f"rollback requested by {reason.by}: stopping forward work")
    ctx.journal.append(
        "request",
        Phase.DONE,
        now=ctx.clock.now(),
        data={
            "by": reason.by,
            "nodes": list(reason.nodes) if reason.nodes else None,
            "request": reason.request_id,
            "seenAt": reason.at,
            **({"force": True} if reason.force else {}),
        },
    )
    if reason.force and hasattr(ctx.runner, "force_restore"):
        # ``rollout rollback --force`` handed over: overwrite as the command itself would
        ctx.runner.force_restore = True
    done: set[str] = set()
    errors: dict[str, RolloutError] = {}
    while True:
        current = ctx.interrupt.reason() or reason
        if current.lost:
            break  # restore nothing more; the rollback so far is journaled
        status = replay(ctx.journal.entries())
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
    if errors:
        what += "; restore failed: " + "; ".join(str(e) for e in errors.values())
        final = _end(ctx, "rollback-failed", what, Phase.FAILED)
    else:
        final = _end(ctx, "rolled-back", what, Phase.FAILED)
    raise NodeOperationError(f"{what}\nnode states:\n{summary(final)}")


def _restore_many(
    ctx: Context, nodes: Sequence[str], status: ChangeStatus
) -> dict[str, RolloutError]:
    return restore_nodes(ctx, [status.nodes[n] for n in nodes])


def rollback(ctx: Context, nodes: Sequence[str] | None = None) -> ChangeStatus:
    """Restore the given nodes (default: every node this change touched).

    Raises:
        InputError: a named node is not part of the change.
        NodeOperationError: a restore failed (the others still ran); every node's state named.
    """
    status = replay(ctx.journal.entries())
    if nodes:
        unknown = [n for n in nodes if n not in status.nodes]
        if unknown:
            raise InputError(
                f"node(s) {', '.join(unknown)} not part of change {status.change}; "
                f"its nodes: {', '.join(status.nodes)}"
            )
    targets = [
        n
        for n, s in status.nodes.items()
        if (not nodes or n in nodes) and s.state not in (NodeState.PENDING, NodeState.RESTORED)
    ]
    ctx.on_event(f"rolling back: {', '.join(targets) or 'nothing to restore'}")
    errors = _restore_many(ctx, targets, status)
    if errors:
        what = "; ".join(str(e) for e in errors.values())
        final = _end(ctx, "rollback-failed", what, Phase.FAILED)
        raise NodeOperationError(f"rollback failed: {what}\nnode states:\n{summary(final)}")
    return _end(ctx, "rolled-back", f"restored: {', '.join(targets) or 'none'}")


def settle_node(ctx: Context, s: NodeStatus) -> None:
    """Finish or undo one node after a crash (the decision ``resume`` makes per node).

    * nothing touched, applied or restored: leave it;
    * forward path, files not written yet, or a forward step failed: restore (undo the cordon);
    * forward path in the apply step: run apply again (idempotent), verify, uncordon;
      past apply: verify, uncordon; a failure there restores the node;
    * restore path (or a failed restore): run the restore again.
    """
    if s.state in (NodeState.PENDING, NodeState.APPLIED, NodeState.RESTORED):
        return
    if s.state is NodeState.APPLYING and s.files_touched and s.phase is not Phase.FAILED:
        change = change_from_record(ctx.journal, s.node, s.record)
        rerun = s.step is Step.APPLY and s.phase is Phase.BEGIN
        try:
            _apply_and_verify(ctx, change, s.prior_allocatable, run_apply=rerun)
            return
        except Exception as e:
            err = wrap(e)
            current = replay(ctx.journal.entries()).nodes[s.node]
            step = current.step or Step.VERIFY
            ctx.record(s.node, step, Phase.FAILED, Path.FORWARD, {"message": str(err)})
            ctx.on_event(f"{s.node}: {step.value} failed on resume: {err}; restoring the node")
            s = replay(ctx.journal.entries()).nodes[s.node]
    restore_node(ctx, s)


def resume(ctx: Context, end: bool = True) -> ChangeStatus:
    """Settle every node of an interrupted change: each ends applied, restored, or untouched.

    ``end`` False: the change's ``resumed`` end is not journaled (the caller goes on with the
    change and ends it itself; a crash before that leaves the change running, so the next
    ``resume`` goes on too).

    Raises:
        NodeOperationError: a node could not be settled; every node's state named.
    """
    status = replay(ctx.journal.entries())
    todo = [
        s
        for s in status.nodes.values()
        if s.state not in (NodeState.PENDING, NodeState.APPLIED, NodeState.RESTORED)
    ]
    ctx.on_event(f"resuming {status.change}: {', '.join(s.node for s in todo) or 'nothing to do'}")
    _, errors = in_parallel([s.node for s in todo], lambda n: settle_node(ctx, status.nodes[n]))
    if errors:
        what = "; ".join(str(e) for e in errors.values())
        final = _end(ctx, "resume-failed", what, Phase.FAILED)
        raise NodeOperationError(f"resume failed: {what}\nnode states:\n{summary(final)}")
    return end_resumed(ctx) if end else replay(ctx.journal.entries())


def end_resumed(ctx: Context) -> ChangeStatus:
    """Journal the end of a resume that had nothing more to run."""
    return _end(ctx, "resumed", "every node settled")
