"""The journal mirrored into the cluster, and the local cache rebuilt from it.

:class:`ClusterMirror` is the :class:`~rollout.change.record.journal.JournalMirror` the CLI attaches
to every journal it writes with an API connection: after each local append it rewrites the journal's
last (still open) chunk ConfigMap, after each backup it writes the backup's bytes, and when a
node's replayed state changes it annotates the Node (:mod:`rollout.kube.mirror`). Its projection
of node states is the journal's :class:`~rollout.change.record.replay.Projection`, updated entry by
entry (O(1) per append).

Best effort, by design: the local fsync is what each step waits for, and an API hiccup must not
abandon a node half-drained. A failed mirror write is reported through ``warn`` (never silently
dropped) and healed by the next append, which rewrites every chunk from the first one not yet
confirmed. A crash between the local append and the mirror write leaves the mirror one entry
behind until the next append (``resume`` or ``rollback`` from any machine that has the entry).
The node threads of a batch take turns on the mirror: each write reads the journal's tail when
its turn comes, so the record never goes back to an older copy
(``tests/unit/test_mirroring.py::test_concurrent_appends_never_leave_an_older_copy_last``); a
thread whose entry the previous write already carried (appended before that write read the
tail) does not write it again
(``tests/unit/test_mirroring.py::test_an_entry_another_write_carried_is_not_written_again``).

:func:`fetch_change` is the other direction: a machine whose state directory has no journal for
a change rebuilds ``changes/<id>/`` from the cluster and then proceeds as with a local journal.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from pathlib import Path as FsPath
from typing import TYPE_CHECKING

from rollout.change.record.journal import Entry, Journal, read_entries
from rollout.change.record.replay import Projection
from rollout.errors import InputError, Location
from rollout.kube import mirror as km

if TYPE_CHECKING:
    from rollout.kube.client import Api


class ClusterMirror:
    """Writes a journal's entries, backups and node states into the cluster (see module doc)."""

    def __init__(self, api: Api, namespace: str, warn: Callable[[str], None]) -> None:
        self.api = api
        self.namespace = namespace
        self.warn = warn
        self.sealed = 0  # chunks before this index are written and full
        self.base = 0  # byte offset of chunk ``sealed`` in journal.jsonl
        self.projection = Projection()  # the journal's status, entry by entry
        self.marked: dict[str, str] = {}  # node -> state last written on the Node
        self.failures = 0
        self.written: set[int] = set()  # chunks this mirror has written (replaced, not created)
        # the node threads of a batch append at once: one mirror write at a time, each reading
        # the journal's tail under this lock, so a write never lands older bytes after newer
        # ones, and the projection and chunk counters change in one thread at a time
        self._writing = threading.Lock()
        # journal.jsonl's length the cluster holds (the last write's end; -1: none yet): a
        # thread whose entry another thread's write already carried writes nothing again
        self.confirmed = -1

    def attach(self, journal: Journal) -> Journal:
        """Start mirroring ``journal`` (its existing entries are the starting projection)."""
        for e in journal.entries():
            self._project(e)
        self.marked = {n: s.state.value for n, s in self.projection.nodes.items()}
        journal.mirror = self
        return journal

    def entry(self, journal: Journal, entry: Entry) -> None:
        """Mirror the journal's open chunk, then the node's state when it changed."""
        with self._writing:
            self._entry(journal, entry)

    def _entry(self, journal: Journal, entry: Entry) -> None:
        try:
            self._chunks(journal)
        except Exception as e:  # best effort: reported, healed by the next append
            self._failed(f"journal of change {journal.change_id}", e)
        node = self._project(entry)
        if node is None:
            return
        state = self.projection.nodes[node].state.value
        if self.marked.get(node) == state:
            return
        intent = self.projection.info.intent_sha256 or ""
        try:
            km.annotate_node(self.api, node, journal.change_id, intent, state)
            self.marked[node] = state
        except Exception as e:
            self._failed(f"annotation of Node {node}", e)

    def backup(self, journal: Journal, node: str, digest: str, content: bytes) -> None:
        """Mirror one backup's bytes."""
        with self._writing:
            try:
                km.put_backup(self.api, self.namespace, journal.change_id, node, digest, content)
            except Exception as e:
                self._failed(f"backup {digest[:12]} of {node}", e)

    def _project(self, e: Entry) -> str | None:
        self.projection.add(e)
        return e.node

    def _chunks(self, journal: Journal) -> None:
        with open(journal.file, "rb") as f:
            f.seek(self.base)
            tail = f.read()
        end = self.base + len(tail)
        if end == self.confirmed:  # every byte, this entry's too, is in the cluster already
            return
        chunks = split_chunks(tail, km.CHUNK_BYTES)
        for i, data in enumerate(chunks, start=self.sealed):
            km.put_journal_chunk(
                self.api, self.namespace, journal.change_id, i, data, i in self.written
            )
            self.written.add(i)
        if len(chunks) > 1:  # every chunk but the last is full: never written again
            self.base += sum(len(c) for c in chunks[:-1])
            self.sealed += len(chunks) - 1
        self.confirmed = end

    def _failed(self, what: str, e: BaseException) -> None:
        self.failures += 1
        self.warn(f"warning: cluster record: {what} not written ({type(e).__name__}: {e})")


def split_chunks(data: bytes, limit: int) -> list[bytes]:
    """``data`` cut at line ends into pieces of at most ``limit`` bytes (a longer line alone);
    a torn last line (no newline yet) stays in the last piece."""
    chunks: list[bytes] = []
    current = b""
    for line in data.splitlines(keepends=True):
        if current and len(current) + len(line) > limit:
            chunks.append(current)
            current = b""
        current += line
    chunks.append(current)
    return chunks


def sync_change(
    api: Api, namespace: str, root: FsPath, change_id: str, warn: Callable[[str], None]
) -> str:
    """Bring this machine's cached journal of ``change_id`` up to the cluster record: entries
    another machine appended since (the record is longer and begins with every byte here) are
    appended under the journal's lock, with the backups (read only then: a current cache costs
    one listing of the journal's chunks); return what happened:
    ``"current"``, ``"refreshed"`` or ``"diverged"`` (the record and the cache disagree on an
    entry both have: the cache is kept, ``warn`` says so) or ``"unreachable"`` (no record read).

    Why: the state directory is a cache. A change applied here, then advanced from another
    machine (a promote, a rollback from the on-call's laptop), must not be acted on from the
    stale copy (``tests/unit/test_mirroring.py::test_a_stale_cache_is_refreshed_from_the_record``).
    """
    import fcntl

    directory = root / "changes" / change_id
    try:
        data = km.fetch_journal(api, namespace, change_id, retry_s=2.0)
    except Exception as e:  # the cache still answers; say that it may be behind
        warn(f"warning: cluster record of {change_id} not read ({type(e).__name__}: {e})")
        return "unreachable"
    if data is None:
        return "current"
    fd = os.open(directory / "journal.jsonl", os.O_RDWR | os.O_APPEND)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        have = os.pread(fd, os.fstat(fd).st_size, 0)
        if have.startswith(data):  # the same, or this cache is ahead (a mirror write failed)
            return "current"
        if not data.startswith(have):
            warn(
                f"warning: the cluster record of {change_id} and {directory} disagree; "
                "acting on the local journal"
            )
            return "diverged"
        # the backups the new entries may name: read only now, never when the cache is current
        _store_backups(directory, change_id, km.fetch_backups(api, namespace, change_id))
        view = memoryview(data)[len(have) :]
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    return "refreshed"


def _store_backups(
    directory: FsPath, change_id: str, backups: list[tuple[str, str, bytes]]
) -> None:
    import hashlib

    for node, digest, content in backups:
        if hashlib.sha256(content).hexdigest() != digest:
            raise InputError(
                f"the cluster's backup of {node} does not match its sha256 {digest}",
                Location(file=km.backup_name(change_id, node, digest)),
            )
        target = directory / "backups" / node / digest
        if target.exists():
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_name(f".{digest}.fetch")
        tmp.write_bytes(content)
        os.replace(tmp, target)


def fetch_change(api: Api, namespace: str, root: FsPath, change_id: str | None) -> str | None:
    """Rebuild ``<root>/changes/<id>/`` from the cluster record (``change_id`` None: the latest
    change in the cluster); return the id, or None when the cluster has no such change.

    The journal is written first to a temporary name and renamed, so a half-fetched cache is never
    taken for a journal; backups are checked against their sha256.

    Raises:
        InputError: a mirrored backup does not match its sha256.
    """
    if change_id is None:
        change_id = km.latest_change(api, namespace)
        if change_id is None:
            return None
    record = km.fetch(api, namespace, change_id)
    if record is None:
        return None
    data, backups = record
    directory = root / "changes" / change_id
    _store_backups(directory, change_id, backups)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "backups").mkdir(exist_ok=True)
    tmp = directory / ".journal.jsonl.fetch"
    tmp.write_bytes(data)
    read_entries(tmp)  # a corrupt record is named now, not half-way through a rollback
    os.replace(tmp, directory / "journal.jsonl")
    return change_id
