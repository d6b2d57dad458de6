"""The forward path on the nodes of a batch: preflight, cordon, drain, the kind's steps (for the
kubelet-config change: backup, apply), verify, uncordon, each step journaled before and after it
runs.

Why its own module: this is what happens to a node; the batch loop, the gate and the rollback
around it live in ``orchestrator.py``, finishing an interrupted change in ``resumption.py``. Where
the node step goes over plain ssh each node of a batch runs its whole forward path on its own (a
batch takes its slowest node's drain + restart + verify), else the nodes of a batch share one
apply playbook run (Ansible's start-up paid once per batch) while every other step, and every
outcome, stays per node; any failure on a node restores that node (``restore.py``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollout.change.engine.context import Context
from rollout.change.engine.drain import drain
from rollout.change.engine.parallel import in_parallel, wrap
from rollout.change.engine.restore import restore_nodes
from rollout.change.kinds.registry import kind_of
from rollout.change.plan.drain_rules import undrainable
from rollout.change.record.entries import (
    cordon_begin,
    cordon_done,
    drain_done,
    step_failed,
    uncordon_begin,
    uncordon_done,
)
from rollout.change.record.replay import NodeStatus, status_of
from rollout.errors import (
    NodeFilesChangedError,
    NodeOperationError,
    PreflightError,
    RolloutError,
)
from rollout.interrupt import StopRequested
from rollout.models import Phase, Step, StepPath


def _prepare(ctx: Context, change: Any) -> None:
    """The forward steps before the node is changed: preflight (the kind's baseline), cordon,
    drain, then the kind's steps that change nothing (the kubelet-config change's backup)."""
    node = change.node
    rec = ctx.record
    kind = kind_of(ctx)
    rec(node, Step.PREFLIGHT, Phase.BEGIN, StepPath.FORWARD)
    info = ctx.cluster.node(node)
    baseline = kind.baseline(ctx, change, info)
    # preflight checked every node before the change; a pod may have come since: still before
    # the cordon, refuse a drain that would lose a pod for good (kubectl drain's rules)
    d = ctx.drain
    lost = undrainable(
        node, ctx.cluster.pods_on_node(node), d.delete_unmanaged, d.delete_emptydir_data
    )
    if lost:
        raise PreflightError("; ".join(lost))
    # each ``done`` below goes to the cluster record with the next ``begin`` (one write for
    # both; nothing acts on the node between them: Journal.append's ``mirror_later``)
    rec(node, Step.PREFLIGHT, Phase.DONE, StepPath.FORWARD, baseline, mirror_later=True)

    ctx.interrupt.check()
    rec(node, Step.CORDON, Phase.BEGIN, StepPath.FORWARD, cordon_begin(info.unschedulable))
    ours = not info.unschedulable
    if ours:
        ctx.cluster.cordon(node)
    rec(node, Step.CORDON, Phase.DONE, StepPath.FORWARD, cordon_done(ours), mirror_later=True)
    ctx.on_event(f"{node}: cordoned" if ours else f"{node}: already cordoned; will stay so")

    ctx.interrupt.check()
    rec(node, Step.DRAIN, Phase.BEGIN, StepPath.FORWARD)
    report = drain(ctx.cluster, node, ctx.drain, ctx.forward_clock, ctx.on_event)
    done = drain_done(report.evicted)
    rec(node, Step.DRAIN, Phase.DONE, StepPath.FORWARD, done, mirror_later=True)
    ctx.on_event(f"{node}: drained ({len(report.evicted)} pod(s) evicted)")

    ctx.interrupt.check()
    kind.prepare(ctx, change)


def _fail_and_restore(
    ctx: Context, failures: Mapping[str, RolloutError]
) -> dict[str, NodeOperationError | NodeFilesChangedError]:
    """Journal each node's failed forward step, then restore those nodes together.

    Returns:
        One error per node saying which step failed and whether its restore held.
    """
    steps: dict[str, Step] = {}
    status = status_of(ctx.journal)
    for node, err in failures.items():
        current = status.nodes.get(node, NodeStatus(node))
        step = current.step or Step.PREFLIGHT
        if current.phase is not Phase.FAILED:
            ctx.record(node, step, Phase.FAILED, StepPath.FORWARD, step_failed(str(err)))
        steps[node] = step
        ctx.on_event(f"{node}: {step.value} failed: {err}; restoring the node")
    status = status_of(ctx.journal)
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
    ctx: Context, changes: Sequence[Any]
) -> dict[str, NodeOperationError | NodeFilesChangedError]:
    """The forward path on the nodes of one batch; every node that fails is restored.

    When the kind says a run per node costs no more than a shared one (``per_node``; for the
    kubelet-config change: the node step goes over plain ssh), each node goes through its whole
    forward path in its own thread (:func:`_pipelined`): a node drained early is written and
    restarted while another still drains, so a batch takes its slowest node's drain + restart +
    verify, not the slowest drain plus the slowest restart plus the slowest verify.

    Otherwise, per node and in parallel: preflight, cordon, drain, the kind's steps that change
    nothing (a node failing here is restored at once: it was never changed). Then one write of
    the kind for every node that got there (the kubelet-config change: one apply playbook run,
    each node's ``apply`` journaled ``begin`` before the run and ``done`` / ``failed`` from its
    own outcome: an unreachable node fails alone). Then per node and in parallel: verify,
    uncordon. The nodes that failed the write or verify are restored together.

    Returns:
        The failed nodes, each with a NodeOperationError saying which step failed and whether
        the restore held (empty: every node applied and verified).
    """
    by_node = {c.node: c for c in changes}
    order = list(by_node)
    kind = kind_of(ctx)
    if kind.per_node(ctx, changes):
        return _pipelined(ctx, by_node)

    def prepare(node: str) -> None:
        try:
            ctx.interrupt.check()  # no new node once forward work must stop
        except StopRequested as e:
            raise NodeOperationError(f"node {node}: not started: {e}") from e
        try:
            _prepare(ctx, by_node[node])
        except Exception as e:  # any failure, even an unexpected one, must restore the node
            raise _fail_and_restore(ctx, {node: wrap(e)})[node] from e

    prepared, errors = in_parallel(order, prepare, ctx.forks)
    ready = [n for n in order if n in prepared]
    late: dict[str, RolloutError] = {}
    if ready and (reason := ctx.interrupt.reason()) is not None:
        late.update({n: StopRequested(reason) for n in ready})  # files untouched: restore
        ready = []
    if ready:
        late.update(kind.write(ctx, [by_node[n] for n in ready]))
        applied = [n for n in ready if n not in late]
        _, verify_errors = in_parallel(
            applied, lambda n: _verify_and_uncordon(ctx, by_node[n]), ctx.forks
        )
        late.update(verify_errors)
    if late:
        errors.update(_fail_and_restore(ctx, {n: late[n] for n in order if n in late}))
    return {n: _as_node_error(errors[n]) for n in order if n in errors}


def apply_step(ctx: Context, c: Any) -> None:
    """The kind's write on one node, on its own run (the same for the forward path and for
    ``resume``).

    Raises:
        NodeFilesChangedError: the compare-and-swap refused (journaled ``filesWritten`` False:
            nothing was written, a restore only undoes the cordon).
        NodeOperationError: the write failed on the node.
    """
    errors = kind_of(ctx).write(ctx, [c])
    if c.node in errors:
        raise errors[c.node]


def _pipelined(
    ctx: Context, by_node: Mapping[str, Any]
) -> dict[str, NodeOperationError | NodeFilesChangedError]:
    """Each node of the batch through preflight, cordon, drain, the kind's steps (its write a run
    of its own), verify and uncordon in its own thread; a node that fails is restored at once, in
    its thread, while the others go on. Same journal entries, same rules as the shared run: no
    node's write begins once forward work must stop (it is untouched, it is restored)."""

    def node_path(node: str) -> None:
        c = by_node[node]
        try:
            ctx.interrupt.check()  # no new node once forward work must stop
        except StopRequested as e:
            raise NodeOperationError(f"node {node}: not started: {e}") from e
        try:
            _prepare(ctx, c)
            ctx.interrupt.check()  # files untouched: a stop now restores the node
            apply_step(ctx, c)
            _verify_and_uncordon(ctx, c)
        except Exception as e:  # any failure, even an unexpected one, must restore the node
            raise _fail_and_restore(ctx, {node: wrap(e)})[node] from e

    order = list(by_node)
    _, errors = in_parallel(order, node_path, ctx.forks)
    return {n: _as_node_error(errors[n]) for n in order if n in errors}


def _as_node_error(e: RolloutError) -> NodeOperationError | NodeFilesChangedError:
    if isinstance(e, NodeOperationError | NodeFilesChangedError):
        return e
    return NodeOperationError(str(e))


def apply_node(ctx: Context, change: Any) -> None:
    """The forward path on one node (a batch of one); on any failure, restore the node and raise.

    Raises:
        NodeOperationError: a step failed; the message says which, and whether the restore held.
    """
    failures = apply_batch(ctx, [change])
    if change.node in failures:
        raise failures[change.node]


def _verify_and_uncordon(ctx: Context, change: Any) -> None:
    """Verify (the kind's check against the node's journaled baseline), and uncordon if we
    cordoned: the tail of the forward path."""
    node = change.node
    kind = kind_of(ctx)
    ctx.record(node, Step.VERIFY, Phase.BEGIN, StepPath.FORWARD, kind.expected(change))
    kind.verify(ctx, change, status_of(ctx.journal).nodes[node])
    ctx.record(node, Step.VERIFY, Phase.DONE, StepPath.FORWARD, mirror_later=True)
    status = status_of(ctx.journal).nodes[node]
    ours = status.we_cordoned
    ctx.record(node, Step.UNCORDON, Phase.BEGIN, StepPath.FORWARD, uncordon_begin(ours))
    if ours:
        ctx.cluster.uncordon(node)
    ctx.record(node, Step.UNCORDON, Phase.DONE, StepPath.FORWARD, uncordon_done(ours))
    ctx.on_event(f"{node}: applied and verified" + ("" if ours else "; left cordoned as it was"))


def apply_and_verify(ctx: Context, change: Any, run_apply: bool = True) -> None:
    """Write (optionally), verify, and uncordon if we cordoned: the tail resume finishes."""
    if run_apply:
        apply_step(ctx, change)
    _verify_and_uncordon(ctx, change)
