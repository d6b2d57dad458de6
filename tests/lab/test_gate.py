"""The rejection-rate gate in the lab: the rejections come from the lab kubelet's own admission
(Topology Manager ``single-numa-node``), the signals from the real API server and the kubelet's
``/metrics`` through the node proxy, the rollback from the real playbooks.

* ``apply --canary`` of single-numa-node under a workload that fits the node but not one NUMA node:
  Failed, automatic rollback, node files byte for byte as before, the workload runs again; the time
  from the kubelet's first rejection to the rollback's start is measured;
* a fitting workload: Successful, no rollback; then the Alertmanager webhook (``rollout serve``):
  without the token 401 and nothing happens, with it exactly one rollback (same alert twice);
* no traffic: Inconclusive, apply holds (exit 8); ``rollout watch`` with probe pods: Successful;
* a rejection storm from one Deployment counts once per owner per window;
* the API server restarted while the gate watches: resumed, nothing counted twice, same verdict.

Each test keeps its own soak short (seconds) so the file stays well under a few minutes.
"""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout.change.plan.gate_section import GateConfig
from rollout.change.record.journal import Journal
from rollout.gate.analysis import evaluate
from rollout.lab.cluster import Lab
from rollout.verdicts import Outcome
from tests.lab import changekit as ck
from tests.lab.test_lab_kubelet import STATIC, _configure, _wait_policy

pytestmark = pytest.mark.lab

TAE = "TopologyAffinityError"


def _gate_plan(path: Path, nodes: list[str], **gate: Any) -> Path:
    """The lab test plan (single-numa-node at pod scope) with a short ``gate:`` section."""
    ck.plan(path, dict.fromkeys(nodes, "kubeadm"))
    settings = {
        "soak": "6s",
        "window": "60s",
        "interval": "1s",
        "threshold": "5%",
        "minAdmissions": 1,
        "baseline": "none",
        "probes": False,
        **gate,
    }
    lines = ["gate:"] + [f"  {k}: {json.dumps(v)}" for k, v in settings.items()]
    path.write_text(path.read_text() + "\n".join(lines) + "\n")
    return path


def _gpu_pod_spec(node: str, gpus: int) -> dict[str, Any]:
    """A Guaranteed pod pinned to ``node`` asking for ``gpus`` GPUs (4 per NUMA node, 8 a node)."""
    res = {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    return {
        "nodeSelector": {"kubernetes.io/hostname": node},
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": res, "limits": res},
            }
        ],
    }


def _deployment(lab: Lab, ns: str, name: str, node: str, gpus: int) -> None:
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": _gpu_pod_spec(node, gpus)},
        },
    }
    code, out = lab.api.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    assert code == 201, out


def _bare_pod(lab: Lab, ns: str, name: str, node: str, gpus: int) -> None:
    body = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}}
    body["spec"] = _gpu_pod_spec(node, gpus)
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{ns}/pods", body)
    assert code == 201, out


def _pods(lab: Lab, ns: str) -> list[dict[str, Any]]:
    code, out = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods")
    assert code == 200
    return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]


def _rejected(lab: Lab, ns: str) -> list[dict[str, Any]]:
    return [p for p in _pods(lab, ns) if p["status"].get("reason") == TAE]


def _running(lab: Lab, ns: str) -> list[dict[str, Any]]:
    return [p for p in _pods(lab, ns) if p["status"].get("phase") == "Running"]


def _first_rejection(lab: Lab, ns: str) -> float:
    """When the kubelet first rejected a pod: its Warning Event's name ends in the kubelet's
    UnixNano in hex (``<pod>.<hex>``, as client-go's recorder names events)."""
    code, out = lab.api.request("GET", f"/api/v1/namespaces/{ns}/events")
    assert code == 200
    times = [
        int(e["metadata"]["name"].rsplit(".", 1)[1], 16) / 1e9
        for e in out["items"]
        if e.get("reason") == TAE
    ]
    assert times, "no TopologyAffinityError event"
    return min(times)


def _records(state: Path, kind: str) -> list[Any]:
    j = ck.latest_journal(state)
    assert j is not None
    return [e for e in j.entries() if e.step == kind]


def _ts(entry: Any) -> float:
    from datetime import datetime

    return datetime.fromisoformat(entry.ts).timestamp()


def _apply_then(
    lab: Lab, plan: Path, inv: Path, state: Path, node: str, during_soak: Callable[[], None]
) -> subprocess.CompletedProcess[str]:
    """``apply --canary`` in the background; once the canary is uncordoned (the soak begins),
    run ``during_soak`` (a workload arriving on the changed node); wait for apply to end."""
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    proc = ck.start_cli(args, ck.env(lab, state))
    try:
        ck.wait_for(lambda: ck.journal_has(state, node, "uncordon", "done"), 120, "the canary")
        during_soak()
        out, err = proc.communicate(timeout=150)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return subprocess.CompletedProcess(args, proc.returncode, out, err)


@pytest.mark.timeout(150)
def test_numa_misfit_fails_the_canary_and_rolls_back_byte_for_byte(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    (node,) = lab_nodes(1).names
    inv = ck.inventory(lab, [node], [node], tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", [node], soak="20s")
    state = tmp_path / "state"
    before = ck.snapshot(lab, node)
    # 6 GPUs fit the node (8) but not one NUMA node (4); the workload arrives during the soak
    r = _apply_then(
        lab, plan, inv, state, node, lambda: _deployment(lab, namespace, "numa-misfit", node, 6)
    )
    assert r.returncode == 5, (r.returncode, r.stderr[-3000:])
    assert "gate failed the canary" in r.stderr
    out = json.loads(r.stdout)
    assert {n["node"]: n["state"] for n in out["nodes"]} == {node: "restored"}
    (verdict,) = _records(state, "verdict")
    assert verdict.data["outcome"] == "Failed" and verdict.data["failedNodes"] == [node]
    assert TAE in verdict.data["reason"] and "threshold 5%" in verdict.data["reason"]
    (trigger,) = _records(state, "trigger")
    assert trigger.data["trigger"] == "gate" and trigger.data["nodes"] == [node]
    # byte for byte, and the kubelet serves the old policy again
    assert ck.snapshot(lab, node) == before
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "none"
    # the workload's next pod is admitted again
    ck.wait_for(lambda: _running(lab, namespace), 40, "the workload running after the rollback")
    first = _first_rejection(lab, namespace)
    latency = _ts(trigger) - first
    print(
        f"first rejection -> Failed verdict {verdict.data['at'] - first:.3f}s, "
        f"-> rollback started {latency:.3f}s; test {time.monotonic() - started:.1f}s"
    )
    assert verdict.data["at"] - first >= 0 and latency < 5.0


@pytest.mark.timeout(200)
def test_two_node_canary_misfit_restores_every_canary_node_and_the_workload_runs(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    """A Deployment whose pod needs more CPUs than one NUMA node holds (40 of 2 x 32), pinned to
    both canary nodes by node affinity, arrives during the soak: the plan names no onFailure, so
    the default (rollback-group) restores both canary nodes, not only the one that rejected
    first, and the workload runs again; the outcome says so."""
    started = time.monotonic()
    names = lab_nodes(2).names
    inv = ck.inventory(lab, names, names, tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", names, soak="20s")
    assert "onFailure" not in plan.read_text()
    state = tmp_path / "state"
    before = {n: ck.snapshot(lab, n) for n in names}
    cpu = {"cpu": "40", "memory": "1Gi"}
    pod = {
        "terminationGracePeriodSeconds": 0,
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {
                            "matchExpressions": [
                                {"key": "kubernetes.io/hostname", "operator": "In", "values": names}
                            ]
                        }
                    ]
                }
            }
        },
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": cpu, "limits": cpu},
            }
        ],
    }
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "misfit"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "misfit"}},
            "template": {"metadata": {"labels": {"app": "misfit"}}, "spec": pod},
        },
    }

    def deploy() -> None:
        ck.wait_for(lambda: ck.journal_has(state, names[1], "uncordon", "done"), 60, "canary 2")
        code, out = lab.api.request(
            "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", body
        )
        assert code == 201, out

    r = _apply_then(lab, plan, inv, state, names[0], deploy)
    assert r.returncode == 5, (r.returncode, r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert {n["node"]: n["state"] for n in out["nodes"]} == dict.fromkeys(names, "restored")
    (trigger,) = _records(state, "trigger")
    assert trigger.data["policy"] == "rollback-group" and trigger.data["nodes"] == names
    for n in names:  # byte for byte, the old policy served again
        assert ck.snapshot(lab, n) == before[n]
        assert ck.configz(lab, n).get("topologyManagerPolicy") == "none"
    recoveries = _records(state, "recovery")
    (tmp_path / "apply.stderr").write_text(r.stderr)  # kept for a failure's reader
    assert len(recoveries) == 1, f"no recovery record: see {tmp_path / 'apply.stderr'}"
    (owner,) = recoveries[0].data["running"]
    assert owner.startswith(f"ReplicaSet/{namespace}/misfit-")
    assert not recoveries[0].data["notRunning"]
    assert f"Running again after the rollback: {owner}" in out["message"]
    assert _running(lab, namespace)
    print(f"two-node misfit, pool rollback + workload running: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(200)
def test_rollback_affected_keeps_watching_and_rolls_the_second_node_back(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    """onFailure: rollback-affected, chosen explicitly: a misfit pinned to canary 1 is rejected,
    only canary 1 is restored; the soak goes on over canary 2, where a second misfit (created once
    the first rollback is journaled) is rejected: canary 2 is restored too, after its own trigger,
    and both workloads run again."""
    names = lab_nodes(2).names
    inv = ck.inventory(lab, names, names, tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", names, soak="40s", onFailure="rollback-affected")
    state = tmp_path / "state"

    def misfits() -> None:
        ck.wait_for(lambda: ck.journal_has(state, names[1], "uncordon", "done"), 60, "canary 2")
        _deployment(lab, namespace, "misfit-a", names[0], 6)
        ck.wait_for(lambda: _records(state, "trigger"), 30, "the first rollback")
        _deployment(lab, namespace, "misfit-b", names[1], 6)

    r = _apply_then(lab, plan, inv, state, names[0], misfits)
    assert r.returncode == 5, (r.returncode, r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert {n["node"]: n["state"] for n in out["nodes"]} == dict.fromkeys(names, "restored")
    triggers = _records(state, "trigger")
    assert [t.data["nodes"] for t in triggers] == [[names[0]], [names[1]]]
    assert {t.data["policy"] for t in triggers} == {"rollback-affected"}
    soaks = [e.data["nodes"] for e in _records(state, "gate") if e.phase.value == "begin"]
    assert soaks == [names, [names[1]]]
    for n in names:
        assert ck.configz(lab, n).get("topologyManagerPolicy") == "none"
    (recovery,) = _records(state, "recovery")
    assert len(recovery.data["running"]) == 2 and not recovery.data["notRunning"]
    assert "Running again after the rollback" in out["message"]


def _serve(env: dict[str, str], token: Path) -> tuple[Any, int]:
    """``rollout serve`` on 127.0.0.1, an ephemeral port (read from its first stderr line)."""
    proc = ck.start_cli(["serve", "--listen", "127.0.0.1:0", "--token-file", str(token)], env)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "listening on 127.0.0.1:" in line, line
    return proc, int(line.split("127.0.0.1:")[1].split()[0])


def _post(port: int, body: Any, token: str | None) -> tuple[int, Any]:
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/webhook",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"}
        | ({"Authorization": f"Bearer {token}"} if token else {}),
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")


def _trigger_end(port: int, trigger: str, token: str, timeout: float = 150) -> dict[str, Any]:
    """The rollback ``rollout serve`` started under ``trigger``, once it ended (GET
    /triggers/<id>, as an operator would poll it)."""
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/triggers/{trigger}",
        headers={"Authorization": f"Bearer {token}"},
    )

    def ended() -> dict[str, Any] | None:
        with urllib.request.urlopen(req, timeout=10) as resp:
            doc: dict[str, Any] = json.loads(resp.read())
        return doc if doc["state"] != "running" else None

    return ck.wait_for(ended, timeout, f"trigger {trigger} ended", 0.5)


@pytest.mark.timeout(180)
def test_fitting_workload_passes_then_the_webhook_rolls_back_once(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    (node,) = lab_nodes(1).names
    inv = ck.inventory(lab, [node], [node], tmp_path / "inv.ini")
    # probes on: the workload's one admission may land before the kubelet's first scrape
    plan = _gate_plan(tmp_path / "plan.yaml", [node], soak="8s", probes=True, minAdmissions=2)
    state = tmp_path / "state"
    env = ck.env(lab, state)
    before = ck.snapshot(lab, node)
    # 2 GPUs fit one NUMA node: admitted under single-numa-node too
    r = _apply_then(
        lab, plan, inv, state, node, lambda: _deployment(lab, namespace, "numa-fit", node, 2)
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    out = json.loads(r.stdout)
    change = out["change"]
    assert out["outcome"] == "held" and {n["state"] for n in out["nodes"]} == {"applied"}
    (verdict,) = _records(state, "verdict")
    assert verdict.data["outcome"] == "Successful", verdict.data["reason"]
    assert not _records(state, "trigger") and not _rejected(lab, namespace)
    assert ck.snapshot(lab, node) != before
    ck.wait_for(lambda: _running(lab, namespace), 40, "the workload running on the new policy")

    # the canary holds for a person's decision; an alert rolls it back meanwhile
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    proc, port = _serve(env, token)
    try:
        alert = {
            "version": "4",
            "status": "firing",
            "alerts": [
                {
                    "status": "firing",
                    "labels": {
                        "alertname": "KubeletTopologyAffinityRejections",
                        "change_id": change,
                    },
                    "fingerprint": "f00d",
                }
            ],
        }
        entries = len(Journal.open(state, change).entries())
        for wrong in (None, "not-the-token"):
            code, _ = _post(port, alert, wrong)
            assert code == 401
        assert len(Journal.open(state, change).entries()) == entries  # nothing happened
        assert ck.snapshot(lab, node) != before
        code, body = _post(port, alert, "s3cret-token")
        assert code == 202 and body["alerts"][0]["action"] == "triggered", body
        code, again = _post(port, alert, "s3cret-token")  # Alertmanager repeats itself
        assert code == 200 and again["alerts"][0]["action"] == "duplicate", again
        run = _trigger_end(port, body["alerts"][0]["trigger"], "s3cret-token")
        assert run["state"] == "rolled-back", run
    finally:
        proc.terminate()
        proc.communicate(timeout=10)
    ends = [
        e.data.get("outcome")
        for e in Journal.open(state, change).entries()
        if e.step == "change" and e.data.get("outcome") == "rolled-back"
    ]
    assert ends == ["rolled-back"]  # exactly one rollback
    assert ck.snapshot(lab, node) == before
    print(f"pass + webhook rollback: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(180)
def test_a_gate_that_requires_evidence_collects_it_before_the_canary_holds(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    """``gate.requireEvidence: true``: the canary's before and after evidence are collected once
    the soak passes, inside the change (before its end), once each, and the change holds on a
    pass."""
    started = time.monotonic()
    (node,) = lab_nodes(1).names
    inv = ck.inventory(lab, [node], [node], tmp_path / "inv.ini")
    plan = _gate_plan(
        tmp_path / "plan.yaml",
        [node],
        soak="8s",
        probes=True,
        minAdmissions=2,
        requireEvidence=True,
    )
    state = tmp_path / "state"
    r = _apply_then(
        lab, plan, inv, state, node, lambda: _deployment(lab, namespace, "numa-fit", node, 2)
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["outcome"] == "held" and out["evidence"]["after"]["overall"] != "fail", out
    j = ck.latest_journal(state)
    assert j is not None
    entries = j.entries()
    labels = [e.data["label"] for e in entries if e.step == "evidence"]
    assert labels == ["before", "after"], labels  # once each: apply did not collect them again
    after = next(
        i for i, e in enumerate(entries) if e.step == "evidence" and e.data["label"] == "after"
    )
    end = max(i for i, e in enumerate(entries) if e.step == "change")
    assert after < end  # collected by the gate, before the change held
    (verdict,) = _records(state, "verdict")
    assert verdict.data["outcome"] == "Successful", verdict.data["reason"]
    print(f"gate with required evidence: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(180)
def test_no_traffic_holds_and_probes_turn_it_into_a_verdict(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    (node,) = lab_nodes(1).names
    inv = ck.inventory(lab, [node], [node], tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", [node], soak="4s", minAdmissions=3)
    state = tmp_path / "state"
    env = ck.env(lab, state)
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 8, (r.returncode, r.stderr[-3000:])  # the gate holds
    out = json.loads(r.stdout)
    assert out["outcome"] == "held" and "gate Inconclusive" in out["message"]
    assert "waiting for at least 3 admissions" in r.stderr
    (verdict,) = _records(state, "verdict")
    assert verdict.data["outcome"] == "Inconclusive" and not _records(state, "trigger")
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "single-numa-node"

    probes = _gate_plan(tmp_path / "probes.yaml", [node], soak="6s", minAdmissions=3, probes=True)
    r = ck.cli(["watch", "--change", out["change"], "--plan", str(probes), "-o", "json"], env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    got = json.loads(r.stdout)
    assert got["outcome"] == "Successful", got["reason"]
    assert len(got["inputs"]["probes"]) == 3 and got["rollback"] == []
    code, left = lab.api.request(
        "GET", f"/api/v1/namespaces/rollout-probes/pods?fieldSelector=spec.nodeName%3D{node}"
    )
    assert code == 200
    assert all(p["metadata"].get("deletionTimestamp") for p in left["items"])  # cleaned up
    print(f"hold + probes: {time.monotonic() - started:.1f}s")


def _single_numa(lab: Lab, node: str) -> None:
    _configure(lab, node, {**STATIC, "topologyManagerPolicy": "single-numa-node"})
    _wait_policy(lab, node, "single-numa-node")
    lab.machines.wait_ready([node], timeout=20)


def _api_signal(lab: Lab, node: str) -> Any:
    from rollout.kube.client import connect
    from rollout.kube.watching import ApiSignal

    api = connect(str(lab.kubeconfig))
    sig = ApiSignal(api, since=time.time() - 1, window=120)
    sig.start([node])
    return sig


@pytest.mark.timeout(90)
def test_rejection_storm_from_one_deployment_counts_once(
    lab: Lab, lab_nodes: Any, namespace: str
) -> None:
    (node,) = lab_nodes(1).names
    _single_numa(lab, node)
    sig = _api_signal(lab, node)
    try:
        _deployment(lab, namespace, "storm", node, 6)
        ck.wait_for(lambda: len(_rejected(lab, namespace)) >= 3, 45, "three rejected replicas")
        ck.wait_for(
            lambda: sum(1 for s in sig.tracker.samples() if s.rejected) >= 3, 10, "3 samples"
        )
        st = sig.state(time.time())
    finally:
        sig.stop()
    c = st.counts[node]
    assert c.rejected == 1 and c.admissions == 1, c  # one owner, one attempt, one rejection
    (owner,) = c.owners
    assert owner.startswith(f"ReplicaSet/{namespace}/storm-")
    v = evaluate(GateConfig(min_admissions=1, probes=False), [st], time.time())
    assert v.status is Outcome.FAILED
    assert "1 of 1 admissions rejected (100%)" in v.reason and owner in v.reason


@pytest.mark.timeout(120)
def test_apiserver_restart_during_the_soak_counts_nothing_twice(
    lab: Lab, lab_nodes: Any, namespace: str
) -> None:
    (node,) = lab_nodes(1).names
    _single_numa(lab, node)
    sig = _api_signal(lab, node)
    cfg = GateConfig(min_admissions=3, probes=False)
    try:
        for i in range(3):
            _bare_pod(lab, namespace, f"misfit-{i}", node, 6)
        for i in range(2):
            _bare_pod(lab, namespace, f"fit-{i}", node, 1)
        ck.wait_for(lambda: len(sig.tracker.samples()) == 5, 40, "5 admissions seen")
        first = sig.state(time.time())
        v1 = evaluate(cfg, [first], time.time())
        lab.restart_apiserver(downtime=1.0)
        # a pod made after the restart is seen: the watch resumed
        _bare_pod(lab, namespace, "after-restart", node, 1)
        try:
            ck.wait_for(lambda: len(sig.tracker.samples()) >= 6, 60, "the watch resumed")
        except AssertionError as e:  # say which side did not resume: the kubelet or the watch
            _, pod = lab.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/after-restart")
            raise AssertionError(
                f"{e}: pod phase {pod.get('status', {}).get('phase')!r}, "
                f"{len(sig.tracker.samples())} samples, last watch error {sig._last_error!r}"
            ) from None
        time.sleep(2)  # let any replayed event arrive
        second = sig.state(time.time())
        v2 = evaluate(cfg, [second], time.time())
        samples = sig.tracker.samples()
    finally:
        sig.stop()
    assert len(samples) == len({s.pod_uid for s in samples}) == 6  # nothing twice
    assert (first.counts[node].admissions, first.counts[node].rejected) == (5, 3)
    assert (second.counts[node].admissions, second.counts[node].rejected) == (6, 3)
    assert v1.status is v2.status is Outcome.FAILED and v1.failed_nodes == v2.failed_nodes
