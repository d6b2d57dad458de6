"""Putting a node back: the restore path shared by automatic restore, ``rollback`` and ``resume``.

Why one path: whether a canary failed verify, an operator asked for a rollback, or the process was
killed mid-step, the node must end exactly as it was: the journaled files back byte for byte, the
checkpoint files handled as on apply, the kubelet restarted and proven healthy with the *previous*
settings, and uncordoned only if this change cordoned it. Every step is journaled on the
``restore`` path, so a restore interrupted in turn is itself resumable. Nodes restored together
(a failed batch, a rollback) share one restore playbook run; every other step stays per node.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

from rollout.change.draining import drain
from rollout.change.journal import Journal
from rollout.change.planning import DrainPolicy
from rollout.change.replaying import NodeStatus
from rollout.change.verifying import verify
from rollout.errors import ExternalError, InputError, NodeOperationError, RolloutError
from rollout.fanout import DEFAULT_FORKS, workers
from rollout.interrupt import Interrupt, InterruptibleClock
from rollout.models import FileBackup, NodeChange, Phase, Step, StepPath
from rollout.protocols import Clock, Cluster, NodeRunner, RestoreFile, RunResult


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
    interrupt: Interrupt = field(default_factory=Interrupt)
    #: at most this many nodes are worked on at once (``--forks``; see ``rollout.fanout``)
    forks: int = DEFAULT_FORKS
    #: restores overwrite files edited after this change wrote them (``rollout rollback --force``,
    #: also when handed over); otherwise the node step's compare-and-swap refuses them
    force_restore: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def forward_clock(self) -> InterruptibleClock:
        """The clock the forward path waits with: an interrupt cuts its waits short."""
        return InterruptibleClock(self.clock, self.interrupt)

    def record(
        self,
        node: str,
        step: Step,
        phase: Phase,
        path: StepPath,
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
                **({"expect": change.expect[p]} if p in change.expect else {}),
            }
            for p in sorted(change.files)
        ],
    }


def change_from_record(
    journal: Journal, node: str, rec: Mapping[str, Any], for_restore: bool = False
) -> NodeChange:
    """Rebuild a node change from its journal record (file bytes from the blob store).

    ``for_restore``: the bytes the change wrote are needed only for their sha256 (a restore
    accepts them as the file's current content), so a blob this machine lacks is left out of
    ``files`` and its sha256 kept in ``written``; a forward path (resume) needs every byte.
    """
    files = {}
    for f in rec.get("files", ()):
        if for_restore and not (journal.backups / node / f["sha256"]).exists():
            continue
        files[f["path"]] = journal.load_backup(node, f["sha256"])
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
        expect={f["path"]: f["expect"] for f in rec.get("files", ()) if "expect" in f},
        written={f["path"]: f["sha256"] for f in rec.get("files", ())},
    )


def restore_files(
    journal: Journal, node: str, backups: tuple[FileBackup, ...]
) -> list[RestoreFile]:
    """The restore payload: original bytes for files that existed, None for files we created.

    A backup this machine does not have (the state directory and the cluster record both lost
    it) is put back from the node's own copy, which the node step checks against the journal's
    sha256 (``RestoreFile.node_copy``); a backup that is here but corrupt is refused.
    """
    out = []
    for b in backups:
        content, node_copy = None, None
        if b.existed:
            if (journal.backups / node / b.sha256).exists():
                content = journal.load_backup(node, b.sha256)
            else:
                node_copy = b.sha256
        out.append(RestoreFile(b.path, content, b.mode, b.owner, b.group, node_copy))
    return out


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


T = TypeVar("T")


def wrap(e: Exception) -> RolloutError:
    """A rollout error as is; anything else as an ExternalError naming its type."""
    return e if isinstance(e, RolloutError) else ExternalError(f"{type(e).__name__}: {e}")


def in_parallel(
    nodes: Sequence[str], work: Callable[[str], T], forks: int = DEFAULT_FORKS
) -> tuple[dict[str, T], dict[str, RolloutError]]:
    """Run ``work`` on each node, at most ``forks`` at once (inline for one node): results and
    failures by node. A node waits for a free worker before its work starts.

    A ``BaseException`` that is not an ``Exception`` (SIGINT, a test's stand-in for SIGKILL) is
    re-raised once every node's work has ended: it stops the process, it does not fail a node.
    """
    results: dict[str, T] = {}
    failures: dict[str, RolloutError] = {}
    if len(nodes) == 1:
        try:
            results[nodes[0]] = work(nodes[0])
        except Exception as e:
            failures[nodes[0]] = wrap(e)
        return results, failures
    if not nodes:
        return results, failures
    fatal: BaseException | None = None
    with ThreadPoolExecutor(max_workers=workers(len(nodes), forks)) as pool:
        futures = {n: pool.submit(work, n) for n in nodes}
        for n, f in futures.items():
            exc = f.exception()
            if exc is None:
                results[n] = f.result()
            elif isinstance(exc, Exception):
                failures[n] = wrap(exc)
            else:
                fatal = fatal or exc
    if fatal is not None:
        raise fatal
    return results, failures


def run_many(
    nodes: Sequence[str], run: Callable[[], Mapping[str, RunResult]]
) -> dict[str, RunResult]:
    """One shared playbook run's result for each node; a run that could not start at all (or
    that named no result for a node) fails those nodes with the reason."""
    try:
        got = dict(run())
    except Exception as e:
        err = wrap(e)
        return {n: RunResult(False, str(err)) for n in nodes}
    return {
        n: got.get(n) or RunResult(False, "the playbook reported nothing for it") for n in nodes
    }


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
