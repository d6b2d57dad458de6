"""The report, built from a journal the real orchestrator wrote (with fakes for the cluster and
Ansible), plus a soak-gate verdict entry: sections present, numbers equal to the journal's."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

from rollout.change.engine.orchestrator import rollback
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.errors import InputError
from rollout.evidence.report import build_report, load_report, rate_points, render, state_spans
from rollout.models import Phase
from tests.unit.fakes_change import CONF, NEW, OLD
from tests.unit.test_orchestrator import _run, _setup

INPUTS = {
    "config": {"threshold": 0.05},
    "signals": {
        "api": {
            "nodes": {
                "n1": {"admissions": 12, "rejections": {"TopologyAffinityError": 3}},
                "n2": {"admissions": 8, "rejections": {}},
            }
        },
        "kubelet": {"nodes": {"n1": {"admissions": 20, "rejections": {}}}},
    },
}


@pytest.fixture
def journal(tmp_path: Path) -> Journal:
    ctx, _, _ = _setup(tmp_path)
    _run(ctx)  # canary n1, n2 applied; holds
    ctx.journal.append(
        "verdict",
        Phase.DONE,
        now=datetime(2026, 1, 1, 0, 1, tzinfo=UTC),
        data={
            "outcome": "Failed",
            "reason": "3 of 20 admissions rejected (15%)",
            "nodes": ["n1", "n2"],
            "inputs": INPUTS,
        },
    )
    rollback(ctx)
    return ctx.journal


def test_report_numbers_match_the_journal(journal: Journal) -> None:
    report = load_report(journal)
    status = replay(journal.entries())
    assert report.change == status.change
    assert report.outcome == "rolled-back"
    assert report.nodes == {n: s.state.value for n, s in status.nodes.items()}
    node_entries = [e for e in journal.entries() if e.node is not None]
    assert len(report.events) == len(node_entries)
    assert report.events[-1].state == status.nodes[report.events[-1].node].state.value
    files = {(f.node, f.path): f for f in report.files}
    assert set(files) == {(n, p) for n in ("n1", "n2") for p in (CONF, "/etc/dropin.conf")}
    created = files[("n2", "/etc/dropin.conf")]
    assert not created.existed and created.after_sha256 == hashlib.sha256(b"x\n").hexdigest()
    f = files[("n1", CONF)]
    assert f.before_sha256 == hashlib.sha256(OLD).hexdigest()
    assert f.after_sha256 == hashlib.sha256(NEW).hexdigest()
    verdict = [d for d in report.decisions if d.source == "verdict"]
    assert len(verdict) == 1
    v = verdict[0]
    assert (v.signal, v.admissions, v.rejections, v.threshold) == ("api", 20, 3, 0.05)
    assert v.rate == pytest.approx(0.15)
    assert [d.status for d in report.decisions if d.source == "gate"] == ["Successful"]
    assert report.evidence_source == "not collected"
    assert report.evidence_status == "not-collected"


def test_markdown_and_json_sections(journal: Journal) -> None:
    report = load_report(journal)
    md = render(report, "markdown")
    for heading in (
        "# Change report",
        "## Nodes",
        "## Timeline",
        "## Gate decisions",
        "## Files changed",
        "## Evidence checks",
    ):
        assert heading in md
    assert hashlib.sha256(NEW).hexdigest() in md
    assert "| 15.0% | 5% |" in md
    assert "not-collected" in md
    data = json.loads(render(report, "json"))
    assert data["change"] == report.change
    assert len(data["timeline"]) == len(report.events)
    assert data["evidence"]["status"] == "not-collected"


def test_html_is_self_contained_with_both_charts(journal: Journal) -> None:
    html = render(load_report(journal), "html")
    assert html.count("<svg") == 2
    assert 'class="chart rejection-rate"' in html and 'class="chart state-timeline"' in html
    assert 'class="threshold"' in html and 'class="rate"' in html
    for external in ("http://", "https://", "<script", "<link", "src="):
        assert external not in html.replace('xmlns="http://www.w3.org/2000/svg"', "")
    spans, t_end = state_spans(load_report(journal))
    assert [s[2] for s in spans["n1"]] == [
        "pending",
        "applying",
        "applied",
        "restoring",
        "restored",
    ]
    assert [s[2] for s in spans["n3"]] == ["pending"]
    assert spans["n1"][-1][1] == t_end
    points, threshold = rate_points(load_report(journal))
    assert threshold == 0.05 and [round(r, 2) for _, r in points] == [0.15]


def test_evidence_file_is_read_and_bad_one_named(journal: Journal, tmp_path: Path) -> None:
    ev = journal.dir / "evidence.json"
    ev.write_text(
        json.dumps(
            {
                "collections": [
                    {
                        "label": "after",
                        "nodes": {
                            "n1": {
                                "allocatable": {"nvidia.com/gpu": "2"},
                                "healthyDevices": {"nvidia.com/gpu": 1},
                            }
                        },
                    }
                ]
            }
        )
    )
    report = load_report(journal)
    assert report.evidence_source == str(ev)
    assert report.evidence_status == "fail"
    assert "allocatable nvidia.com/gpu is 2, 1 healthy" in render(report, "markdown")
    bad = tmp_path / "bad.json"
    bad.write_text("{\n  nope")
    with pytest.raises(InputError) as e:
        load_report(journal, bad)
    assert str(bad) in str(e.value) and e.value.location.line == 2


def test_unhealthy_devices_are_notes_in_markdown_and_html(journal: Journal) -> None:
    node = {
        "allocatable": {"nvidia.com/gpu": "7"},
        "capacity": {"nvidia.com/gpu": "8"},
        "healthyDevices": {"nvidia.com/gpu": 7},
        "unhealthyDevices": {"nvidia.com/gpu": ["GPU-3"]},
    }
    doc = {"collections": [{"label": "after", "nodes": {"n1": node}}]}
    (journal.dir / "evidence.json").write_text(json.dumps(doc))
    report = load_report(journal)
    note = "n1: 1 nvidia.com/gpu device(s) unhealthy (capacity 8, allocatable 7): GPU-3"
    assert f"- note: {note}" in render(report, "markdown")
    assert f'<ul class="notes"><li>note: {note}</li></ul>' in render(report, "html")
    (after,) = [c for c in report.checks if c.label == "after" and c.notes]
    assert after.status.value == "pass"


def test_empty_journal_renders(tmp_path: Path) -> None:
    report = build_report([])
    assert "No gate decision was recorded." in render(report, "markdown")
    assert "no gate verdicts recorded" in render(report, "html")


def test_recovery_after_an_automatic_rollback_is_a_gate_decision(journal: Journal) -> None:
    journal.append(
        "recovery",
        Phase.DONE,
        now=datetime(2026, 1, 1, 0, 2, tzinfo=UTC),
        data={"running": ["ReplicaSet/ml/a-1"], "notRunning": ["ReplicaSet/ml/b-2"], "waited": 60},
    )
    (d,) = [d for d in load_report(journal).decisions if d.source == "recovery"]
    assert d.status == "workload NOT running"
    assert d.reason == "Running again: ReplicaSet/ml/a-1; NOT Running after 60s: ReplicaSet/ml/b-2"
    assert "| recovery | workload NOT running |" in render(load_report(journal), "markdown")
