"""Write the journal fixtures of ``tests/unit/test_entries.py`` with the rollout on ``PYTHONPATH``.

The fixtures in this folder were written by rollout at main ``2b0ee73`` (the last commit before
the typed record, ``rollout.change.record.entries``), from a checkout of that commit:

    git archive 2b0ee73 | tar -x -C /tmp/old
    cd /tmp/old && PYTHONPATH=/tmp/old python <this file> <this folder>

Each ``<name>/journal.jsonl`` is a change as that version journaled it (through its own engine
and writers, on the unit tests' fake cluster); ``<name>/expected.json`` is what that version
made of it: ``status -o json``, ``report -o json`` and the decisions ``resume`` and ``promote``
take from a journal. The test reads the journals with the code of today and must make the same
of them. Do not regenerate them with a newer rollout: their point is that they are old.

Entries whose writer needs the lab (a gate verdict, an alert's trigger, a recovery, a bench
verdict) are appended with the payload that version's writer builds, from the same values
(``Verdict.as_dict``, ``decision_record``; the alert's literal as ``rollout.gate.serve`` spelt it).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import types
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rollout.change.commands.apply_change import journal_consents
from rollout.change.commands.promote_change import evidence_refusal, last_gate, promote_refusal
from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import continue_change, rollback, run_change
from rollout.change.engine.resumption import unfinished_gate, unfinished_rollback
from rollout.change.plan.batches import make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.gate_section import BenchPolicy
from rollout.change.plan.strategy import Strategy
from rollout.change.record.journal import Journal, Kind
from rollout.change.record.replay import replay
from rollout.evidence.collecting import journal_evidence
from rollout.evidence.report import build_report
from rollout.gate.owning import journal_recorder
from rollout.gate.performance import decision_record
from rollout.interrupt import StopReason
from rollout.models import Phase
from rollout.verdicts import Finding, Outcome, Verdict, VerdictStatus
from tests.unit.fakes_change import (
    FakeClock,
    FakeCluster,
    FakeRunner,
    ScriptedGate,
    make_change,
    make_node,
)
from tests.unit.test_collect import _collection
from tests.unit.test_owner import SoakThenRequest

NODES = ["n1", "n2", "n3", "n4"]
T = datetime(2026, 1, 1, 0, 5, tzinfo=UTC)
PLAN_TEXT = "kubelet:\n  cpuManagerPolicy: static\n"


def _ctx(root: Path, change: str) -> Context:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    return Context(
        cluster=cluster,
        runner=FakeRunner(cluster),
        clock=FakeClock(),
        journal=Journal.create(root, change),
        drain=DrainPolicy(timeout_s=5, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
    )


def promoted(root: Path) -> Journal:
    """Apply --canary with its consents, evidence, a gate and a bench verdict; promote; an
    alert's rollback of one node; then ``rollback --force`` of two."""
    ctx = _ctx(root, "20260101T000000Z-promo1")
    j = ctx.journal
    consents = types.SimpleNamespace(
        forced=["n2: nvidia.com/gpu allocatable 8 -> 0"],
        serving_forced=["default/llm on n1"],
        accepted=[{"node": "n1", "pod": "default/big", "reason": "TopologyAffinityError"}],
    )
    journal_consents(j, consents, "maintenance 42", T, "serving drained by hand")  # type: ignore[arg-type]
    j.append(
        Kind.DRAIN_OVERRIDES,
        Phase.DONE,
        now=T,
        data={"flags": ["--delete-emptydir-data"], "pods": ["default/cache"]},
    )
    batches = make_batches(NODES, ["n1", "n2"], Strategy(max_unavailable=2), True)
    changes = {n: make_change(n) for n in NODES}
    info = {
        "plan": "/srv/plans/tighten.yaml",
        "planText": PLAN_TEXT,
        "inventory": "/srv/inventory.ini",
        "intentSha256": "ab" * 32,
        "by": "alice@laptop pid 42",
        "stage": {"plan": "tighten", "index": 0, "name": "static", "count": 2},
    }
    run_change(ctx, changes, batches, ScriptedGate(VerdictStatus.SUCCESSFUL), True, info=info)
    journal_evidence(j, "before", ["n1", "n2"], root / "e.json", _collection("before", 8, "8"))
    journal_evidence(j, "after", ["n1", "n2"], root / "e.json", _collection("after", 8, "8"))
    journal_evidence(j, "recreated", ["n1"], root / "e.json", error="ssh: n2 unreachable")
    verdict = Verdict(
        Outcome.SUCCESSFUL,
        "0 rejections in 300s",
        at=1767225900.0,
        findings=(Finding("rejections", Outcome.SUCCESSFUL, "0 of 12", ("n1", "n2")),),
        inputs={
            "config": {"threshold": 0.05},
            "signals": {
                "kubelet": {
                    "nodes": {
                        "n1": {"admissions": 7, "rejections": {"TopologyAffinityError": 1}},
                        "n2": {"admissions": 5, "rejections": {}},
                    }
                }
            },
        },
    )
    j.append(
        Kind.VERDICT,
        Phase.DONE,
        now=T,
        data={"change": j.change_id, "nodes": ["n1", "n2"], **verdict.as_dict()},
    )
    bench = decision_record(
        BenchPolicy(standin=True, accept_simulated=True),
        Verdict(Outcome.SUCCESSFUL, "p99 +1% (limit 10%)"),
        Verdict(Outcome.FAILED, "no aligned advantage: p99 -1%"),
        ["n1"],
    )
    j.append(Kind.BENCH_VERDICT, Phase.DONE, now=T, data=bench)
    status = replay(j.entries())
    promotion = {
        "by": "bob@desk pid 7",
        "at": "2026-01-01T00:10:00+00:00",
        "batches": [["n3"], ["n4"]],
        "forced": None,
        "refusal": None,
        "forcedRefusals": [],
        "forcedServing": None,
        "forcedServingCanaries": [],
    }
    part = {
        **{k: v for k, v in status.info.items() if k != "rollback"},
        "nodes": NODES,
        "batches": [*status.info.get("batches", ()), ["n3"], ["n4"]],
        "canaryOnly": False,
        "promotion": promotion,
    }
    rest = make_batches(["n3", "n4"], [], Strategy(max_unavailable=1), False)
    continue_change(ctx, changes, rest, ScriptedGate(VerdictStatus.SUCCESSFUL), part)
    record = journal_recorder(root)
    record(
        j.change_id,
        {
            "change": j.change_id,
            "trigger": "alert",
            "id": "5f3a9c1b2d4e",
            "alert": "KubeletTopologyAffinityRejections",
            "fingerprint": "fp1",
            "node": "n4",
            "nodes": ["n4"],
            "labels": {"alertname": "KubeletTopologyAffinityRejections", "node": "n4"},
            "startsAt": "2026-01-01T00:20:00Z",
            "ownerLive": False,
            "reason": "alert fp1 (KubeletTopologyAffinityRejections)",
        },
    )
    j.append(
        Kind.RECOVERY,
        Phase.DONE,
        now=T,
        data={"change": j.change_id, "running": ["Deployment/a"], "notRunning": [], "waited": 30.0},
    )
    rollback(ctx, ["n3", "n4"], force=True)
    record(
        j.change_id,
        {
            "change": j.change_id,
            "trigger": "alert",
            "id": "5f3a9c1b2d4e",
            "outcome": "rolled-back",
            "detail": "restored: n3, n4",
            "seconds": 4.2,
        },
    )
    return j


def requested(root: Path) -> Journal:
    """Apply whose canary soak is cut by a rollback handed to the owner (``request``)."""
    ctx = _ctx(root, "20260101T000000Z-req001")
    gate = SoakThenRequest(ctx.interrupt, StopReason(by="carol@ops pid 9", request_id="r1"))
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), False)
    run_change(ctx, {n: make_change(n) for n in NODES}, batches, gate, False)
    return ctx.journal


def interrupted(root: Path) -> Journal:
    """A held canary whose ``rollback`` of every node died after its ``begin``; a Failed
    gate verdict before it with its trigger (the soak's records)."""
    ctx = _ctx(root, "20260101T000000Z-cut001")
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), True)
    run_change(
        ctx,
        {n: make_change(n) for n in NODES},
        batches,
        ScriptedGate(VerdictStatus.SUCCESSFUL),
        True,
    )
    j = ctx.journal
    j.append(Kind.GATE, Phase.BEGIN, now=T, data={"nodes": ["n1"]})
    j.append(
        Kind.TRIGGER,
        Phase.DONE,
        now=T,
        data={
            "change": j.change_id,
            "trigger": "gate",
            "nodes": ["n1"],
            "policy": "rollback-affected",
            "reason": "rejections 3/10 > 5%",
        },
    )
    j.append(
        Kind.GATE,
        Phase.DONE,
        now=T,
        data={"status": "Failed", "reason": "rejections 3/10 > 5%", "nodes": ["n1"]},
    )
    info = {k: v for k, v in replay(j.entries()).info.items() if k != "rollback"}
    j.append(
        "change", Phase.BEGIN, now=T, data={**info, "rollback": {"nodes": None, "force": False}}
    )
    return j


def _plain(value: Any) -> Any:
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {k: _plain(v) for k, v in dataclasses.asdict(value).items()}
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "value"):
        return value.value
    return value


def expected(j: Journal) -> dict[str, Any]:
    entries = j.entries()
    status = replay(entries, j.change_id)
    canary = [n for b in status.info.get("batches", ())[:1] for n in b]
    return {
        "status": status.to_dict(),
        "report": build_report(entries).as_dict(),
        "unfinishedRollback": _plain(unfinished_rollback(entries)),
        "unfinishedGate": _plain(unfinished_gate(entries, has_gate=True)),
        "promoteRefusal": promote_refusal(status, last_gate(j)),
        "evidenceRefusal": evidence_refusal(entries, canary),
    }


def main(out: Path) -> None:
    import tempfile

    for make in (promoted, requested, interrupted):
        with tempfile.TemporaryDirectory() as tmp:
            j = make(Path(tmp))
            target = out / make.__name__
            target.mkdir(parents=True, exist_ok=True)
            (target / "journal.jsonl").write_bytes(j.file.read_bytes())
            doc = json.dumps(expected(j), indent=1, sort_keys=True, default=str)
            (target / "expected.json").write_text(doc + "\n")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
