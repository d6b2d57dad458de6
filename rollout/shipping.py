"""The orchestrator's ``NodeRunner`` Protocol over the apply and restore playbooks.

Why an adapter: the orchestrator speaks in ``NodeChange`` and ``RestoreFile``; the playbooks take
per-host JSON payloads (``rollout.ansible.payloads``). Each host gets its own runner directory so
the nodes of one batch run their playbooks at the same time without sharing ansible-runner's
private data dir. A restore prefers the metadata (mode, owner, group, directories we created) that
the apply playbook recorded on the node, and always the bytes the journal holds.
"""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

from rollout.ansible.payloads import ApplyPayload, BackedUpFile, Backup, FileWrite, RestorePayload
from rollout.ansible.runner import AnsibleRunner, HostResult, TaskEvent
from rollout.models import NodeChange
from rollout.protocols import RestoreFile, RunResult


def _result(h: HostResult | None, what: str) -> RunResult:
    if h is None:
        return RunResult(False, f"{what} did not run on the host")
    if h.status == "ok":
        return RunResult(True, changed=h.changed)
    where = f" at {h.failed_task!r}" if h.failed_task else ""
    return RunResult(False, f"{what} {h.status}{where}: {h.message or 'no message'}")


class PlaybookNodeRunner:
    """Runs apply.yml / restore.yml for one node at a time."""

    def __init__(
        self,
        root: Path,
        inventory: Path,
        on_event: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self.root = root
        self.inventory = inventory
        self.on_event = on_event
        self._runners: dict[str, AnsibleRunner] = {}
        self._lock = threading.Lock()

    def runner(self, host: str) -> AnsibleRunner:
        """The host's own runner (own private data dir)."""
        with self._lock:
            if host not in self._runners:
                self._runners[host] = AnsibleRunner(self.root / "hosts" / host)
            return self._runners[host]

    def _events(self, node: str) -> Callable[[TaskEvent], None]:
        def handler(e: TaskEvent) -> None:
            if e.kind == "failed" or e.kind == "unreachable":
                self.on_event(f"{node}: {e.kind} at {e.task!r}: {e.message or ''}")

        return handler

    def apply(self, change: NodeChange, change_id: str, backup_dir: str) -> RunResult:
        """See ``NodeRunner.apply``."""
        files = tuple(
            FileWrite(path, content, *change.mode.get(path, ("0644", "root", "root")))
            for path, content in sorted(change.files.items())
        )
        payload = ApplyPayload(
            change_id=change_id,
            files=files,
            service=change.service,
            checkpoint_reset=change.checkpoint_reset,
            healthz_url=change.healthz_url,
        )
        res = self.runner(change.host).apply(
            self.inventory, change_id, {change.host: payload}, self._events(change.node)
        )
        return _result(res.playbook.hosts.get(change.host), "apply playbook")

    def restore(
        self, change: NodeChange, change_id: str, files: Sequence[RestoreFile]
    ) -> RunResult:
        """See ``NodeRunner.restore``."""
        runner = self.runner(change.host)
        manifest = runner.backup(change_id, change.host)
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
                )
            )
        payload = RestorePayload.from_backup(
            Backup(change.host, change_id, tuple(out)),
            service=change.service,
            checkpoint_reset=change.checkpoint_reset,
            healthz_url=change.healthz_url,
        )
        res = runner.restore(
            self.inventory, change_id, {change.host: payload}, self._events(change.node)
        )
        return _result(res.hosts.get(change.host), "restore playbook")
