"""The durable record of a change: every node step, journaled before and after it happens.

Why a journal: a change runs on production nodes and may die at any point (SIGKILL, lost SSH, a
laptop lid). Whatever happens, ``rollout status`` must say what state every node is in and
``rollout resume`` / ``rollout rollback`` must be able to finish or undo it. So each step is written
down *before* it starts (``begin``, with what we need to undo it, such as the node's prior cordon
state) and *after* it ends (``done`` / ``failed``), as one JSON line, fsynced before the step
proceeds; appenders in several processes take turns on an exclusive ``flock`` of the file. Backups
of the original files live next to the journal, named by their sha256.

Layout::

    ${ROLLOUT_STATE_DIR:-~/.local/state/rollout}/changes/<change-id>/journal.jsonl
    ${ROLLOUT_STATE_DIR:-~/.local/state/rollout}/changes/<change-id>/backups/<node>/<sha256>

:func:`rollout.change.record.replay.replay` turns the entries into every node's state.

The directory is a cache of the change's cluster record: with a :class:`JournalMirror` attached
(``rollout.kube.mirror.ClusterMirror``), every entry and backup is also written into the cluster
after the local fsync, and a machine without the directory fetches it from there.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import secrets
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from pathlib import Path as FsPath
from typing import Any, Protocol

from rollout.change.record.entries import SCHEMA_VERSION
from rollout.errors import InputError, Location
from rollout.identity import process_identity
from rollout.models import Phase, StepPath


class Kind(StrEnum):
    """Every kind of change-level entry (``Entry.node`` None), the one place their names are
    spelled; node entries carry a :class:`rollout.models.Step`. What each one's ``data`` holds
    is its type in :mod:`rollout.change.record.entries` (read and written there only, with the
    schema version ``rollout.change.record.entries.SCHEMA_VERSION``); how it moves a change's status
    is
    :mod:`rollout.change.record.replay`
    (``tests/unit/test_journal.py::test_every_entry_kind_is_named_from_the_catalogue``)."""

    CHANGE = "change"  # begin (plan, inventory, intent, batches, who), then done/failed + outcome
    GATE = "gate"  # the gate's soak over nodes: begin, then done with its verdict
    VERDICT = "verdict"  # one gate evaluation: status, reason, inputs
    TRIGGER = "trigger"  # what asked for a rollback (gate, alert, watch) and which nodes
    RECOVERY = "recovery"  # after an automatic rollback: which rejected owners run again
    REQUEST = "request"  # a rollback handed to the change's owner (the Lease holder)
    EVIDENCE = "evidence"  # an evidence collection: label, nodes, file, each check's result
    RECREATE = "recreate"  # apply --recreate-workloads: one controller's pods on a node, then
    # done with their replacements (and the nodes they run on) or failed with why
    BENCH = "bench"  # rollout bench on a node: both bindings' numbers per GPU model, or the error
    BENCH_VERDICT = "bench-verdict"  # gate.bench on the canary: regression and aligned-advantage
    # verdicts over the before and after benches (rollout.gate.performance.decision_record)
    DRAIN_OVERRIDES = "drain-overrides"  # drain flags given (what the drains may lose)
    PREFLIGHT_FORCED = "preflight-forced"  # device refusals overridden: reason, refusals
    SERVING_FORCED = "serving-canary-forced"  # serving canaries overridden: reason, inProgress
    REJECTIONS_ACCEPTED = "predicted-rejections-accepted"  # the operator's accepted predictions
    CLAIM_FREEZE = "claim-freeze"  # allocationPath.freezeClaims: the ValidatingAdmissionPolicy
    # that denies new claims of the class, applied (begin, done once enforced) then removed


CHANGE_STEP = Kind.CHANGE
"""The step name of change-level entries (node is None): begin, then done/failed with an outcome."""
EVIDENCE_STEP = Kind.EVIDENCE
"""The step name of an evidence collection's entry (node is None; ``rollout.evidence.collecting``):
label, nodes, file and each check's result."""


def state_dir(env: Mapping[str, str] | None = None) -> FsPath:
    """The state directory: ``$ROLLOUT_STATE_DIR``, else ``~/.local/state/rollout``."""
    env = os.environ if env is None else env
    root = env.get("ROLLOUT_STATE_DIR")
    return FsPath(root) if root else FsPath.home() / ".local" / "state" / "rollout"


def new_change_id(now: datetime, token: str | None = None) -> str:
    """A change id: ``<utc timestamp>-<short random>``; sorts by start time.

    Args:
        now: the start time (converted to UTC).
        token: the random part (tests pass one; default: 6 hex characters).
    """
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{stamp}-{token or secrets.token_hex(3)}"


@dataclass(frozen=True)
class Handed:
    """An entry another process asked the change's owner to write (``rollout watch``'s verdict,
    ``rollout serve``'s trigger): the request's id and who asked (``user@host pid N``)."""

    id: str
    by: str


@dataclass(frozen=True)
class Entry:
    """One journal line.

    Attributes:
        ts: ISO-8601 UTC time of the write.
        change: change id.
        step: a :class:`Step` value, or ``"change"`` for change-level entries.
        phase: begin / done / failed.
        node: Node name (None for change-level entries).
        path: forward or restore (None for change-level entries).
        data: step details (prior cordon state, backup hashes, messages).
        writer: the process that wrote it (``user@host pid N``, as the Lease names its holder;
            None in journals written before rollout named it).
        handed: set when the writer wrote it on another process's request (the owner writing
            what ``watch`` or ``serve`` decided): that request.
    """

    ts: str
    change: str
    step: str
    phase: Phase
    node: str | None = None
    path: StepPath | None = None
    data: Mapping[str, Any] = field(default_factory=dict)
    writer: str | None = None
    handed: Handed | None = None

    def to_json(self) -> str:
        """The entry as one compact JSON line (no newline)."""
        obj: dict[str, Any] = {"v": SCHEMA_VERSION, "ts": self.ts, "change": self.change}
        obj["step"] = self.step
        obj["phase"] = self.phase.value
        if self.node is not None:
            obj["node"] = self.node
        if self.path is not None:
            obj["path"] = self.path.value
        if self.data:
            obj["data"] = dict(self.data)
        if self.writer is not None:
            obj["writer"] = self.writer
        if self.handed is not None:
            obj["handed"] = {"id": self.handed.id, "by": self.handed.by}
        return json.dumps(obj, sort_keys=True, separators=(",", ":"))

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Entry:
        """Build an entry from a parsed JSON object (KeyError/ValueError on a bad shape).

        Raises:
            InputError: the entry is of a newer schema than :data:`SCHEMA_VERSION`.
        """
        version = obj.get("v", 1)
        if not isinstance(version, int) or version > SCHEMA_VERSION:
            raise InputError(
                f"journal entry of schema v{version}, written by a newer rollout; this one reads "
                f"v{SCHEMA_VERSION}: upgrade rollout to act on this change",
                Location(field="v"),
            )
        path = obj.get("path")
        try:
            phase, path = _PHASES[obj["phase"]], _PATHS[path] if path else None
        except (KeyError, TypeError):  # the message the enums give, for the line it names
            phase, path = Phase(obj["phase"]), StepPath(path) if path else None
        # the frozen dataclass's __init__ sets each field through object.__setattr__: built
        # directly, a 70,000-entry journal reads 3x faster (benchmarks/README.md, scale_bench)
        handed = obj.get("handed")
        out = object.__new__(cls)
        out.__dict__.update(
            ts=str(obj["ts"]),
            change=str(obj["change"]),
            step=str(obj["step"]),
            phase=phase,
            node=obj.get("node"),
            path=path,
            data=obj.get("data") or {},
            writer=obj.get("writer"),
            handed=None if handed is None else Handed(str(handed["id"]), str(handed["by"])),
        )
        return out


_PHASES = {p.value: p for p in Phase}
_PATHS = {p.value: p for p in StepPath}


class JournalMirror(Protocol):
    """A second copy of the journal outside this machine, written after each local write.

    Best effort: the local fsync is what a step waits for; a mirror reports its own failures
    (it must not raise)."""

    def entry(self, journal: Journal, entry: Entry) -> None:
        """Called after ``entry`` is fsynced in ``journal``."""

    def backup(self, journal: Journal, node: str, digest: str, content: bytes) -> None:
        """Called after a backup is fsynced."""


class Journal:
    """An append-only, fsynced JSON-lines file for one change.

    Attributes:
        mirror: written after each local append and backup (None: local only).
    """

    def __init__(self, directory: FsPath, change_id: str) -> None:
        self.dir = directory
        self.change_id = change_id
        self.file = directory / "journal.jsonl"
        self.backups = directory / "backups"
        self.mirror: JournalMirror | None = None
        self._read: list[Entry] = []  # every complete entry read so far, in file order
        self._offset = 0  # the byte after the last of them
        self._inode: tuple[int, int] | None = None  # (st_dev, st_ino) they were read from
        self._reading = threading.Lock()  # the node threads of a batch read the same journal
        # entries appended with ``mirror_later``, not yet handed to the mirror (file order)
        self._unmirrored: list[Entry] = []
        self._mirroring = threading.Lock()
        self.generation = 0  # +1 each time the file was replaced and is read from the start

    @classmethod
    def create(cls, root: FsPath, change_id: str) -> Journal:
        """Create the change directory (and fsync its parent so it survives a crash)."""
        changes = root / "changes"
        changes.mkdir(parents=True, exist_ok=True)
        directory = changes / change_id
        directory.mkdir()
        (directory / "backups").mkdir()
        journal = cls(directory, change_id)
        journal.file.touch()
        _fsync_dir(directory)
        _fsync_dir(changes)
        return journal

    @classmethod
    def open(cls, root: FsPath, change_id: str | None = None) -> Journal:
        """Open an existing change's journal (default: the latest change).

        Raises:
            InputError: no such change, or no change at all.
        """
        changes = root / "changes"
        if change_id is None:
            change_id = latest_change(root)
            if change_id is None:
                raise InputError(f"no change recorded under {changes}", Location(field="--change"))
        directory = changes / change_id
        if not (directory / "journal.jsonl").is_file():
            raise InputError(f"no change {change_id!r} under {changes}", Location(field="--change"))
        return cls(directory, change_id)

    def append(
        self,
        step: str,
        phase: Phase,
        *,
        now: datetime,
        node: str | None = None,
        path: StepPath | None = None,
        data: Mapping[str, Any] | None = None,
        handed: Handed | None = None,
        mirror_later: bool = False,
    ) -> Entry:
        """Write one entry and fsync it before returning; then hand it, and every entry appended
        with ``mirror_later`` before it, to the mirror. The entry names this process as its
        writer (``rollout.identity``); ``handed``: it is written on that request of another
        process's.

        The write holds an exclusive ``flock`` on ``journal.jsonl`` from the tail repair to the
        fsync, so appenders in several processes never tear or lose each other's entries
        (``tests/unit/test_journal_lock.py``). Readers take no lock: a line being written is
        a torn last line to them, which they skip.

        ``mirror_later``: a step's ``done`` that the next ``begin`` follows at once, nothing
        acting on a node between them: the mirror gets it with the next append (one cluster
        write carries both, ``ClusterMirror`` writes the journal's tail) or
        :meth:`flush_mirror`. A ``begin`` is never deferred, so the cluster record holds a step's
        ``begin``, and every entry before it, before the step acts
        (``tests/unit/test_mirroring.py``).
        """
        entry = Entry(
            ts=now.astimezone(UTC).isoformat(timespec="milliseconds"),
            change=self.change_id,
            step=step,
            phase=phase,
            node=node,
            path=path,
            data=dict(data or {}),
            writer=process_identity(),
            handed=handed,
        )
        line = (entry.to_json() + "\n").encode()
        fd = os.open(self.file, os.O_RDWR | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            # appenders in other processes (apply and serve, a resume and a handed rollback)
            # wait here: a tail repair must never see, and cut, another's half-copied line
            fcntl.flock(fd, fcntl.LOCK_EX)
            _repair_torn_tail(fd, self.file)
            _write_all(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)  # releases the lock
        failpoint(entry)
        with self._mirroring:
            self._unmirrored.append(entry)
            if not mirror_later:
                self._hand_over()
        return entry

    def flush_mirror(self) -> None:
        """Hand the mirror every entry appended with ``mirror_later`` and not yet mirrored."""
        with self._mirroring:
            self._hand_over()

    def _hand_over(self) -> None:
        entries, self._unmirrored = self._unmirrored, []
        mirror = self.mirror
        if mirror is not None:
            for e in entries:  # the first write carries the journal's tail, every one of them
                mirror.entry(self, e)

    def entries(self) -> list[Entry]:
        """Every entry. A torn last line (the process died mid-write) is ignored.

        Incremental: only the bytes appended since the last call (by this process or another)
        are read and parsed, so a change that asks after every step costs O(entries), not
        O(entries^2) (``tests/unit/test_journal.py::test_entries_parse_each_line_once``). A file
        replaced under the same name (a cache fetched again) is read from the start.

        Raises:
            InputError: a line before the last one is not a journal entry (file and line named).
        """
        with self._reading:
            return list(self._catch_up())

    def entries_since(self, count: int) -> list[Entry]:
        """The entries after the first ``count`` (what a live projection has not seen)."""
        with self._reading:
            return self._catch_up()[count:]

    def _catch_up(self) -> list[Entry]:
        try:
            st = os.stat(self.file)
        except OSError as e:
            raise InputError(f"cannot read journal: {e}", Location(file=str(self.file))) from e
        if self._inode != (st.st_dev, st.st_ino) or st.st_size < self._offset:
            if self._inode is not None:
                self.generation += 1
            self._read, self._offset, self._inode = [], 0, (st.st_dev, st.st_ino)
        if st.st_size == self._offset:
            return self._read
        with open(self.file, "rb") as f:
            f.seek(self._offset)
            tail = f.read()
        end = tail.rfind(b"\n") + 1  # whole lines only: a torn last one waits for its newline
        lines = tail[:end].split(b"\n")[:-1]
        # a last whole line that is no entry is a torn write whose newline made it (when it ends
        # the file): cut by the next append's repair, read again if it is still there
        parsed, used = _parse_lines(lines, self.file, len(self._read) + 1, end == len(tail))
        self._read.extend(parsed)
        self._offset += sum(len(raw) + 1 for raw in lines[:used])
        return self._read

    def save_backup(self, node: str, content: bytes) -> str:
        """Store an original file's bytes under its sha256 (fsynced); return the digest."""
        import hashlib

        digest = hashlib.sha256(content).hexdigest()
        directory = self.backups / node
        directory.mkdir(parents=True, exist_ok=True)
        target = directory / digest
        if not target.exists():
            tmp = directory / f".{digest}.tmp"
            with open(tmp, "wb") as f:
                f.write(content)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, target)
            _fsync_dir(directory)
        if self.mirror is not None:
            self.mirror.backup(self, node, digest, content)
        return digest

    def load_backup(self, node: str, digest: str) -> bytes:
        """The original bytes of a backed-up file.

        Raises:
            InputError: the backup is missing or does not match its hash.
        """
        import hashlib

        target = self.backups / node / digest
        try:
            content = target.read_bytes()
        except OSError as e:
            raise InputError(f"backup missing: {e}", Location(file=str(target))) from e
        if hashlib.sha256(content).hexdigest() != digest:
            raise InputError("backup does not match its sha256", Location(file=str(target)))
        return content


def read_entries(file: FsPath) -> list[Entry]:
    """Parse a journal file (see :meth:`Journal.entries`)."""
    try:
        lines = file.read_bytes().split(b"\n")
    except OSError as e:
        raise InputError(f"cannot read journal: {e}", Location(file=str(file))) from e
    if lines and lines[-1] == b"":
        lines.pop()
    return _parse_lines(lines, file, 1, True)[0]


def _parse_lines(
    lines: list[bytes], file: FsPath, first_line: int, last_may_be_torn: bool
) -> tuple[list[Entry], int]:
    """The entries of ``lines`` and how many lines they are. With ``last_may_be_torn``, a last
    line that is not an entry is left out (a torn final write); any other is named.

    Raises:
        InputError: a line that is not a journal entry (file and line named).
    """
    fast = _parse_all(lines)
    if fast is not None:  # every line an entry: the common case, one JSON parse
        return fast, len(lines)
    out: list[Entry] = []
    for i, raw in enumerate(lines):
        try:
            out.append(Entry.from_json(json.loads(raw)))
        except (ValueError, KeyError, TypeError) as e:
            if last_may_be_torn and i == len(lines) - 1:
                return out, i
            raise InputError(
                f"not a journal entry: {e}", Location(file=str(file), line=first_line + i)
            ) from e
    return out, len(lines)


def _parse_all(lines: list[bytes]) -> list[Entry] | None:
    """Every line as an entry, parsed as one JSON array (several times faster than a parse per
    line on a 70,000-entry journal); None when any line is not an entry: the caller then parses
    line by line to name it, or to skip a torn last line."""
    if not lines:
        return []
    try:
        with gc_paused():
            objs = json.loads(b"[" + b",".join(lines) + b"]")
            return [Entry.from_json(o) for o in objs] if len(objs) == len(lines) else None
    except (ValueError, KeyError, TypeError):
        return None


@contextmanager
def gc_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a block that only allocates acyclic objects
    (parsing a journal, replaying it): each 700 allocations would otherwise start a collection
    that walks every young object, most of the time of reading a 70,000-entry journal
    (``benchmarks/scale_bench.py journal``). Nothing is leaked: reference counting frees what
    the block drops, and the collector runs again after it."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def _write_all(fd: int, data: bytes) -> None:
    """``os.write`` until every byte is written (a write may be cut short, e.g. by a signal)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def _repair_torn_tail(fd: int, file: FsPath) -> None:
    """Before appending: a last line without its newline is a write the process died in.

    If it parses as an entry (only the newline was lost) the newline is added; otherwise the torn
    bytes are cut off (the step they began was never confirmed: ``append`` returns only after the
    fsync). Without this, the next entry would be glued to the torn bytes and every later read
    would fail on a corrupt middle line.
    """
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return
    data = os.pread(fd, size, 0)
    cut = data.rfind(b"\n") + 1
    try:
        Entry.from_json(json.loads(data[cut:]))
    except (ValueError, KeyError, TypeError):
        os.ftruncate(fd, cut)
    else:
        os.write(fd, b"\n")
    os.fsync(fd)


FAILPOINT_ENV = "ROLLOUT_FAILPOINT"
"""``step:phase[:node]`` (``*`` matches anything): the process kills itself with SIGKILL right
after writing the first journal entry that matches. For crash-consistency tests only, in the spirit
of etcd's gofail: a crash at an exact, named point instead of a race with a poller."""


def failpoint(entry: Entry, env: Mapping[str, str] | None = None) -> None:
    """SIGKILL this process if ``$ROLLOUT_FAILPOINT`` names ``entry`` (:data:`FAILPOINT_ENV`)."""
    spec = (os.environ if env is None else env).get(FAILPOINT_ENV)
    if not spec or not failpoint_matches(spec, entry):
        return
    import signal

    os.kill(os.getpid(), signal.SIGKILL)


def failpoint_matches(spec: str, entry: Entry) -> bool:
    """Whether ``step:phase[:node]`` names ``entry`` (pure; ``*`` or an empty part matches all)."""
    parts = spec.split(":")
    want = [*parts, "*", "*", "*"][:3]
    have = (entry.step, entry.phase.value, entry.node or "")
    return all(w in ("", "*", h) for w, h in zip(want, have, strict=True))


def latest_change(root: FsPath) -> str | None:
    """The most recent change id under ``root`` (ids sort by start time), or None."""
    changes = root / "changes"
    if not changes.is_dir():
        return None
    ids = sorted(p.name for p in changes.iterdir() if (p / "journal.jsonl").is_file())
    return ids[-1] if ids else None


def _fsync_dir(directory: FsPath) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
