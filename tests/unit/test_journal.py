"""Journal durability rules and replay (pure)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.change.record.journal import (
    CHANGE_STEP,
    Entry,
    Journal,
    failpoint,
    failpoint_matches,
    latest_change,
    new_change_id,
    state_dir,
)
from rollout.change.record.replay import replay
from rollout.errors import InputError
from rollout.models import NodeState, Phase, Step, StepPath

T = datetime(2026, 11, 30, 21, 48, 2, tzinfo=UTC)


def _e(
    node: str | None,
    step: str,
    phase: Phase,
    path: StepPath | None = StepPath.FORWARD,
    **data: object,
) -> Entry:
    return Entry(
        ts="t",
        change="c",
        step=step,
        phase=phase,
        node=node,
        path=path if node else None,
        data=data,
    )


def test_change_id_sorts_by_time() -> None:
    a = new_change_id(T, "aaaaaa")
    assert a == "20261130T214802Z-aaaaaa"
    assert new_change_id(datetime(2026, 12, 1, tzinfo=UTC)) > a


def test_state_dir_from_env() -> None:
    assert state_dir({"ROLLOUT_STATE_DIR": "/x"}) == Path("/x")
    assert state_dir({}).parts[-3:] == (".local", "state", "rollout")


def test_append_read_and_latest(tmp_path: Path) -> None:
    j1 = Journal.create(tmp_path, "20260101T000000Z-a")
    j2 = Journal.create(tmp_path, "20260102T000000Z-b")
    j1.append(
        "cordon",
        Phase.BEGIN,
        now=T,
        node="n1",
        path=StepPath.FORWARD,
        data={"priorCordoned": False},
    )
    assert [e.step for e in j1.entries()] == ["cordon"]
    assert j2.entries() == []
    assert latest_change(tmp_path) == "20260102T000000Z-b"
    assert Journal.open(tmp_path).change_id == "20260102T000000Z-b"
    with pytest.raises(InputError, match="no change 'nope'"):
        Journal.open(tmp_path, "nope")


def test_torn_last_line_is_ignored_but_corrupt_middle_line_is_named(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, "c")
    j.append("cordon", Phase.BEGIN, now=T, node="n1", path=StepPath.FORWARD)
    with open(j.file, "ab") as f:
        f.write(b'{"ts": "2026')  # the process died mid-write
    assert len(j.entries()) == 1
    with open(j.file, "ab") as f:
        f.write(b"\ngarbage\n")  # not something append writes: a corrupt middle line
    j.append("cordon", Phase.DONE, now=T, node="n1", path=StepPath.FORWARD)
    with pytest.raises(InputError, match=r"journal.jsonl:2"):
        j.entries()


def test_append_after_a_torn_line_repairs_the_tail_first(tmp_path: Path) -> None:
    # what production does: the process died mid-write, then resume appends (no newline added
    # by hand); the journal must stay readable and keep every confirmed entry
    j = Journal.create(tmp_path, "c")
    j.append("cordon", Phase.BEGIN, now=T, node="n1", path=StepPath.FORWARD)
    with open(j.file, "ab") as f:
        f.write(b'{"ts": "2026')
    j.append("cordon", Phase.DONE, now=T, node="n1", path=StepPath.FORWARD)
    j.append("drain", Phase.BEGIN, now=T, node="n1", path=StepPath.FORWARD)
    got = [(e.step, e.phase) for e in j.entries()]
    assert got == [("cordon", Phase.BEGIN), ("cordon", Phase.DONE), ("drain", Phase.BEGIN)]
    assert j.file.read_bytes().endswith(b"\n") and b'"2026\n' not in j.file.read_bytes()


def test_a_whole_last_entry_that_lost_only_its_newline_is_kept(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, "c")
    j.append("cordon", Phase.BEGIN, now=T, node="n1", path=StepPath.FORWARD)
    j.file.write_bytes(j.file.read_bytes().rstrip(b"\n"))
    j.append("cordon", Phase.DONE, now=T, node="n1", path=StepPath.FORWARD)
    assert [e.phase for e in j.entries()] == [Phase.BEGIN, Phase.DONE]


def test_failpoint_names_step_phase_and_node() -> None:
    entry = Entry(ts="t", change="c", step="drain", phase=Phase.BEGIN, node="n1")
    assert failpoint_matches("drain:begin:n1", entry)
    assert failpoint_matches("drain:begin", entry)
    assert failpoint_matches("*:begin:*", entry)
    assert not failpoint_matches("drain:done:n1", entry)
    assert not failpoint_matches("drain:begin:n2", entry)
    assert not failpoint_matches("cordon", entry)
    change = Entry(ts="t", change="c", step="change", phase=Phase.DONE)
    assert failpoint_matches("change:done", change)
    failpoint(entry, {})  # unset: nothing happens


def test_failpoint_kills_the_process_right_after_the_named_entry_is_on_disk(
    tmp_path: Path,
) -> None:
    import signal
    import subprocess
    import sys

    code = (
        "import sys; from datetime import UTC, datetime; from pathlib import Path\n"
        "from rollout.change.record.journal import Journal; from rollout.models import Phase\n"
        "j = Journal.create(Path(sys.argv[1]), 'c'); now = datetime.now(UTC)\n"
        "for step in ('cordon', 'drain', 'backup'):\n"
        "    j.append(step, Phase.BEGIN, now=now, node='n1')\n"
    )
    env = {"ROLLOUT_FAILPOINT": "drain:begin:n1", "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code, str(tmp_path)], env=env, check=False)
    assert r.returncode == -signal.SIGKILL
    j = Journal.open(tmp_path, "c")
    assert [e.step for e in j.entries()] == ["cordon", "drain"]


def test_backup_blobs_are_content_addressed_and_checked(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, "c")
    digest = j.save_backup("n1", b"old bytes\n")
    assert j.load_backup("n1", digest) == b"old bytes\n"
    (j.backups / "n1" / digest).write_bytes(b"tampered")
    with pytest.raises(InputError, match="does not match its sha256"):
        j.load_backup("n1", digest)


B, D, F = Phase.BEGIN, Phase.DONE, Phase.FAILED
R = StepPath.RESTORE


@pytest.mark.parametrize(
    ("entries", "state", "we_cordoned", "touched"),
    [
        ([], NodeState.PENDING, False, False),
        ([_e("n", "cordon", B, priorCordoned=False)], NodeState.APPLYING, False, False),
        (
            [_e("n", "cordon", B, priorCordoned=False), _e("n", "cordon", D, cordonedByUs=True)],
            NodeState.APPLYING,
            True,
            False,
        ),
        (
            [_e("n", "cordon", D, cordonedByUs=True), _e("n", "apply", B)],
            NodeState.APPLYING,
            True,
            True,
        ),
        (
            [_e("n", "cordon", D, cordonedByUs=True), _e("n", "uncordon", D, uncordoned=True)],
            NodeState.APPLIED,
            False,
            False,
        ),
        ([_e("n", "apply", B), _e("n", "apply", F, message="x")], NodeState.APPLYING, False, True),
        ([_e("n", "apply", B), _e("n", "restore", B, R)], NodeState.RESTORING, False, True),
        (
            [_e("n", "apply", B), _e("n", "restore", F, R, message="x")],
            NodeState.FAILED,
            False,
            True,
        ),
        (
            [_e("n", "apply", B), _e("n", "uncordon", D, R, uncordoned=False)],
            NodeState.RESTORED,
            False,
            False,
        ),
    ],
)
def test_replay_states(
    entries: list[Entry], state: NodeState, we_cordoned: bool, touched: bool
) -> None:
    begin = _e(None, CHANGE_STEP, B, nodes=["n"])
    s = replay([begin, *entries]).nodes["n"]
    assert (s.state, s.we_cordoned, s.files_touched) == (state, we_cordoned, touched)


def test_replay_keeps_first_prior_cordon_state_backups_and_outcome() -> None:
    entries = [
        _e(None, CHANGE_STEP, B, nodes=["n", "m"]),
        _e(
            "n",
            "preflight",
            D,
            configz={"cpuManagerPolicy": "none"},
            allocatable={"nvidia.com/gpu": "8"},
        ),
        _e("n", "cordon", B, priorCordoned=True),
        _e(
            "n",
            "backup",
            D,
            files=[{"path": "/a", "existed": True, "sha256": "ab"}],
            change={"host": "h"},
        ),
        _e("n", "cordon", B, R, priorCordoned=False),
        _e(None, CHANGE_STEP, D, outcome="held", message="canary applied"),
    ]
    st = replay(entries)
    n = st.nodes["n"]
    assert n.prior_cordoned is True
    assert n.prior_config == {"cpuManagerPolicy": "none"}
    assert n.prior_allocatable == {"nvidia.com/gpu": "8"}
    assert n.backups[0].sha256 == "ab" and n.record == {"host": "h"}
    assert st.nodes["m"].state is NodeState.PENDING
    assert (st.outcome, st.message) == ("held", "canary applied")
    assert n.step is Step.CORDON


def _node_steps(j: Journal, node: str) -> None:
    for step in ("cordon", "drain", "backup", "apply", "verify", "uncordon"):
        j.append(step, Phase.BEGIN, now=T, node=node, path=StepPath.FORWARD)
        data = {"cordonedByUs": True} if step == "cordon" else {}
        j.append(step, Phase.DONE, now=T, node=node, path=StepPath.FORWARD, data=data)


def test_entries_parse_each_line_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine asks for the status after every step of every node: each line is parsed once
    over the whole change (O(entries)), not once per question (O(entries^2))."""
    from rollout.change.record import journal as jm
    from rollout.change.record.replay import status_of

    parsed = []
    real = jm.Entry.from_json.__func__  # type: ignore[attr-defined]
    monkeypatch.setattr(
        jm.Entry, "from_json", classmethod(lambda cls, obj: parsed.append(1) or real(cls, obj))
    )
    j = Journal.create(tmp_path, "c")
    j.append(CHANGE_STEP, Phase.BEGIN, now=T, data={"nodes": [f"n{i}" for i in range(40)]})
    for i in range(40):
        _node_steps(j, f"n{i}")
        assert status_of(j).nodes[f"n{i}"].state is NodeState.APPLIED
        assert len(j.entries()) == 1 + 12 * (i + 1)
    assert len(parsed) == 1 + 12 * 40


def test_the_live_projection_equals_a_full_replay(tmp_path: Path) -> None:
    from rollout.change.record.replay import status_of

    j = Journal.create(tmp_path, "c")
    j.append(CHANGE_STEP, Phase.BEGIN, now=T, data={"nodes": ["a", "b"], "plan": "p"})
    assert status_of(j) == replay(j.entries(), "c")
    _node_steps(j, "a")
    j.append("cordon", Phase.BEGIN, now=T, node="b", path=StepPath.FORWARD)
    assert status_of(j) == replay(j.entries(), "c")
    # another process (another Journal object on the file) appends: both see it
    other = Journal.open(tmp_path, "c")
    other.append("restore", Phase.BEGIN, now=T, node="b", path=StepPath.RESTORE)
    other.append(CHANGE_STEP, Phase.DONE, now=T, data={"outcome": "rolled-back"})
    live = status_of(j)
    assert live == replay(read_all(j.file), "c")
    assert live.outcome == "rolled-back" and live.nodes["b"].state is NodeState.RESTORING


def test_a_status_handed_out_never_changes_as_the_projection_folds_on(tmp_path: Path) -> None:
    """The projection folds each node's fields in place; what it handed out before must stay
    the status of the entries it had then (the engine keeps them across later steps)."""
    from rollout.change.record.replay import status_of

    j = Journal.create(tmp_path, "c")
    j.append(CHANGE_STEP, Phase.BEGIN, now=T, data={"nodes": ["a", "b"], "plan": "p"})
    j.append("cordon", Phase.BEGIN, now=T, node="a", path=StepPath.FORWARD)
    early = status_of(j)
    expected = replay(j.entries(), "c")
    _node_steps(j, "a")
    j.append("restore", Phase.BEGIN, now=T, node="b", path=StepPath.RESTORE)
    assert status_of(j).nodes["a"].state is NodeState.APPLIED
    assert early == expected and early.nodes["a"].state is NodeState.APPLYING
    assert list(early.nodes) == ["a", "b"] == list(status_of(j).nodes)


def read_all(file: Path) -> list[Entry]:
    from rollout.change.record.journal import read_entries

    return read_entries(file)


def test_a_replaced_journal_file_is_read_again_from_the_start(tmp_path: Path) -> None:
    from rollout.change.record.replay import status_of

    j = Journal.create(tmp_path, "c")
    _node_steps(j, "a")
    assert status_of(j).nodes["a"].state is NodeState.APPLIED
    # a cache fetched again from the cluster record: a new file renamed over the old one
    tmp = j.dir / ".journal.jsonl.fetch"
    tmp.write_bytes(j.file.read_bytes().splitlines(keepends=True)[0])
    tmp.replace(j.file)
    assert len(j.entries()) == 1
    assert status_of(j).nodes["a"].state is NodeState.APPLYING
    # a torn last line waits for its newline
    with open(j.file, "ab") as f:
        f.write(b'{"ts": "t", "change": "c", "step": "cordon", "phase": "done", "node": "z"')
    assert "z" not in status_of(j).nodes
    with open(j.file, "ab") as f:
        f.write(b"}\n")
    assert status_of(j).nodes["z"].step is Step.CORDON


def test_an_entry_of_a_newer_schema_is_refused(tmp_path: Path) -> None:
    from rollout.change.record.entries import SCHEMA_VERSION

    j = Journal.create(tmp_path, "c")
    j.append("cordon", Phase.BEGIN, now=T, node="n1", path=StepPath.FORWARD)
    assert f'"v":{SCHEMA_VERSION}' in j.file.read_text()
    old = {"ts": "t", "change": "c", "step": "cordon", "phase": "done", "node": "n1"}
    assert Entry.from_json(old).phase is Phase.DONE  # written before the version: v1
    newer = {**old, "v": SCHEMA_VERSION + 1}
    with open(j.file, "a") as f:
        f.write(json.dumps(newer) + "\n")
    with pytest.raises(InputError, match=f"schema v{SCHEMA_VERSION + 1}, written by a newer"):
        Journal.open(tmp_path, "c").entries()


def test_every_entry_kind_is_named_from_the_catalogue() -> None:
    """No module spells a change-level entry's step name itself: the names written
    (``append``/``record``'s first argument) and compared (``e.step == ...``) come from
    ``rollout.change.record.journal.Kind``, so a renamed or new kind is one edit, and the replay,
    the crash matrix and the report read the same names."""
    import ast

    from rollout.change.record.journal import Kind

    names = {k.value for k in Kind}
    root = Path(__file__).resolve().parents[2] / "rollout"
    spelled = []
    for f in sorted(root.rglob("*.py")):
        if f.name == "journal.py" and f.parent.name == "record":
            continue
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            literals: list[ast.expr] = []
            if isinstance(node, ast.Call) and node.args:
                fn = node.func
                called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                if called in ("append", "record"):
                    literals.append(node.args[0])
            if isinstance(node, ast.Compare) and any(
                isinstance(x, ast.Attribute) and x.attr == "step"
                for x in (node.left, *node.comparators)
            ):
                literals += [node.left, *node.comparators]
            spelled += [
                f"{f.relative_to(root.parent)}:{x.lineno}: {x.value!r}"
                for x in literals
                if isinstance(x, ast.Constant) and x.value in names
            ]
    assert spelled == []
