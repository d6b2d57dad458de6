"""Live progress: the table and the plain lines are pure text, checked without a terminal."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.change.commands.progress import (
    Board,
    ObservedJournal,
    Progress,
    plain_line,
    resolve_mode,
    table,
)
from rollout.change.record.journal import Entry, Journal
from rollout.models import Phase, StepPath

T = "2026-12-01T10:00:05.000+00:00"


def entry(node: str | None, step: str, phase: Phase, path: StepPath | None = None) -> Entry:
    return Entry(ts=T, change="c1", step=step, phase=phase, node=node, path=path, data={})


def test_board_follows_each_nodes_last_step_and_note() -> None:
    b = Board().with_nodes(("gpu-07", "gpu-08"))
    b = b.apply(entry("gpu-07", "drain", Phase.BEGIN, StepPath.FORWARD))
    b = b.event("gpu-07: drained (3 pod(s) evicted)")
    b = b.apply(entry("gpu-08", "restore", Phase.FAILED, StepPath.RESTORE))
    b = b.apply(entry(None, "change", Phase.DONE))  # change-level: no row
    assert [(r.node, r.state, r.note) for r in b.rows] == [
        ("gpu-07", "drain…", "drained (3 pod(s) evicted)"),
        ("gpu-08", "restore FAILED", ""),
    ]
    assert table(b) == [
        "NODE    PATH     STEP               SINCE     NOTE",
        "gpu-07  forward  drain…             10:00:05  drained (3 pod(s) evicted)",
        "gpu-08  restore  restore FAILED     10:00:05",
        "> gpu-07: drained (3 pod(s) evicted)",
    ]
    assert all(len(line) <= 20 for line in table(b, width=20))


@pytest.mark.parametrize(
    ("e", "line"),
    [
        (entry("n1", "apply", Phase.DONE, StepPath.FORWARD), "10:00:05 n1 forward apply done"),
        (entry("n1", "uncordon", Phase.BEGIN), "10:00:05 n1 uncordon begin"),
        (entry(None, "change", Phase.BEGIN), None),
    ],
)
def test_plain_lines(e: Entry, line: str | None) -> None:
    assert plain_line(e) == line


@pytest.mark.parametrize(
    ("mode", "tty", "env", "want"),
    [
        ("auto", True, {"TERM": "xterm"}, "table"),
        ("auto", False, {"TERM": "xterm"}, "plain"),
        ("auto", True, {"TERM": "dumb"}, "plain"),
        ("auto", True, {"TERM": "xterm", "CI": "true"}, "plain"),
        ("table", False, {}, "table"),
        ("off", True, {}, "off"),
    ],
)
def test_auto_is_a_table_only_on_an_interactive_terminal(
    mode: str, tty: bool, env: dict[str, str], want: str
) -> None:
    assert resolve_mode(mode, tty, env) == want


def test_plain_mode_writes_lines_no_escape_codes() -> None:
    out = io.StringIO()
    p = Progress(out, "plain")
    p.nodes(("n1",))
    p.entry(entry("n1", "cordon", Phase.BEGIN, StepPath.FORWARD))
    p.event("n1: cordoned")
    assert out.getvalue() == "10:00:05 n1 forward cordon begin\nn1: cordoned\n"


def test_table_mode_redraws_in_place_and_keeps_other_messages_above() -> None:
    out = io.StringIO()
    p = Progress(out, "table")
    p.nodes(("n1",))  # header + 1 row
    first = out.getvalue()
    assert "\x1b[" not in first and first.count("\n") == 2
    p.entry(entry("n1", "drain", Phase.BEGIN, StepPath.FORWARD))
    assert out.getvalue()[len(first) :].startswith("\x1b[2F\x1b[J")  # up 2 lines, clear
    p.event("batch 1/2: n1")  # not about a row: printed once, above a fresh table
    text = out.getvalue()
    assert text.count("batch 1/2: n1\n") == 1 and not text.endswith("batch 1/2: n1\n")
    assert text.rstrip().endswith("n1    forward  drain…             10:00:05")


def test_observed_journal_reports_each_written_entry(tmp_path: Path) -> None:
    seen: list[Entry] = []
    j = ObservedJournal(Journal.create(tmp_path, "c1"), seen.append)
    j.append("cordon", Phase.BEGIN, now=datetime(2026, 12, 1, tzinfo=UTC), node="n1")
    assert [e.step for e in seen] == ["cordon"]
    assert [e.step for e in Journal.open(tmp_path, "c1").entries()] == ["cordon"]
