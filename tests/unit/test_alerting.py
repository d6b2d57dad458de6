"""The shipped rules as a Prometheus rules file, and who owns a node an alert names (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout.change.record.entries import ChangeBegin
from rollout.change.record.replay import ChangeStatus, NodeStatus
from rollout.errors import InputError
from rollout.gate.alerting import (
    ROUTE_LABEL,
    dump_yaml,
    owner_of,
    routed_alerts,
    rules_file,
    shipped_rule_text,
)
from rollout.lab.monitoring import (
    ALERTMANAGER_MODULE_VERSION,
    INTERVALS,
    PROMETHEUS_MODULE_VERSION,
    alertmanager_config,
    prometheus_config,
)
from rollout.models import NodeState

REPO = Path(__file__).resolve().parents[2]


def test_deploy_copy_is_identical_to_the_packaged_rules() -> None:
    # users run the wheel (rollout/data); deploy/ is what they apply with the Operator
    assert (REPO / "deploy" / "prometheus-rule.yaml").read_text() == shipped_rule_text()


def test_rules_file_keeps_every_group_and_rule() -> None:
    from ruamel.yaml import YAML

    doc = YAML(typ="safe").load(shipped_rule_text())
    out = rules_file(shipped_rule_text())
    assert [g["name"] for g in out["groups"]] == [g["name"] for g in doc["spec"]["groups"]]
    assert [r for g in out["groups"] for r in g["rules"]] == [
        r for g in doc["spec"]["groups"] for r in g["rules"]
    ]
    # and survives a dump/load (what Prometheus and promtool read)
    assert YAML(typ="safe").load(dump_yaml(out)) == out


def test_the_rejection_alerts_are_routed_to_rollout() -> None:
    routed = routed_alerts(rules_file(shipped_rule_text()))
    assert routed == [
        "KubeletTopologyAffinityRejections",
        "KubeletTopologyManagerAdmissionErrors",
        "RolloutChangeRejectingPods",
    ]


@pytest.mark.parametrize(
    ("text", "line", "words"),
    [
        ("kind: ConfigMap\napiVersion: v1\n", 1, "PrometheusRule"),
        (
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nspec:\n  groups: []\n",
            3,
            "no rule groups",
        ),
        (
            "apiVersion: monitoring.coreos.com/v1\nkind: PrometheusRule\nspec:\n  groups:\n"
            "    - name: g\n      rules:\n        - alert: A\n          for: 1m\n",
            7,
            "needs expr",
        ),
        ("a: [\n", 2, "not valid YAML"),
    ],
)
def test_bad_rule_files_name_file_field_and_line(text: str, line: int, words: str) -> None:
    with pytest.raises(InputError) as e:
        rules_file(text, "my-rule.yaml")
    msg = str(e.value)
    assert f"my-rule.yaml:{line}" in msg and words in msg


# ------------------------------------------------------------------------------ owner_of


def change(cid: str, info: dict[str, Any] | None = None, **nodes: NodeState) -> ChangeStatus:
    return ChangeStatus(
        cid,
        {n: NodeStatus(node=n, state=s) for n, s in nodes.items()},
        info=ChangeBegin.read(info or {}),
    )


A = "20261130T100000Z-aaaaaa"
B = "20261130T110000Z-bbbbbb"


@pytest.mark.parametrize(
    ("changes", "want"),
    [
        ([], None),
        ([change(A, n1=NodeState.APPLIED)], A),
        ([change(A, n1=NodeState.APPLYING)], A),
        ([change(A, n1=NodeState.RESTORING)], A),
        ([change(A, n1=NodeState.RESTORED)], None),  # already put back
        ([change(A, n1=NodeState.FAILED)], None),  # restore failed: a person must look
        ([change(A, n1=NodeState.PENDING)], None),  # listed but never touched
        ([change(A, n2=NodeState.APPLIED)], None),  # another node
        # the newest change that touched the node decides, in whatever order journals come
        ([change(B, n1=NodeState.APPLIED), change(A, n1=NodeState.APPLIED)], B),
        ([change(A, n1=NodeState.APPLIED), change(B, n1=NodeState.RESTORED)], None),
        ([change(A, n1=NodeState.APPLIED), change(B, n1=NodeState.PENDING)], A),
    ],
)
def test_owner_of(changes: list[ChangeStatus], want: str | None) -> None:
    got = owner_of("n1", changes)
    assert (got.change if got else None) == want
    if got:
        assert got.nodes == ("n1",) and got.node == "n1" and not got.live


def test_owner_is_live_when_it_holds_the_lease() -> None:
    changes = [change(A, n1=NodeState.APPLIED)]
    owner = owner_of("n1", changes, lease_change=A)
    assert owner is not None and owner.live
    owner = owner_of("n1", changes, lease_change=B)
    assert owner is not None and not owner.live


def test_rollback_group_policy_rolls_back_the_nodes_batch() -> None:
    info = {"batches": [["n1", "n2"], ["n3", "n4"]]}
    c = change(
        A,
        info,
        n1=NodeState.APPLIED,
        n2=NodeState.RESTORED,
        n3=NodeState.APPLIED,
        n4=NodeState.APPLIED,
    )
    assert owner_of("n3", [c], group_policy={A: True}).nodes == ("n3", "n4")  # type: ignore[union-attr]
    assert owner_of("n1", [c], group_policy={A: True}).nodes == ("n1",)  # type: ignore[union-attr]
    assert owner_of("n3", [c], group_policy={A: False}).nodes == ("n3",)  # type: ignore[union-attr]


# ------------------------------------------------------------------------------ lab configs


def test_module_versions_match_the_wrapper_modules() -> None:
    prom = (REPO / "tools" / "prombin" / "go.mod").read_text()
    am = (REPO / "tools" / "ambin" / "go.mod").read_text()
    assert f"github.com/prometheus/prometheus {PROMETHEUS_MODULE_VERSION}" in prom
    assert f"github.com/prometheus/alertmanager {ALERTMANAGER_MODULE_VERSION}" in am


def test_prometheus_scrapes_kubelets_through_the_node_proxy() -> None:
    p = Path("/x")
    cfg = prometheus_config(
        apiserver="127.0.0.1:6443",
        ca=p / "ca",
        cert=p / "c",
        key=p / "k",
        targets=p / "targets.json",
        alertmanager="127.0.0.1:8",
        rules=p / "rules.yaml",
    )
    assert cfg["global"]["scrape_interval"] == "2s" == cfg["global"]["evaluation_interval"]
    kubelet = cfg["scrape_configs"][0]
    assert kubelet["kubernetes_sd_configs"][0]["role"] == "node"
    relabel = {r["target_label"]: r.get("replacement") for r in kubelet["relabel_configs"]}
    assert relabel["__address__"] == "127.0.0.1:6443"
    assert relabel["__metrics_path__"] == "/api/v1/nodes/${1}/proxy/metrics"
    assert "node" in relabel  # the label the rules group by
    assert cfg["scrape_configs"][1]["file_sd_configs"][0]["files"] == ["/x/targets.json"]


def test_alertmanager_routes_the_rollback_label_to_serve_with_the_token() -> None:
    cfg = alertmanager_config(webhook_url="http://127.0.0.1:9/webhook", token_file=Path("/t"))
    route = cfg["route"]
    assert route["group_wait"] == f"{INTERVALS['group_wait']:g}s"
    k, v = ROUTE_LABEL
    assert route["routes"] == [{"receiver": "rollout", "matchers": [f'{k}="{v}"']}]
    hook = cfg["receivers"][1]["webhook_configs"][0]
    assert hook["url"].endswith("/webhook")
    assert hook["http_config"]["authorization"] == {"type": "Bearer", "credentials_file": "/t"}


def test_monitoring_state_round_trips_and_teardown_signals_only_our_programs(
    tmp_path: Path,
) -> None:
    import os

    from rollout.lab.monitoring import MonitoringState, load_state, ours

    m = MonitoringState(str(tmp_path / "bin"), str(tmp_path), str(tmp_path / "state"), 1, 2, 3)
    # PIDs that are alive but not the programs we started (this test process) are never ours
    m.prometheus_pid = m.alertmanager_pid = m.serve_pid = os.getpid()
    assert load_state(m.to_dict()) == m and load_state(None) is None
    assert ours(m) == []
    assert m.prometheus_url == "http://127.0.0.1:1" and m.serve_url == "http://127.0.0.1:3"
