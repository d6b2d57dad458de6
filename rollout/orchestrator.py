"""The apply / rollback / resume loop: cordon, drain, write, restart, verify, uncordon, journaled.

Why this shape: each node step is journaled before and after it runs, so any interruption leaves a
record that says exactly what to finish or undo; any failure on a node restores that node at once
(``restoring.py``) and stops the rollout before another node is touched; the canary batch ends at a
:class:`~rollout.protocols.Gate` (the rejection-rate gate plugs in there). The loop sees the world
only through the Protocols in ``rollout.protocols``, so its decisions are unit-tested with fakes and
proven end to end in the lab.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from typing import Any

from rollout.draining import drain
from rollout.errors import (
    ExternalError,
    InputError,
    NodeOperationError,
    PreflightError,
    RolloutError,
)
from rollout.journal import CHANGE_STEP, ChangeStatus, NodeStatus, replay
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
from rollout.planning import Batch, device_resources
from rollout.protocols import Gate
from rollout.restoring import Context, change_from_record, change_record, restore_node
from rollout.verifying import WATCHED, config_subset, verify
from rollout.windows import Decision


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


def _wrap(e: Exception) -> RolloutError:
    return e if isinstance(e, RolloutError) else ExternalError(f"{type(e).__name__}: {e}")


def apply_node(ctx: Context, change: NodeChange) -> None:
    """The forward path on one node; on any failure, restore the node and raise.

    Raises:
        NodeOperationError: a step failed; the message says which, and whether the restore held.
    """
    node = change.node
    rec = ctx.record
    step = Step.PREFLIGHT
    try:
        rec(node, step, Phase.BEGIN, Path.FORWARD)
        info = ctx.cluster.node(node)
        keys = tuple(dict.fromkeys((*WATCHED, *change.expected)))
        prior = config_subset(ctx.cluster.configz(node), keys)
        devices = device_resources(info.allocatable)
        rec(node, step, Phase.DONE, Path.FORWARD, {"configz": prior, "allocatable": devices})

        step = Step.CORDON
        rec(node, step, Phase.BEGIN, Path.FORWARD, {"priorCordoned": info.unschedulable})
        ours = not info.unschedulable
        if ours:
            ctx.cluster.cordon(node)
        rec(node, step, Phase.DONE, Path.FORWARD, {"cordonedByUs": ours})
        ctx.on_event(f"{node}: cordoned" if ours else f"{node}: already cordoned; will stay so")

        step = Step.DRAIN
        rec(node, step, Phase.BEGIN, Path.FORWARD)
        report = drain(ctx.cluster, node, ctx.drain, ctx.clock, ctx.on_event)
        rec(node, step, Phase.DONE, Path.FORWARD, {"evicted": list(report.evicted)})
        ctx.on_event(f"{node}: drained ({len(report.evicted)} pod(s) evicted)")

        step = Step.BACKUP
        rec(node, step, Phase.BEGIN, Path.FORWARD, {"paths": list(change.touched)})
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
            step,
            Phase.DONE,
            Path.FORWARD,
            {"files": [vars(b) for b in backups], "change": change_record(change, blobs)},
        )

        step = Step.APPLY
        _apply_and_verify(ctx, change, devices)
    except Exception as e:  # any failure, even an unexpected one, must restore the node
        err = _wrap(e)
        current = replay(ctx.journal.entries()).nodes.get(node, NodeStatus(node))
        if current.phase is not Phase.FAILED:
            step = current.step or step
            rec(node, step, Phase.FAILED, Path.FORWARD, {"message": str(err)})
        ctx.on_event(f"{node}: {step.value} failed: {err}; restoring the node")
        status = replay(ctx.journal.entries()).nodes[node]
        try:
            restore_node(ctx, status)
        except NodeOperationError as re:
            raise NodeOperationError(
                f"node {node}: {step.value} failed: {err}; and then {re}"
            ) from re
        raise NodeOperationError(f"node {node}: {step.value} failed: {err}; node restored") from e


def _apply_and_verify(
    ctx: Context, change: NodeChange, devices: Mapping[str, str], run_apply: bool = True
) -> None:
    """Apply (optionally), verify, and uncordon if we cordoned: the tail shared with resume."""
    node = change.node
    if run_apply:
        ctx.record(node, Step.APPLY, Phase.BEGIN, Path.FORWARD)
        ctx.on_event(f"{node}: writing {len(change.files)} file(s) and restarting {change.service}")
        result = ctx.runner.apply(change, ctx.journal.change_id, str(ctx.journal.backups / node))
        if not result.ok:
            raise NodeOperationError(f"apply playbook failed on {node}: {result.message}")
        ctx.record(node, Step.APPLY, Phase.DONE, Path.FORWARD, {"changed": result.changed})
    ctx.record(node, Step.VERIFY, Phase.BEGIN, Path.FORWARD, {"expected": dict(change.expected)})
    verify(ctx.cluster, node, change.expected, devices, ctx.clock, ctx.verify_timeout_s)
    ctx.record(node, Step.VERIFY, Phase.DONE, Path.FORWARD)
    status = replay(ctx.journal.entries()).nodes[node]
    ours = status.we_cordoned
    ctx.record(node, Step.UNCORDON, Phase.BEGIN, Path.FORWARD, {"weCordoned": ours})
    if ours:
        ctx.cluster.uncordon(node)
    ctx.record(node, Step.UNCORDON, Phase.DONE, Path.FORWARD, {"uncordoned": ours})
    ctx.on_event(f"{node}: applied and verified" + ("" if ours else "; left cordoned as it was"))


def _parallel(nodes: Sequence[str], work: Callable[[str], None]) -> dict[str, RolloutError]:
    """Run ``work`` on each node at once; return the failures by node."""
    failures: dict[str, RolloutError] = {}
    if not nodes:
        return failures
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        futures = {n: pool.submit(work, n) for n in nodes}
        for n, f in futures.items():
            e = f.exception()
            if e is not None:
                failures[n] = _wrap(e) if isinstance(e, Exception) else ExternalError(str(e))
    return failures


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

    ``forward`` (``rollout.windows.guard``) is asked before each batch: refused before the first,
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
            "canaryOnly": canary_only,
            **({"window": window.as_dict()} if window else {}),
        },
    )
    canary = [n for b in batches if b.canary for n in b.nodes]
    for i, batch in enumerate(batches):
        if forward is not None and i > 0 and not (window := forward(ctx.clock.now())).allowed:
            return _end(ctx, "held", f"change window closed; holding: {window.reason}")
        ctx.on_event(f"batch {i + 1}/{len(batches)}: {', '.join(batch.nodes)}")
        failures = _parallel(batch.nodes, lambda n: apply_node(ctx, changes[n]))
        if failures:
            what = "; ".join(str(e) for e in failures.values())
            status = _end(ctx, "stopped", what, Phase.FAILED)
            raise NodeOperationError(f"rollout stopped: {what}\nnode states:\n{summary(status)}")
        last_canary = batch.canary and (i + 1 == len(batches) or not batches[i + 1].canary)
        if not last_canary:
            continue
        verdict = gate.evaluate(ctx.journal.change_id, canary)
        ctx.journal.append(
            "gate",
            Phase.DONE,
            now=ctx.clock.now(),
            data={"status": verdict.status.value, "reason": verdict.reason, "nodes": canary},
        )
        ctx.on_event(f"gate: {verdict.status.value}: {verdict.reason}")
        if verdict.status is VerdictStatus.FAILED:
            # the gate names what to restore (its onFailure policy); by default the whole canary
            targets = [n for n in canary if n in verdict.failed_nodes] or canary
            errors = _restore_many(ctx, targets, replay(ctx.journal.entries()))
            what = f"gate failed the canary: {verdict.reason}; restored {', '.join(targets)}"
            if errors:
                what += "; restore failed: " + "; ".join(str(e) for e in errors.values())
            status = _end(ctx, "rolled-back", what, Phase.FAILED)
            raise NodeOperationError(f"{what}\nnode states:\n{summary(status)}")
        if verdict.status is not VerdictStatus.SUCCESSFUL:
            return _end(ctx, "held", f"gate {verdict.status.value}: {verdict.reason}; holding")
        if canary_only:
            return _end(ctx, "held", f"canary applied; holding (gate: {verdict.reason})")
    return _end(ctx, "completed", f"{len(changes)} node(s) applied")


def _restore_many(
    ctx: Context, nodes: Sequence[str], status: ChangeStatus
) -> dict[str, RolloutError]:
    return _parallel(nodes, lambda n: restore_node(ctx, status.nodes[n]))


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
            err = _wrap(e)
            current = replay(ctx.journal.entries()).nodes[s.node]
            step = current.step or Step.VERIFY
            ctx.record(s.node, step, Phase.FAILED, Path.FORWARD, {"message": str(err)})
            ctx.on_event(f"{s.node}: {step.value} failed on resume: {err}; restoring the node")
            s = replay(ctx.journal.entries()).nodes[s.node]
    restore_node(ctx, s)


def resume(ctx: Context) -> ChangeStatus:
    """Settle every node of an interrupted change: each ends applied, restored, or untouched.

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
    errors = _parallel([s.node for s in todo], lambda n: settle_node(ctx, status.nodes[n]))
    if errors:
        what = "; ".join(str(e) for e in errors.values())
        final = _end(ctx, "resume-failed", what, Phase.FAILED)
        raise NodeOperationError(f"resume failed: {what}\nnode states:\n{summary(final)}")
    return _end(ctx, "resumed", "every node settled")
