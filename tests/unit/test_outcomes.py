"""The outcome -> exit-code table in docs/exit-codes.md is the one the code uses
(``rollout.change.outcomes``), and the errors each ``stopped`` cause raises carry the codes the
table names."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rollout.change.outcomes import (
    BY_CAUSE,
    FORWARD_EXIT,
    GATE_HOLDS_EXIT,
    ROLLBACK_EXIT,
    ChangeOutcome,
    exit_code,
)
from rollout.errors import (
    LeaseLostError,
    NodeFilesChangedError,
    NodeOperationError,
    RolloutError,
)

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
    ("error", "code"),
    [(NodeFilesChangedError, 3), (LeaseLostError, 4), (NodeOperationError, 5)],
)
def test_a_stopped_change_exits_with_its_causes_code(error: type[RolloutError], code: int) -> None:
    """``stopped`` is "by cause": the error the engine raises for each cause has the code the
    table's row names."""
    assert error.exit_code == code
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
