"""The plan, parsed once (``rollout.change.plan.schema``): ``load_plan`` returns one frozen typed
value (strategy, windows, gate, the allocation path's section); a bad value in any section is named
by file, line and field; only the plan's parse calls the sections' parsers (a command parses each
section once); plans and recorded plan texts written before still load."""

from __future__ import annotations

import ast
import dataclasses
import json
import re
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout.change.plan import allocation_path_section, gate_section, schema, strategy, windows
from rollout.change.plan.allocation_path_section import AllocationPath, PathPlan
from rollout.change.plan.gate_section import BenchPolicy, GateConfig, OnFailure
from rollout.change.plan.schema import load_plan, parse_plan, recorded_plan
from rollout.change.plan.strategy import Strategy
from rollout.change.plan.windows import Window
from rollout.change.record.journal import read_entries
from rollout.change.record.replay import replay
from rollout.cli import cli
from rollout.errors import InputError, Location
from rollout.lab.inventory import LabNode, plan_text

ROOT = Path(__file__).parents[2]

KITCHEN = """\
apiVersion: rollout.dev/v1alpha1
kind: RolloutPlan
metadata: {name: every-section}
method: dropin
kubelet:
  cpuManagerPolicy: static
  reservedSystemCPUs: "0,32"
nodes:
  gpu-02: {kubelet: {reservedSystemCPUs: "0,64"}, distribution: k3s}
strategy:
  canaryGroup: canary
  maxUnavailable: 50%
  drain: {timeout: 1m30s, backoffCap: 2s, gracePeriod: 10s}
gate:
  soak: 5m
  onFailure: rollback-affected
  bench: {standin: true, acceptSimulated: true}
windows:
  - {name: nights, days: mon-thu, start: "22:00", end: "04:00", timeZone: Europe/Berlin}
allocationPath:
  groups: {gpu: dra}
  driver: gpu.example.com
  deviceClass: gpu.example.com
  claimLimit: 2m
"""


def test_every_section_is_one_frozen_typed_value() -> None:
    plan = parse_plan(KITCHEN, "plan.yaml")
    assert isinstance(plan.strategy, Strategy) and plan.strategy.canary_group == "canary"
    assert plan.strategy.drain.timeout_s == 90.0 and plan.strategy.drain.grace_period_s == 10
    # a percentage is kept and resolved against the change's nodes (preflight, the runbook)
    assert plan.strategy.max_unavailable_percent == 50.0
    assert plan.strategy.for_nodes(6).max_unavailable == 3
    assert plan.strategy.for_nodes(1).max_unavailable == 1  # never below one node
    # the same as the section parsed knowing the node count, as preflight once parsed it
    drain = {"timeout": "1m30s", "backoffCap": "2s", "gracePeriod": "10s"}
    raw = {"canaryGroup": "canary", "maxUnavailable": "50%", "drain": drain}
    assert plan.strategy.for_nodes(6) == strategy.parse_strategy(raw, plan.location, 6)
    assert isinstance(plan.gate, GateConfig) and plan.has_gate
    assert plan.gate.soak == 300.0 and plan.gate.on_failure is OnFailure.ROLLBACK_AFFECTED
    assert isinstance(plan.gate.bench, BenchPolicy) and plan.gate.bench.standin
    (w,) = plan.windows
    assert isinstance(w, Window) and w.tz == "Europe/Berlin" and w.name == "nights"
    assert isinstance(plan.allocation_path, PathPlan)
    assert plan.allocation_path.groups == {"gpu": AllocationPath.DRA}
    assert plan.allocation_path.claim_limit_s == 120.0
    assert plan.distribution_for("gpu-02") == "k3s" and plan.method_for("gpu-01") == "dropin"
    # the intent is per node: the plan's fragment with the node's override, the plan's lines
    assert plan.intent_for("gpu-02").fields["reservedSystemCPUs"] == "0,64"
    assert plan.intent_for("gpu-01").fields["reservedSystemCPUs"] == "0,32"
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.strategy = Strategy()  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        plan.gate.soak = 1.0  # type: ignore[misc]


@pytest.mark.parametrize(
    ("section", "gate", "has_gate"),
    [
        ("", None, False),
        ("gate: {}\n", GateConfig(), True),
        ("gate:\n", GateConfig(), True),  # written, empty: the gate's defaults
    ],
)
def test_absent_sections_are_their_defaults(
    section: str, gate: GateConfig | None, has_gate: bool
) -> None:
    plan = parse_plan("kind: RolloutPlan\nkubelet: {cpuManagerPolicy: none}\n" + section, "p.yaml")
    assert plan.strategy == Strategy() and plan.windows == () and plan.allocation_path is None
    assert plan.gate == gate and plan.has_gate is has_gate


def _case(text: str, at: str, field: str, words: str) -> tuple[str, int, str, str]:
    """A plan text, the line holding ``at`` (1-based), the field and the message's words."""
    line = next(i for i, t in enumerate(text.splitlines(), 1) if at in t)
    return text, line, field, words


HEAD = "kind: RolloutPlan\nkubelet: {cpuManagerPolicy: none}\n"
BAD = {
    "strategy-count": _case(
        HEAD + "strategy:\n  maxUnavailable: 0\n",
        "maxUnavailable",
        "strategy.maxUnavailable",
        "must be at least 1",
    ),
    "strategy-duration": _case(
        HEAD + "strategy:\n  drain:\n    timeout: 1d\n",
        "timeout",
        "strategy.drain.timeout",
        "not a duration",
    ),
    "strategy-unknown": _case(
        HEAD + "strategy:\n  canary: x\n", "canary:", "strategy.canary", "unknown field"
    ),
    "gate-fraction": _case(
        HEAD + "gate:\n  window: 2m\n  threshold: lots\n",
        "threshold",
        "gate.threshold",
        "must be a fraction",
    ),
    "gate-bench": _case(
        HEAD + "gate:\n  bench:\n    standin: true\n    timeout: forever\n",
        "forever",
        "gate.bench.timeout",
        "must be a duration",
    ),
    "gate-prometheus": _case(
        HEAD + "gate:\n  prometheus:\n    url: ftp://x\n    query: up\n",
        "url",
        "gate.prometheus.url",
        "http(s) URL",
    ),
    "windows": _case(
        HEAD + "windows:\n  - name: x\n    start: 25:00\n    end: '01:00'\n",
        "start",
        "windows[0].start",
        "not a time of day",
    ),
    "allocation-path": _case(
        HEAD + "allocationPath:\n  groups:\n    gpu: vgpu\n  driver: d\n  deviceClass: c\n",
        "vgpu",
        "allocationPath.groups.gpu",
        "neither device-plugin nor dra",
    ),
    "allocation-path-duration": _case(
        HEAD + "allocationPath:\n  groups: {gpu: dra}\n  driver: d\n  deviceClass: c\n"
        "  claimLimit: 1d\n",
        "claimLimit",
        "allocationPath.claimLimit",
        'invalid duration "1d"',
    ),
    "stages": _case(
        HEAD + "stages:\n  - {name: a, kubelet: {x: 1}}\n  - {name: b, kubelet: {x: 2}}\n",
        "stages",
        "stages",
        "needs gate.bench",
    ),
    "tenancy": _case(HEAD + "tenancy: ''\n", "tenancy", "tenancy", "path of a tenancy file"),
    "nodes": _case(
        HEAD + "nodes:\n  gpu-1:\n    kubelt: {}\n", "kubelt", "nodes.gpu-1.kubelt", "unknown"
    ),
}


@pytest.mark.parametrize(("text", "line", "field", "words"), BAD.values(), ids=list(BAD))
def test_a_bad_value_in_any_section_names_file_line_and_field(
    tmp_path: Path, text: str, line: int, field: str, words: str
) -> None:
    p = tmp_path / "plan.yaml"
    p.write_text(text)
    with pytest.raises(InputError, match=re.escape(words)) as e:
        load_plan(p)
    assert e.value.location == Location(str(p), field, line)
    assert str(e.value).startswith(f"{p}:{line}, field '{field}': ")


PARSERS: dict[str, set[str]] = {
    # a section's parser: called by the plan's parse only
    "parse_strategy": {"rollout/change/plan/schema.py"},
    "parse_windows": {"rollout/change/plan/schema.py"},
    "parse_gate_config": {"rollout/change/plan/schema.py"},
    "parse_path_plan": {"rollout/change/plan/schema.py"},
    "parse_bench_policy": {"rollout/change/plan/gate_section.py"},  # gate.bench, within the gate's
    # the intent from a plan: Plan.intent_for; the CLI's render without a plan has flags only
    "build_intent": {"rollout/change/plan/schema.py", "rollout/cli/kubelet.py"},
}


def test_only_the_plan_parses_its_sections() -> None:
    """No module re-parses a plan section: outside the plan module nothing calls the sections'
    parsers (and ``rollout render`` builds an intent without a plan only from its flags)."""
    seen: dict[str, set[str]] = {name: set() for name in PARSERS}
    for f in sorted((ROOT / "rollout").rglob("*.py")):
        rel = f.relative_to(ROOT).as_posix()
        for node in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call):
                continue
            fn = node.func
            name = fn.id if isinstance(fn, ast.Name) else getattr(fn, "attr", None)
            if name in PARSERS:
                seen[name].add(rel)
                if name == "build_intent" and rel == "rollout/cli/kubelet.py":
                    assert node.args and isinstance(node.args[0], ast.Constant), (
                        "rollout render builds an intent from a plan with Plan.intent_for"
                    )
    assert seen == PARSERS


INVENTORY = "[canary]\ngpu-01\n\n[gpu]\ngpu-02\ngpu-03\n"


def _counting(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    """Count each call of the plan's parse and of every section's parser, wherever it is looked
    up from (its own module or the plan module's import of it)."""
    calls: Counter[str] = Counter()

    def wrap(name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        def counted(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return fn(*args, **kwargs)

        return counted

    for module, name in [
        (schema, "parse_plan"),
        (strategy, "parse_strategy"),
        (windows, "parse_windows"),
        (gate_section, "parse_gate_config"),
        (gate_section, "parse_bench_policy"),
        (allocation_path_section, "parse_path_plan"),
    ]:
        counted = wrap(name, getattr(module, name))
        monkeypatch.setattr(module, name, counted)
        if hasattr(schema, name):
            monkeypatch.setattr(schema, name, counted)
    return calls


def test_a_command_parses_each_section_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``rollout runbook --offline`` reads every section (strategy, gate, windows) and once
    validated the plan, then built the runbook again: the plan is parsed once, each section
    once."""
    calls = _counting(monkeypatch)
    plan, inv, out = tmp_path / "plan.yaml", tmp_path / "inv.ini", tmp_path / "rb.json"
    plan.write_text(KITCHEN)
    inv.write_text(INVENTORY)
    args = ["runbook", "--plan", str(plan), "-i", str(inv), "--offline", "-o", "json"]
    r = CliRunner().invoke(cli, [*args, "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert calls == Counter(
        parse_plan=1,
        parse_strategy=1,
        parse_windows=1,
        parse_gate_config=1,
        parse_bench_policy=1,
        parse_path_plan=1,
    )
    rb = json.loads(out.read_text())
    assert rb["strategy"]["max_unavailable"] == 1  # 50% of the runbook's 3 nodes


def test_a_bad_plan_fails_apply_before_anything_else(tmp_path: Path) -> None:
    """``apply`` leaves the plan to its parse: a bad section exits 2 with file, line and field
    before the inventory is read or a cluster is asked (the kubeconfig named is not one:
    connecting would fail with another message)."""
    text, line, field, words = BAD["gate-fraction"]
    p, inv = tmp_path / "plan.yaml", tmp_path / "inv.ini"
    p.write_text(text)
    inv.write_text(INVENTORY)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text("not: a kubeconfig\n")
    args = ["apply", "--plan", str(p), "-i", str(inv), "--yes", "--kubeconfig", str(kubeconfig)]
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 2, r.output
    assert f"{p}:{line}, field '{field}': " in r.output and words in r.output


def test_plans_written_before_still_load() -> None:
    """The example plan, the lab's plan, the migration lab's allocation-path plan and a plan
    text an older change recorded (its file gone) load as typed values."""
    example = load_plan(ROOT / "examples" / "plan.yaml")
    assert example.name == "gpu-numa-canary" and example.gate is None
    assert example.strategy == Strategy() and example.kubelet["cpuManagerPolicy"] == "static"
    lab = parse_plan(plan_text([LabNode("n1", 1, "kubeadm", "t")], "demo"), "lab.yaml")
    assert lab.gate is not None and lab.strategy.canary_group == "canary"
    migration = parse_plan(
        "apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\nallocationPath:\n  groups:\n"
        "    nodes: dra\n  driver: gpu.example.com\n  deviceClass: gpu.example.com\n"
        "  timeout: 90s\n  claimLimit: 5m\nstrategy:\n  canaryGroup: canary\n"
        "  maxUnavailable: 1\n  drain:\n    timeout: 30s\n    backoffCap: 1s\n",
        "migrate.yaml",
    )
    assert migration.allocation_path is not None
    assert migration.allocation_path.settings.timeout_s == 90.0
    assert migration.strategy.drain.backoff_cap_s == 1.0
    journal = ROOT / "tests" / "unit" / "data" / "journals" / "promoted" / "journal.jsonl"
    info = replay(read_entries(journal)).info
    assert info.plan == "/srv/plans/tighten.yaml" and not Path(info.plan).exists()
    recorded = recorded_plan(dataclasses.replace(info, stage=None), "c1")
    assert recorded is not None and recorded.kubelet == {"cpuManagerPolicy": "static"}
    assert recorded.path == "/srv/plans/tighten.yaml (as recorded in change c1)"
    assert recorded.strategy == Strategy() and recorded.gate is None
