"""deploy/prometheus-rule.yaml and deploy/grafana-dashboard.json refer only to real metric names.

promtool-free: every PromQL expression is parsed down to its metric names, which must be the kubelet
admission metrics the gate reads (``rollout.kube.scraping.KUBELET_METRICS``) or the names
``rollout serve`` actually exports (checked against a live ``GateMetrics`` exposition).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from ruamel.yaml import YAML

from rollout.gate.serve import ROLLOUT_METRICS, GateMetrics
from rollout.kube.scraping import KUBELET_METRICS
from rollout.verdicts import Outcome, Verdict

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"

FUNCTIONS = {
    "sum", "rate", "increase", "max", "min", "avg", "count", "by", "without", "on", "ignoring",
    "and", "or", "unless", "bool", "group_left", "group_right", "histogram_quantile", "irate",
    "delta", "topk", "bottomk", "abs", "clamp_min", "clamp_max",
}  # fmt: skip


def metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects (strings, matchers, ranges, groupings cut)."""
    e = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)
    e = re.sub(r"\{[^}]*\}", " ", e)
    e = re.sub(r"\[[^\]]*\]", " ", e)
    e = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", " ", e)
    e = e.replace("$node", " ").replace("${datasource}", " ")
    names = set(re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", e))
    return {n for n in names if n not in FUNCTIONS}


def rule_exprs() -> list[str]:
    doc = YAML(typ="safe").load((DEPLOY / "prometheus-rule.yaml").read_text())
    assert doc["kind"] == "PrometheusRule" and doc["apiVersion"] == "monitoring.coreos.com/v1"
    rules = [r for g in doc["spec"]["groups"] for r in g["rules"]]
    assert all(r["alert"] and r["annotations"]["summary"] for r in rules)
    return [str(r["expr"]) for r in rules]


def dashboard_exprs() -> list[str]:
    d = json.loads((DEPLOY / "grafana-dashboard.json").read_text())
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids)) and d["uid"]
    exprs = [t["expr"] for p in d["panels"] for t in p["targets"]]
    for v in d["templating"]["list"]:
        if v["type"] == "query":  # label_values(METRIC, LABEL): the metric is what must exist
            m = re.fullmatch(r"label_values\((\w+),\s*\w+\)", v["query"])
            assert m, v["query"]
            exprs.append(m.group(1))
    return exprs


def exported_rollout_metrics() -> set[str]:
    m = GateMetrics()
    m.observe(
        Verdict(
            Outcome.FAILED,
            "x",
            inputs={"signals": {"api": {"nodes": {"a": {"rejections": {"T": 1}}}}}},
        )
    )
    m.set_node_state("a", "applied", ["applied"])
    m.set_bench_verdict("c1", "restricted", "aligned-advantage", "Failed")
    m.rollbacks.labels(trigger="gate").inc()
    m.requests.labels(code="200").inc()
    m.alerts.labels(action="unowned").inc()
    m.webhook_rollbacks.labels(outcome="rolled-back").inc()
    text = m.exposition().decode()
    return {
        line.split("{")[0].split(" ")[0] for line in text.splitlines() if line and line[0] != "#"
    }


def test_rollout_metric_list_matches_what_is_exported() -> None:
    exported = exported_rollout_metrics()
    assert set(ROLLOUT_METRICS) <= exported


@pytest.mark.parametrize("source", ["rule", "dashboard"])
def test_every_expression_names_only_real_metrics(source: str) -> None:
    exprs = rule_exprs() if source == "rule" else dashboard_exprs()
    known = set(KUBELET_METRICS) | set(ROLLOUT_METRICS)
    used: set[str] = set()
    for expr in exprs:
        names = metric_names(expr)
        assert names, f"no metric in {expr!r}"
        assert names <= known, f"unknown metric(s) {names - known} in {expr!r}"
        used |= names
    assert set(KUBELET_METRICS) <= used  # every kubelet signal is alerted on and shown


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ('sum by (node) (rate(kubelet_admission_rejections_total{reason="X"}[5m])) > 0',
         {"kubelet_admission_rejections_total"}),
        ("a_total / on(node) group_left b_total", {"a_total", "b_total"}),
        ('max by (node, state) (rollout_node_state{node=~"$node"}) == 1', {"rollout_node_state"}),
    ],
)  # fmt: skip
def test_metric_name_extraction(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_the_checker_catches_a_typo() -> None:
    known = set(KUBELET_METRICS)
    assert not metric_names("rate(kubelet_admission_rejection_total[5m])") <= known
