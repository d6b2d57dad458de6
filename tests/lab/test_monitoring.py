"""The alert loop in the lab: real Prometheus and Alertmanager (built from the Go module proxy),
the lab kubelets' own counters, ``rollout serve``.

* Prometheus discovers the nodes through the API server, scrapes each kubelet through the node
  proxy and ``rollout serve``; its rules are the shipped PrometheusRule's groups; ``lab env`` and
  ``lab status`` show the URLs and health;
* the gate's ``prometheus`` signal against that Prometheus: rejections counted; a node with no
  series never passes; Prometheus refusing connections or hanging is an Error that holds;
* the end-to-end path: a change passes its gate, then a misfitting workload reaches the canary;
  the kubelet rejects, Prometheus scrapes, ``KubeletTopologyAffinityRejections`` fires,
  Alertmanager posts over HTTPS (its real ``tls_config``, the lab CA; ``rollout serve`` speaks
  nothing else), ``rollout serve`` authenticates, answers 202 and maps the node to the change: one
  rollback (Alertmanager's repeats and a second alert change nothing), files byte for byte,
  a ``trigger`` record naming the alert; meanwhile every Grafana panel query returns data.

Slow by nature: the rule's ``for: 1m`` is the shipped one, so the end-to-end test takes ~2-3 min.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.change.plan.gate_section import GateConfig, PrometheusSource
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.gate.alerting import rules_file, shipped_rule_text
from rollout.gate.analysis import evaluate
from rollout.gate.prometheus import PrometheusSignal
from rollout.lab import monitoring as mon
from rollout.lab.cluster import Lab
from rollout.lab.controlplane import free_port
from rollout.verdicts import Outcome
from tests.lab import changekit as ck
from tests.lab.conftest import IN_CI
from tests.lab.test_gate import (
    _apply_then,
    _deployment,
    _first_rejection,
    _gate_plan,
    _rejected,
    _running,
    _single_numa,
    _ts,
)

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
REJECTIONS = "sum by (node) (increase(kubelet_admission_rejections_total[5m]))"


@pytest.fixture(scope="module")
def monitoring(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    missing = mon.missing_monitoring_binaries(mon.find_monitoring_bin_dir())
    if missing:
        msg = f"monitoring binaries missing: {missing}; run tools/build-monitoring-binaries.sh"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    t0 = time.monotonic()
    m = lab.start_monitoring(state_dir=tmp_path_factory.mktemp("mon-state"))
    print(f"monitoring up in {time.monotonic() - t0:.1f}s")
    try:
        yield m
    finally:
        pids = mon.ours(m)
        lab.stop_monitoring()
        assert pids and all(not Path(f"/proc/{p}").exists() or _zombie(p) for p in pids)


def _zombie(pid: int) -> bool:
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def _get_json(url: str, timeout: float = 5) -> Any:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())


def _query(m: Any, q: str) -> list[dict[str, Any]]:
    doc = mon.query(m, q)
    assert doc["status"] == "success", doc
    return list(doc["data"]["result"])


def _up(m: Any, job: str, **labels: str) -> bool:
    sel = ",".join([f'job="{job}"', *(f'{k}="{v}"' for k, v in labels.items())])
    return any(r["value"][1] == "1" for r in _query(m, f"up{{{sel}}}"))


@pytest.mark.timeout(120)
def test_prometheus_scrapes_kubelets_through_the_node_proxy_and_loads_the_rules(
    lab: Lab, lab_nodes: Any, monitoring: Any
) -> None:
    (node,) = lab_nodes(1).names
    t0 = time.monotonic()
    ck.wait_for(lambda: _up(monitoring, "kubelet", node=node), 30, f"kubelet {node} up", 0.5)
    print(f"new node scraped {time.monotonic() - t0:.1f}s after Ready")
    series = _query(
        monitoring, f'kubelet_topology_manager_admission_requests_total{{node="{node}"}}'
    )
    assert series and series[0]["metric"]["job"] == "kubelet"
    # rollout serve speaks HTTPS only; Prometheus scrapes it verifying its certificate
    assert monitoring.serve_url.startswith("https://") and monitoring.serve_ca
    ck.wait_for(lambda: _up(monitoring, "rollout-serve"), 20, "rollout serve scraped", 0.5)
    # the rules are the shipped groups, converted at start
    want = rules_file(shipped_rule_text())
    got = _get_json(monitoring.prometheus_url + "/api/v1/rules")["data"]["groups"]
    assert [g["name"] for g in got] == [g["name"] for g in want["groups"]]
    assert [r["name"] for g in got for r in g["rules"]] == [
        r["alert"] for g in want["groups"] for r in g["rules"]
    ]
    assert all(g["interval"] == 2 for g in got)
    # Alertmanager runs the lab's route: rollout="rollback" -> rollout serve, with the token file
    status = _get_json(monitoring.alertmanager_url + "/api/v2/status")
    assert status["cluster"]["status"] == "disabled"
    original = status["config"]["original"]  # Alertmanager shows webhook URLs as <secret>
    assert "- name: rollout\n" in original and "webhook_configs:" in original, original
    assert f"credentials_file: {monitoring.token_file}" in original, original
    assert f"ca_file: {monitoring.serve_ca}" in original, original  # webhook tls_config
    # lab env / lab status through the CLI, from another process (the state file)
    args = ["--name", lab.name, "--workdir", str(lab.dir), "-o", "json"]
    env = ck.cli(["lab", "env", *args], dict(os.environ))
    assert env.returncode == 0, env.stderr
    doc = json.loads(env.stdout)
    assert doc["PROMETHEUS_URL"] == monitoring.prometheus_url
    assert doc["ALERTMANAGER_URL"] == monitoring.alertmanager_url
    assert doc["ROLLOUT_STATE_DIR"] == monitoring.state_dir
    st = ck.cli(["lab", "status", *args], dict(os.environ))
    assert st.returncode == 0, st.stderr
    health = json.loads(st.stdout)["monitoring"]
    assert (health["prometheus"], health["alertmanager"], health["serve"]) == (True, True, True)


@pytest.mark.timeout(150)
def test_gate_prometheus_signal_against_the_lab_prometheus(
    lab: Lab, lab_nodes: Any, namespace: str, monitoring: Any
) -> None:
    busy, idle = lab_nodes(2).names
    _single_numa(lab, busy)
    ck.wait_for(lambda: _up(monitoring, "kubelet", node=idle), 30, "idle node scraped", 0.5)
    _deployment(lab, namespace, "misfit", busy, 6)  # recreated after every rejection
    ck.wait_for(lambda: len(_rejected(lab, namespace)) >= 2, 45, "two rejections")
    cfg = GateConfig(min_admissions=1, probes=False)

    def read(nodes: list[str], url: str = monitoring.prometheus_url, timeout: float = 5) -> Any:
        sig = PrometheusSignal(PrometheusSource(url, REJECTIONS), timeout=timeout)
        sig.start(nodes)
        return sig

    sig = read([busy])

    def counted() -> bool:
        st = sig.state(time.time())
        return st.consecutive_errors == 0 and st.counts[busy].rejected > 0

    ck.wait_for(counted, 30, "Prometheus counting the rejections", 1)
    assert evaluate(cfg, [sig.state(time.time())], time.time()).status is Outcome.FAILED

    # the idle node has no series: never a pass, an Error once the error limit is reached
    sig = read([idle])
    verdicts = [evaluate(cfg, [sig.state(time.time())], time.time()) for _ in range(4)]
    assert all(v.status is not Outcome.SUCCESSFUL for v in verdicts)
    assert verdicts[-1].status is Outcome.ERROR and verdicts[-1].holds
    assert f"no series for {idle}" in verdicts[-1].reason

    # Prometheus down: nothing listening, then the real one hung (SIGSTOP): Error, hold
    sig = read([busy], url=f"http://127.0.0.1:{free_port()}")
    v = [evaluate(cfg, [sig.state(time.time())], time.time()) for _ in range(4)][-1]
    assert v.status is Outcome.ERROR and v.holds and "refused" in v.reason.lower()
    sig = read([busy], timeout=1)
    os.kill(monitoring.prometheus_pid, signal.SIGSTOP)
    try:
        v = [evaluate(cfg, [sig.state(time.time())], time.time()) for _ in range(4)][-1]
    finally:
        os.kill(monitoring.prometheus_pid, signal.SIGCONT)
    assert v.status is Outcome.ERROR and v.holds and "timed out" in v.reason.lower()


#: panels whose series exist only for a change this scenario does not make: the benchmark's
#: decisions need a plan with ``gate.bench`` (its export is held by
#: tests/unit/test_bench_gate.py and the staged plan by tests/lab/test_stages_lab.py)
NOT_IN_THIS_SCENARIO = {"rollout_bench_verdict"}


def _dashboard_queries(node: str) -> list[tuple[str, str]]:
    doc = json.loads((REPO / "deploy" / "grafana-dashboard.json").read_text())
    return [
        (p["title"], t["expr"].replace("$node", node))
        for p in doc["panels"]
        for t in p.get("targets", [])
        if not any(m in t["expr"] for m in NOT_IN_THIS_SCENARIO)
    ]


def _trigger_records(state: Path, change: str, ended: bool = False) -> list[Any]:
    """The change's ``trigger`` records: those that started a rollback, or (``ended``) those
    with its outcome."""
    return [
        e
        for e in Journal.open(state, change).entries()
        if e.step == "trigger" and ("outcome" in e.data) == ended
    ]


def _gate_metrics_endpoint(lab: Lab, node: str, monitoring: Any) -> tuple[Any, Any]:
    """The gate run as ``rollout watch --listen`` runs it (its metrics served over HTTP and
    scraped by the lab Prometheus), so the dashboard's gate panels have a source."""
    from rollout.gate.assembly import build_soak_gate
    from rollout.gate.serve import AlertReceiver, GateMetrics, make_server
    from rollout.kube.client import connect

    metrics = GateMetrics()
    server = make_server(("127.0.0.1", 0), "unused-token", AlertReceiver(lambda *a: None, metrics))
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    mon.add_rollout_target(monitoring, f"127.0.0.1:{server.server_address[1]}")
    cfg = GateConfig(soak=20, window=120, interval=1, min_admissions=1, probes=False)
    gate = build_soak_gate(
        cfg, connect(str(lab.kubeconfig)), since=time.time() - 300, record=None,
        metrics=metrics, output="json",
    )  # fmt: skip
    return gate.evaluate("panel-check", [node]), server


@pytest.mark.timeout(540)
def test_alert_rolls_back_the_change_owning_the_node_exactly_once(
    lab: Lab, lab_nodes: Any, namespace: str, monitoring: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    (node,) = lab_nodes(1).names
    inv = ck.inventory(lab, [node], [node], tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", [node], soak="8s", probes=True, minAdmissions=2)
    state = Path(monitoring.state_dir)  # where the lab's rollout serve reads journals
    before = ck.snapshot(lab, node)
    # the change passes its gate with a workload that fits one NUMA node (2 GPUs)
    r = _apply_then(
        lab, plan, inv, state, node, lambda: _deployment(lab, namespace, "numa-fit", node, 2)
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    change = json.loads(r.stdout)["change"]
    assert ck.snapshot(lab, node) != before and not _trigger_records(state, change)
    ck.wait_for(lambda: _running(lab, namespace), 40, "the fitting workload running")
    ck.wait_for(lambda: _up(monitoring, "kubelet", node=node), 30, "the canary scraped", 0.5)
    applied_at = time.monotonic()

    # after the change: a workload that fits the node (6 of 8 GPUs) but no NUMA node (4)
    _deployment(lab, namespace, "numa-misfit", node, 6)
    ck.wait_for(lambda: _rejected(lab, namespace), 45, "the kubelet's first rejection")
    gate_verdict, gate_server = _gate_metrics_endpoint(lab, node, monitoring)
    try:
        assert gate_verdict.status is Outcome.FAILED
        # the rule fires (for: 1m), Alertmanager posts, serve rolls back: the trigger record
        trig = ck.wait_for(
            lambda: _trigger_records(state, change), 150, "the alert's trigger record", 1
        )
        ck.wait_for(
            lambda: replay(Journal.open(state, change).entries()).outcome == "rolled-back",
            120,
            "the rollback",
            0.5,
        )
        assert ck.snapshot(lab, node) == before  # byte for byte
        assert ck.configz(lab, node).get("topologyManagerPolicy") == "none"

        # every Grafana panel's query returns data, without error, during the rejection
        def all_panels_have_data() -> bool:
            return all(_query(monitoring, q) for _, q in _dashboard_queries(node))

        try:
            ck.wait_for(all_panels_have_data, 40, "every panel with data", 1)
        except AssertionError:
            empty = [t for t, q in _dashboard_queries(node) if not _query(monitoring, q)]
            raise AssertionError(f"panels without data: {empty}") from None
    finally:
        gate_server.shutdown()
        gate_server.server_close()

    # Alertmanager repeats (repeat_interval) and a second rule for the same node: nothing more
    second = {
        "labels": {
            "alertname": "KubeletTopologyManagerAdmissionErrors",
            "node": node,
            "rollout": "rollback",
            "severity": "warning",
        },
        "annotations": {"summary": "a second rule firing for the same node"},
    }
    req = urllib.request.Request(
        monitoring.alertmanager_url + "/api/v2/alerts",
        data=json.dumps([second]).encode(),
        headers={"Content-Type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=5) as resp:
        assert resp.status == 200

    def served(action: str) -> float:
        for r in _query(monitoring, f'rollout_webhook_alerts_total{{action="{action}"}}'):
            return float(r["value"][1])
        return 0.0

    # the repeat is a duplicate; the second alert finds the node restored (unowned) or being
    # restored (already-rolled-back): either way nothing runs
    ck.wait_for(
        lambda: served("duplicate") >= 1 and served("unowned") + served("already-rolled-back") >= 1,
        90,
        "a repeat notification and the second alert answered",
        1,
    )
    (trigger,) = _trigger_records(state, change)  # still one
    (ended,) = _trigger_records(state, change, ended=True)
    assert ended.data["id"] == trigger.data["id"] and ended.data["outcome"] == "rolled-back"
    ends = [
        e for e in Journal.open(state, change).entries()
        if e.step == "change" and e.data.get("outcome") == "rolled-back"
    ]  # fmt: skip
    assert len(ends) == 1
    assert served("triggered") == 1
    (done,) = _query(monitoring, 'rollout_webhook_rollbacks_total{outcome="rolled-back"}')
    assert done["value"][1] == "1"
    assert trigger.data["trigger"] == "alert"
    assert trigger.data["alert"] == "KubeletTopologyAffinityRejections"
    assert trigger.data["node"] == node and trigger.data["nodes"] == [node]
    assert trigger.data["labels"]["rollout"] == "rollback"
    assert ck.snapshot(lab, node) == before
    ck.wait_for(lambda: len(_running(lab, namespace)) >= 2, 60, "both workloads running again")

    first = _first_rejection(lab, namespace)
    alert_path = _ts(trig[0]) - first
    print(
        f"alert path: first rejection -> trigger record {alert_path:.1f}s "
        f"(scrape {mon.INTERVALS['scrape_interval']:g}s, evaluation "
        f"{mon.INTERVALS['evaluation_interval']:g}s, for: 1m, group_wait "
        f"{mon.INTERVALS['group_wait']:g}s); "
        f"test {time.monotonic() - started:.1f}s (after apply {time.monotonic() - applied_at:.1f}s)"
    )
    assert 60 <= alert_path < 120  # bounded below by for: 1m


@pytest.mark.timeout(240)
def test_lab_up_monitoring_then_lab_down_stops_it(tmp_path: Path) -> None:
    """The CLI end to end on a lab of its own: ``lab up --monitoring``, then ``lab down``."""
    if mon.missing_monitoring_binaries(mon.find_monitoring_bin_dir()) and not IN_CI:
        pytest.skip("monitoring binaries missing")
    name = f"m{os.getpid() % 100000}"
    args = ["--name", name, "--workdir", str(tmp_path / "lab")]
    env = {**os.environ, "ROLLOUT_STATE_DIR": str(tmp_path / "state")}
    t0 = time.monotonic()
    up = ck.cli(["lab", "up", "--nodes", "1", "--monitoring", *args, "-o", "json"], env, 180)
    try:
        assert up.returncode == 0, up.stderr[-3000:]
        doc = json.loads(up.stdout)
        print(f"lab up --monitoring (1 node): {time.monotonic() - t0:.1f}s")
        assert "scrape_interval 2s" in up.stderr  # the intervals are stated
        assert doc["ROLLOUT_STATE_DIR"] == str(tmp_path / "state")
        for url in (doc["PROMETHEUS_URL"], doc["ALERTMANAGER_URL"]):
            with urllib.request.urlopen(url + "/-/ready", timeout=5) as r:
                assert r.status == 200
        state = json.loads((tmp_path / "lab" / "lab.json").read_text())["monitoring"]
        pids = [state["prometheus_pid"], state["alertmanager_pid"], state["serve_pid"]]
        text = ck.cli(["lab", "env", *args], env)
        assert f"export PROMETHEUS_URL={doc['PROMETHEUS_URL']}" in text.stdout
    finally:
        down = ck.cli(["lab", "down", *args], env, 120)
    assert down.returncode == 0, down.stderr
    assert all(not Path(f"/proc/{p}").exists() or _zombie(p) for p in pids)
    with pytest.raises(OSError):
        urllib.request.urlopen(doc["PROMETHEUS_URL"] + "/-/ready", timeout=2)
