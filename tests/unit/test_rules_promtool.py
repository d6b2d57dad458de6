"""Every rule rollout ships, checked and unit-tested by Prometheus' own promtool.

The rules file is converted from ``rollout/data/prometheus-rule.yaml`` at test time (the same
conversion ``rollout lab up --monitoring`` does), never a copy. Series that must fire: a rejection
burst on one node (only that node, only after ``for:``), a topology-manager error ratio over 5%,
other admission reasons, the gate's own counters. Series that must not: a steady baseline with
old rejections, a kubelet restart that resets every counter, a node that admits nothing.

promtool is built from the Go module proxy by ``tools/build-monitoring-binaries.sh`` (run by
``scripts/setup``); missing, the test fails in CI and is skipped elsewhere.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from rollout.gate.alerting import dump_yaml, rules_file, shipped_rule_text
from rollout.lab.monitoring import find_monitoring_bin_dir

IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
RULES = rules_file(shipped_rule_text())
BY_NAME = {r["alert"]: r for g in RULES["groups"] for r in g["rules"]}

TAE = 'kubelet_admission_rejections_total{node="%s",reason="TopologyAffinityError"}'
REQ = 'kubelet_topology_manager_admission_requests_total{node="%s"}'
ERR = 'kubelet_topology_manager_admission_errors_total{node="%s"}'


@pytest.fixture(scope="module")
def promtool() -> Path:
    p = find_monitoring_bin_dir() / "promtool"
    if not os.access(p, os.X_OK):
        msg = f"{p} missing; run tools/build-monitoring-binaries.sh"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return p


def expected(alert: str, **labels: str) -> dict[str, Any]:
    """The alert as promtool reports it: rule labels + series labels, annotations rendered."""
    rule = BY_NAME[alert]
    lab = {**labels, **rule.get("labels", {})}

    def render(text: str) -> str:
        return re.sub(r"\{\{\s*\$labels\.(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), text)

    return {
        "exp_labels": lab,
        "exp_annotations": {k: render(v) for k, v in rule.get("annotations", {}).items()},
    }


def case(alert: str, series: list[tuple[str, str]], at: dict[str, list[dict[str, Any]]]) -> Any:
    return {
        "interval": "15s",
        "input_series": [{"series": s, "values": v} for s, v in series],
        "alert_rule_test": [
            {"eval_time": t, "alertname": alert, "exp_alerts": exp} for t, exp in at.items()
        ],
    }


# 15 s between samples: "0+0x40" is 10 minutes of zeros.
TESTS = [
    # A rejection burst on n1 (a controller recreating a misfitting pod every 15 s) after
    # 10 quiet minutes; n2 stays quiet. Pending (not firing) before for: 1m has passed, then
    # firing for n1 only.
    case(
        "KubeletTopologyAffinityRejections",
        [(TAE % "n1", "0x40 1+1x20"), (TAE % "n2", "0x60")],
        {
            "9m": [],
            "10m30s": [],
            "11m45s": [expected("KubeletTopologyAffinityRejections", node="n1")],
        },
    ),
    # Must not fire: a steady baseline with old rejections (counter flat at 3), busy admissions.
    case(
        "KubeletTopologyAffinityRejections",
        [(TAE % "n1", "3x80"), (REQ % "n1", "100+5x80"), (ERR % "n1", "3x80")],
        {"5m": [], "12m": [], "20m": []},
    ),
    # Must not fire: a kubelet restart resets every counter (7 -> gone -> 0, requests 500 -> 0).
    case(
        "KubeletTopologyAffinityRejections",
        [
            (TAE % "n1", "7x40 _x4 0x40"),
            (REQ % "n1", "100+10x40 0+2x44"),
            (ERR % "n1", "7x40 0x44"),
        ],
        {"10m": [], "11m": [], "12m": [], "13m": [], "20m": []},
    ),
    case(
        "KubeletTopologyManagerAdmissionErrors",
        [(REQ % "n1", "100+10x40 0+2x44"), (ERR % "n1", "7x40 0x44")],
        {"10m": [], "11m": [], "12m": [], "13m": [], "20m": []},
    ),
    # The topology manager's own counters (older kubelets): 20% of admissions fail on n1 for
    # more than 5 minutes; n2 fails 1% (under the 5% line); n3 admits nothing (0/0 is no alert).
    case(
        "KubeletTopologyManagerAdmissionErrors",
        [
            (REQ % "n1", "0+10x80"),
            (ERR % "n1", "0x20 0+2x60"),
            (REQ % "n2", "0+100x80"),
            (ERR % "n2", "0+1x80"),
            (REQ % "n3", "0x80"),
            (ERR % "n3", "0x80"),
        ],
        {
            "6m": [],
            "16m": [expected("KubeletTopologyManagerAdmissionErrors", node="n1")],
        },
    ),
    # Other admission reasons (info), per node and reason; a TopologyAffinityError is not one.
    case(
        "KubeletAdmissionRejections",
        [
            ('kubelet_admission_rejections_total{node="n1",reason="OutOfcpu"}', "0x10 1+1x40"),
            (TAE % "n2", "0x10 1+1x40"),
        ],
        {
            "2m": [],
            "9m": [expected("KubeletAdmissionRejections", node="n1", reason="OutOfcpu")],
        },
    ),
    # The gate's own metrics (rollout serve / rollout watch --listen).
    case(
        "RolloutGateFailed",
        [('rollout_gate_verdicts_total{outcome="Failed"}', "0x10 1x30")],
        {"2m": [], "4m": [expected("RolloutGateFailed", outcome="Failed")], "20m": []},
    ),
    case(
        "RolloutGateHolding",
        [
            ('rollout_gate_verdicts_total{outcome="Inconclusive"}', "0x10 1x30"),
            ('rollout_gate_verdicts_total{outcome="Successful"}', "0+1x40"),
        ],
        {"2m": [], "4m": [expected("RolloutGateHolding", outcome="Inconclusive")]},
    ),
    case(
        "RolloutChangeRejectingPods",
        [
            (
                'rollout_gate_rejections_seen_total{node="n1",reason="TopologyAffinityError"}',
                "0x10 2x30",
            ),
        ],
        {"2m": [], "4m": [expected("RolloutChangeRejectingPods", node="n1")], "10m": []},
    ),
]


def test_every_shipped_rule_has_a_case_that_fires() -> None:
    fired = {t["alertname"] for c in TESTS for t in c["alert_rule_test"] if t["exp_alerts"]}
    assert fired == set(BY_NAME)


def test_promtool_check_and_test_rules(promtool: Path, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(dump_yaml(RULES))
    r = subprocess.run(
        [str(promtool), "check", "rules", str(rules)], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert f"SUCCESS: {len(BY_NAME)} rules found" in r.stdout + r.stderr
    tests = tmp_path / "rules_test.yaml"
    tests.write_text(
        dump_yaml({"rule_files": [rules.name], "evaluation_interval": "15s", "tests": TESTS})
    )
    r = subprocess.run(
        [str(promtool), "test", "rules", str(tests)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout + r.stderr


def test_promtool_would_catch_a_rule_that_fires_on_a_restart(
    promtool: Path, tmp_path: Path
) -> None:
    """The restart case is a real check: a naive delta() rule fires on it and promtool says so."""
    bad = {
        "groups": [
            {
                "name": "naive",
                "rules": [
                    {
                        "alert": "KubeletTopologyAffinityRejections",
                        "expr": "sum by (node) (delta(kubelet_admission_rejections_total"
                        '{reason="TopologyAffinityError"}[5m])) != 0',
                    }
                ],
            }
        ]
    }
    (tmp_path / "rules.yaml").write_text(dump_yaml(bad))
    restart = dict(TESTS[2])
    restart["alert_rule_test"] = [
        {"eval_time": "12m", "alertname": "KubeletTopologyAffinityRejections", "exp_alerts": []}
    ]
    (tmp_path / "t.yaml").write_text(
        dump_yaml({"rule_files": ["rules.yaml"], "evaluation_interval": "15s", "tests": [restart]})
    )
    r = subprocess.run(
        [str(promtool), "test", "rules", "t.yaml"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    assert r.returncode != 0 and "FAILED" in r.stdout + r.stderr
