"""The runbook, generated from a plan and an inventory: sections, batches, thresholds, rollback by
pool, the rules; bad input names file, field and line and writes nothing."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout.cli import cli
from rollout.errors import InputError
from rollout.plan import parse_plan
from rollout.preparing import Inventory
from rollout.runbook import Preflight, build_runbook, render

PLAN = """\
kind: RolloutPlan
metadata: {name: gpu-numa-canary}
kubelet:
  cpuManagerPolicy: static
  reservedSystemCPUs: "0,32"
  topologyManagerPolicy: single-numa-node
nodes:
  gpu-02: {kubelet: {reservedSystemCPUs: "0,64"}}
strategy: {maxUnavailable: 2}
gate: {threshold: 0.02, window: 2m, soak: 5m, minAdmissions: 10}
windows:
  - {name: weeknights, days: mon-thu, start: "22:00", end: "04:00", timeZone: Europe/Berlin}
"""
INVENTORY = "[canary]\ngpu-01\ngpu-02\n\n[pool_a]\ngpu-03\ngpu-04\ngpu-05\n"
INV = Inventory(
    path=Path("inv.ini"),
    hosts=("gpu-01", "gpu-02", "gpu-03", "gpu-04", "gpu-05"),
    groups={"all": (), "canary": ("gpu-01", "gpu-02"), "pool_a": ("gpu-03", "gpu-04", "gpu-05")},
    hostvars={"gpu-05": {"rollout_node_name": "node-5"}},
)
FRIDAY = datetime(2026, 12, 4, 12, tzinfo=UTC)
SECTIONS = (
    "Scope",
    "Nodes by batch",
    "Change windows",
    "Preflight",
    "Inspect",
    "Go / no-go",
    "Rollback",
    "Rules",
)


OFFLINE = Preflight(ran=False)


def _runbook(preflight: Preflight = OFFLINE, warnings: tuple[str, ...] = ()) -> str:
    plan = parse_plan(PLAN, "plan.yaml")
    return render(build_runbook(plan, INV, FRIDAY, preflight, warnings), "markdown")


def test_markdown_runbook_from_the_plan() -> None:
    md = _runbook()
    for s in SECTIONS:
        assert f"\n## {s}\n" in md
    assert "| 1 | yes | gpu-01, gpu-02 |" in md
    assert "| 2 | no | gpu-03, gpu-04 |" in md
    assert "| 3 | no | node-5 |" in md  # the Node name, not the host name
    assert "| gpu-02 | `reservedSystemCPUs: 0,64` |" in md
    assert "at or below 2%" in md and "at least 10 admissions" in md
    assert "soaks for 300s" in md and "sliding 120s window" in md
    assert "the next one opens Mon 2026-12-07 22:00 CET" in md
    assert "Skipped (`--offline`)" in md
    for cmd in (
        "kubectl api-resources --api-group=resource.k8s.io",
        "GPU:.status.allocatable.nvidia\\.com/gpu",
        "kubectl describe pod",
        "kubectl get events -A --sort-by=.lastTimestamp",
        "kubectl get resourceclaims -A",
        "kubectl get resourceslices",
    ):
        assert cmd in md
    assert (
        "| canary | `rollout rollback --change CHANGE_ID --node gpu-01 --node gpu-02 --yes` |" in md
    )
    assert "--node gpu-03 --node gpu-04 --node node-5 --yes" in md
    assert "separate windows" in md and "loosening tenant nodeSelectors" in md
    assert "## Warnings" not in md


def test_preflight_and_canary_warnings_shown() -> None:
    md = _runbook(
        Preflight(ran=True, ok=False, lines=("inventory host gpu-05 has no Node 'node-5'",)),
        ("Argo Rollout shop/web is Progressing: change ... in separate windows",),
    )
    assert "Result: **REFUSED**" in md and "- inventory host gpu-05 has no Node 'node-5'" in md
    assert "## Warnings" in md and "Argo Rollout shop/web is Progressing" in md


def test_html_runbook_is_one_page_and_escaped() -> None:
    plan = parse_plan(PLAN.replace("gpu-numa-canary", "a<b>"), "plan.yaml")
    html = render(build_runbook(plan, INV, FRIDAY, Preflight(ran=False)), "html")
    assert html.startswith("<!DOCTYPE html>") and "a&lt;b&gt;" in html
    for s in (
        "scope",
        "batches",
        "windows",
        "preflight",
        "inspect",
        "go-no-go",
        "rollback",
        "rules",
    ):
        assert f'<h2 id="{s}">' in html
    for external in ("http://", "https://", "<script", "<link", "src="):
        assert external not in html


def test_bad_gate_section_named() -> None:
    plan = parse_plan(PLAN.replace("threshold: 0.02", "threshold: lots"), "plan.yaml")
    with pytest.raises(InputError) as e:
        build_runbook(plan, INV, FRIDAY, Preflight(ran=False))
    assert e.value.location.field == "gate.threshold" and e.value.location.line == 10


def test_cli_offline_writes_file_and_bad_input_writes_nothing(tmp_path: Path) -> None:
    plan, inv, out = tmp_path / "plan.yaml", tmp_path / "inv.ini", tmp_path / "runbook.html"
    plan.write_text(PLAN)
    inv.write_text(INVENTORY)
    args = ["runbook", "--plan", str(plan), "-i", str(inv), "--offline", "-o", "html"]
    ok = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert ok.exit_code == 0, ok.output
    assert '<h2 id="rollback">' in out.read_text()
    plan.write_text(PLAN.replace('start: "22:00"', 'start: "26:00"'))
    bad_out = tmp_path / "bad.md"
    bad = CliRunner().invoke(cli, [*args, "--out", str(bad_out)])
    assert bad.exit_code == 2
    assert "plan.yaml:12" in bad.output and "windows[0].start" in bad.output
    assert not bad_out.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["inv.ini", "plan.yaml", "runbook.html"]
