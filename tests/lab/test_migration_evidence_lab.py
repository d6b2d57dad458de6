"""A migration's evidence across the move, through the CLI on real-kubelet nodes with the real
DRA driver: ``rollout migrate`` collects ``before`` (the node on the device plugin: the
workload's device IDs from the kubelet's podresources, the healthy set) and ``after`` (the node
on DRA: every healthy GPU in the driver's ResourceSlices, none through the plugin); once the
workload's pod is back on the node through the DeviceClass's ``extendedResourceName``,
``rollout evidence --change ID --label after-recreate`` shows its device from the claim's status
and from podresources' dynamic resources, and ``gpus-served-once`` passes in all three.

Two real-kubelet nodes for the module: ``mev-dra`` on DRA (the driver known in the cluster) and
``mev-a`` on the device plugin, the GPU Operator DaemonSets (``Machines.path_daemonsets``), and a
Deployment asking for ``nvidia.com/gpu`` that may run on ``mev-a`` only.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.lab import daemonsets as ds
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_migrate_lab import _plan as migration_plan

pytestmark = [pytest.mark.lab]
GPU = "nvidia.com/gpu"
NODE, OTHER = "mev-a", "mev-dra"


@pytest.fixture(scope="module")
def pool(lab: Lab) -> Iterator[list[str]]:
    lab.machines.add_nodes([OTHER], ["kubeadm"], kubelet="real", timeout=120, path="dra")
    lab.machines.add_nodes([NODE], ["kubeadm"], kubelet="real", timeout=120)
    lab.machines.device_class(GPU)
    lab.machines.path_daemonsets()
    try:
        yield [NODE]
    finally:
        lab.api.request("DELETE", f"/api/v1/namespaces/{ds.NAMESPACE}")
        lab.machines.device_class(None)
        lab.machines.remove_nodes([NODE, OTHER])


def _deployment(ns: str) -> dict[str, Any]:
    sel = {"app": "gpu-user"}
    return {
        "metadata": {"name": "gpu-user", "namespace": ns},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": sel},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause",
                            "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
                        }
                    ],
                },
            },
        },
    }


def _running(lab: Lab, ns: str) -> dict[str, Any] | None:
    code, body = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app=gpu-user")
    assert code == 200, body
    live = [
        p
        for p in body["items"]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    ]
    return dict(live[0]) if live else None


def _collection(path: Path, label: str) -> dict[str, Any]:
    doc = json.loads(path.read_text())
    (col,) = [c for c in doc["collections"] if c["label"] == label]
    return dict(col["nodes"][NODE])


@pytest.mark.timeout(900)
def test_the_evidence_holds_across_a_move_to_dra(
    lab: Lab, pool: list[str], namespace: str, tmp_path: Path
) -> None:
    code, out = lab.api.request(
        "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", _deployment(namespace)
    )
    assert code == 201, out
    before_pod = ck.wait_for(
        lambda: _running(lab, namespace), 120, "the gpu-user pod Running", every=0.5
    )
    inv = ck.inventory(lab, pool, [NODE], tmp_path / "inv.ini")
    plan = migration_plan(tmp_path / "plan.yaml", claim_limit=None)
    state = tmp_path / "state"
    env = ck.env(lab, state)
    r = ck.cli(["migrate", "--plan", str(plan), "-i", str(inv), "--yes", "-o", "json"], env, 600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "evidence before: pass" in r.stderr and "evidence after: pass" in r.stderr, r.stderr
    change = json.loads(r.stdout)["change"]
    j = ck.latest_journal(state)
    assert j is not None
    evidence = j.dir / "evidence.json"

    # before, on the device plugin: the pod's device ID from the kubelet's podresources
    before = _collection(evidence, "before")
    name = before_pod["metadata"]["name"]
    (pod,) = [p for p in before["pods"] if p["name"] == name]
    assert before["deviceSource"] == "podresources"
    (gpu_id,) = pod["devices"][GPU]
    assert gpu_id in before["allocatableDevices"][GPU]
    assert before["gpuPath"]["path"] == "device-plugin" and before["gpuPath"]["served"] == 8
    assert before["gpuPath"]["sliceDevices"] == []

    # after, on DRA: every healthy GPU in the driver's slices, none through the plugin
    after = _collection(evidence, "after")
    g = after["gpuPath"]
    assert (g["path"], g["allocatable"], len(g["sliceDevices"]), g["expected"]) == ("dra", 0, 8, 8)
    checks = {
        (e.data["label"], c["name"]): c
        for e in j.entries()
        if e.step == "evidence"
        for c in e.data.get("checks") or ()
    }
    for label in ("before", "after"):
        assert checks[(label, "gpus-served-once")]["status"] == "pass", checks
        assert checks[(label, "unique-device-ids")]["status"] in ("pass", "not-judged")

    # the workload back on the node through the DeviceClass: its device from the claim's status
    # and from the kubelet's podresources (dynamic resources)
    def back() -> dict[str, Any] | None:
        p = _running(lab, namespace)
        ok = p and p["spec"].get("nodeName") == NODE
        return p if ok and (p["status"].get("extendedResourceClaimStatus") or {}) else None

    ck.wait_for(back, 180, "the gpu-user pod Running on the DRA node", every=0.5)
    r = ck.cli(
        ["evidence", "--label", "after-recreate", "--change", change, "-o", "json"], env, 300
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    node = doc["collection"]["nodes"][NODE]
    (dra_pod,) = [p for p in node["pods"] if p["name"].startswith("gpu-user")]
    (claim,) = [c for c in node["draClaims"] if dra_pod["name"] in " ".join(c["pods"])]
    (dev,) = claim["devices"]
    assert (dev["driver"], dev["pool"]) == (ds.DRIVER, NODE)
    assert f"{NODE}/{dev['device']}" in g["sliceDevices"]  # the slices list pool/device
    kubelet = dra_pod.get("podResourcesDra") or {}
    assert [f"{ds.DRIVER}/{NODE}/{dev['device']}"] == [d for ds_ in kubelet.values() for d in ds_]
    assert claim["claim"] in kubelet, (claim, kubelet)
    by = {c["name"]: c for c in doc["checks"]}
    assert by["gpus-served-once"]["status"] == "pass", by["gpus-served-once"]
    assert by["unique-device-ids"]["status"] == "pass", by["unique-device-ids"]
    assert node["gpuPath"]["expected"] == 8
