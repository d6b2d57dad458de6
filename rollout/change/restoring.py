"""Putting a node back: the restore path shared by automatic restore, ``rollback`` and ``resume``.

Why one path: whether a canary failed verify, an operator asked for a rollback, or the process was
killed mid-step, the node must end exactly as it was: the journaled files back byte for byte, the
checkpoint files handled as on apply, the kubelet restarted and proven healthy with the *previous*
settings, and uncordoned only if this change cordoned it. Every step is journaled on the
``restore`` path, so a restore interrupted in turn is itself resumable. Nodes restored together
(a failed batch, a rollback) share one restore playbook run; every other step stays per node.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from rollout.change.context import Context
from rollout.change.draining import drain
from rollout.change.node_records import change_from_record, restore_files
from rollout.change.parallel import in_parallel, run_many, wrap
from rollout.change.replaying import NodeStatus
from rollout.change.verifying import verify
from rollout.errors import InputError, NodeOperationError, RolloutError
from rollout.models import NodeChange, Phase, Step, StepPath
from rollout.protocols import RestoreFile


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
    """Run the restore path for several nodes; their files go back in one playbook run.

    When the apply step never began (``files_touched`` False) the files are as they were, so only
    the cordon is undone. Otherwise, per node: cordon (recording whether we did), drain; then
    one restore run for every node that got that far; then per node: verify against the previous
    settings, uncordon only if this change cordoned the node. A node that fails a step stops
    there; the others go on.

    Returns:
        The nodes whose restore failed, each with a NodeOperationError naming the step (journaled
        as ``failed``; state ``failed``).
    """
    by_node = {s.node: s for s in statuses}
    failed: dict[str, RolloutError] = {}
    ours: dict[str, bool] = {s.node: needs_uncordon(s) for s in statuses}
    changes: dict[str, NodeChange] = {}
    files: dict[str, list[RestoreFile]] = {}

    def fail(node: str, step: Step, e: RolloutError) -> None:
        ctx.record(node, step, Phase.FAILED, StepPath.RESTORE, {"message": str(e)})
        failed[node] = NodeOperationError(f"restore of node {node} failed at {step.value}: {e}")

    step_of: dict[str, Step] = {}

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
        if not status.record:
            step_of[node] = Step.UNCORDON
            raise InputError(f"journal has no change record for node {node}")
        changes[node] = change_from_record(ctx.journal, node, status.record, for_restore=True)
        step_of[node] = Step.CORDON
        info = ctx.cluster.node(node)
        ctx.record(
            node, Step.CORDON, Phase.BEGIN, StepPath.RESTORE, {"priorCordoned": info.unschedulable}
        )
        if not info.unschedulable:
            ctx.cluster.cordon(node)
            ours[node] = True
        ctx.record(node, Step.CORDON, Phase.DONE, StepPath.RESTORE, {"cordonedByUs": ours[node]})
        step_of[node] = Step.DRAIN
        ctx.record(node, Step.DRAIN, Phase.BEGIN, StepPath.RESTORE)
        report = drain(ctx.cluster, node, ctx.drain, ctx.clock, ctx.on_event)
        ctx.record(
            node, Step.DRAIN, Phase.DONE, StepPath.RESTORE, {"evicted": list(report.evicted)}
        )
        step_of[node] = Step.RESTORE
        files[node] = restore_files(ctx.journal, node, status.backups)
        ctx.record(
            node,
            Step.RESTORE,
            Phase.BEGIN,
            StepPath.RESTORE,
            {"files": [{"path": f.path, "remove": f.content is None} for f in files[node]]},
        )
        ctx.on_event(f"{node}: restoring {len(files[node])} file(s)")

    in_parallel(list(by_node), guarded(Step.CORDON, prepare), ctx.forks)

    todo = [n for n in by_node if n in files and n not in failed]
    if todo:
        results = run_many(
            todo,
            lambda: ctx.runner.restore_many(
                [(changes[n], files[n]) for n in todo],
                ctx.journal.change_id,
                force=ctx.force_restore,
            ),
        )
        for n in todo:
            if not results[n].ok:
                fail(
                    n,
                    Step.RESTORE,
                    NodeOperationError(f"restore playbook failed on {n}: {results[n].message}"),
                )

    def finish(node: str) -> None:
        status = by_node[node]
        if status.files_touched:
            ctx.record(node, Step.RESTORE, Phase.DONE, StepPath.RESTORE)
            step_of[node] = Step.RESTORE_VERIFY
            ctx.record(
                node,
                Step.RESTORE_VERIFY,
                Phase.BEGIN,
                StepPath.RESTORE,
                {"expected": dict(status.prior_config)},
            )
            verify(
                ctx.cluster,
                node,
                status.prior_config,
                status.prior_allocatable,
                ctx.clock,
                ctx.verify_timeout_s,
                slices_before=status.prior_slices,
            )
            ctx.record(node, Step.RESTORE_VERIFY, Phase.DONE, StepPath.RESTORE)
        step_of[node] = Step.UNCORDON
        mine = ours[node]
        ctx.record(node, Step.UNCORDON, Phase.BEGIN, StepPath.RESTORE, {"weCordoned": mine})
        if mine:
            ctx.cluster.uncordon(node)
        ctx.record(node, Step.UNCORDON, Phase.DONE, StepPath.RESTORE, {"uncordoned": mine})
        ctx.on_event(f"{node}: restored" + ("" if mine else " (cordon state left as it was)"))

    in_parallel([n for n in by_node if n not in failed], guarded(Step.UNCORDON, finish), ctx.forks)
    return {n: failed[n] for n in by_node if n in failed}
