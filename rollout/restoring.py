"""Putting a node back: the restore path shared by automatic restore, ``rollback`` and ``resume``.

Why one path: whether a canary failed verify, an operator asked for a rollback, or the process was
killed mid-step, the node must end exactly as it was: the journaled files back byte for byte, the
checkpoint files handled as on apply, the kubelet restarted and proven healthy with the *previous*
settings, and uncordoned only if this change cordoned it. Every step is journaled on the
``restore`` path, so a restore interrupted in turn is itself resumable.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.draining import drain
from rollout.errors import InputError, NodeOperationError, RolloutError
from rollout.journal import Journal, NodeStatus
from rollout.models import FileBackup, NodeChange, Path, Phase, Step
from rollout.planning import DrainPolicy
from rollout.protocols import Clock, Cluster, NodeRunner, RestoreFile
from rollout.verifying import verify


@dataclass
class Context:
    """What every node step needs: the world behind Protocols, the journal and the policies."""

    cluster: Cluster
    runner: NodeRunner
    clock: Clock
    journal: Journal
    drain: DrainPolicy = field(default_factory=DrainPolicy)
    verify_timeout_s: float = 120.0
    on_event: Callable[[str], None] = lambda _m: None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def record(
        self,
        node: str,
        step: Step,
        phase: Phase,
        path: Path,
        data: Mapping[str, Any] | None = None,
    ) -> None:
        """Journal one node step (thread-safe; fsynced before returning)."""
        with self._lock:
            self.journal.append(
                step.value, phase, now=self.clock.now(), node=node, path=path, data=data
            )


def change_record(change: NodeChange, blobs: Mapping[str, str]) -> dict[str, Any]:
    """What the journal keeps of a node change so resume and rollback can rebuild it."""
    return {
        "host": change.host,
        "service": change.service,
        "healthzUrl": change.healthz_url,
        "checkpointReset": list(change.checkpoint_reset),
        "removed": list(change.removed),
        "expected": dict(change.expected),
        "files": [
            {
                "path": p,
                "sha256": blobs[p],
                "mode": change.mode.get(p, ("0644", "root", "root"))[0],
                "owner": change.mode.get(p, ("0644", "root", "root"))[1],
                "group": change.mode.get(p, ("0644", "root", "root"))[2],
            }
            for p in sorted(change.files)
        ],
    }


def change_from_record(journal: Journal, node: str, rec: Mapping[str, Any]) -> NodeChange:
    """Rebuild a node change from its journal record (file bytes from the blob store)."""
    files = {f["path"]: journal.load_backup(node, f["sha256"]) for f in rec.get("files", ())}
    mode = {f["path"]: (f["mode"], f["owner"], f["group"]) for f in rec.get("files", ())}
    return NodeChange(
        node=node,
        host=str(rec.get("host", node)),
        files=files,
        removed=tuple(rec.get("removed", ())),
        checkpoint_reset=tuple(rec.get("checkpointReset", ())),
        expected=dict(rec.get("expected", {})),
        service=str(rec.get("service", "kubelet")),
        mode=mode,
        healthz_url=str(rec.get("healthzUrl", "http://127.0.0.1:10248/healthz")),
    )


def restore_files(
    journal: Journal, node: str, backups: tuple[FileBackup, ...]
) -> list[RestoreFile]:
    """The restore payload: original bytes for files that existed, None for files we created."""
    return [
        RestoreFile(
            path=b.path,
            content=journal.load_backup(node, b.sha256) if b.existed else None,
            mode=b.mode,
            owner=b.owner,
            group=b.group,
        )
        for b in backups
    ]


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
    """Run the restore path for one node.

    When the apply step never began (``files_touched`` False) the files are as they were, so only
    the cordon is undone. Otherwise: cordon (recording whether we did), drain, restore files,
    verify against the previous settings, uncordon only if this change cordoned the node.

    Raises:
        NodeOperationError: a restore step failed (journaled as ``failed``; state ``failed``).
    """
    node = status.node
    step = Step.UNCORDON
    try:
        ours = needs_uncordon(status)
        if status.files_touched:
            if not status.record:
                raise InputError(f"journal has no change record for node {node}")
            change = change_from_record(ctx.journal, node, status.record)
            step = Step.CORDON
            info = ctx.cluster.node(node)
            ctx.record(node, step, Phase.BEGIN, Path.RESTORE, {"priorCordoned": info.unschedulable})
            if not info.unschedulable:
                ctx.cluster.cordon(node)
                ours = True
            ctx.record(node, step, Phase.DONE, Path.RESTORE, {"cordonedByUs": ours})
            step = Step.DRAIN
            ctx.record(node, step, Phase.BEGIN, Path.RESTORE)
            report = drain(ctx.cluster, node, ctx.drain, ctx.clock, ctx.on_event)
            ctx.record(node, step, Phase.DONE, Path.RESTORE, {"evicted": list(report.evicted)})
            step = Step.RESTORE
            files = restore_files(ctx.journal, node, status.backups)
            ctx.record(
                node,
                step,
                Phase.BEGIN,
                Path.RESTORE,
                {"files": [{"path": f.path, "remove": f.content is None} for f in files]},
            )
            ctx.on_event(f"{node}: restoring {len(files)} file(s)")
            result = ctx.runner.restore(change, ctx.journal.change_id, files)
            if not result.ok:
                raise NodeOperationError(f"restore playbook failed on {node}: {result.message}")
            ctx.record(node, step, Phase.DONE, Path.RESTORE)
            step = Step.RESTORE_VERIFY
            ctx.record(
                node, step, Phase.BEGIN, Path.RESTORE, {"expected": dict(status.prior_config)}
            )
            verify(
                ctx.cluster,
                node,
                status.prior_config,
                status.prior_allocatable,
                ctx.clock,
                ctx.verify_timeout_s,
            )
            ctx.record(node, step, Phase.DONE, Path.RESTORE)
        step = Step.UNCORDON
        ctx.record(node, step, Phase.BEGIN, Path.RESTORE, {"weCordoned": ours})
        if ours:
            ctx.cluster.uncordon(node)
        ctx.record(node, step, Phase.DONE, Path.RESTORE, {"uncordoned": ours})
        ctx.on_event(f"{node}: restored" + ("" if ours else " (cordon state left as it was)"))
    except RolloutError as e:
        ctx.record(node, step, Phase.FAILED, Path.RESTORE, {"message": str(e)})
        raise NodeOperationError(f"restore of node {node} failed at {step.value}: {e}") from e
