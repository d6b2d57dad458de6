"""``rollout migrate`` through the CLI on real-kubelet nodes with the real DRA driver: the lab's
GPU Operator DaemonSets, the preflight refusal of labels no DaemonSet selects, and the claim
freeze (``allocationPath.freezeClaims``) on the real kube-apiserver.

Two real-kubelet nodes for the module: ``frz-dra`` on DRA (its slices make the driver known in
the cluster) and ``frz-a`` on the device plugin; the DeviceClass maps ``nvidia.com/gpu``, and
``Machines.path_daemonsets`` creates the device plugin's and the DRA kubelet plugin's DaemonSets
with node selectors on the two path labels (their pods run on the fake runtime).

* a plan whose DRA label no DaemonSet selects is refused before any change, naming the label;
  the nodes, their labels and the state dir stay as they were; the DaemonSets' pods sit on the
  nodes their labels select;
* a frozen rollback killed right after the freeze is in force (``claim-freeze:done``): a
  tenant's new ResourceClaim and ResourceClaimTemplate of the class are refused with the
  policy's message, the node still fully on DRA; ``rollout resume`` finishes the rollback in
  the design's order and removes the freeze, and the same claim is then created.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.change.kinds import claim_freeze as cf
from rollout.lab import daemonsets as ds
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_migrate_lab import _plan as migration_plan

pytestmark = [pytest.mark.lab]
GPU = "nvidia.com/gpu"
DP, DRA = ds.DEFAULT_LABELS[ds.DEVICE_PLUGIN], ds.DEFAULT_LABELS[ds.DRA_DRIVER]
RES = "/apis/resource.k8s.io/v1"
NODE, OTHER = "frz-a", "frz-dra"
ADM = "/apis/admissionregistration.k8s.io/v1"


@pytest.fixture(scope="module")
def pool(lab: Lab) -> Iterator[list[str]]:
    lab.machines.add_nodes([OTHER], ["kubeadm"], kubelet="real", timeout=120, path="dra")
    lab.machines.add_nodes([NODE], ["kubeadm"], kubelet="real", timeout=120)
    lab.machines.device_class(GPU)
    try:
        yield [NODE]
    finally:
        lab.api.request("DELETE", f"/api/v1/namespaces/{ds.NAMESPACE}")
        lab.machines.device_class(None)
        lab.machines.remove_nodes([NODE, OTHER])


def _plan(path: Path, *extra: str) -> Path:
    return migration_plan(path, claim_limit=None, extra=extra)


def _labels(lab: Lab, node: str) -> dict[str, str]:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    return dict(body["metadata"].get("labels") or {})


def _path(lab: Lab, node: str) -> str:
    labels = _labels(lab, node)
    dp, dra = labels.get(DP) == "true", labels.get(DRA) == "true"
    return "both" if dp and dra else "dra" if dra else "device-plugin" if dp else "none"


def _ds_nodes(lab: Lab, comp: str) -> set[str]:
    code, body = lab.api.request(
        "GET",
        f"/api/v1/namespaces/{ds.NAMESPACE}/pods?labelSelector=app={ds.DAEMONSET_NAMES[comp]}",
    )
    assert code == 200, body
    return {
        p["spec"].get("nodeName")
        for p in body["items"]
        if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    }


def _claim(ns: str, name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": ds.DEVICE_CLASS}}]
            }
        },
    }


def _template(ns: str, name: str) -> dict[str, Any]:
    claim = _claim(ns, name)
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": claim["metadata"],
        "spec": {"spec": claim["spec"]},
    }


@pytest.mark.timeout(600)
def test_labels_no_daemonset_selects_are_refused_by_name_before_any_change(
    lab: Lab, pool: list[str], tmp_path: Path
) -> None:
    made = lab.machines.path_daemonsets()
    assert made == [
        f"{ds.NAMESPACE}/{ds.DAEMONSET_NAMES[ds.DEVICE_PLUGIN]}",
        f"{ds.NAMESPACE}/{ds.DAEMONSET_NAMES[ds.DRA_DRIVER]}",
    ]
    # the DaemonSet controller runs each one's pod where its label selects, as the agent runs
    # the component itself
    ck.wait_for(
        lambda: NODE in _ds_nodes(lab, ds.DEVICE_PLUGIN) and OTHER in _ds_nodes(lab, ds.DRA_DRIVER),
        180,
        "the DaemonSets' pods Running on the nodes their labels select",
        every=1,
    )
    assert NODE not in _ds_nodes(lab, ds.DRA_DRIVER)
    inv = ck.inventory(lab, pool, [NODE], tmp_path / "inv.ini")
    state = tmp_path / "state"
    env = ck.env(lab, state)
    before = _labels(lab, NODE)
    bad = _plan(tmp_path / "bad.yaml", "  draLabel: example.com/no-daemonset-selects-this")
    r = ck.cli(["migrate", "--plan", str(bad), "-i", str(inv), "--yes"], env, timeout=300)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert "migration refused before any change" in r.stderr
    assert (
        "no DaemonSet selects nodes on example.com/no-daemonset-selects-this=true "
        "(allocationPath.draLabel)"
    ) in r.stderr, r.stderr[-3000:]
    assert "devicePluginLabel" not in r.stderr  # the GPU Operator's label is selected
    assert _labels(lab, NODE) == before and not ck.unschedulable(lab, NODE)
    assert ck.latest_journal(state) is None  # no change began
    good = _plan(tmp_path / "good.yaml")
    r = ck.cli(
        ["migrate", "--plan", str(good), "-i", str(inv), "--dry-run", "-o", "json"],
        env,
        timeout=300,
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["nodes"][0]["evicts"] == []  # a DaemonSet's pod is not evicted


@pytest.mark.timeout(900)
def test_a_frozen_rollback_refuses_new_claims_of_the_class_until_it_ends(
    lab: Lab, pool: list[str], namespace: str, tmp_path: Path
) -> None:
    lab.machines.path_daemonsets()
    inv = ck.inventory(lab, pool, [NODE], tmp_path / "inv.ini")
    plan = _plan(tmp_path / "plan.yaml", "  freezeClaims: true")
    state = tmp_path / "state"
    env = ck.env(lab, state)
    r = ck.cli(["migrate", "--plan", str(plan), "-i", str(inv), "--yes", "-o", "json"], env, 400)
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    assert _path(lab, NODE) == "dra"
    name = cf.name_of(ds.DEVICE_CLASS)
    assert lab.api.request("GET", f"{ADM}/validatingadmissionpolicies/{name}")[0] == 404

    fail_env = {**env, "ROLLOUT_FAILPOINT": "claim-freeze:done"}
    r = ck.cli(["rollback", "--change", change, "--yes"], fail_env, timeout=400)
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])  # killed, the freeze in force
    # the node is untouched by the rollback so far: fully on DRA, schedulable
    assert _path(lab, NODE) == "dra" and not ck.unschedulable(lab, NODE)
    path = f"{RES}/namespaces/{namespace}"
    code, body = lab.api.request("POST", f"{path}/resourceclaims", _claim(namespace, "new-gpu"))
    assert code == 403, (code, body)
    assert f"ValidatingAdmissionPolicy '{name}'" in body["message"], body["message"]
    assert f"change {change}" in body["message"] and "frozen" in body["message"]
    code, body = lab.api.request(
        "POST", f"{path}/resourceclaimtemplates", _template(namespace, "new-gpu")
    )
    assert code == 403 and "frozen" in body["message"], (code, body)

    r = ck.cli(["resume", "--change", change, "--yes", "-o", "json"], env, timeout=400)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _path(lab, NODE) == "device-plugin" and not ck.unschedulable(lab, NODE)
    for kind in ("validatingadmissionpolicybindings", "validatingadmissionpolicies"):
        assert lab.api.request("GET", f"{ADM}/{kind}/{name}")[0] == 404, kind
    j = ck.latest_journal(state)
    assert j is not None
    entries = j.entries()
    freeze = [f"{e.data['action']} {e.phase.value}" for e in entries if e.step == "claim-freeze"]
    assert freeze == ["apply begin", "apply done", "remove begin", "remove done"], freeze
    first_restore = next(
        i for i, e in enumerate(entries) if e.node == NODE and e.path and e.path.value == "restore"
    )
    removed = max(i for i, e in enumerate(entries) if e.step == "claim-freeze")
    applied = [i for i, e in enumerate(entries) if e.step == "claim-freeze"][1]
    assert applied < first_restore < removed

    # the same tenant claim is admitted once the rollback has ended (the API server's policy
    # informer drops the binding within moments: waited for, never assumed)
    def created() -> bool:
        code, body = lab.api.request("POST", f"{path}/resourceclaims", _claim(namespace, "new-gpu"))
        assert code in (201, 403), (code, body)
        return code == 201

    ck.wait_for(created, 30, "the claim admitted after the freeze", every=0.5)
