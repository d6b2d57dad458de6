"""``apply --recreate-probes`` on the real kubelet: once the canary is applied, a device probe
(one ``nvidia.com/gpu``, the tool's own pod) runs, is deleted and runs again on it, and the
``after-recreate`` evidence is collected while the second one runs. The kubelet's device manager
hands the recreated probe a GPU afresh; ``unique-device-ids`` and ``numa-aligned`` judge it.
The probes are gone afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab]


@pytest.fixture(scope="module")
def real(lab: Lab) -> Iterator[list[str]]:
    names = ["rc-real-1"]
    lab.machines.add_nodes(names, ["kubeadm"], kubelet="real", timeout=120)
    try:
        yield names
    finally:
        lab.machines.remove_nodes(names)


@pytest.mark.timeout(420)
def test_recreated_probe_gets_a_gpu_afresh_and_the_after_recreate_evidence_judges_it(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    canary = real[0]
    inv = ck.inventory(lab, real, real, tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", {canary: "kubeadm"})
    state = tmp_path / "state"
    env = ck.env(lab, state)
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    bad = ck.cli([*args, "--recreate-probes", "--no-evidence"], env)
    assert bad.returncode == 2 and "--no-evidence contradicts it" in bad.stderr, bad.stderr
    assert not state.exists()

    r = ck.cli([*args, "--recreate-probes"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    journal = ck.latest_journal(state)
    assert journal is not None
    collected = {e.data["label"]: e.data for e in journal.entries() if e.step == "evidence"}
    assert list(collected) == ["before", "after", "after-recreate"], collected
    again = collected["after-recreate"]
    assert not again.get("error"), again
    checks = {c["name"]: c for c in again["checks"]}
    assert checks["unique-device-ids"]["status"] == "pass", checks
    assert checks["numa-aligned"]["status"] == "pass", checks
    assert checks["numa-aligned"]["checked"] >= 1, checks  # the recreated probe
    doc = json.loads((journal.dir / "evidence.json").read_text())
    (node,) = [c["nodes"][canary] for c in doc["collections"] if c["label"] == "after-recreate"]
    probes = [p for p in node["pods"] if p["name"].startswith("rollout-device-")]
    assert [p["name"].split("-")[-2] for p in probes] == ["1"], probes  # the second probe only
    (gpu,) = probes[0]["devices"]["nvidia.com/gpu"]
    assert gpu in node["deviceNuma"], node
    code, body = lab.api.request("GET", "/api/v1/namespaces/rollout-probes/pods")
    assert code == 200 and not [
        p for p in body["items"] if p["metadata"]["name"].startswith("rollout-device-")
    ], body  # deleted afterwards

    back = ck.cli(["rollback", "--change", change, "--yes"], env)
    assert back.returncode == 0, back.stderr[-3000:]


def _gpu_deployment(lab: Lab, name: str, node: str) -> None:
    """One Guaranteed replica asking for one GPU, kept on ``node`` by its hostname label."""
    labels = {"app": name}
    res = {"cpu": "1", "memory": "64Mi", "nvidia.com/gpu": "1"}
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause:3.10",
                            "resources": {"requests": res, "limits": res},
                        }
                    ],
                },
            },
        },
    }
    code, out = lab.api.request("POST", "/apis/apps/v1/namespaces/default/deployments", body)
    assert code == 201, out


def _running_pods(lab: Lab, app: str) -> list[str]:
    code, body = lab.api.request(
        "GET", f"/api/v1/namespaces/default/pods?labelSelector=app%3D{app}"
    )
    assert code == 200, body
    return sorted(
        p["metadata"]["name"]
        for p in body["items"]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


@pytest.mark.timeout(420)
def test_recreate_workloads_recreates_a_deployments_pod_and_judges_it(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    canary = real[0]
    _gpu_deployment(lab, "rc-gpu", canary)
    try:
        ck.wait_for(
            lambda: len(_running_pods(lab, "rc-gpu")) == 1, 90, "the GPU pod to run", every=0.5
        )
        inv = ck.inventory(lab, real, real, tmp_path / "inv.ini")
        plan = ck.plan(tmp_path / "plan.yaml", {canary: "kubeadm"})
        state = tmp_path / "state"
        env = ck.env(lab, state)
        # the drain's pod has nowhere else to go: it waits Pending for the canary's uncordon
        args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes"]
        args += ["--capacity-warn-only", "-o", "json"]
        bad = ck.cli([*args, "--recreate-workloads", "--no-evidence"], env)
        assert bad.returncode == 2 and "--no-evidence contradicts it" in bad.stderr, bad.stderr
        assert not state.exists()

        (running,) = _running_pods(lab, "rc-gpu")
        dry = ck.cli([*args[:-2], "--recreate-workloads", "--dry-run"], env)
        assert dry.returncode == 0, dry.stderr[-3000:]
        assert "--recreate-workloads, once applied" in dry.stdout, dry.stdout
        assert "  recreate ReplicaSet/default/rc-gpu-" in dry.stdout, dry.stdout
        assert f": default/{running}\n" in dry.stdout, dry.stdout
        assert not state.exists() and _running_pods(lab, "rc-gpu") == [running]

        r = ck.cli([*args, "--recreate-workloads"], env)
        assert r.returncode == 0, r.stderr[-3000:]
        change = json.loads(r.stdout)["change"]
        journal = ck.latest_journal(state)
        assert journal is not None
        steps = [(e.phase.value, dict(e.data)) for e in journal.entries() if e.step == "recreate"]
        assert [ph for ph, _ in steps] == ["begin", "done"], (steps, r.stderr[-3000:])
        (begin, done) = (d for _, d in steps)
        assert begin["owner"].startswith("ReplicaSet/default/rc-gpu-"), begin
        (old,) = begin["pods"]
        (new,) = done["replacements"]
        assert done["replacements"][new] == canary and done["offChangedNodes"] == [], done
        assert old != new and _running_pods(lab, "rc-gpu") == [new.split("/")[1]]
        assert f"recreating {begin['owner']}: evicting {old}" in r.stderr, r.stderr[-3000:]

        collected = {e.data["label"]: e.data for e in journal.entries() if e.step == "evidence"}
        assert list(collected) == ["before", "after", "after-recreate"], collected
        again = collected["after-recreate"]
        assert not again.get("error") and again["overall"] == "pass", again
        checks = {c["name"]: c for c in again["checks"]}
        assert checks["numa-aligned"]["checked"] >= 1, checks  # the replacement
        doc = json.loads((journal.dir / "evidence.json").read_text())
        (node,) = [c["nodes"][canary] for c in doc["collections"] if c["label"] == "after-recreate"]
        (pod,) = [p for p in node["pods"] if f"default/{p['name']}" == new]
        (gpu,) = pod["devices"]["nvidia.com/gpu"]
        assert gpu in node["deviceNuma"], node
    finally:
        lab.api.request("DELETE", "/apis/apps/v1/namespaces/default/deployments/rc-gpu")
    back = ck.cli(["rollback", "--change", change, "--yes"], env)
    assert back.returncode == 0, back.stderr[-3000:]
