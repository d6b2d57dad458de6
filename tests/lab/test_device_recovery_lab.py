"""Device identity and failures on real-kubelet lab nodes, through the CLI (issue 21): what GPU
workloads do when the device plugin restarts, when GPUs go unhealthy and come back, and when a
pod fits the node but no single NUMA node. Each test on a fresh node (8 ``nvidia.com/gpu`` from
the fake device plugin, 4 per NUMA node), workloads owned by Deployments:

* a plugin restart during the soak: ``apply --canary`` (single-numa-node, static CPU manager,
  ``gate.requireEvidence``); in the soak a Deployment takes all 8 GPUs (4 pods x 2), then
  ``lab fault plugin-restart``: the running pods keep their GPUs, one deleted pod's replacement
  gets the 2 freed ones, the gate is Successful with nothing rejected and the change holds; the
  canary's ``after`` evidence (podresources ``List``) has every GPU held by exactly one container.
* recovery: ``lab fault device-unhealthy`` (every GPU): a pod bound by ``nodeName`` is rejected
  (``UnexpectedAdmissionError``) and its ReplicaSet's replacements too; a scheduled pod stays
  Pending; ``device-healthy``: both Deployments reach their replicas.
* NUMA fragmentation: after ``apply`` of single-numa-node, two pods of 3 GPUs leave one GPU free
  on each NUMA node: a Deployment of 2 GPUs fits the node (2 free) but no NUMA node, and the
  kubelet rejects it (``TopologyAffinityError``) pod after pod; the pod holding one fragment
  deleted, the workload runs.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.kubelet.device_checkpoint import DEVICE_CHECKPOINT_FILE, parse_device
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_device_faults_lab import _fault
from tests.lab.test_gate import _apply_then, _gate_plan, _gpu_pod_spec, _records, _ts

pytestmark = [pytest.mark.lab]
GPU = "nvidia.com/gpu"
TAE = "TopologyAffinityError"
UAE = "UnexpectedAdmissionError"
# the real kubelet's words (pkg/kubelet/cm/topologymanager, pkg/kubelet/cm/devicemanager,
# pkg/kubelet/cm/admission/errors.go), behind the "Pod was rejected: " of the pod's status
NO_LOCALITY = "Pod was rejected: Resources cannot be allocated with Topology locality"
NO_HEALTHY = (
    "Pod was rejected: Allocate failed due to no healthy devices present; cannot allocate "
    f"unhealthy devices {GPU}, which is unexpected"
)


def _node(lab_nodes: Any) -> str:
    (node,) = lab_nodes(1, kubelet="real").names
    return str(node)


def _inventory(lab: Lab, node: str, path: Path) -> Path:
    """The node as the canary; the real kubelet answers /healthz a few seconds after it starts
    (longer on a loaded machine): the playbook waits up to 60 x 1 s."""
    inv = ck.inventory(lab, [node], [node], path)
    slow = "rollout_kubelet_healthz_retries=60\nrollout_kubelet_healthz_delay=1\n"
    inv.write_text(inv.read_text().replace(ck.FAST_VARS, slow))
    return inv


def _deployment(
    lab: Lab, ns: str, name: str, node: str, gpus: int, replicas: int = 1, bound: bool = False
) -> None:
    """A Deployment of Guaranteed pods (2 CPUs, ``gpus`` GPUs) on ``node``: chosen by the
    scheduler (nodeSelector), or with ``bound`` given to the kubelet directly (``nodeName``)."""
    spec = _gpu_pod_spec(node, gpus)
    if bound:
        del spec["nodeSelector"]
        spec["nodeName"] = node
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {"metadata": {"labels": {"app": name}}, "spec": spec},
        },
    }
    code, out = lab.api.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    assert code == 201, out


def _pods(lab: Lab, ns: str, app: str) -> list[dict[str, Any]]:
    """The Deployment's pods (by its label), deleting ones left out."""
    code, out = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")
    assert code == 200, out
    return [p for p in out["items"] if not p["metadata"].get("deletionTimestamp")]


def _seen(pods: list[dict[str, Any]]) -> list[tuple[str, Any, Any]]:
    """What a failed wait prints: each pod's name, phase and reason."""
    return [
        (p["metadata"]["name"], p["status"].get("phase"), p["status"].get("reason")) for p in pods
    ]


def _running(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [p for p in pods if p["status"].get("phase") == "Running"]


def _rejected(pods: list[dict[str, Any]], reason: str) -> list[dict[str, Any]]:
    return [p for p in pods if p["status"].get("reason") == reason]


def _wait_pods(lab: Lab, ns: str, app: str, ok: Any, timeout: float, what: str) -> Any:
    """Wait until ``ok(pods)`` is truthy; on the deadline, fail printing the pods seen."""
    seen: list[dict[str, Any]] = []

    def check() -> Any:
        nonlocal seen
        seen = _pods(lab, ns, app)
        return ok(seen)

    try:
        return ck.wait_for(check, timeout, what, every=0.25)
    except AssertionError as e:
        raise AssertionError(f"{e}; {app}'s pods: {_seen(seen)}") from None


def _ready(lab: Lab, ns: str, name: str) -> int:
    code, out = lab.api.request("GET", f"/apis/apps/v1/namespaces/{ns}/deployments/{name}")
    assert code == 200, out
    return int(out.get("status", {}).get("readyReplicas") or 0)


def _wait_ready(lab: Lab, ns: str, name: str, replicas: int, timeout: float, what: str) -> None:
    """Wait until the Deployment has ``replicas`` ready; on the deadline, print its pods."""
    try:
        ck.wait_for(lambda: _ready(lab, ns, name) == replicas, timeout, what, every=0.25)
    except AssertionError as e:
        raise AssertionError(f"{e}; {name}'s pods: {_seen(_pods(lab, ns, name))}") from None


def _checkpoint(lab: Lab, node: str) -> tuple[int, dict[str, set[str]], set[str]]:
    """The kubelet's device checkpoint: its mtime, the GPUs of each pod UID, and the healthy
    GPUs it registered."""
    path = lab.machines.node_root(node) / "var/lib/kubelet" / DEVICE_CHECKPOINT_FILE
    mtime = path.stat().st_mtime_ns
    cp = parse_device(path.read_text())
    by_uid: dict[str, set[str]] = {}
    for e in cp.entries or ():
        if e.resource == GPU:
            by_uid.setdefault(e.pod_uid, set()).update(e.devices())
    return mtime, by_uid, set((cp.registered or {}).get(GPU) or ())


@pytest.mark.timeout(240)
def test_a_plugin_restart_in_the_soak_leaves_every_gpu_with_one_container(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    node = _node(lab_nodes)
    inv = _inventory(lab, node, tmp_path / "inv.ini")
    plan = _gate_plan(
        tmp_path / "plan.yaml",
        [node],
        soak="45s",  # the workload below took 35 s at load 11 (CI beside other work)
        probes=True,
        minAdmissions=2,
        requireEvidence=True,
    )
    state = tmp_path / "state"
    env = ck.env(lab, state)
    seen: dict[str, Any] = {}

    def workload_then_restart() -> None:
        # 4 pods x 2 GPUs: every GPU of the node taken (2 pods on each NUMA node)
        _deployment(lab, namespace, "gpu-work", node, 2, replicas=4)
        pods = _wait_pods(
            lab,
            namespace,
            "gpu-work",
            lambda ps: len(r := _running(ps)) == 4 and r,
            60,
            "4 gpu-work pods running",
        )
        mtime, held, _ = _checkpoint(lab, node)
        seen["held"] = {p["metadata"]["name"]: held[p["metadata"]["uid"]] for p in pods}
        got = _fault(lab, env, "plugin-restart", node)
        seen["restarted"] = time.time()
        assert (got["changed"], got["allocatable"]) == (True, 8), got
        # the kubelet has the plugin's devices again once its ListAndWatch update wrote the
        # checkpoint (the Node's allocatable may still be the one from before the restart)
        ck.wait_for(
            lambda: (c := _checkpoint(lab, node))[0] != mtime and len(c[2]) == 8,
            30,
            "the kubelet registering the 8 GPUs again",
        )
        _, after, _ = _checkpoint(lab, node)
        kept = {p["metadata"]["name"]: after.get(p["metadata"]["uid"]) for p in pods}
        assert kept == seen["held"], (kept, seen["held"])  # running pods keep their GPUs
        gone = pods[0]["metadata"]["name"]
        code, body = lab.api.request(
            "DELETE", f"/api/v1/namespaces/{namespace}/pods/{gone}?gracePeriodSeconds=0"
        )
        assert code == 200, body
        seen["gone"] = gone
        _wait_pods(
            lab,
            namespace,
            "gpu-work",
            lambda ps: (
                len(r := _running(ps)) == 4 and gone not in {p["metadata"]["name"] for p in r}
            ),
            60,
            "the replacement of the deleted pod running",
        )
        seen["replaced"] = time.time()

    r = _apply_then(lab, plan, inv, state, node, workload_then_restart)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["outcome"] == "held", out
    assert {n["node"]: n["state"] for n in out["nodes"]} == {node: "applied"}
    (verdict,) = _records(state, "verdict")
    assert verdict.data["outcome"] == "Successful", verdict.data["reason"]
    # the restart and the replacement inside the soak (45 s from the uncordon)
    (uncordon,) = [e for e in _records(state, "uncordon") if e.phase.value == "done"]
    soak = (seen["restarted"] - _ts(uncordon), seen["replaced"] - _ts(uncordon))
    assert verdict.data["at"] > seen["replaced"], f"the soak ended first: {soak}"
    assert not _records(state, "trigger")
    pods = _pods(lab, namespace, "gpu-work")
    assert not [p for p in pods if p["status"].get("phase") == "Failed"], _seen(pods)

    # the canary's 'after' evidence, collected by the gate once the soak passed
    (after,) = [e for e in _records(state, "evidence") if e.data["label"] == "after"]
    checks = {c["name"]: c for c in after.data["checks"]}
    unique = checks["unique-device-ids"]
    assert unique["status"] == "pass", unique
    doc = json.loads(Path(after.data["file"]).read_text())
    (coll,) = [c for c in doc["collections"] if c["label"] == "after"]
    d = coll["nodes"][node]
    assert d["deviceSource"] == "podresources", d.get("podResourcesProblem")
    held: dict[str, list[str]] = {}
    for p in d["pods"]:
        if p["namespace"] == namespace:
            assert p["podResourcesListed"] is True, p
            for c, got in p["podResourcesContainers"].items():
                held[f"{p['name']}/{c}"] = list(got.get("devices", {}).get(GPU) or ())
    gpus = [g for devs in held.values() for g in devs]
    assert len(held) == 4 and len(gpus) == len(set(gpus)) == 8, held  # each GPU in one container
    for name, devs in seen["held"].items():
        if name != seen["gone"]:
            assert set(held[f"{name}/app"]) == devs, (name, held, seen["held"])
    print(
        f"plugin restart {soak[0]:.1f}s and replacement running {soak[1]:.1f}s into the soak; "
        f"test {time.monotonic() - started:.1f}s"
    )


@pytest.mark.timeout(180)
def test_gpu_workloads_rejected_while_unhealthy_run_once_the_gpus_are_healthy(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    node = _node(lab_nodes)
    env = ck.env(lab, tmp_path / "state")
    sick = _fault(lab, env, "device-unhealthy", node)
    assert (sick["capacity"], sick["allocatable"], len(sick["changed"])) == (8, 0, 8), sick

    # bound by nodeName: the kubelet rejects it, and the ReplicaSet's next pod the same way
    _deployment(lab, namespace, "bound", node, 1, bound=True)
    rejected = _wait_pods(
        lab,
        namespace,
        "bound",
        lambda ps: len(r := _rejected(ps, UAE)) >= 2 and r,
        60,
        f"two bound pods rejected with {UAE}",
    )
    assert {p["status"].get("message") for p in rejected} == {NO_HEALTHY}, _seen(rejected)
    assert {p["status"]["phase"] for p in rejected} == {"Failed"}
    # left to the scheduler: no node has a free GPU, it stays Pending
    _deployment(lab, namespace, "scheduled", node, 1)

    def unschedulable(pods: list[dict[str, Any]]) -> Any:
        return [
            p
            for p in pods
            if p["status"].get("phase") == "Pending"
            and any(
                c["type"] == "PodScheduled"
                and c["status"] == "False"
                and f"Insufficient {GPU}" in (c.get("message") or "")
                for c in p["status"].get("conditions") or ()
            )
        ]

    (pending,) = _wait_pods(lab, namespace, "scheduled", unschedulable, 60, "a Pending pod")
    for app in ("bound", "scheduled"):
        assert not _running(_pods(lab, namespace, app)), (app, _seen(_pods(lab, namespace, app)))

    well = _fault(lab, env, "device-healthy", node)
    assert (well["allocatable"], len(well["changed"])) == (8, 8), well
    for app in ("bound", "scheduled"):
        _wait_ready(lab, namespace, app, 1, 60, f"{app} back at its 1 replica")
    (runs,) = _running(_pods(lab, namespace, "bound"))
    assert runs["metadata"]["uid"] not in {p["metadata"]["uid"] for p in rejected}
    (again,) = _running(_pods(lab, namespace, "scheduled"))
    assert again["metadata"]["uid"] == pending["metadata"]["uid"]  # the same pod, scheduled now
    print(f"unhealthy GPUs rejected, healthy again running: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(240)
def test_a_pod_that_fits_the_node_but_no_numa_node_runs_once_the_fragment_is_freed(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    node = _node(lab_nodes)
    inv = _inventory(lab, node, tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", [node], soak="4s", probes=True, minAdmissions=2)
    env = ck.env(lab, tmp_path / "state")
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"],
        env,
        timeout=200,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert json.loads(r.stdout)["outcome"] == "held"
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "single-numa-node"

    # 3 GPUs on each NUMA node (3 + 3 cannot share one of 4): one GPU free on each
    for name in ("hold-a", "hold-b"):
        _deployment(lab, namespace, name, node, 3)
        _wait_pods(lab, namespace, name, _running, 60, f"{name} running")
    _, by_uid, _ = _checkpoint(lab, node)
    assert sum(len(v) for v in by_uid.values()) == 6, by_uid

    _deployment(lab, namespace, "frag", node, 2)  # 2 free on the node, 1 on each NUMA node
    rejected = _wait_pods(
        lab,
        namespace,
        "frag",
        lambda ps: len(r := _rejected(ps, TAE)) >= 2 and r,
        60,
        f"two frag pods rejected with {TAE}",
    )
    assert {p["status"].get("message") for p in rejected} == {NO_LOCALITY}, _seen(rejected)
    assert not _running(_pods(lab, namespace, "frag"))

    code, body = lab.api.request(
        "DELETE", f"/apis/apps/v1/namespaces/{namespace}/deployments/hold-b"
    )
    assert code == 200, body
    _wait_ready(lab, namespace, "frag", 1, 90, "frag running once hold-b is gone")
    print(f"NUMA fragment rejected, freed, running: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(240)
def test_a_pod_rejected_while_the_plugin_is_away_in_the_soak_fails_the_canary_and_runs_again(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    """The plugin away long enough for an admission (``plugin-stop``, then ``plugin-start``: the
    restart in two steps; ``plugin-restart`` is away too briefly to hit): a pod bound then is
    rejected, the gate counts the rejections of that time (that pod's, or a probe pod's
    TopologyAffinityError, whichever it sees first) and rolls the canary back (fail closed: the
    gate cannot tell a plugin's absence from the change's doing), and the ReplicaSet's next pod
    runs once the GPUs are back: the recovery record says so."""
    started = time.monotonic()
    node = _node(lab_nodes)
    inv = _inventory(lab, node, tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", [node], soak="15s", probes=True, minAdmissions=2)
    state = tmp_path / "state"
    env = ck.env(lab, state)
    before = ck.snapshot(lab, node)

    def plugin_away() -> None:
        _fault(lab, env, "plugin-stop", node)
        _deployment(lab, namespace, "bound", node, 1, bound=True)
        rejected = _wait_pods(
            lab,
            namespace,
            "bound",
            lambda ps: _rejected(ps, UAE),
            60,
            f"a bound pod rejected with {UAE}",
        )
        assert {p["status"].get("message") for p in rejected} == {NO_HEALTHY}, _seen(rejected)
        _fault(lab, env, "plugin-start", node)

    r = _apply_then(lab, plan, inv, state, node, plugin_away)
    assert r.returncode == 5, (r.returncode, r.stderr[-3000:])
    out = json.loads(r.stdout)
    assert out["outcome"] == "rolled-back" and out["cause"] == "gate-failed", out
    assert {n["node"]: n["state"] for n in out["nodes"]} == {node: "restored"}
    (verdict,) = _records(state, "verdict")
    # the first rejections the gate sees while the GPUs are gone: the bound pod's
    # UnexpectedAdmissionError, or a probe pod's TopologyAffinityError (no GPU hint can be met)
    assert verdict.data["outcome"] == "Failed", verdict.data
    assert UAE in verdict.data["reason"] or TAE in verdict.data["reason"], verdict.data
    (recovery,) = _records(state, "recovery")
    (owner,) = recovery.data["running"]
    assert owner.startswith(f"ReplicaSet/{namespace}/bound-") and not recovery.data["notRunning"]
    assert f"Running again after the rollback: {owner}" in out["message"]
    assert ck.snapshot(lab, node) == before  # byte for byte
    _wait_ready(lab, namespace, "bound", 1, 30, "bound at its 1 replica")
    print(f"plugin away in the soak, rolled back, running again: {time.monotonic() - started:.1f}s")
