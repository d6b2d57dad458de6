"""What the journal keeps of a node change, and what resume and rollback rebuild from it: the
node change itself (:func:`change_from_record`) and the restore payload (:func:`restore_files`).

Pure but for the journal's blob store: the forward path writes the record, the restore path and
resume read it, so it belongs to neither.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.change.record.journal import Journal
from rollout.models import FileBackup, NodeChange
from rollout.protocols import RestoreFile


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


@dataclass(frozen=True)
class RecordedFile:
    """One file a node change writes, as its record keeps it (bytes in the blob store)."""

    path: str
    sha256: str
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    expect: str | None = None  # compare-and-swap: the sha256 the file must have before


@dataclass(frozen=True)
class NodeRecord:
    """A kubelet-config node change's record (:func:`change_record`), read: the one place its
    keys are read (the journal carries it in the ``backup`` step's ``change``)."""

    host: str | None
    service: str
    healthz_url: str
    checkpoint_reset: tuple[str, ...]
    removed: tuple[str, ...]
    expected: Mapping[str, Any]
    files: tuple[RecordedFile, ...]

    @classmethod
    def read(cls, rec: Mapping[str, Any]) -> NodeRecord:
        return cls(
            host=None if rec.get("host") is None else str(rec["host"]),
            service=str(rec.get("service", "kubelet")),
            healthz_url=str(rec.get("healthzUrl", "http://127.0.0.1:10248/healthz")),
            checkpoint_reset=tuple(rec.get("checkpointReset", ())),
            removed=tuple(str(p) for p in rec.get("removed", ())),
            expected=dict(rec.get("expected") or {}),
            files=tuple(
                RecordedFile(
                    str(f["path"]),
                    str(f["sha256"]),
                    str(f.get("mode", "0644")),
                    str(f.get("owner", "root")),
                    str(f.get("group", "root")),
                    None if f.get("expect") is None else str(f["expect"]),
                )
                for f in rec.get("files", ())
            ),
        )


def change_from_record(
    journal: Journal, node: str, rec: Mapping[str, Any], for_restore: bool = False
) -> NodeChange:
    """Rebuild a node change from its journal record (file bytes from the blob store).

    ``for_restore``: the bytes the change wrote are needed only for their sha256 (a restore
    accepts them as the file's current content), so a blob this machine lacks is left out of
    ``files`` and its sha256 kept in ``written``; a forward path (resume) needs every byte.
    """
    r = NodeRecord.read(rec)
    files = {}
    for f in r.files:
        if for_restore and not (journal.backups / node / f.sha256).exists():
            continue
        files[f.path] = journal.load_backup(node, f.sha256)
    return NodeChange(
        node=node,
        host=r.host if r.host is not None else node,
        files=files,
        removed=r.removed,
        checkpoint_reset=r.checkpoint_reset,
        expected=dict(r.expected),
        service=r.service,
        mode={f.path: (f.mode, f.owner, f.group) for f in r.files},
        healthz_url=r.healthz_url,
        expect={f.path: f.expect for f in r.files if f.expect is not None},
        written={f.path: f.sha256 for f in r.files},
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
