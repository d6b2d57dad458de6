"""``rollout apply --canary`` and ``rollout rollback`` against the lab: real API server, sshd,
ansible-runner and the lab kubelet; node files checked by sha256 on the node's own filesystem."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from rollout.lab.seeds import DISTRIBUTIONS
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab

WANT = {
    "cpuManagerPolicy": "static",
    "reservedSystemCPUs": "0,32",
    "topologyManagerPolicy": "single-numa-node",
    "topologyManagerScope": "pod",
}


def _deployment(lab: Lab, ns: str, name: str, replicas: int, labels: dict[str, str]) -> None:
    body: dict[str, Any] = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.invalid/pause:3.10",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ],
                },
            },
        },
    }
    code, out = lab.api.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    assert code == 201, out


def _pods(lab: Lab, ns: str) -> list[dict[str, Any]]:
    code, out = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods")
    assert code == 200
    return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]


def _running_on(lab: Lab, ns: str) -> dict[str, str]:
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in _pods(lab, ns)
        if p.get("status", {}).get("phase") == "Running"
    }


def test_canary_apply_then_rollback_byte_for_byte(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    nodes = lab_nodes(4)
    names = nodes.names
    canary = names[:2]
    inv = ck.inventory(lab, names, canary, tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"))
    env = ck.env(lab, tmp_path / "state")
    # an operator cordoned the second canary node on purpose before the change
    ck.set_unschedulable(lab, canary[1], True)
    _deployment(lab, namespace, "web", 4, {"app": "web"})
    ck.wait_for(lambda: len(_running_on(lab, namespace)) == 4, 60, "4 web pods running")
    before_pods = _running_on(lab, namespace)
    on_canary0 = [p for p, n in before_pods.items() if n == canary[0]]
    assert on_canary0, before_pods  # the spread put a pod on the first canary node
    before = {n: ck.snapshot(lab, n) for n in names}

    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    change = out["change"]
    st = {n["node"]: n["state"] for n in out["nodes"]}
    assert st == {
        canary[0]: "applied",
        canary[1]: "applied",
        names[2]: "pending",
        names[3]: "pending",
    }
    for n in canary:
        cfg = ck.configz(lab, n)
        assert {k: cfg.get(k) for k in WANT} == WANT
    assert not ck.unschedulable(lab, canary[0])
    assert ck.unschedulable(lab, canary[1])  # still cordoned: we did not cordon it
    for n in names[2:]:
        assert ck.snapshot(lab, n) == before[n]  # the rest untouched
        assert ck.configz(lab, n).get("cpuManagerPolicy") == "none"
    after_pods = _running_on(lab, namespace)
    assert not set(on_canary0) & set(after_pods)  # evicted
    # rescheduled elsewhere: four running again, none on the cordoned-then-drained node during
    # the change (replacements were created while it was unschedulable)
    ck.wait_for(lambda: len(_running_on(lab, namespace)) == 4, 60, "web pods rescheduled")
    replaced = {p: n for p, n in _running_on(lab, namespace).items() if p not in before_pods}
    assert replaced and canary[0] not in replaced.values(), replaced

    r = ck.cli(["rollback", "--change", change, "--yes", "-o", "json"], env)
    assert r.returncode == 0, r.stderr
    st = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert st[canary[0]] == st[canary[1]] == "restored"
    for n in names:
        assert ck.snapshot(lab, n) == before[n], n  # byte for byte, files we added removed
    assert ck.configz(lab, canary[0]).get("cpuManagerPolicy") == "none"
    assert not ck.unschedulable(lab, canary[0])
    assert ck.unschedulable(lab, canary[1])  # still as the operator left it
    r = ck.cli(["status", "--change", change], env)
    assert r.returncode == 0 and f"{canary[0]}: restored" in r.stdout
    print(f"canary apply + rollback: {time.monotonic() - started:.1f}s")


def test_every_distribution_applied_and_rolled_back(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    nodes = lab_nodes(len(DISTRIBUTIONS), ",".join(DISTRIBUTIONS))
    names = nodes.names
    dists = {n.name: n.distribution for n in nodes.nodes}
    assert sorted(dists.values()) == sorted(DISTRIBUTIONS)
    inv = ck.inventory(lab, names, names, tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dists, max_unavailable=len(names))
    env = ck.env(lab, tmp_path / "state")
    before = {n: ck.snapshot(lab, n) for n in names}
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert {n["state"] for n in out["nodes"]} == {"applied"}, out
    for n in names:
        cfg = ck.configz(lab, n)
        assert {k: cfg.get(k) for k in WANT} == WANT, (dists[n], cfg)
    r = ck.cli(["rollback", "--change", out["change"], "--yes"], env)
    assert r.returncode == 0, r.stderr
    for n in names:
        assert ck.snapshot(lab, n) == before[n], dists[n]
        assert ck.configz(lab, n).get("cpuManagerPolicy") == "none"


def test_second_apply_while_one_runs_is_refused_naming_the_holder(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    from tests.lab.test_failures import _one_pod_with_pdb

    nodes = lab_nodes(2)
    names = nodes.names
    inv = ck.inventory(lab, names, names[:1], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"), drain_timeout="180s")
    env = ck.env(lab, tmp_path / "state")
    # the first apply's drain waits on a PDB until the test lifts it: it holds the lock for as
    # long as the second apply needs to get there, however fast an apply is
    _one_pod_with_pdb(lab, namespace, names[0], 1)
    apply = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes"]
    first = ck.start_cli([*apply, "--force-delete-unmanaged"], env)  # the pod has no controller
    try:
        ck.wait_for(
            lambda: ck.journal_has(tmp_path / "state", names[0], "cordon", "done"),
            120,
            "first apply cordoning",
        )
        second = ck.cli(
            ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes"],
            ck.env(lab, tmp_path / "state2"),
        )
        code, out = lab.api.request(
            "DELETE", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/never"
        )
        assert code == 200, out
        assert second.returncode == 4, second.stderr
        assert "another change holds the cluster lock" in second.stderr
        assert f"pid {first.pid}" in second.stderr and "change 20" in second.stderr
        assert not (tmp_path / "state2").exists()  # nothing written
    finally:
        _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err
    r = ck.cli(
        ["rollback", "--change", ck.latest_journal(tmp_path / "state").change_id, "--yes"], env
    )  # type: ignore[union-attr]
    assert r.returncode == 0, r.stderr
