"""The orchestrator's ``NodeRunner`` Protocol over the apply and restore playbooks.

Why an adapter: the orchestrator speaks in ``NodeChange`` and ``RestoreFile``; the playbooks take
per-host JSON payloads (``rollout.ansible.payloads``). The nodes of one batch share one playbook
run (``forks`` = batch size): Ansible's start-up (~2 s of CPU) is paid once per batch, and the
runs of a batch no longer compete for the controller's cores. Outcomes stay per host, so a node
that fails or is unreachable fails alone. A restore prefers the metadata (mode, owner, group,
directories we created) that the apply playbook recorded on the node, and always the bytes the
journal holds.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rollout.ansible.payloads import (
    ABSENT,
    ApplyPayload,
    BackedUpFile,
    Backup,
    FileWrite,
    RestorePayload,
)
from rollout.ansible.runner import AnsibleRunner, HostResult, TaskEvent
from rollout.models import NodeChange
from rollout.protocols import RestoreFile, RunResult


def _result(h: HostResult | None, what: str, node: str) -> RunResult:
    if h is None:
        return RunResult(False, f"{what} did not run on the host")
    if h.status == "ok":
        return RunResult(True, changed=h.changed)
    report = h.report or {}
    if report.get("refused"):
        found = "; ".join(
            f"{m.get('path')}: expected sha256 {m.get('expected')}, found {m.get('found')}"
            for m in report.get("mismatches") or ()
        )
        return RunResult(
            False,
            f"node {node}: file(s) changed on the node, nothing written: {found}",
            refused=True,
        )
    where = f" at {h.failed_task!r}" if h.failed_task else ""
    return RunResult(False, f"{what} {h.status}{where}: {h.message or 'no message'}")


class PlaybookNodeRunner:
    """Runs apply.yml / restore.yml for the nodes of a batch, one playbook run per call."""

    def __init__(
        self,
        root: Path,
        inventory: Path,
        on_event: Callable[[str], None] = lambda _m: None,
        force_restore: bool = False,
    ) -> None:
        self.root = root
        self.inventory = inventory
        self.on_event = on_event
        self.ansible = AnsibleRunner(root)
        #: restore over files someone edited after our write (``rollback --force``)
        self.force_restore = force_restore

    def _events(self, nodes: Mapping[str, str]) -> Callable[[TaskEvent], None]:
        def handler(e: TaskEvent) -> None:
            if e.kind == "failed" or e.kind == "unreachable":
                node = nodes.get(e.host, e.host)
                self.on_event(f"{node}: {e.kind} at {e.task!r}: {e.message or ''}")

        return handler

    def apply(self, change: NodeChange, change_id: str, backup_dir: str) -> RunResult:
        """See ``NodeRunner.apply``."""
        return self.apply_many([change], change_id)[change.node]

    def apply_many(self, changes: Sequence[NodeChange], change_id: str) -> Mapping[str, RunResult]:
        """See ``NodeRunner.apply_many``.

        Raises:
            ExternalError: the playbook could not start at all (every node of the call failed).
        """
        payloads = {c.host: _apply_payload(c, change_id) for c in changes}
        res = self.ansible.apply(
            self.inventory, change_id, payloads, self._events({c.host: c.node for c in changes})
        )
        return {
            c.node: _result(res.playbook.hosts.get(c.host), "apply playbook", c.node)
            for c in changes
        }

    def restore(
        self, change: NodeChange, change_id: str, files: Sequence[RestoreFile]
    ) -> RunResult:
        """See ``NodeRunner.restore``."""
        return self.restore_many([(change, files)], change_id)[change.node]

    def restore_many(
        self, items: Sequence[tuple[NodeChange, Sequence[RestoreFile]]], change_id: str
    ) -> Mapping[str, RunResult]:
        """See ``NodeRunner.restore_many``.

        Raises:
            ExternalError: the playbook could not start at all (every node of the call failed).
        """
        payloads = {c.host: self._restore_payload(c, change_id, files) for c, files in items}
        res = self.ansible.restore(
            self.inventory,
            change_id,
            payloads,
            self._events({c.host: c.node for c, _ in items}),
            {"rollout_kubelet_force": True} if self.force_restore else None,
        )
        out = {c.node: _result(res.hosts.get(c.host), "restore playbook", c.node) for c, _ in items}
        for node, r in out.items():
            if r.refused:
                out[node] = RunResult(
                    False,
                    r.message.replace("nothing written", "changed after our write; nothing written")
                    + " (rollout rollback --force overwrites them)",
                    refused=True,
                )
        return out

    def _backup(self, change_id: str, host: str) -> Backup | None:
        """The controller's copy of the node's backup manifest; also where releases that ran one
        playbook per host kept it (``hosts/<host>/``), so their changes still roll back fully."""
        found = self.ansible.backup(change_id, host)
        if found is None:
            found = AnsibleRunner(self.root / "hosts" / host).backup(change_id, host)
        return found

    def _restore_payload(
        self, change: NodeChange, change_id: str, files: Sequence[RestoreFile]
    ) -> RestorePayload:
        manifest = self._backup(change_id, change.host)
        recorded = {f.path: f for f in manifest.files} if manifest else {}
        out = []
        for f in files:
            m = recorded.get(f.path)
            out.append(
                BackedUpFile(
                    path=f.path,
                    existed=f.content is not None,
                    sha256=hashlib.sha256(f.content).hexdigest() if f.content is not None else None,
                    mode=(m.mode if m and m.mode else f.mode),
                    owner=(m.owner if m and m.owner else f.owner),
                    group=(m.group if m and m.group else f.group),
                    content=f.content,
                    missing_parents=m.missing_parents if m else (),
                    written=(
                        hashlib.sha256(change.files[f.path]).hexdigest()
                        if f.path in change.files
                        else None
                    ),
                )
            )
        return RestorePayload.from_backup(
            Backup(change.host, change_id, tuple(out)),
            service=change.service,
            checkpoint_reset=change.checkpoint_reset,
            healthz_url=change.healthz_url,
        )


def _expect(change: NodeChange, path: str) -> str:
    """What the node's file must still hold right before the write: the sha256 preflight read
    (journaled with the change, so a resumed apply checks the same), else of ``before``."""
    if path in change.expect:
        return change.expect[path]
    before = change.before.get(path)
    return ABSENT if before is None else hashlib.sha256(before).hexdigest()


def _apply_payload(change: NodeChange, change_id: str) -> ApplyPayload:
    """The files with the mode and owner render chose for a new file and the node's own for an
    existing one (``NodeChange.mode``), and the digest preflight read as the expectation."""
    files = tuple(
        FileWrite(
            path,
            content,
            *change.mode.get(path, ("0644", "root", "root")),
            expect=_expect(change, path),
        )
        for path, content in sorted(change.files.items())
    )
    return ApplyPayload(
        change_id=change_id,
        files=files,
        service=change.service,
        checkpoint_reset=change.checkpoint_reset,
        healthz_url=change.healthz_url,
    )
