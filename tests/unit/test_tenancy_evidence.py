"""The tenancy audit in a change's evidence (before and after), in the journal's evidence entry,
and its table in the report and the runbook: every row's tenant, identity, what was tried, what
was expected, what the API server answered and who decided."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout.change.plan.schema import parse_plan
from rollout.change.record.journal import EVIDENCE_STEP, Journal
from rollout.change.tenancy.audit import Audit, Row
from rollout.evidence.collecting import describe, journal_evidence, tenancy_audit
from rollout.evidence.report import load_report
from rollout.evidence.report import render as render_report
from rollout.evidence.runbook import Preflight, build_runbook
from rollout.evidence.runbook import render as render_runbook
from tests.unit.test_runbook import FRIDAY, INV, PLAN

POLICY = "rollout-tenancy-gpu-a"
ROWS = (
    Row("policy", "", "", f"ValidatingAdmissionPolicy/{POLICY}-claims", "present", "present",
        "", True),
    Row("probe", "team-a", "alice", "claim allowed class, selector, count", "allowed", "allowed",
        "", True),
    Row("probe", "team-a", "alice", "claim adminAccess", "refused", "refused",
        f"policy {POLICY}-claims (binding {POLICY}-claims)", True,
        "adminAccess is reserved to administrators"),
    Row("probe", "team-a", "system:serviceaccount:team-a:runner",
        "claim selector off the list", "refused", "allowed",
        f"RBAC: RoleBinding team-a/edit; expected refuser {POLICY}-claims", False,
        "device.attributes['x'] == 1 || true slipped past"),
    Row("rbac", "team-a", "alice", "may write nodes", "refused", "refused", "RBAC", True),
    Row("probe", "team-b", "bob", "pool node", "some", "untested", "", True,
        "no node matches pool.nodeSelector"),
)  # fmt: skip
AUDIT = {"file": "tenancy.yaml", **Audit(POLICY, ROWS, {"resource.k8s.io/v1": True}).to_json()}
PASSING = {
    "file": "tenancy.yaml",
    **Audit(POLICY, ROWS[:3], {"resource.k8s.io/v1": True}).to_json(),
}
NOT_COLLECTED = {"file": "tenancy.yaml", "result": "not-collected", "error": "connection refused"}


def _journal(tmp_path: Path) -> Journal:
    return Journal.create(tmp_path, "20261206T080000Z-abcdef")


def _evidence(journal: Journal, before: dict[str, Any], after: dict[str, Any] | None) -> None:
    collections = [{"label": "before", "at": "2026-12-06T08:00:00+00:00", "nodes": {}}]
    collections[0]["tenancy"] = before
    if after is not None:
        collections.append(
            {"label": "after", "at": "2026-12-06T08:10:00+00:00", "nodes": {}, "tenancy": after}
        )
    (journal.dir / "evidence.json").write_text(json.dumps({"collections": collections}))


# (row, the markdown table line it must render as)
MARKDOWN_ROWS = [
    (
        ROWS[0],
        f"| — | — | policy | ValidatingAdmissionPolicy/{POLICY}-claims | present | present | — "
        "| yes |  |",
    ),
    (ROWS[1], "| team-a | alice | probe | claim allowed class, selector, count | allowed | "
              "allowed | — | yes |  |"),
    (
        ROWS[2],
        f"| team-a | alice | probe | claim adminAccess | refused | refused | policy {POLICY}-claims"
        f" (binding {POLICY}-claims) | yes |  |",
    ),
    (
        ROWS[3],
        "| team-a | system:serviceaccount:team-a:runner | probe | claim selector off the list | "
        f"refused | allowed | RBAC: RoleBinding team-a/edit; expected refuser {POLICY}-claims | "
        "**NO** | device.attributes['x'] == 1 \\|\\| true slipped past |",
    ),
    (ROWS[4], "| team-a | alice | rbac | may write nodes | refused | refused | RBAC | yes |  |"),
    (ROWS[5], "| team-b | bob | probe | pool node | some | untested | — | yes | no node matches "
              "pool.nodeSelector |"),
]  # fmt: skip


@pytest.mark.parametrize(("row", "line"), MARKDOWN_ROWS, ids=[r.case for r, _ in MARKDOWN_ROWS])
def test_every_row_of_the_audit_is_a_line_of_the_reports_table(
    tmp_path: Path, row: Row, line: str
) -> None:
    journal = _journal(tmp_path)
    _evidence(journal, AUDIT, PASSING)
    md = render_report(load_report(journal), "markdown")
    before, after = md.split("**after**")
    assert line in before  # before: every row
    assert (line in after) is (row in ROWS[:3])  # after: the passing audit's rows only


def test_the_reports_tenancy_section_in_markdown_html_and_json(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    _evidence(journal, AUDIT, PASSING)
    report = load_report(journal)
    md = render_report(report, "markdown")
    assert "## Tenancy audit" in md
    assert "**before** (2026-12-06T08:00:00+00:00):" in md
    assert f"Tenancy audit of {POLICY} (`tenancy.yaml`): **fail** (6 checks, 1 failed, 1 not " in md
    assert f"Tenancy audit of {POLICY} (`tenancy.yaml`): **pass** (3 checks, 0 failed, 0 not " in md
    assert (
        "| tenant | identity | kind | tried | expected | got | decided by | as expected | detail |"
        in md
    )
    html = render_report(report, "html")
    assert '<h3 id="tenancy-before">before (2026-12-06T08:00:00+00:00)</h3>' in html
    assert '<h3 id="tenancy-after">' in html
    assert (
        "<tr><td>team-a</td><td>alice</td><td>probe</td><td>claim adminAccess</td><td>refused"
        f"</td><td>refused</td><td>policy {POLICY}-claims (binding {POLICY}-claims)</td>"
        '<td class="pass passed">yes</td><td></td></tr>' in html
    )
    assert "device.attributes[&#39;x&#39;] == 1 || true slipped past" in html  # escaped
    doc = json.loads(render_report(report, "json"))
    assert [(t["label"], t["result"], len(t["rows"])) for t in doc["tenancy"]] == [
        ("before", "fail", 6),
        ("after", "pass", 3),
    ]
    assert doc["tenancy"][0]["rows"][3]["by"].startswith("RBAC: RoleBinding team-a/edit")


def test_an_audit_that_could_not_run_says_why_and_none_says_so(tmp_path: Path) -> None:
    journal = _journal(tmp_path)
    _evidence(journal, NOT_COLLECTED, None)
    md = render_report(load_report(journal), "markdown")
    assert "Tenancy audit of `tenancy.yaml`: **not-collected**: connection refused" in md
    assert "| tenant |" not in md
    (journal.dir / "evidence.json").write_text(json.dumps({"collections": [{"label": "after"}]}))
    md = render_report(load_report(journal), "markdown")
    assert "No tenancy audit was collected (the plan names no `tenancy:` file)." in md
    assert json.loads(render_report(load_report(journal), "json"))["tenancy"] == []


def test_a_tenancy_file_that_cannot_be_read_is_not_collected_never_a_pass(tmp_path: Path) -> None:
    missing = str(tmp_path / "tenancy.yaml")
    got = tenancy_audit(missing, api=None)
    assert got["file"] == missing and got["result"] == "not-collected"
    assert missing in got["error"]


@pytest.mark.parametrize(
    ("audit", "said"),
    [
        (AUDIT, f"tenancy audit of {POLICY}: fail (6 checks, 1 failed)"),
        (PASSING, f"tenancy audit of {POLICY}: pass (3 checks, 0 failed)"),
        (NOT_COLLECTED, "tenancy audit of tenancy.yaml: not-collected: connection refused"),
    ],
)
def test_the_journals_evidence_entry_carries_the_audits_verdict(
    tmp_path: Path, audit: dict[str, Any], said: str
) -> None:
    journal = _journal(tmp_path)
    collection = {"label": "after", "at": "", "nodes": {}, "tenancy": audit}
    data = journal_evidence(journal, "after", ["n1"], journal.dir / "evidence.json", collection)
    (entry,) = [e for e in journal.entries() if e.step == EVIDENCE_STEP]
    t = entry.data["tenancy"]
    assert t["result"] == audit["result"] and t["checks"] == len(audit.get("rows") or ())
    assert "rows" not in t  # the rows are in evidence.json, not in the journal
    assert said in describe(data)
    assert "tenancy" not in journal_evidence(
        journal, "after", ["n1"], journal.dir / "evidence.json", {"label": "after", "nodes": {}}
    )


def test_the_runbooks_preflight_shows_the_audits_table() -> None:
    plan = parse_plan(PLAN, "plan.yaml")
    pre = Preflight(ran=True, ok=False, lines=("tenancy audit of x: fail",), tenancy=AUDIT)
    rb = build_runbook(plan, INV, FRIDAY, pre)
    md = render_runbook(rb, "markdown")
    preflight = md.split("## Preflight")[1].split("## Admission preview")[0]
    for _, line in MARKDOWN_ROWS:
        assert line in preflight
    html = render_runbook(rb, "html")
    assert '<table class="tenancy">' in html and '<td class="fail refused">NO</td>' in html
    doc = json.loads(render_runbook(rb, "json"))
    assert doc["preflight"]["tenancy"]["rows"][3]["got"] == "allowed"
    offline = render_runbook(build_runbook(plan, INV, FRIDAY, Preflight(ran=False)), "markdown")
    assert "| tenant |" not in offline


def test_rollout_evidence_audits_the_tenancy_file_of_the_changes_recorded_plan(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from rollout.change.record.entries import ChangeBegin
    from rollout.cli.docs import _tenancy_of

    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN + "tenancy: tenancy.yaml\n")
    assert _tenancy_of(ChangeBegin(plan=str(plan))) == str(tmp_path / "tenancy.yaml")
    plan.write_text(PLAN)
    assert _tenancy_of(ChangeBegin(plan=str(plan))) is None
    assert _tenancy_of(ChangeBegin(plan=str(tmp_path / "gone.yaml"))) is None
    assert _tenancy_of(ChangeBegin()) is None
    plan.write_text(PLAN + "tenancy: 3\n")
    assert _tenancy_of(ChangeBegin(plan=str(plan))) is None
    err = capsys.readouterr().err
    assert "warning: no tenancy audit:" in err and "tenancy" in err and str(plan) in err
