"""The change commands' input handling and output (no cluster needed for these paths)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout.change.record.journal import CHANGE_STEP, Journal
from rollout.cli import cli
from rollout.models import Phase, StepPath

T = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture
def state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("ROLLOUT_STATE_DIR", str(tmp_path / "state"))
    monkeypatch.delenv("ROLLOUT_PLAN", raising=False)
    monkeypatch.delenv("ROLLOUT_INVENTORY", raising=False)
    return tmp_path / "state"


def _journal(state: Path, change: str) -> Journal:
    j = Journal.create(state, change)
    j.append(CHANGE_STEP, Phase.BEGIN, now=T, data={"nodes": ["a", "b"]})
    for step, phase, data in [
        ("cordon", Phase.BEGIN, {"priorCordoned": False}),
        ("cordon", Phase.DONE, {"cordonedByUs": True}),
        ("uncordon", Phase.DONE, {"uncordoned": True}),
    ]:
        j.append(step, phase, now=T, node="a", path=StepPath.FORWARD, data=data)
    j.append(CHANGE_STEP, Phase.DONE, now=T, data={"outcome": "held", "message": "holding"})
    return j


def test_status_defaults_to_latest_change_and_prints_json(state: Path) -> None:
    _journal(state, "20260101T000000Z-aaa")
    _journal(state, "20260102T000000Z-bbb")
    r = CliRunner().invoke(cli, ["status", "-o", "json"])
    assert r.exit_code == 0, r.output
    data = json.loads(r.output)
    assert data["change"] == "20260102T000000Z-bbb"
    assert data["outcome"] == "held"
    assert {n["node"]: n["state"] for n in data["nodes"]} == {"a": "applied", "b": "pending"}
    text = CliRunner().invoke(cli, ["status", "--change", "20260101T000000Z-aaa"])
    assert "change 20260101T000000Z-aaa: held" in text.output
    assert "a: applied" in text.output and "b: pending" in text.output


def test_status_of_unknown_change_is_bad_input(state: Path) -> None:
    _journal(state, "20260101T000000Z-aaa")
    r = CliRunner().invoke(cli, ["status", "--change", "nope"])
    assert r.exit_code == 2
    assert "no change 'nope'" in r.output


def test_apply_without_plan_or_with_bad_strategy_writes_nothing(
    state: Path, tmp_path: Path
) -> None:
    r = CliRunner().invoke(cli, ["apply", "--yes"])
    assert r.exit_code == 2 and "no plan" in r.output
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\n"
        "kubelet:\n  cpuManagerPolicy: static\n"
        "strategy:\n  maxUnavailable: 0\n"
    )
    r = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--yes"])
    assert r.exit_code == 2
    assert f"{plan}:6, field 'strategy.maxUnavailable'" in r.output
    assert not state.exists()


def test_rollback_without_tty_and_without_yes_is_refused(state: Path) -> None:
    _journal(state, "20260101T000000Z-aaa")
    r = CliRunner().invoke(cli, ["rollback", "--change", "20260101T000000Z-aaa"])
    assert r.exit_code == 2
    assert "without --yes when standard input is not a terminal" in r.output


def test_a_plan_that_requires_evidence_refuses_no_evidence_before_any_io(
    state: Path, tmp_path: Path
) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\n"
        "kubelet:\n  cpuManagerPolicy: static\n"
        "gate:\n  soak: 30s\n  requireEvidence: true\n"
    )
    r = CliRunner().invoke(cli, ["apply", "--plan", str(plan), "--yes", "--no-evidence"])
    assert r.exit_code == 2, r.output
    assert "plan.yaml:7, field 'gate.requireEvidence'" in r.output
    assert not state.exists()  # nothing journaled, no change started
