"""The kubelet-config change as a kind of change: its own steps between the engine's drain and
verify (``rollout.change.engine.context.KindSteps``).

Forward: ``backup`` (the node's files kept in the journal's blob store, the change record with
them), then ``apply`` (the files written and the kubelet restarted through the node step; the
nodes of a batch share one playbook run unless the runner says a run per node costs no more),
verify against ``/configz`` and the device allocatable from before. Restore: the journaled files
back byte for byte through one restore run for the batch, verify against the previous settings.
The engine around it (``applying``, ``restoring``) owns everything else.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollout.change.engine.context import Context
from rollout.change.engine.parallel import run_many
from rollout.change.kinds.kubelet_record import change_from_record, change_record, restore_files
from rollout.change.kinds.kubelet_verify import WATCHED, config_subset, verify
from rollout.change.plan.capacity import device_resources
from rollout.change.record.entries import backup_done, write_refused
from rollout.change.record.replay import NodeStatus
from rollout.errors import InputError, NodeFilesChangedError, NodeOperationError, RolloutError
from rollout.models import FileBackup, NodeChange, NodeInfo, Phase, Step, StepPath
from rollout.protocols import RestoreFile, RunResult


class KubeletConfig:
    """The kubelet-config kind (``work`` is a :class:`~rollout.models.NodeChange`)."""

    @property
    def name(self) -> str:
        return "kubelet-config"

    def per_node(self, ctx: Context, works: Sequence[Any]) -> bool:
        return ctx.runner.per_node([c.host for c in works])

    def baseline(self, ctx: Context, work: Any, info: NodeInfo) -> dict[str, Any]:
        change: NodeChange = work
        keys = tuple(dict.fromkeys((*WATCHED, *change.expected)))
        prior = config_subset(ctx.cluster.configz(change.node), keys)
        devices = device_resources(info.allocatable)
        slices = {d: dict(s) for d, s in ctx.cluster.dra_slices(change.node).items()}
        return {"configz": prior, "allocatable": devices, "slices": slices}

    def prepare(self, ctx: Context, work: Any) -> None:
        change: NodeChange = work
        node = change.node
        rec = ctx.record
        rec(node, Step.BACKUP, Phase.BEGIN, StepPath.FORWARD, {"paths": list(change.touched)})
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
            StepPath.FORWARD,
            backup_done(backups, change_record(change, blobs)),
            mirror_later=True,  # with the ``apply`` begin, before anything is written
        )

    def write(self, ctx: Context, works: Sequence[Any]) -> dict[str, RolloutError]:
        """Each node's ``apply`` journaled ``begin`` before the one run, ``done`` / ``failed``
        from its own outcome (an unreachable node fails alone)."""
        changes: list[NodeChange] = list(works)
        for c in changes:
            ctx.record(c.node, Step.APPLY, Phase.BEGIN, StepPath.FORWARD)
            ctx.on_event(f"{c.node}: writing {len(c.files)} file(s) and restarting {c.service}")
        nodes = [c.node for c in changes]
        results = run_many(nodes, lambda: ctx.runner.apply_many(changes, ctx.journal.change_id))
        errors: dict[str, RolloutError] = {}
        for node in nodes:
            if (err := _apply_outcome(ctx, node, results[node])) is not None:
                errors[node] = err
        return errors

    def expected(self, work: Any) -> dict[str, Any]:
        return {"expected": dict(work.expected)}

    def verify(self, ctx: Context, work: Any, before: NodeStatus) -> None:
        change: NodeChange = work
        verify(
            ctx.cluster,
            change.node,
            change.expected,
            before.prior_allocatable,
            ctx.forward_clock,
            ctx.verify_timeout_s,
            slices_before=before.prior_slices,
        )

    def rebuild(self, ctx: Context, status: NodeStatus, for_restore: bool) -> Any:
        if for_restore and not status.record:
            raise InputError(f"journal has no change record for node {status.node}")
        return change_from_record(ctx.journal, status.node, status.record, for_restore)

    def restore_before_drain(self, ctx: Context, status: NodeStatus, work: Any) -> None:
        return None

    def restore_prepare(self, ctx: Context, status: NodeStatus, work: Any) -> Any:
        files = restore_files(ctx.journal, status.node, status.backups)
        ctx.record(
            status.node,
            Step.RESTORE,
            Phase.BEGIN,
            StepPath.RESTORE,
            {"files": [{"path": f.path, "remove": f.content is None} for f in files]},
        )
        ctx.on_event(f"{status.node}: restoring {len(files)} file(s)")
        return (work, files)

    def restore_write(
        self, ctx: Context, items: Sequence[tuple[NodeStatus, Any]]
    ) -> dict[str, RolloutError]:
        todo = [s.node for s, _ in items]
        payload: list[tuple[NodeChange, list[RestoreFile]]] = [p for _, p in items]
        results = run_many(
            todo,
            lambda: ctx.runner.restore_many(
                payload, ctx.journal.change_id, force=ctx.force_restore
            ),
        )
        return {
            n: NodeOperationError(f"restore playbook failed on {n}: {results[n].message}")
            for n in todo
            if not results[n].ok
        }

    def restore_done(self, ctx: Context, status: NodeStatus) -> None:
        ctx.record(status.node, Step.RESTORE, Phase.DONE, StepPath.RESTORE)

    def restore_expected(self, status: NodeStatus) -> dict[str, Any]:
        return {"expected": dict(status.prior_config)}

    def restore_verify(self, ctx: Context, status: NodeStatus) -> None:
        verify(
            ctx.cluster,
            status.node,
            status.prior_config,
            status.prior_allocatable,
            ctx.clock,
            ctx.verify_timeout_s,
            slices_before=status.prior_slices,
        )


def _apply_outcome(ctx: Context, node: str, r: RunResult) -> RolloutError | None:
    """Journal one node's apply outcome; the error to restore it with, or None."""
    if r.ok:
        done = {"changed": r.changed, **({"nodeStep": dict(r.timings)} if r.timings else {})}
        ctx.record(node, Step.APPLY, Phase.DONE, StepPath.FORWARD, done, mirror_later=True)
        return None
    if r.refused:  # compare-and-swap: nothing written; the restore only uncordons
        ctx.record(
            node,
            Step.APPLY,
            Phase.FAILED,
            StepPath.FORWARD,
            write_refused(r.message),
        )
        return NodeFilesChangedError(r.message)
    return NodeOperationError(f"apply playbook failed on {node}: {r.message}")


KUBELET_CONFIG = KubeletConfig()
"""The kubelet-config kind (stateless: one for every change)."""
