"""Putting a node back: the restore path shared by automatic restore, ``rollback`` and ``resume``.

Why one path: whether a canary failed verify, an operator asked for a rollback, or the process was
killed mid-step, the node must end exactly as it was (for the kubelet-config change: the journaled
files back byte for byte, the checkpoint files handled as on apply, the kubelet restarted and
proven healthy with the *previous* settings; each kind's restore steps are its own, see
``rollout.change.engine.context.KindSteps``), and uncordoned only if this change cordoned it. Every
step is journaled on the ``restore`` path, so a restore interrupted in turn is itself resumable.
Nodes restored together (a failed batch, a rollback) share the kind's restore write (one restore
playbook run); every other step stays per node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rollout.change.engine.context import Context, RestoreBracket
from rollout.change.engine.drain import drain
from rollout.change.engine.parallel import in_parallel, wrap
from rollout.change.kinds.registry import kind_of
from rollout.change.record.entries import (
    cordon_begin,
    cordon_done,
    drain_done,
    step_failed,
    uncordon_begin,
    uncordon_done,
)
from rollout.change.record.replay import NodeStatus, status_of
from rollout.errors import NodeOperationError, RolloutError
from rollout.models import Phase, Step, StepPath


def needs_uncordon(status: NodeStatus) -> bool:
    """Whether undoing this node must uncordon it (pure).

    True when this change cordoned it, and also when the process died between journaling the
    cordon ``begin`` (prior state: schedulable) and its ``done``: the cordon may have happened, and
    uncordoning returns the node to its recorded prior state either way.
    """
    if status.we_cordoned:
        return True
    return (
        status.step is Step.CORDON
        and status.phase is Phase.BEGIN
        and status.prior_cordoned is False
    )


def restore_node(ctx: Context, status: NodeStatus) -> None:
    """Run the restore path for one node (see :func:`restore_nodes`).

    Raises:
        NodeOperationError: a restore step failed (journaled as ``failed``; state ``failed``).
    """
    failures = restore_nodes(ctx, [status])
    if status.node in failures:
        raise failures[status.node]


def restore_nodes(ctx: Context, statuses: Sequence[NodeStatus]) -> dict[str, RolloutError]:
    """Run the restore path for several nodes; the kind's restore write is shared by them.

    When the kind's write never began (``files_touched`` False) the node is as it was, so only
    the cordon is undone. Otherwise, per node: cordon (recording whether we did), the kind's
    steps before the drain, drain, the kind's steps before its write; then one restore write of
    the kind for every node that got that far (the kubelet-config change: one restore playbook
    run); then per node: verify against the state from before, uncordon only if this change
    cordoned the node. A node that fails a step stops there; the others go on. A kind with
    work around its restores (``RestoreBracket``: the claim freeze) does it before the first
    node and after the last; when that fails no node is touched and each is returned failed.

    Returns:
        The nodes whose restore failed, each with a NodeOperationError naming the step (journaled
        as ``failed``; state ``failed``).
    """
    kind = kind_of(ctx)
    if not isinstance(kind, RestoreBracket):
        return _restore_nodes(ctx, statuses)
    try:  # the kind's work around the restores (the claim freeze), before any node is touched
        kind.restore_begin(ctx, statuses)
    except RolloutError as e:
        return {s.node: NodeOperationError(f"restore of node {s.node}: {e}") for s in statuses}
    try:
        failed = _restore_nodes(ctx, statuses)
    except Exception:  # not a kill: a killed process ends nothing, the next end of it does
        kind.restore_end(ctx)
        raise
    kind.restore_end(ctx)
    return failed


def _restore_nodes(ctx: Context, statuses: Sequence[NodeStatus]) -> dict[str, RolloutError]:
    kind = kind_of(ctx)
    by_node = {s.node: s for s in statuses}
    failed: dict[str, RolloutError] = {}
    ours: dict[str, bool] = {s.node: needs_uncordon(s) for s in statuses}
    works: dict[str, Any] = {}
    prepared: dict[str, Any] = {}

    def fail(node: str, step: Step | None, e: RolloutError) -> None:
        if step is None:  # inside the kind's steps: the one it journaled begun and not ended
            last = status_of(ctx.journal).nodes[node]
            open_step = last.path is StepPath.RESTORE and last.phase is Phase.BEGIN
            step = last.step if open_step and last.step is not None else Step.RESTORE
        ctx.record(node, step, Phase.FAILED, StepPath.RESTORE, step_failed(str(e)))
        failed[node] = NodeOperationError(f"restore of node {node} failed at {step.value}: {e}")

    step_of: dict[str, Step | None] = {}

    def guarded(step: Step, work: Callable[[str], None]) -> Callable[[str], None]:
        def run(node: str) -> None:
            try:
                work(node)
            except Exception as e:  # even an unexpected error is journaled against the node
                fail(node, step_of.get(node, step), wrap(e))

        return run

    def prepare(node: str) -> None:
        status = by_node[node]
        if not status.files_touched:
            return
        step_of[node] = Step.UNCORDON
        works[node] = kind.rebuild(ctx, status, for_restore=True)
        step_of[node] = Step.CORDON
        info = ctx.cluster.node(node)
        ctx.record(
            node, Step.CORDON, Phase.BEGIN, StepPath.RESTORE, cordon_begin(info.unschedulable)
        )
        if not info.unschedulable:
            ctx.cluster.cordon(node)
            ours[node] = True
        ctx.record(node, Step.CORDON, Phase.DONE, StepPath.RESTORE, cordon_done(ours[node]))
        step_of[node] = None
        kind.restore_before_drain(ctx, status, works[node])
        step_of[node] = Step.DRAIN
        ctx.record(node, Step.DRAIN, Phase.BEGIN, StepPath.RESTORE)
        report = drain(ctx.cluster, node, ctx.drain, ctx.clock, ctx.on_event)
        ctx.record(node, Step.DRAIN, Phase.DONE, StepPath.RESTORE, drain_done(report.evicted))
        step_of[node] = None  # its own restore steps (the kubelet-config change: restore)
        prepared[node] = kind.restore_prepare(ctx, status, works[node])

    in_parallel(list(by_node), guarded(Step.CORDON, prepare), ctx.forks)

    todo = [n for n in by_node if n in prepared and n not in failed]
    if todo:
        errors = kind.restore_write(ctx, [(by_node[n], prepared[n]) for n in todo])
        for n in todo:
            if n in errors:
                fail(n, step_of.get(n), errors[n])

    def finish(node: str) -> None:
        status = by_node[node]
        if status.files_touched:
            kind.restore_done(ctx, status)
            step_of[node] = Step.RESTORE_VERIFY
            ctx.record(
                node,
                Step.RESTORE_VERIFY,
                Phase.BEGIN,
                StepPath.RESTORE,
                kind.restore_expected(status),
            )
            kind.restore_verify(ctx, status)
            ctx.record(node, Step.RESTORE_VERIFY, Phase.DONE, StepPath.RESTORE)
        step_of[node] = Step.UNCORDON
        mine = ours[node]
        ctx.record(node, Step.UNCORDON, Phase.BEGIN, StepPath.RESTORE, uncordon_begin(mine))
        if mine:
            ctx.cluster.uncordon(node)
        ctx.record(node, Step.UNCORDON, Phase.DONE, StepPath.RESTORE, uncordon_done(mine))
        ctx.on_event(f"{node}: restored" + ("" if mine else " (cordon state left as it was)"))

    in_parallel([n for n in by_node if n not in failed], guarded(Step.UNCORDON, finish), ctx.forks)
    return {n: failed[n] for n in by_node if n in failed}
