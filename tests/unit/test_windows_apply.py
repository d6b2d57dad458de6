"""The change-window hook in the orchestrator: refused before the first batch (nothing journaled),
held between batches once the window closes, forced with a journaled reason, rollback unaffected."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, rollback, run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.strategy import Strategy
from rollout.change.plan.windows import DAY_NAMES, Decision, guard, parse_windows
from rollout.change.record.journal import CHANGE_STEP
from rollout.change.record.replay import replay
from rollout.errors import PreflightError
from rollout.models import NodeState
from tests.unit.fakes_change import CONF, OLD, make_change
from tests.unit.test_orchestrator import NODES, _setup

# The fake clock starts on Thursday 2026-01-01 00:00 UTC.
OPEN_NOW = parse_windows([{"days": ["thu"], "start": "00:00", "end": "01:00"}])
CLOSED_NOW = parse_windows([{"days": ["sat"], "start": "22:00", "end": "02:00"}])


def _run(ctx: Context, forward: object, canary_only: bool = False) -> object:
    batches = make_batches(NODES, ["n1", "n2"], Strategy(max_unavailable=2), canary_only)
    changes = {n: make_change(n) for n in NODES}
    return run_change(ctx, changes, batches, NoGate(), canary_only, forward=forward)  # type: ignore[arg-type]


def test_outside_window_refused_before_anything(tmp_path: Path) -> None:
    ctx, cluster, _ = _setup(tmp_path)
    with pytest.raises(PreflightError) as e:
        _run(ctx, guard(CLOSED_NOW, None))
    assert "next one opens Sat 2026-01-03 22:00 UTC" in str(e.value)
    assert ctx.journal.entries() == []
    assert not [c for c in cluster.calls if c[0] == "cordon"]
    assert all(cluster.nodes[n].files == {CONF: OLD} for n in NODES)


def test_forced_apply_journals_the_reason(tmp_path: Path) -> None:
    ctx, _, _ = _setup(tmp_path)
    status = _run(ctx, guard(CLOSED_NOW, "INC-4711 hotfix"), canary_only=True)
    assert status.outcome == "held"  # type: ignore[attr-defined]
    begin = next(e for e in ctx.journal.entries() if e.step == CHANGE_STEP)
    assert begin.data["window"]["forced"] is True
    assert begin.data["window"]["forceReason"] == "INC-4711 hotfix"


def test_window_closing_mid_rollout_holds_after_the_batch_and_rollback_still_works(
    tmp_path: Path,
) -> None:
    ctx, cluster, _ = _setup(tmp_path)
    check = guard(OPEN_NOW, None)

    def forward(now: datetime) -> Decision:
        decision = check(now)
        ctx.clock.t += 2 * 3600  # type: ignore[attr-defined]  # the batch takes two hours
        return decision

    status = _run(ctx, forward)
    assert status.outcome == "held"  # type: ignore[attr-defined]
    assert "change window closed" in status.message  # type: ignore[attr-defined]
    states = {n: s.state for n, s in replay(ctx.journal.entries()).nodes.items()}
    assert states == {
        "n1": NodeState.APPLIED,
        "n2": NodeState.APPLIED,
        "n3": NodeState.PENDING,
        "n4": NodeState.PENDING,
    }
    after = rollback(ctx)  # outside the window: rollback never asks
    assert after.outcome == "rolled-back"
    assert all(cluster.nodes[n].files == {CONF: OLD} for n in NODES)


def test_apply_cli_outside_window_exits_3_before_any_io(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rollout.cli import cli

    plan = tmp_path / "plan.yaml"
    day = DAY_NAMES[(datetime.now(UTC).weekday() + 3) % 7]  # never open now
    plan.write_text(
        f"kind: RolloutPlan\nwindows:\n  - {{days: [{day}], start: '02:00', end: '02:01'}}\n"
    )
    state = tmp_path / "state"
    result = CliRunner().invoke(
        cli,
        ["apply", "--plan", str(plan), "--yes"],  # no inventory, no cluster: refused first
        env={"ROLLOUT_STATE_DIR": str(state), "ROLLOUT_INVENTORY": ""},
    )
    assert result.exit_code == 3, result.output
    assert "outside every change window" in result.output
    assert (
        f"the next one opens {day.title()}" in result.output and "--force-window" in result.output
    )
    assert not state.exists()
