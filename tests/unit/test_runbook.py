"""The runbook, generated from a plan and an inventory: sections, batches, thresholds, rollback by
pool, the rules; bad input names file, field and line and writes nothing."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout.ansible.hosts import Inventory
from rollout.change.plan.schema import parse_plan
from rollout.cli import cli
from rollout.errors import InputError
from rollout.evidence.runbook import GO_RULE, Preflight, build_runbook, preview_section, render
from rollout.kubelet.admission.node_preview import NodePreview, preview_node
from tests.unit.test_previewing import FACTS, NODE, SINGLE, _deployment, _pod, _replicaset, _spec

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
    "Admission preview",
    "Inspect",
    "Go / no-go",
    "Rollback",
    "Rules",
)


OFFLINE = Preflight(ran=False)


def _runbook(
    preflight: Preflight = OFFLINE, warnings: tuple[str, ...] = (), fmt: str = "markdown"
) -> str:
    plan = parse_plan(PLAN, "plan.yaml")
    return render(build_runbook(plan, INV, FRIDAY, preflight, warnings), fmt)


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
        "CAP:.status.capacity.nvidia\\.com/gpu,ALLOC:.status.allocatable.nvidia\\.com/gpu",
        "rollout evidence --label after --change CHANGE_ID",
        "rollout evidence --label after-recreate --change CHANGE_ID",
        "rollout bench --change CHANGE_ID --command './bench.sh'",
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
        "admission-preview",
        "inspect",
        "go-no-go",
        "rollback",
        "rules",
    ):
        assert f'<h2 id="{s}">' in html
    for external in ("http://", "https://", "<script", "<link", "src="):
        assert external not in html


def test_bad_gate_section_named() -> None:
    with pytest.raises(InputError) as e:  # the plan's one parse names it, before any runbook
        parse_plan(PLAN.replace("threshold: 0.02", "threshold: lots"), "plan.yaml")
    assert e.value.location.field == "gate.threshold" and e.value.location.line == 10
    assert e.value.location.file == "plan.yaml"


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


def _previews(running_gpus: int, candidates: tuple[int, ...] = ()) -> tuple[NodePreview, ...]:
    """gpu-07 (two NUMA nodes of 4 GPUs) under single-numa-node, pod scope: one running pod of
    ``running_gpus`` GPUs (Deployment ml/train) and Deployments of ``candidates`` GPUs that can
    land there; computed by the real preview, not written by hand."""
    objs: list[dict[str, Any]] = [
        _deployment("train", _spec(running_gpus)),
        _replicaset("train-1", "train"),
    ]
    objs += [_deployment(f"cand{g}", _spec(g)) for g in candidates]
    pod = _pod("train-1-a", "train-1", _spec(running_gpus))
    return (preview_node(NODE, FACTS, SINGLE, [pod], objs),)


RUNNING_REJECTED = (
    "pod ml/train-1-a of Deployment/ml/train predicted rejected on node gpu-07: "
    "TopologyAffinityError: needs 6 nvidia.com/gpu on one NUMA node; the largest NUMA node of "
    "gpu-07 has 4"
)


@pytest.mark.parametrize(
    ("preflight", "ran", "note", "go", "rejected", "misfits"),
    [
        (OFFLINE, False, "--offline", False, (), ()),
        # preflight refused before the preview (a missing Node): no preview, not a "go"
        (Preflight(True, False, ("no Node",), None), False, "refused before", False, (), ()),
        (Preflight(True, True, (), ()), True, "", True, (), ()),  # nothing in scope
        (Preflight(True, True, (), _previews(2)), True, "", True, (), ()),
        # a workload that can land and fits no node is a warning, not a no-go
        (
            Preflight(True, True, (), _previews(2, (6,))),
            True,
            "",
            True,
            (),
            ("Deployment/ml/cand6",),
        ),
        # the running pod predicted rejected: no-go (preflight refused and still carries it)
        (
            Preflight(True, False, (RUNNING_REJECTED,), _previews(6, (2,))),
            True,
            "",
            False,
            (RUNNING_REJECTED,),
            ("Deployment/ml/train",),
        ),
    ],
)
def test_preview_section_go_only_without_predicted_rejections_of_running_pods(
    preflight: Preflight,
    ran: bool,
    note: str,
    go: bool,
    rejected: tuple[str, ...],
    misfits: tuple[str, ...],
) -> None:
    pv = preview_section(preflight)
    assert (pv.ran, pv.go, pv.rejected_running, pv.fits_no_node) == (ran, go, rejected, misfits)
    assert note in pv.note and (pv.note == "") is ran
    assert pv.rule == GO_RULE


def test_markdown_preview_section_names_pods_verdicts_and_numbers() -> None:
    md = _runbook(Preflight(True, False, (RUNNING_REJECTED,), _previews(6, (2,))))
    section = md.split("\n## Admission preview\n", 1)[1].split("\n## Inspect\n", 1)[0]
    assert (
        "**Rule:** Go only if no pod running on a node in scope is predicted rejected (or the "
        "rejections are accepted with --accept-predicted-rejections, which is journaled)."
        in section
    )
    assert "Verdict: **NO-GO** (1 running pod(s) predicted rejected" in section
    assert f"- {RUNNING_REJECTED}" in section
    assert "### Node gpu-07" in section
    assert (
        "| ml/train-1-a | Deployment/ml/train | running | **REJECTED** | TopologyAffinityError: "
        "Resources cannot be allocated with Topology locality | needs 6 nvidia.com/gpu on one "
        "NUMA node; the largest NUMA node of gpu-07 has 4 |" in section
    )
    assert (
        "| - | Deployment/ml/cand2 | can land | admitted |  "
        "| admitted on NUMA node(s) 0 of gpu-07 |" in section
    )
    assert "Fits no node in scope under the new config: Deployment/ml/train." in section
    assert f"Before the change: {GO_RULE}" in md  # and in the go / no-go section


@pytest.mark.parametrize(
    ("preflight", "verdict", "absent"),
    [
        (OFFLINE, "No preview (--offline: no pods or workloads were read", "### Node"),
        (Preflight(True, True, (), _previews(2)), "Verdict: **GO**", "REJECTED"),
    ],
)
def test_markdown_preview_section_offline_and_go(
    preflight: Preflight, verdict: str, absent: str
) -> None:
    md = _runbook(preflight)
    section = md.split("\n## Admission preview\n", 1)[1].split("\n## Inspect\n", 1)[0]
    assert verdict in section and absent not in section
    assert "Fits no node" not in section or "(none)" in section


def test_html_and_json_preview_section() -> None:
    preflight = Preflight(True, False, (RUNNING_REJECTED,), _previews(6, (2,)))
    html = _runbook(preflight, fmt="html")
    assert '<span class="refused">NO-GO</span>' in html
    assert "<h3>Node gpu-07</h3>" in html and "needs 6 nvidia.com/gpu on one NUMA node" in html
    doc = json.loads(_runbook(preflight, fmt="json"))
    assert "previews" not in doc["preflight"]  # shown once, as "preview"
    pv = doc["preview"]
    assert (pv["ran"], pv["go"], pv["rule"]) == (True, False, GO_RULE)
    assert pv["rejectedRunning"] == [RUNNING_REJECTED]
    assert pv["fitsNoNode"] == ["Deployment/ml/train"]
    (node,) = pv["nodes"]
    assert node["node"] == "gpu-07"
    assert [(p["workload"], p["running"], p["verdict"]) for p in node["pods"]] == [
        ("Deployment/ml/train", True, "rejected"),
        ("Deployment/ml/cand2", False, "admitted"),
    ]
    assert json.loads(_runbook(OFFLINE, fmt="json"))["preview"]["ran"] is False


@pytest.mark.parametrize("refused", [False, True])
def test_cli_runbook_shows_the_preview_preflight_computed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, refused: bool
) -> None:
    """Wiring only (the live reads are stand-ins here; tests/lab/test_preview_lab.py reads a real
    cluster): the previews preflight computed reach the runbook, also when preflight refuses."""
    import rollout.ansible.runner
    import rollout.change.preflight.checking
    import rollout.kube.canaries
    import rollout.kube.client
    from rollout.change.preflight.checking import Prepared, PreviewedRefusal

    previews = _previews(6 if refused else 2)

    class Runner:
        def __init__(self, _: Path) -> None: ...

        def gather_facts(self, *_: Any) -> dict[str, Any]:
            return {}

    p = parse_plan(PLAN, "plan.yaml")

    def prepare(*_: Any, **__: Any) -> Prepared:
        if refused:
            raise PreviewedRefusal(f"preflight refused the change:\n  {RUNNING_REJECTED}", previews)
        return Prepared(
            strategy=p.strategy.for_nodes(len(INV.hosts)),
            batches=(),
            changes={},
            canary=(),
            evictions={},
            diffs={},
            previews=previews,
        )

    monkeypatch.setattr(rollout.kube.client, "connect", lambda *_: object())
    monkeypatch.setattr(rollout.kube.canaries, "canaries_in_progress", lambda _: [])
    monkeypatch.setattr(rollout.ansible.runner, "AnsibleRunner", Runner)
    monkeypatch.setattr(rollout.change.preflight.checking, "prepare", prepare)
    plan, inv = tmp_path / "plan.yaml", tmp_path / "inv.ini"
    plan.write_text(PLAN)
    inv.write_text(INVENTORY)
    r = CliRunner().invoke(cli, ["runbook", "--plan", str(plan), "-i", str(inv), "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.output)
    assert doc["preflight"]["ok"] is not refused
    pv = doc["preview"]
    assert (pv["ran"], pv["go"]) == (True, not refused)
    assert pv["rejectedRunning"] == ([RUNNING_REJECTED] if refused else [])
    assert [n["node"] for n in pv["nodes"]] == ["gpu-07"]


def test_a_serving_canary_preflight_refuses_is_not_repeated_as_a_warning(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Preflight names the serving canary among its refusals; the runbook's warnings keep only
    what preflight did not say (here a listing it could not read)."""
    import rollout.ansible.runner
    import rollout.change.preflight.checking
    import rollout.kube.canaries
    from rollout.change.preflight.checking import PreviewedRefusal
    from rollout.evidence.runbook import live_preflight

    argo = "Argo Rollout ml/llm is Paused: change the device-allocation layer and ..."
    unread = "could not list canaries.flagger.app (403 Forbidden); a model-serving canary may be"

    class Runner:
        def __init__(self, _: Path) -> None: ...

        def gather_facts(self, *_: Any) -> dict[str, Any]:
            return {}

    def prepare(*_: Any, **__: Any) -> Any:
        raise PreviewedRefusal(f"preflight refused the change:\n  {argo}", ())

    monkeypatch.setattr(rollout.kube.canaries, "canaries_in_progress", lambda _: [argo, unread])
    monkeypatch.setattr(rollout.ansible.runner, "AnsibleRunner", Runner)
    monkeypatch.setattr(rollout.change.preflight.checking, "prepare", prepare)
    monkeypatch.setattr(rollout.change.preflight.checking, "ClusterReader", lambda *_: None)
    preflight, warnings = live_preflight(parse_plan(PLAN, "plan.yaml"), INV, None)  # type: ignore[arg-type]
    assert preflight.lines == (argo,) and preflight.ok is False
    assert warnings == [unread]
