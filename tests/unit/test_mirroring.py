"""The change's cluster record (rollout/change/record/cluster_mirror.py, rollout/kube/mirror.py)
against an in-memory API: every append and backup is mirrored, chunks stay under the object limit,
Nodes are annotated as their state changes, a failed write is reported and healed, and a second
state directory rebuilt from the record replays and restores the same bytes."""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.change.record.cluster_mirror import (
    ClusterMirror,
    fetch_change,
    split_chunks,
    sync_change,
)
from rollout.change.record.journal import CHANGE_STEP, Journal
from rollout.change.record.replay import replay
from rollout.kube import mirror as km
from rollout.models import Phase, Step, StepPath

NOW = datetime(2026, 12, 2, 9, 0, tzinfo=UTC)
CHANGE = "20261202T090000Z-abc123"


class Conflict(Exception):
    status = 409


class NotFound(Exception):
    status = 404


class Forbidden(Exception):
    status = 403


class FakeCore:
    def __init__(self) -> None:
        self.maps: dict[tuple[str, str], dict[str, Any]] = {}
        self.patches: list[tuple[str, dict[str, Any]]] = []
        self.down = False
        self.replaced = 0
        self.created = 0
        self.listed: list[str] = []

    def _check(self) -> None:
        if self.down:
            raise Forbidden("configmaps is forbidden")

    def create_namespaced_config_map(
        self, namespace: str, body: dict[str, Any], _request_timeout: Any = None
    ) -> Any:
        self._check()
        key = (namespace, body["metadata"]["name"])
        self.created += 1
        if key in self.maps:
            raise Conflict()
        self.maps[key] = json.loads(json.dumps(body))
        return body

    def replace_namespaced_config_map(
        self, name: str, namespace: str, body: dict[str, Any], _request_timeout: Any = None
    ) -> Any:
        self._check()
        self.replaced += 1
        if (namespace, name) not in self.maps:
            raise NotFound()
        self.maps[(namespace, name)] = json.loads(json.dumps(body))
        return body

    def list_namespaced_config_map(
        self, namespace: str, label_selector: str | None = None, _request_timeout: Any = None
    ) -> Any:
        self._check()
        wanted = [term.split("=") for term in (label_selector or "").split(",") if term]
        items = [
            b
            for (ns, _), b in self.maps.items()
            if ns == namespace and all(b["metadata"]["labels"].get(k) == v for k, v in wanted)
        ]
        self.listed.append(label_selector or "")
        return {"items": items}

    def patch_node(self, name: str, body: dict[str, Any], _request_timeout: Any = None) -> Any:
        self._check()
        self.patches.append((name, body))
        return body


class FakeApi:
    def __init__(self) -> None:
        self.core = FakeCore()


def _forward(journal: Journal, node: str) -> None:
    for step in (Step.CORDON, Step.DRAIN, Step.BACKUP, Step.APPLY, Step.VERIFY, Step.UNCORDON):
        journal.append(step.value, Phase.BEGIN, now=NOW, node=node, path=StepPath.FORWARD)
        data: dict[str, Any] = {}
        if step is Step.BACKUP:
            digest = journal.save_backup(node, b"original bytes of " + node.encode() + b"\n")
            data = {"files": [{"path": "/var/lib/kubelet/config.yaml", "existed": True,
                               "sha256": digest}]}  # fmt: skip
        journal.append(step.value, Phase.DONE, now=NOW, node=node, path=StepPath.FORWARD, data=data)


def _change(tmp: Path, api: FakeApi, warnings: list[str]) -> Journal:
    journal = ClusterMirror(api, "kube-system", warnings.append).attach(
        Journal.create(tmp / "a", CHANGE)
    )
    journal.append(
        CHANGE_STEP,
        Phase.BEGIN,
        now=NOW,
        data={"nodes": ["n1", "n2"], "intentSha256": "f00d"},
    )
    return journal


def test_every_append_and_backup_is_in_the_cluster_and_nodes_carry_their_state(
    tmp_path: Path,
) -> None:
    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    _forward(journal, "n1")
    data, backups = km.fetch(api, "kube-system", CHANGE)  # type: ignore[arg-type, misc]
    assert data == journal.file.read_bytes()
    assert [(n, c) for n, _, c in backups] == [("n1", b"original bytes of n1\n")]
    states = [b["metadata"]["annotations"][km.STATE_KEY] for n, b in api.core.patches]
    assert states == ["applying", "applied"]  # written when the state changes, not per entry
    last = api.core.patches[-1][1]["metadata"]
    assert last["annotations"] == {
        km.CHANGE_KEY: CHANGE,
        km.INTENT_KEY: "f00d",
        km.STATE_KEY: "applied",
    }
    assert last["labels"][km.STATE_KEY] == "applied"
    assert warnings == []
    # one request per chunk write: the open chunk is created once, then replaced
    entries = len(journal.entries())
    assert (api.core.created, api.core.replaced) == (1 + 1, entries - 1)  # + the backup


def test_a_second_state_directory_is_rebuilt_from_the_record(tmp_path: Path) -> None:
    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    _forward(journal, "n1")
    other = tmp_path / "b"
    assert fetch_change(api, "kube-system", other, None) == CHANGE
    copy = Journal.open(other, CHANGE)
    assert copy.entries() == journal.entries()
    status = replay(copy.entries())
    assert status.nodes["n1"].state.value == "applied"
    digest = status.nodes["n1"].backups[0].sha256
    assert copy.load_backup("n1", digest) == b"original bytes of n1\n"
    assert fetch_change(api, "kube-system", other, "20990101T000000Z-000000") is None


def test_chunks_stay_under_the_limit_and_rejoin_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(km, "CHUNK_BYTES", 600)
    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    for n in ("n1", "n2"):
        _forward(journal, n)
    chunks = [
        b for b in api.core.maps.values() if b["metadata"]["labels"][km.RECORD_KEY] == "journal"
    ]
    assert len(chunks) > 3
    assert all(len(b["data"]["journal.jsonl"].encode()) <= 600 for b in chunks)
    data, _ = km.fetch(api, "kube-system", CHANGE)  # type: ignore[misc]
    assert data == journal.file.read_bytes()


def test_a_failed_mirror_write_is_reported_and_healed_by_the_next_append(tmp_path: Path) -> None:
    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    api.core.down = True
    journal.append(Step.CORDON.value, Phase.BEGIN, now=NOW, node="n1", path=StepPath.FORWARD)
    assert any("cluster record: journal" in w for w in warnings)
    assert any("annotation of Node n1" in w for w in warnings)
    assert len(journal.entries()) == 2  # the local journal is what the step waited for
    api.core.down = False
    journal.append(Step.CORDON.value, Phase.DONE, now=NOW, node="n1", path=StepPath.FORWARD)
    data, _ = km.fetch(api, "kube-system", CHANGE)  # type: ignore[misc]
    assert data == journal.file.read_bytes()
    assert api.core.patches[-1][1]["metadata"]["annotations"][km.STATE_KEY] == "applying"


def test_split_chunks_cuts_at_line_ends() -> None:
    assert split_chunks(b"aa\nbb\ncc\n", 6) == [b"aa\nbb\n", b"cc\n"]
    assert split_chunks(b"toolongline\nx\n", 4) == [b"toolongline\n", b"x\n"]
    assert split_chunks(b"", 4) == [b""]
    assert b"".join(split_chunks(b"a\nb\ntorn", 3)) == b"a\nb\ntorn"


def test_a_corrupt_mirrored_backup_is_refused(tmp_path: Path) -> None:
    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    _forward(journal, "n1")
    for b in api.core.maps.values():
        if b["metadata"]["labels"][km.RECORD_KEY] == "backup":
            b["binaryData"]["content"] = "dGFtcGVyZWQ="
    with pytest.raises(Exception, match="does not match its sha256"):
        fetch_change(api, "kube-system", tmp_path / "b", CHANGE)


def test_a_stale_cache_is_refreshed_from_the_record(tmp_path: Path) -> None:
    """Machine A applied n1; machine B fetched the change, then went on with n2 (mirrored). A's
    state directory is now a stale cache: sync_change appends B's entries and backups."""
    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    _forward(journal, "n1")
    other = tmp_path / "b"
    fetch_change(api, "kube-system", other, CHANGE)
    on_b = ClusterMirror(api, "kube-system", warnings.append).attach(Journal.open(other, CHANGE))
    _forward(on_b, "n2")
    assert replay(journal.entries()).nodes["n2"].state.value == "pending"
    assert sync_change(api, "kube-system", tmp_path / "a", CHANGE, warnings.append) == "refreshed"
    assert journal.file.read_bytes() == on_b.file.read_bytes()
    status = replay(journal.entries())
    assert status.nodes["n2"].state.value == "applied"
    digest = status.nodes["n2"].backups[0].sha256
    assert journal.load_backup("n2", digest) == b"original bytes of n2\n"
    # nothing new: the cache is current, not rewritten, and the backups are not read
    api.core.listed.clear()
    assert sync_change(api, "kube-system", tmp_path / "a", CHANGE, warnings.append) == "current"
    assert api.core.listed == [f"{km.CHANGE_KEY}={CHANGE},{km.RECORD_KEY}=journal"]
    assert warnings == []


def test_a_cache_ahead_of_the_record_or_disagreeing_with_it_is_kept(tmp_path: Path) -> None:
    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    api.core.down = True  # the mirror falls behind: the local journal is ahead
    _forward(journal, "n1")
    api.core.down = False
    before = journal.file.read_bytes()
    assert sync_change(api, "kube-system", tmp_path / "a", CHANGE, warnings.append) == "current"
    assert journal.file.read_bytes() == before
    # another writer's record that does not begin with these bytes: kept, and said
    for b in api.core.maps.values():
        if b["metadata"]["labels"][km.RECORD_KEY] == "journal":
            b["data"]["journal.jsonl"] = b["data"]["journal.jsonl"].replace("f00d", "beef")
            b["data"]["journal.jsonl"] += b["data"]["journal.jsonl"]
    warnings.clear()
    assert sync_change(api, "kube-system", tmp_path / "a", CHANGE, warnings.append) == "diverged"
    assert journal.file.read_bytes() == before
    assert any("disagree" in w for w in warnings)
    api.core.down = True
    assert sync_change(api, "kube-system", tmp_path / "a", CHANGE, warnings.append) == (
        "unreachable"
    )


def test_the_latest_change_is_found_from_each_changes_first_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(km, "CHUNK_BYTES", 600)
    api, warnings = FakeApi(), []
    _forward(_change(tmp_path, api, warnings), "n1")
    assert len([b for b in api.core.maps.values() if "journal.jsonl" in b.get("data", {})]) > 1
    api.core.listed.clear()
    assert km.latest_change(api, "kube-system") == CHANGE  # type: ignore[arg-type]
    assert api.core.listed == [f"{km.RECORD_KEY}=journal,{km.CHUNK_KEY}=0"]


def test_concurrent_appends_never_leave_an_older_copy_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two node threads append at once. The first one's mirror write is held until the second
    one's write starts (or 1 s passes): unserialized, the older copy would land last and the
    record would lack the second entry until some later append."""
    import threading

    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    put = km.put_journal_chunk
    first_in, second_called = threading.Event(), threading.Event()
    calls: list[str] = []

    def held(*args: Any, **kwargs: Any) -> Any:
        name = threading.current_thread().name
        calls.append(name)
        if name == "n1" and not first_in.is_set():
            first_in.set()
            second_called.wait(1.0)
        elif name == "n2":
            second_called.set()
        return put(*args, **kwargs)

    monkeypatch.setattr(km, "put_journal_chunk", held)

    def step(node: str) -> None:
        journal.append(Step.CORDON.value, Phase.BEGIN, now=NOW, node=node, path=StepPath.FORWARD)

    t1 = threading.Thread(target=step, args=("n1",), name="n1")
    t1.start()
    assert first_in.wait(5)
    t2 = threading.Thread(target=step, args=("n2",), name="n2")
    t2.start()
    t1.join(10)
    t2.join(10)
    assert calls[:2] == ["n1", "n2"]
    data, _ = km.fetch(api, "kube-system", CHANGE)  # type: ignore[misc]
    assert data == journal.file.read_bytes()
    assert [e.node for e in journal.entries()][-2:] == ["n1", "n2"]
    assert warnings == []


def test_an_entry_another_write_carried_is_not_written_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two node threads append while a third write is in flight: the first of them to get its
    turn writes the tail holding both entries; the second finds its entry in the cluster
    already and writes nothing (one write, not two); the record equals the journal. A write
    that failed is never taken as carried: the next append writes again."""
    import threading

    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    mirror = journal.mirror
    assert isinstance(mirror, ClusterMirror)
    written: list[int] = []
    put = km.put_journal_chunk

    def counted(*args: Any, **kwargs: Any) -> Any:
        written.append(len(args[4]))
        return put(*args, **kwargs)

    monkeypatch.setattr(km, "put_journal_chunk", counted)
    before = api.core.replaced
    with mirror._writing:  # a write in flight: both threads append, then wait their turn
        threads = [
            threading.Thread(
                target=journal.append,
                args=(Step.CORDON.value, Phase.BEGIN),
                kwargs={"now": NOW, "node": n, "path": StepPath.FORWARD},
            )
            for n in ("n1", "n2")
        ]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while len(journal.entries()) < 3 and time.monotonic() < deadline:  # both appended
            time.sleep(0.01)
    for t in threads:
        t.join(10)
    assert len(written) == 1 and api.core.replaced == before + 1
    data, _ = km.fetch(api, "kube-system", CHANGE)  # type: ignore[misc]
    assert data == journal.file.read_bytes()

    api.core.down = True
    journal.append(Step.DRAIN.value, Phase.BEGIN, now=NOW, node="n1", path=StepPath.FORWARD)
    api.core.down = False
    mirror.entry(journal, journal.entries()[-1])  # same bytes, but never confirmed: written
    data, _ = km.fetch(api, "kube-system", CHANGE)  # type: ignore[misc]
    assert data == journal.file.read_bytes() and len(written) == 3


def test_a_done_the_next_begin_follows_goes_to_the_record_with_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step's ``done`` journaled ``mirror_later`` is fsynced locally at once and reaches the
    cluster record with the next ``begin``: one write for both, and the record holds that
    ``begin`` (and everything before it) before the append returns, i.e. before the step acts.
    The Node's state follows entry by entry, in order; ``flush_mirror`` hands over a deferred
    entry nothing followed."""
    api, warnings = FakeApi(), []
    journal = _change(tmp_path, api, warnings)
    written: list[bytes] = []
    put = km.put_journal_chunk

    def counted(*args: Any, **kwargs: Any) -> Any:
        written.append(args[4])
        return put(*args, **kwargs)

    monkeypatch.setattr(km, "put_journal_chunk", counted)
    fwd: dict[str, Any] = {"now": NOW, "node": "n1", "path": StepPath.FORWARD}
    for step in (Step.CORDON, Step.DRAIN, Step.BACKUP, Step.APPLY, Step.VERIFY):
        journal.append(step.value, Phase.BEGIN, **fwd)
        data, _ = km.fetch(api, "kube-system", CHANGE)  # type: ignore[misc]
        assert data == journal.file.read_bytes()  # the begin, and all before it, is there
        journal.append(step.value, Phase.DONE, mirror_later=True, **fwd)
        data, _ = km.fetch(api, "kube-system", CHANGE)  # type: ignore[misc]
        assert data != journal.file.read_bytes()  # the done waits for the next begin
        assert data == journal.file.read_bytes()[: len(data)]
    assert len(written) == 5  # five begins, each carrying the done before it: not ten writes
    journal.append(Step.UNCORDON.value, Phase.BEGIN, **fwd)
    journal.append(Step.UNCORDON.value, Phase.DONE, mirror_later=True, **fwd)
    journal.flush_mirror()
    data, _ = km.fetch(api, "kube-system", CHANGE)  # type: ignore[misc]
    assert data == journal.file.read_bytes() and len(written) == 7
    states = [b["metadata"]["annotations"][km.STATE_KEY] for _, b in api.core.patches]
    assert states == ["applying", "applied"]
    assert warnings == []
