"""The plan's ``gate.requireEvidence``: the canary's gate collects its ``after`` evidence once the
soak is Successful and acts on it (``rollout.change.commands.apply_change.EvidenceGate``): a failed
check restores the canary as a Failed verdict does, evidence that could not be collected holds."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout.change.commands.apply_change import EvidenceGate
from rollout.change.engine.orchestrator import run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.gate_section import parse_gate_config
from rollout.change.plan.strategy import Strategy
from rollout.change.record.journal import EVIDENCE_STEP, Journal
from rollout.errors import InputError
from rollout.evidence.collecting import journal_evidence
from rollout.models import NodeState
from rollout.verdicts import VerdictStatus
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    OLD,
    FakeCluster,
    FakeRunner,
    ScriptedGate,
    fake_context,
    make_change,
    make_node,
)

NODES = ["n1", "n2", "n3"]
GPU = "nvidia.com/gpu"
HEALTHY = {"allocatable": {GPU: "2"}, "healthyDevices": {GPU: 2}}
UNHEALTHY = {"allocatable": {GPU: "2"}, "healthyDevices": {GPU: 1}}  # one advertised, not healthy


class Hooks:
    """Evidence hooks over canned collections (``None``: the collection failed)."""

    def __init__(self, after: dict[str, Any] | None) -> None:
        self.after = after
        self.collected: list[tuple[str, list[str]]] = []

    def collect(self, journal: Journal, label: str, nodes: list[str], raw_facts: Any = None) -> Any:
        self.collected.append((label, list(nodes)))
        if self.after is None:
            return None, "ssh: connect to host n1: Connection refused"
        return {"label": label, "at": "2026-12-04T00:00:00+00:00", "nodes": self.after}, None

    def record(self, journal: Journal, label: str, nodes: list[str], collected: Any) -> None:
        collection, error = collected if collected is not None else (None, "not collected")
        journal_evidence(journal, label, nodes, journal.dir / "evidence.json", collection, error)


def _run(tmp_path: Path, after: dict[str, Any] | None) -> tuple[Any, Any, FakeCluster, Hooks]:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    ctx = fake_context(cluster, FakeRunner(cluster), Journal.create(tmp_path, "c1"))
    hooks = Hooks(after)
    gate = EvidenceGate(ScriptedGate(VerdictStatus.SUCCESSFUL), ctx.journal, hooks, (None, "x"))
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), True)
    status = run_change(ctx, {n: make_change(n) for n in NODES}, batches, gate, True)
    return ctx, status, cluster, hooks


def _labels(ctx: Any) -> list[str]:
    return [e.data["label"] for e in ctx.journal.entries() if e.step == EVIDENCE_STEP]


def test_failed_evidence_fails_the_gate_and_restores_the_canary(tmp_path: Path) -> None:
    ctx, status, cluster, hooks = _run(tmp_path, {"n1": UNHEALTHY})
    text = ended(status, 5, "gate.requireEvidence: the canary's 'after' evidence failed")
    assert "allocatable-matches-healthy" in text
    assert status.nodes["n1"].state is NodeState.RESTORED
    assert cluster.nodes["n1"].files == {CONF: OLD}
    assert hooks.collected == [("after", ["n1"])]
    assert _labels(ctx) == ["before", "after"]
    # the journal says what started the rollback, before the rollback's first step
    entries = ctx.journal.entries()
    (i, trigger), *_ = [(i, e) for i, e in enumerate(entries) if e.step == "trigger"]
    assert trigger.data["trigger"] == "gate" and trigger.data["source"] == "evidence"
    assert (
        trigger.data["nodes"] == ["n1"] and "allocatable-matches-healthy" in trigger.data["reason"]
    )
    assert all(e.step != "restore" for e in entries[:i])


def test_evidence_that_could_not_be_collected_holds(tmp_path: Path) -> None:
    ctx, status, _, _ = _run(tmp_path, None)
    assert status.outcome == "held" and status.nodes["n1"].state is NodeState.APPLIED
    assert "gate Inconclusive" in status.message and "Connection refused" in status.message
    assert not [e for e in ctx.journal.entries() if e.step == "trigger"]


def test_passing_evidence_lets_the_canary_hold_as_a_successful_gate_does(tmp_path: Path) -> None:
    _, status, _, _ = _run(tmp_path, {"n1": HEALTHY})
    assert status.outcome == "held" and "canary applied; holding" in status.message
    assert status.nodes["n1"].state is NodeState.APPLIED


def test_a_soak_that_did_not_pass_collects_no_evidence(tmp_path: Path) -> None:
    journal = Journal.create(tmp_path, "c1")
    hooks = Hooks({"n1": HEALTHY})
    gate = EvidenceGate(ScriptedGate(VerdictStatus.INCONCLUSIVE), journal, hooks)
    assert gate.evaluate("c1", ["n1"]).status is VerdictStatus.INCONCLUSIVE
    assert hooks.collected == [] and gate.verdict is None


def test_the_plan_field_is_a_boolean_named_by_file_field_and_line() -> None:
    assert parse_gate_config({"requireEvidence": True}).require_evidence is True
    assert parse_gate_config({}).require_evidence is False
    with pytest.raises(InputError, match="must be true or false") as e:
        parse_gate_config({"requireEvidence": "yes"}, file="plan.yaml", line_of=lambda _p: 7)
    assert e.value.location is not None and e.value.location.line == 7
    assert e.value.location.field == "gate.requireEvidence"
