"""``rollout serve``'s rollback policy per change (``rollout.gate.owning.rolls_back_group``): the
plan's ``gate:`` section, absent, empty (the gate's defaults) and explicit, read from the file the
change recorded and, where that file is gone, from the plan text the journal recorded."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.change.plan.gate_section import GateConfig, OnFailure
from rollout.change.record.journal import CHANGE_STEP, Journal
from rollout.change.record.replay import ChangeStatus, replay
from rollout.gate.owning import rolls_back_group
from rollout.models import Phase

CHANGE = "20261130T100000Z-aaaaaa"
HEAD = (
    "apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\nmetadata:\n  name: p\n"
    'kubelet:\n  cpuManagerPolicy: static\n  reservedSystemCPUs: "0"\n'
)


def _status(tmp_path: Path, gate: str | None, keep_file: bool = True) -> ChangeStatus:
    """A change begun with a plan whose ``gate:`` section is ``gate`` (None: no section)."""
    text = HEAD + (gate if gate is not None else "")
    plan = tmp_path / "plan.yaml"
    plan.write_text(text)
    j = Journal.create(tmp_path / "state", CHANGE)
    info = {"nodes": ["n1", "n2"], "batches": [["n1", "n2"]], "plan": str(plan), "planText": text}
    j.append(CHANGE_STEP, Phase.BEGIN, now=datetime(2026, 11, 30, 10, tzinfo=UTC), data=info)
    if not keep_file:
        plan.unlink()  # another machine: only the recorded text
    return replay(j.entries(), CHANGE)


@pytest.mark.parametrize("keep_file", [True, False], ids=["plan-file", "recorded-text"])
@pytest.mark.parametrize(
    ("gate", "group"),
    [
        (None, False),  # no gate: only the alerted node, the smaller act
        ("gate:\n", True),  # an empty gate: the gate's defaults, rollback-group
        ("gate: {}\n", True),
        ("gate:\n  soak: 30s\n", True),  # onFailure left to its default
        ("gate:\n  onFailure: rollback-group\n", True),
        ("gate:\n  onFailure: rollback-affected\n", False),
    ],
    ids=["absent", "empty", "empty-mapping", "default", "explicit-group", "explicit-affected"],
)
def test_the_group_policy_follows_the_gates_documented_default(
    tmp_path: Path, gate: str | None, group: bool, keep_file: bool
) -> None:
    assert rolls_back_group(_status(tmp_path, gate, keep_file)) is group


def test_the_default_it_follows_is_the_gate_sections_own() -> None:
    assert GateConfig().on_failure is OnFailure.ROLLBACK_GROUP


def test_an_unreadable_plan_rolls_back_only_the_node(tmp_path: Path) -> None:
    status = _status(tmp_path, "gate:\n")
    Path(status.info.plan or "").write_text("gate: [not, a, mapping\n")
    assert rolls_back_group(status) is False
