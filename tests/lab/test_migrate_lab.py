"""``rollout migrate`` through the CLI on real-kubelet nodes with the real DRA driver
(``sigs.k8s.io/dra-example-driver`` v0.4.0, ``rollout.lab.daemonsets``): a node's path follows
its labels, as the GPU Operator's DaemonSets make it.

Three real-kubelet nodes for the module: ``mig-dra`` already on DRA (the pool kept on the other
path: its slices are the driver's in the cluster, and its GPUs the room drained pods move to),
``mig-a`` and ``mig-b`` on the device plugin, in an inventory whose canary is ``mig-a``. The
DeviceClass maps ``nvidia.com/gpu`` (KEP-5004), and two DaemonSet objects select on the two path
labels (the lab's agent does what their pods would; their selectors also name a label no node
has, so the controller starts no pod of theirs). In file order:

* a canary moves to DRA, holds, and is promoted; a Deployment asking for ``nvidia.com/gpu`` runs
  throughout, served through the DeviceClass once its node is on DRA; no node ever serves the
  name both ways (sampled every 0.2 s);
* the pool rolls back in the design document's order (journal order checked) and the Deployment's
  pod runs again on the device plugin;
* a rollback with a pod holding a claim on the node waits, fails naming the pod, the driver still
  running; once the pod is gone ``rollout resume`` finishes it;
* an unallocated claim older than ``claimLimit`` fails the canary's gate: rolled back;
* ``rollout`` killed right after a journal entry (``ROLLOUT_FAILPOINT``) forward (the label
  write, the allocatable-0 wait's begin and end) and on the way back, and ``rollout resume``: the
  node ends on one path, fully;
* ``rollout`` killed as the canary's gate begins: ``rollout resume`` soaks the DRA pool's gate
  (not the plain one), which fails on an unallocated claim and rolls the canary back;
* release is confirmed by the kubelet's own account, read on the node: forward, its podresources
  API and device checkpoint (journaled); back, with the kubelet stopped and the claim's pod and
  claim gone from the API server, ``dra_manager_state`` still has the claim prepared: the
  rollback refuses, naming the claim, and the driver keeps running; once the kubelet is back and
  its DRA manager unprepared the claim, the rollback finishes;
* ``--terminate-claims`` given to ``promote`` only: the rollback of the canary (whose own record
  has no consent) terminates the pod holding a claim on it, as the change record says.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.lab import daemonsets as ds
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab]
GPU = "nvidia.com/gpu"
DP, DRA = ds.DEFAULT_LABELS[ds.DEVICE_PLUGIN], ds.DEFAULT_LABELS[ds.DRA_DRIVER]
RES = "/apis/resource.k8s.io/v1"
NODES = ["mig-a", "mig-b"]
OTHER = "mig-dra"
NS = "gpu-operator-lab"


@pytest.fixture(scope="module")
def pool(lab: Lab) -> Iterator[list[str]]:
    lab.machines.add_nodes([OTHER], ["kubeadm"], kubelet="real", timeout=120, path="dra")
    lab.machines.add_nodes(NODES, ["kubeadm"] * len(NODES), kubelet="real", timeout=120)
    lab.machines.device_class(GPU)
    lab.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    for name, label in (("device-plugin", DP), ("dra-kubelet-plugin", DRA)):
        code, out = lab.api.request(
            "POST", f"/apis/apps/v1/namespaces/{NS}/daemonsets", _ds(name, label)
        )
        assert code in (201, 409), out
    try:
        yield NODES
    finally:
        lab.api.request("DELETE", f"/api/v1/namespaces/{NS}")
        lab.machines.device_class(None)
        lab.machines.remove_nodes([*NODES, OTHER])


def _ds(name: str, label: str) -> dict[str, Any]:
    sel = {"app": name}
    return {
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": sel},
                "spec": {
                    "nodeSelector": {label: "true", "rollout-lab/no-such-node": "true"},
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause"}],
                },
            },
        },
    }


def _plan(
    path: Path,
    to: str = "dra",
    timeout: str = "90s",
    claim_limit: str | None = "5m",
    extra: tuple[str, ...] = (),
) -> Path:
    """The allocation-path plan of the migration lab tests (the freeze and evidence tests too):
    ``extra`` lines go into the ``allocationPath`` section."""
    lines = [
        "apiVersion: rollout.dev/v1alpha1",
        "kind: RolloutPlan",
        "allocationPath:",
        "  groups:",
        f"    nodes: {to}",
        f"  driver: {ds.DRIVER}",
        f"  deviceClass: {ds.DEVICE_CLASS}",
        f"  timeout: {timeout}",
        *([f"  claimLimit: {claim_limit}"] if claim_limit else []),
        *extra,
        "strategy:",
        "  canaryGroup: canary",
        "  maxUnavailable: 1",
        "  drain:",
        "    timeout: 30s",
        "    backoffCap: 1s",
        "",
    ]
    path.write_text("\n".join(lines))
    return path


def _node(lab: Lab, node: str) -> dict[str, Any]:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    return dict(body)


def _path(lab: Lab, node: str) -> str:
    labels = _node(lab, node)["metadata"].get("labels", {})
    dp, dra = labels.get(DP) == "true", labels.get(DRA) == "true"
    return "both" if dp and dra else "dra" if dra else "device-plugin" if dp else "none"


def _allocatable(lab: Lab, node: str) -> int:
    return int(_node(lab, node)["status"]["allocatable"].get(GPU, "0"))


class BothWatch:
    """Samples every node every 0.2 s: allocatable above 0 while the driver lists devices."""

    def __init__(self, lab: Lab, nodes: list[str]) -> None:
        self.lab, self.nodes, self.seen = lab, nodes, []  # type: list[str]
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            for n in self.nodes:
                if _allocatable(self.lab, n) and self.lab.devices.driver_slices(n):
                    self.seen.append(n)
            time.sleep(0.2)

    def __enter__(self) -> BothWatch:
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(5)


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
                    "affinity": {
                        "nodeAffinity": {
                            "requiredDuringSchedulingIgnoredDuringExecution": {
                                "nodeSelectorTerms": [
                                    {
                                        "matchExpressions": [
                                            {
                                                "key": "kubernetes.io/hostname",
                                                "operator": "In",
                                                "values": [*NODES, OTHER],
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
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


def _running_pod(lab: Lab, ns: str) -> dict[str, Any]:
    def get() -> dict[str, Any] | None:
        code, body = lab.api.request(
            "GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app=gpu-user"
        )
        assert code == 200, body
        live = [p for p in body["items"] if p["status"].get("phase") == "Running"]
        return dict(live[0]) if live else None

    return dict(ck.wait_for(get, 90, "the gpu-user pod Running", every=0.5))


def _run(lab: Lab, state: Path, *args: str, timeout: float = 400, **env: str) -> Any:
    r = ck.cli(list(args), {**ck.env(lab, state), **env}, timeout=timeout)
    return r


def _steps(state: Path, node: str, path: str) -> list[str]:
    j = ck.latest_journal(state)
    assert j is not None
    return [
        e.step
        for e in j.entries()
        if e.node == node
        and e.phase.value == "begin"
        and e.path is not None
        and e.path.value == path
    ]


@pytest.mark.timeout(900)
def test_a_canary_moves_to_dra_holds_is_promoted_and_the_pool_rolls_back_in_order(
    lab: Lab, pool: list[str], namespace: str, tmp_path: Path
) -> None:
    inv = ck.inventory(lab, pool, ["mig-a"], tmp_path / "inv.ini")
    plan = _plan(tmp_path / "plan.yaml")
    state = tmp_path / "state"
    code, out = lab.api.request(
        "POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", _deployment(namespace)
    )
    assert code == 201, out
    first = _running_pod(lab, namespace)

    dry = _run(
        lab, state, "migrate", "--plan", str(plan), "-i", str(inv), "--dry-run", "-o", "json"
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    doc = json.loads(dry.stdout)
    assert [b["nodes"] for b in doc["batches"]] == [["mig-a"], ["mig-b"]]
    # a percentage maxUnavailable is of the pool's nodes (it was of one node: always 1)
    whole = tmp_path / "whole.yaml"
    whole.write_text(
        plan.read_text()
        .replace("maxUnavailable: 1", 'maxUnavailable: "100%"')
        .replace("canaryGroup: canary", "canaryGroup: none")
    )
    dry = _run(
        lab, state, "migrate", "--plan", str(whole), "-i", str(inv), "--dry-run", "-o", "json"
    )
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert [b["nodes"] for b in json.loads(dry.stdout)["batches"]] == [["mig-a", "mig-b"]]
    assert all(_path(lab, n) == "device-plugin" for n in pool)  # the dry runs changed nothing

    with BothWatch(lab, [*pool, OTHER]) as watch:
        r = _run(
            lab,
            state,
            "migrate",
            "--plan",
            str(plan),
            "-i",
            str(inv),
            "--canary",
            "--yes",
            "-o",
            "json",
        )
        assert r.returncode == 0, r.stderr[-3000:]
        held = json.loads(r.stdout)
        assert held["outcome"] == "held", held
        assert (_path(lab, "mig-a"), _path(lab, "mig-b")) == ("dra", "device-plugin")
        assert _allocatable(lab, "mig-a") == 0 and len(lab.devices.driver_slices("mig-a")) == 8
        change = held["change"]
        # the workload's pod may end on either pool node, holding a claim there: the operator's
        # consent (recorded at promote, carried to the rollback) lets the rollback end it after
        # the claims step; the rollback that waits without consent has its own test below
        r = _run(
            lab, state, "promote", "--change", change, "--terminate-claims", "--yes", "-o", "json"
        )
        assert r.returncode == 0, r.stderr[-3000:]
        assert json.loads(r.stdout)["outcome"] == "completed"
        assert all(_path(lab, n) == "dra" for n in pool)
        # the workload runs; every node it may run on is on DRA now: served through a claim
        # the scheduler made for nvidia.com/gpu (the DeviceClass's extendedResourceName)
        pod = _running_pod(lab, namespace)
        assert _path(lab, pod["spec"]["nodeName"]) == "dra"
        assert (pod["status"].get("extendedResourceClaimStatus") or {}).get("resourceClaimName")

        r = _run(lab, state, "rollback", "--change", change, "--yes", "-o", "json")
        assert r.returncode == 0, r.stderr[-3000:]
    assert watch.seen == [], f"served through both paths: {watch.seen}"
    assert _steps(state, "mig-a", "restore") == [
        "cordon", "claims", "drain", "release", "stop-driver", "slices-gone", "switch",
        "restore-verify", "uncordon",
    ]  # fmt: skip
    for n in pool:
        assert _path(lab, n) == "device-plugin" and _allocatable(lab, n) == 8
        assert lab.devices.driver_slices(n) == []
    # the workload runs again; a new pod on a device-plugin node takes the plugin's GPU
    lab.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/{first['metadata']['name']}")
    pod = _running_pod(lab, namespace)
    if pod["spec"]["nodeName"] in pool:
        assert not pod["status"].get("extendedResourceClaimStatus"), pod["status"]


@pytest.mark.timeout(600)
def test_a_rollback_with_a_pod_holding_a_claim_waits_and_fails_naming_it_then_resume_finishes(
    lab: Lab, pool: list[str], namespace: str, tmp_path: Path
) -> None:
    inv = ck.inventory(lab, ["mig-a"], ["mig-a"], tmp_path / "inv.ini")
    plan = _plan(tmp_path / "plan.yaml", timeout="35s")  # the kubelet wipes slices after 30 s
    state = tmp_path / "state"
    r = _run(lab, state, "migrate", "--plan", str(plan), "-i", str(inv), "--yes", "-o", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "one-gpu", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": ds.DEVICE_CLASS}}]
            }
        },
    }
    code, out = lab.api.request("POST", f"{RES}/namespaces/{namespace}/resourceclaims", claim)
    assert code == 201, out
    pod = {
        "metadata": {"name": "holder", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "mig-a"},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "one-gpu"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    assert code == 201, out
    ck.wait_for(
        lambda: (
            lab.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/holder")[1]["status"].get(
                "phase"
            )
            == "Running"
        ),
        90,
        "the claim holder Running",
        every=0.5,
    )
    r = _run(lab, state, "rollback", "--change", change, "--yes", "-o", "json")
    assert r.returncode != 0
    assert f"{namespace}/holder" in r.stderr and "failed at claims" in r.stderr, r.stderr[-3000:]
    assert _path(lab, "mig-a") == "dra" and lab.devices.driver_slices("mig-a")  # driver kept
    lab.api.request("DELETE", f"/api/v1/namespaces/{namespace}/pods/holder")
    ck.wait_for(
        lambda: lab.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/holder")[0] == 404,
        90,
        "the holder gone",
        every=0.5,
    )
    lab.api.request("DELETE", f"{RES}/namespaces/{namespace}/resourceclaims/one-gpu")
    r = _run(lab, state, "rollback", "--change", change, "--yes", "-o", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert _path(lab, "mig-a") == "device-plugin" and _allocatable(lab, "mig-a") == 8


@pytest.mark.timeout(400)
def test_an_unallocated_claim_fails_the_canarys_gate_and_rolls_it_back(
    lab: Lab, pool: list[str], namespace: str, tmp_path: Path
) -> None:
    inv = ck.inventory(lab, ["mig-b"], ["mig-b"], tmp_path / "inv.ini")
    plan = _plan(tmp_path / "plan.yaml", claim_limit="1s")
    state = tmp_path / "state"
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "too-many", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": ds.DEVICE_CLASS, "count": 64}}
                ]
            }
        },
    }
    code, out = lab.api.request("POST", f"{RES}/namespaces/{namespace}/resourceclaims", claim)
    assert code == 201, out
    pod = {
        "metadata": {"name": "waits", "namespace": namespace},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "too-many"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    assert code == 201, out
    time.sleep(2)  # older than claimLimit
    r = _run(
        lab,
        state,
        "migrate",
        "--plan",
        str(plan),
        "-i",
        str(inv),
        "--canary",
        "--yes",
        "-o",
        "json",
    )
    assert r.returncode != 0
    doc = json.loads(r.stdout)
    assert doc["outcome"] == "rolled-back", doc
    assert f"ResourceClaim {namespace}/too-many" in doc["message"], doc["message"]
    assert _path(lab, "mig-b") == "device-plugin" and _allocatable(lab, "mig-b") == 8


@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("failpoint", "back"),
    [
        ("switch:done:mig-a", False),
        # between the device plugin's label write and the DRA label: the allocatable-0 wait
        ("allocatable-zero:begin:mig-a", False),
        ("allocatable-zero:done:mig-a", False),
        ("stop-driver:done:mig-a", True),
    ],
)
def test_rollout_killed_after_a_journal_entry_resumes_to_one_path(
    lab: Lab, pool: list[str], tmp_path: Path, failpoint: str, back: bool
) -> None:
    inv = ck.inventory(lab, ["mig-a"], ["mig-a"], tmp_path / "inv.ini")
    plan = _plan(tmp_path / "plan.yaml")
    state = tmp_path / "state"
    args = ["migrate", "--plan", str(plan), "-i", str(inv), "--yes", "-o", "json"]
    with BothWatch(lab, ["mig-a"]) as watch:
        if back:
            r = _run(lab, state, *args)
            assert r.returncode == 0, r.stderr[-3000:]
            change = json.loads(r.stdout)["change"]
            r = _run(
                lab, state, "rollback", "--change", change, "--yes", ROLLOUT_FAILPOINT=failpoint
            )
        else:
            r = _run(lab, state, *args, ROLLOUT_FAILPOINT=failpoint)
        assert r.returncode == -9, (r.returncode, r.stderr[-2000:])  # SIGKILL at the failpoint
        j = ck.latest_journal(state)
        assert j is not None
        r = _run(lab, state, "resume", "--change", j.change_id, "--yes", "-o", "json")
        assert r.returncode == 0, r.stderr[-3000:]
    node = json.loads(r.stdout)["nodes"][0]
    want = "device-plugin" if back or node["state"] == "restored" else "dra"
    assert _path(lab, "mig-a") == want, node
    assert not ck.unschedulable(lab, "mig-a")
    assert watch.seen == []
    if want == "device-plugin":
        assert _allocatable(lab, "mig-a") == 8
    else:
        r = _run(lab, state, "rollback", "--change", j.change_id, "--yes")
        assert r.returncode == 0, r.stderr[-3000:]
    assert _path(lab, "mig-a") == "device-plugin"


def _unallocatable_claim(lab: Lab, ns: str, name: str) -> None:
    """A claim no node can satisfy and a pod waiting on it (the DRA pool gate's signal)."""
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "devices": {
                "requests": [
                    {"name": "gpu", "exactly": {"deviceClassName": ds.DEVICE_CLASS, "count": 64}}
                ]
            }
        },
    }
    code, out = lab.api.request("POST", f"{RES}/namespaces/{ns}/resourceclaims", claim)
    assert code == 201, out
    pod = {
        "metadata": {"name": f"{name}-pod", "namespace": ns},
        "spec": {
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert code == 201, out


@pytest.mark.timeout(600)
def test_resume_after_a_crash_at_the_canarys_gate_soaks_the_dra_pool_gate(
    lab: Lab, pool: list[str], namespace: str, tmp_path: Path
) -> None:
    """issue 37: ``rollout resume`` of a migration wires the DRA pool's gate as migrate did; the
    plain gate (the plan has no ``gate:``) would pass and hold the canary."""
    inv = ck.inventory(lab, ["mig-b"], ["mig-b"], tmp_path / "inv.ini")
    plan = _plan(tmp_path / "plan.yaml", claim_limit="1s")
    state = tmp_path / "state"
    args = ["migrate", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    r = _run(lab, state, *args, ROLLOUT_FAILPOINT="gate:begin")
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])  # killed as the soak began
    assert _path(lab, "mig-b") == "dra"
    _unallocatable_claim(lab, namespace, "too-many")
    ck.wait_for(
        lambda: (
            lab.api.request("GET", f"{RES}/namespaces/{namespace}/resourceclaims/too-many")[0]
            == 200
        ),
        30,
        "the claim stored",
    )
    time.sleep(2)  # older than claimLimit
    j = ck.latest_journal(state)
    assert j is not None
    r = _run(lab, state, "resume", "--change", j.change_id, "--yes", "-o", "json")
    doc = json.loads(r.stdout)
    assert doc["outcome"] == "rolled-back", (doc, r.stderr[-2000:])
    assert f"ResourceClaim {namespace}/too-many" in doc["message"], doc["message"]
    assert _path(lab, "mig-b") == "device-plugin" and _allocatable(lab, "mig-b") == 8
    assert not ck.unschedulable(lab, "mig-b")


@pytest.mark.timeout(900)
def test_terminate_claims_given_to_promote_is_recorded_and_carried_to_the_canarys_rollback(
    lab: Lab, pool: list[str], namespace: str, tmp_path: Path
) -> None:
    inv = ck.inventory(lab, pool, ["mig-a"], tmp_path / "inv.ini")
    plan = _plan(tmp_path / "plan.yaml")
    state = tmp_path / "state"
    r = _run(
        lab, state, "migrate", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o",
        "json",
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    r = _run(
        lab, state, "promote", "--change", change, "--terminate-claims", "--dry-run", "-o", "json"
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout)["terminateClaims"] is True
    r = _run(lab, state, "promote", "--change", change, "--terminate-claims", "--yes", "-o", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    assert all(_path(lab, n) == "dra" for n in pool)
    j = ck.latest_journal(state)
    assert j is not None
    begins = [e.data for e in j.entries() if e.step == "change" and e.phase.value == "begin"]
    assert begins[0]["terminateClaims"] is False and begins[-1]["terminateClaims"] is True
    assert begins[-1]["promotion"]["terminateClaims"] is True
    # a pod holding a claim on the canary, whose own node record says no consent
    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "held-gpu", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": ds.DEVICE_CLASS}}]
            }
        },
    }
    code, out = lab.api.request("POST", f"{RES}/namespaces/{namespace}/resourceclaims", claim)
    assert code == 201, out
    pod = {
        "metadata": {"name": "holder", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "mig-a"},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "held-gpu"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    assert code == 201, out
    ck.wait_for(
        lambda: (
            lab.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/holder")[1]["status"].get(
                "phase"
            )
            == "Running"
        ),
        90,
        "the claim holder Running",
        every=0.5,
    )
    # the rollback from a fresh state directory: the journal comes from the cluster record
    r = _run(lab, tmp_path / "elsewhere", "rollback", "--change", change, "--yes", "-o", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    ck.wait_for(
        lambda: lab.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/holder")[0] == 404,
        90,
        "the holder terminated",
        every=0.5,
    )
    for n in pool:
        assert _path(lab, n) == "device-plugin" and _allocatable(lab, n) == 8
        assert not ck.unschedulable(lab, n)
    j = ck.latest_journal(tmp_path / "elsewhere")
    assert j is not None
    claims = [e for e in j.entries() if e.step == "claims" and e.node == "mig-a"]
    assert claims and claims[0].data["terminate"] is True, [c.data for c in claims]
    assert f"{namespace}/holder" in claims[0].data["pods"]


def _release_done(state: Path, node: str, path: str) -> dict[str, Any]:
    j = ck.latest_journal(state)
    assert j is not None
    done = [
        e.data
        for e in j.entries()
        if e.node == node
        and e.step == "release"
        and e.phase.value == "done"
        and e.path is not None
        and e.path.value == path
    ]
    assert done, f"no release done on {path}"
    return dict(done[-1])


def _dra_state(lab: Lab, node: str) -> list[Any]:
    """The claims in the node's ``dra_manager_state`` (the kubelet's own file)."""
    path = lab.machines.node_root(node) / "var/lib/kubelet/dra_manager_state"
    try:
        doc = json.loads(path.read_text())
        return list(json.loads(doc["Data"]).get("ClaimInfoStateList") or [])
    except (OSError, ValueError, KeyError):
        return [None]  # unreadable (being rewritten): not empty


@pytest.mark.timeout(900)
def test_release_is_confirmed_by_the_kubelets_own_account_on_the_node(
    lab: Lab, pool: list[str], namespace: str, tmp_path: Path
) -> None:
    inv = ck.inventory(lab, ["mig-a"], ["mig-a"], tmp_path / "inv.ini")
    plan = _plan(tmp_path / "plan.yaml", timeout="40s")
    state = tmp_path / "state"
    r = _run(lab, state, "migrate", "--plan", str(plan), "-i", str(inv), "--yes", "-o", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    forward = _release_done(state, "mig-a", "forward")["kubelet"]
    assert forward["sources"] == ["podresources", "kubelet_internal_checkpoint"], forward
    assert forward["held"] == [] and forward["problems"] == [], forward

    claim = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "kept-gpu", "namespace": namespace},
        "spec": {
            "devices": {
                "requests": [{"name": "gpu", "exactly": {"deviceClassName": ds.DEVICE_CLASS}}]
            }
        },
    }
    code, out = lab.api.request("POST", f"{RES}/namespaces/{namespace}/resourceclaims", claim)
    assert code == 201, out
    pod = {
        "metadata": {"name": "kept", "namespace": namespace},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": "mig-a"},
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": "kept-gpu"}],
            "containers": [
                {
                    "name": "c",
                    "image": "registry.k8s.io/pause",
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
    assert code == 201, out
    ck.wait_for(
        lambda: (
            lab.api.request("GET", f"/api/v1/namespaces/{namespace}/pods/kept")[1]["status"].get(
                "phase"
            )
            == "Running"
        ),
        90,
        "the claim's pod Running",
        every=0.5,
    )
    ck.wait_for(lambda: _dra_state(lab, "mig-a") != [], 30, "the claim in dra_manager_state")
    # the API server forgets the pod and the claim while the kubelet is down: only the kubelet's
    # own account still has the claim prepared
    lab.machines.stop_kubelet("mig-a")
    try:
        code, out = lab.api.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/kept", {"gracePeriodSeconds": 0}
        )
        assert code in (200, 202), out
        lab.api.request("DELETE", f"{RES}/namespaces/{namespace}/resourceclaims/kept-gpu")
        ck.wait_for(
            lambda: (
                lab.api.request("GET", f"{RES}/namespaces/{namespace}/resourceclaims/kept-gpu")[0]
                == 404
            ),
            90,
            "the claim gone from the API server",
            every=0.5,
        )
        assert _dra_state(lab, "mig-a") != []
        r = _run(lab, state, "rollback", "--change", change, "--yes", "-o", "json")
        assert r.returncode != 0
        assert "the kubelet's own account says ResourceClaim " in r.stderr, r.stderr[-3000:]
        assert f"{namespace}/kept-gpu prepared" in r.stderr, r.stderr[-3000:]
        assert "(dra_manager_state)" in r.stderr, r.stderr[-3000:]
        assert _path(lab, "mig-a") == "dra"  # the driver was never stopped under the claim
    finally:
        lab.machines.start_kubelet("mig-a")
    lab.machines.wait_ready(["mig-a"], timeout=120)
    # the kubelet's DRA manager unprepares the claim of the gone pod (its reconcile loop)
    ck.wait_for(lambda: _dra_state(lab, "mig-a") == [], 240, "the claim unprepared", every=1)
    r = _run(lab, state, "rollback", "--change", change, "--yes", "-o", "json")
    assert r.returncode == 0, r.stderr[-3000:]
    back = _release_done(state, "mig-a", "restore")["kubelet"]
    assert "dra_manager_state" in back["sources"] and back["held"] == [], back
    assert _path(lab, "mig-a") == "device-plugin"
    ck.wait_for(lambda: _allocatable(lab, "mig-a") == 8, 60, "the plugin's 8 GPUs back")
    assert not ck.unschedulable(lab, "mig-a")
