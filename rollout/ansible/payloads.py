"""What the playbooks receive and what they leave behind, as plain data.

Render computes the bytes (design.md, convention 10); these records carry them to the
playbooks as one JSON file per host on the controller (``<payload dir>/<host>.json``), because
per-host content differs (each node has its own reserved CPUs). The backup manifest the apply
playbook writes comes back as :class:`Backup`, and :meth:`RestorePayload.from_backup` turns it
into the restore payload, so a rollback uses exactly the bytes recorded before the change.
Pure: no I/O here.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from rollout.errors import InputError, Location

DEFAULT_HEALTHZ_URL = "http://127.0.0.1:10248/healthz"
#: What a compare-and-swap expects of a path that must not exist.
ABSENT = "absent"
BACKUP_ROOT = "/var/lib/rollout/backups"


class RenderedLike(Protocol):
    """What :meth:`FileWrite.from_rendered` needs (``rollout.kubelet.render.RenderedFile``)."""

    @property
    def path(self) -> str: ...
    @property
    def content(self) -> bytes: ...
    @property
    def mode(self) -> str: ...
    @property
    def owner(self) -> str: ...


def _with_ca(ca_path: str | None, payload: dict[str, Any]) -> dict[str, Any]:
    """Add ``healthz_ca_path`` only when set, so the playbook omits the option otherwise."""
    return {**payload, "healthz_ca_path": ca_path} if ca_path else payload


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


@dataclass(frozen=True)
class FileWrite:
    """One file the apply playbook writes.

    Attributes:
        path: absolute node path.
        content: exact bytes (UTF-8 text: the playbook's copy module writes text).
        mode: octal string such as ``"0644"``.
        owner, group: user and group names on the node.
        validate: optional validator command with ``%s`` for the temporary file.
        expect: the sha256 the node's file must still have right before the write (what
            preflight read), or :data:`ABSENT`; the node step refuses to write otherwise.
    """

    path: str
    content: bytes
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    validate: str | None = None
    expect: str = ABSENT

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()

    @classmethod
    def from_rendered(cls, f: RenderedLike) -> FileWrite:
        """Build from render's file record, whose ``owner`` is ``user`` or ``user:group``."""
        owner, _, group = f.owner.partition(":")
        return cls(path=f.path, content=f.content, mode=f.mode, owner=owner, group=group or owner)

    def as_json(self) -> dict[str, Any]:
        try:
            self.content.decode("utf-8")
        except UnicodeDecodeError as e:
            raise InputError(
                "only UTF-8 text files can be shipped", Location(file=self.path)
            ) from e
        out: dict[str, Any] = {
            "path": self.path,
            "content_b64": _b64(self.content),
            "mode": self.mode,
            "owner": self.owner,
            "group": self.group,
            "sha256": self.sha256,
            "expect": self.expect,
        }
        if self.validate:
            out["validate"] = self.validate
        return out


@dataclass(frozen=True)
class ApplyPayload:
    """Everything apply.yml needs for one host."""

    change_id: str
    files: tuple[FileWrite, ...]
    service: str
    checkpoint_reset: tuple[str, ...] = ()
    healthz_url: str = DEFAULT_HEALTHZ_URL
    backup_dir: str | None = None
    healthz_ca_path: str | None = None

    def as_json(self) -> dict[str, Any]:
        return _with_ca(
            self.healthz_ca_path,
            {
                "change_id": self.change_id,
                "files": [f.as_json() for f in self.files],
                "checkpoint_reset": list(self.checkpoint_reset),
                "service": self.service,
                "healthz_url": self.healthz_url,
                "backup_dir": self.backup_dir or f"{BACKUP_ROOT}/{self.change_id}",
            },
        )


@dataclass(frozen=True)
class BackedUpFile:
    """One file as it was before the change (``existed=False``: the change creates it).

    ``written`` is the sha256 of what the apply wrote there, when known: a restore accepts it
    (or the original) as the file's current content and refuses anything else (someone edited
    the file after our write) unless forced.
    """

    path: str
    existed: bool
    sha256: str | None = None
    mode: str | None = None
    owner: str | None = None
    group: str | None = None
    content: bytes | None = None
    missing_parents: tuple[str, ...] = ()
    written: str | None = None


@dataclass(frozen=True)
class Backup:
    """A host's backup manifest, as kept on the controller."""

    host: str
    change_id: str
    files: tuple[BackedUpFile, ...]

    @classmethod
    def from_manifest(
        cls, host: str, data: Mapping[str, Any], *, file: str | None = None
    ) -> Backup:
        """Parse ``manifest.json`` and check every file's bytes against its sha256.

        Raises:
            InputError: a field is missing or a file's bytes do not match its recorded sha256.
        """
        try:
            entries = []
            for i, e in enumerate(data["files"]):
                content = None
                if e["existed"]:
                    content = base64.b64decode(e["content_b64"], validate=True)
                    if hashlib.sha256(content).hexdigest() != e["sha256"]:
                        raise InputError(
                            f"backup of {e['path']} does not match its sha256",
                            Location(file=file, field=f"files[{i}].content_b64"),
                        )
                entries.append(
                    BackedUpFile(
                        path=e["path"],
                        existed=bool(e["existed"]),
                        sha256=e.get("sha256"),
                        mode=e.get("mode"),
                        owner=e.get("owner"),
                        group=e.get("group"),
                        content=content,
                        missing_parents=tuple(e.get("missingParents") or ()),
                    )
                )
            return cls(host=host, change_id=str(data["changeId"]), files=tuple(entries))
        except (KeyError, TypeError, ValueError) as e:
            if isinstance(e, InputError):
                raise
            raise InputError(f"malformed backup manifest: {e!r}", Location(file=file)) from e


@dataclass(frozen=True)
class RestorePayload:
    """Everything restore.yml needs for one host."""

    change_id: str
    files: tuple[BackedUpFile, ...]
    service: str
    checkpoint_reset: tuple[str, ...] = ()
    healthz_url: str = DEFAULT_HEALTHZ_URL
    remove_dirs: tuple[str, ...] = field(default=())
    healthz_ca_path: str | None = None

    @classmethod
    def from_backup(
        cls,
        backup: Backup,
        *,
        service: str,
        checkpoint_reset: tuple[str, ...] = (),
        healthz_url: str = DEFAULT_HEALTHZ_URL,
        healthz_ca_path: str | None = None,
        written: Mapping[str, str] | None = None,
    ) -> RestorePayload:
        """Put back what existed, remove what the change created (and the directories it made).

        ``written``: path -> sha256 of what the apply wrote (the restore accepts it as the
        current content; see :class:`BackedUpFile`).
        """
        dirs = {d for f in backup.files if not f.existed for d in f.missing_parents}
        files = tuple(
            replace(f, written=(written or {}).get(f.path, f.written)) for f in backup.files
        )
        return cls(
            change_id=backup.change_id,
            files=files,
            service=service,
            checkpoint_reset=checkpoint_reset,
            healthz_url=healthz_url,
            remove_dirs=tuple(sorted(dirs, key=lambda d: (-d.count("/"), d))),
            healthz_ca_path=healthz_ca_path,
        )

    def as_json(self) -> dict[str, Any]:
        return _with_ca(
            self.healthz_ca_path,
            {
                "change_id": self.change_id,
                "restore": [
                    {
                        "path": f.path,
                        "content_b64": _b64(f.content)
                        if f.existed and f.content is not None
                        else None,
                        "mode": f.mode,
                        "owner": f.owner,
                        "group": f.group,
                        "sha256": f.sha256,
                        "current": [f.written] if f.written else [],
                        # no bytes here: the node puts back its own copy of them (checked)
                        **({"from_node_backup": True} if f.existed and f.content is None else {}),
                    }
                    for f in self.files
                ],
                "backup_dir": f"{BACKUP_ROOT}/{self.change_id}",
                "remove_dirs": list(self.remove_dirs),
                "checkpoint_reset": list(self.checkpoint_reset),
                "service": self.service,
                "healthz_url": self.healthz_url,
            },
        )
