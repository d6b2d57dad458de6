"""The outcome -> exit-code table in docs/exit-codes.md is the one the code uses
(``rollout.change.record.change_outcomes``), a ``stopped`` change exits with the code its recorded
cause has, and a command that ends with a failed status prints it as the errors did."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollout.change.engine.orchestrator import failure_text
from rollout.change.record.change_outcomes import (
    BY_CAUSE,
    FORWARD_EXIT,
    GATE_HOLDS_EXIT,
    ROLLBACK_EXIT,
    ChangeOutcome,
    StopCause,
    ended_exit,
    exit_code,
)
from rollout.change.record.journal import CHANGE_STEP, Journal
from rollout.change.record.replay import replay
from rollout.errors import (
    LeaseLostError,
    NodeFilesChangedError,
    NodeOperationError,
    RolloutError,
)
from rollout.models import Phase

DOC = Path(__file__).resolve().parents[2] / "docs" / "exit-codes.md"


def _documented() -> dict[str, tuple[str, str]]:
    text = DOC.read_text(encoding="utf-8")
    section = text[text.index("## By outcome") :]
    rows = re.findall(r"^\| `([a-z-]+)` \| ([^|]+) \| ([^|]+) \|", section, re.M)
    return {name: (fwd.strip(), back.strip()) for name, fwd, back in rows}


def _cell(code: int | None) -> str:
    return "by cause" if code is BY_CAUSE else str(code)


def test_every_outcome_is_documented_with_the_codes_the_code_returns() -> None:
    doc = _documented()
    assert set(doc) == {o.value for o in ChangeOutcome}
    for o in ChangeOutcome:
        assert doc[o.value] == (_cell(FORWARD_EXIT[o]), _cell(ROLLBACK_EXIT[o])), o
        assert exit_code(o) == FORWARD_EXIT[o]
        assert exit_code(o.value, rollback=True) == ROLLBACK_EXIT[o]


def test_the_codes_in_the_outcome_table_are_codes_the_top_table_defines() -> None:
    text = DOC.read_text(encoding="utf-8")
    top = {int(c) for c in re.findall(r"^\| (\d+) \|", text, re.M)}
    used = {c for t in (FORWARD_EXIT, ROLLBACK_EXIT) for c in t.values() if c is not None}
    assert used | {GATE_HOLDS_EXIT} <= top


@pytest.mark.parametrize(
    ("cause", "error", "code"),
    [
        (StopCause.FILES_CHANGED, NodeFilesChangedError, 3),
        (StopCause.LEASE_LOST, LeaseLostError, 4),
        (StopCause.NODE_FAILED, NodeOperationError, 5),
        (None, NodeOperationError, 5),  # a journal from before causes were recorded
    ],
)
def test_a_stopped_change_exits_with_its_causes_code(
    cause: StopCause | None, error: type[RolloutError], code: int
) -> None:
    """``stopped`` is "by cause": the code the table's row names for each cause, the same as
    the error a command raises for that cause before any change began."""
    assert ended_exit(ChangeOutcome.STOPPED, cause) == code == error.exit_code
    assert ended_exit(ChangeOutcome.STOPPED, cause, rollback=True) == code
    row = _documented()["stopped"][0]
    assert row == "by cause"
    stopped_row = next(
        line for line in DOC.read_text().splitlines() if line.startswith("| `stopped`")
    )
    assert f"{code} when" in stopped_row


def test_a_rolled_back_change_is_a_failure_of_apply_and_the_success_of_rollback() -> None:
    assert exit_code(ChangeOutcome.ROLLED_BACK) == NodeOperationError.exit_code
    assert exit_code(ChangeOutcome.ROLLED_BACK, rollback=True) == 0
    assert exit_code("an-outcome-from-the-future") == 1


def test_a_rollbacks_own_end_exits_as_the_rollback_command_wherever_it_ran() -> None:
    """``rollout resume`` finishing an interrupted rollback exits as ``rollback`` does."""
    assert ended_exit(ChangeOutcome.ROLLED_BACK, StopCause.ROLLBACK) == 0
    assert ended_exit(ChangeOutcome.ROLLED_BACK, StopCause.GATE_FAILED) == 5
    assert ended_exit(ChangeOutcome.ROLLED_BACK, StopCause.REQUESTED) == 5  # apply's own exit
    assert ended_exit(ChangeOutcome.ROLLBACK_FAILED, StopCause.ROLLBACK) == 5


def _ended(tmp_path: Path, outcome: ChangeOutcome, cause: str | None, message: str) -> Journal:
    from datetime import UTC, datetime

    journal = Journal.create(tmp_path, "c1")
    now = datetime(2026, 12, 4, tzinfo=UTC)
    journal.append(CHANGE_STEP, Phase.BEGIN, now=now, data={"nodes": ["n1"]})
    data = {"outcome": outcome.value, "message": message}
    if cause is not None:
        data["cause"] = cause
    journal.append(CHANGE_STEP, Phase.FAILED, now=now, data=data)
    return journal


def test_the_cause_is_replayed_and_an_unknown_one_reads_as_none(tmp_path: Path) -> None:
    got = replay(_ended(tmp_path / "a", ChangeOutcome.STOPPED, "lease-lost", "x").entries())
    assert got.cause is StopCause.LEASE_LOST and got.to_dict()["cause"] == "lease-lost"
    future = replay(_ended(tmp_path / "b", ChangeOutcome.STOPPED, "cosmic-ray", "x").entries())
    assert future.cause is None and ended_exit(future.outcome, future.cause) == 5


@pytest.mark.parametrize(
    ("outcome", "cause", "first"),
    [
        (ChangeOutcome.STOPPED, "node-failed", "rollout stopped: node n1: apply failed"),
        (ChangeOutcome.STOPPED, "lease-lost", "node n1: apply failed"),
        (ChangeOutcome.ROLLBACK_FAILED, "rollback", "rollback failed: node n1: apply failed"),
        (ChangeOutcome.RESUME_FAILED, "resume", "resume failed: node n1: apply failed"),
    ],
)
def test_the_failure_text_is_the_message_then_every_nodes_state(
    tmp_path: Path, outcome: ChangeOutcome, cause: str, first: str
) -> None:
    status = replay(_ended(tmp_path, outcome, cause, "node n1: apply failed").entries())
    assert failure_text(status).splitlines() == [first, "node states:", "  n1: pending"]


def test_a_command_that_ends_failed_exits_with_the_code_and_says_why(tmp_path: Path) -> None:
    """``finish``: the exit code the table gives, the failure on stderr, the status on stdout
    only with ``-o json`` (as the errors it replaces printed)."""
    import click
    from click.testing import CliRunner

    from rollout.cli.wiring import finish

    status = replay(_ended(tmp_path, ChangeOutcome.STOPPED, "files-changed", "n1 moved").entries())

    @click.command()
    @click.option("-o", "output", default="text")
    def cmd(output: str) -> None:
        finish(status, output)

    text = CliRunner().invoke(cmd, [])
    assert text.exit_code == 3 and text.stdout == ""
    assert text.stderr.startswith("error: rollout stopped: n1 moved\nnode states:\n")
    js = CliRunner().invoke(cmd, ["-o", "json"])
    assert js.exit_code == 3 and '"cause": "files-changed"' in js.stdout
