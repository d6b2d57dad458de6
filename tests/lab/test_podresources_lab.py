"""In the lab: ``rollout evidence`` reads the real kubelet's podresources API and it agrees with the
kubelet's checkpoints.

One real-kubelet kubeadm node with the static CPU manager and ``single-numa-node``; two
Guaranteed pods with one GPU and 2 CPUs each (exclusive). ``rollout evidence --label after``
(the collection ``apply`` runs too: the facts module on the node, over ssh) then shows each pod's
GPU and exclusive CPUs from the kubelet's ``v1.PodResourcesLister/List`` (``deviceSource`` and
``cpuSource`` ``podresources``), the healthy set from ``GetAllocatableResources``, and the check
``podresources-matches-checkpoint`` passes: the same GPU as ``kubelet_internal_checkpoint`` and
the same CPUs as ``cpu_manager_state``, read from the node's files here. With the socket removed,
the checkpoint is the source again and the evidence says why.
"""

from __future__ import annotations

import calendar
import json
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.evidence.checks import CGROUP_NOTE
from rollout.kubelet.checkpoints import CPU_STATE_FILE
from rollout.kubelet.cpuset import parse as parse_cpuset
from rollout.kubelet.device_checkpoint import DEVICE_CHECKPOINT_FILE, parse_device
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_lab_kubelet import _configure, _get, _phase, _pod, _wait_policy

pytestmark = pytest.mark.lab
GPU = "nvidia.com/gpu"
GPU1 = {"cpu": "2", "memory": "64Mi", GPU: "1"}


def _posted_since(lab: Lab, node: str, since: int, resource: str) -> str | None:
    """The Node's allocatable ``resource`` if its kubelet posted the status at or after ``since``
    (the Ready condition's heartbeat: every status post sets it), else None."""
    status = lab.api.request("GET", f"/api/v1/nodes/{node}")[1]["status"]
    ready = [c for c in status.get("conditions") or () if c.get("type") == "Ready"]
    beat = ready[0].get("lastHeartbeatTime") if ready else None
    if not beat or calendar.timegm(time.strptime(beat, "%Y-%m-%dT%H:%M:%SZ")) < since:
        return None
    return status["allocatable"].get(resource)


@pytest.mark.timeout(300)
def test_evidence_reads_the_real_kubelets_podresources_and_it_agrees_with_the_checkpoints(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    made = lab_nodes(1, kubelet="real")
    (node,) = made.names
    restarted = int(time.time())  # the Node's timestamps are whole seconds
    _configure(
        lab,
        node,
        {
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0,32",
            "topologyManagerPolicy": "single-numa-node",
        },
    )
    _wait_policy(lab, node, "single-numa-node")
    lab.machines.wait_ready([node], timeout=30)
    # all 8 GPUs allocatable in a status the restarted kubelet posted: the one on the API right
    # after the restart may be the old kubelet's (8), and the new one posts 0 until the device
    # plugin registers again (CI saw evidence taken in that window)
    ck.wait_for(
        lambda: _posted_since(lab, node, restarted, GPU) == "8", 60, "all 8 GPUs allocatable"
    )
    uids = {}
    for name in ("pr-a", "pr-b"):
        code, body = lab.api.request(
            "POST", f"/api/v1/namespaces/{namespace}/pods", _pod(name, node, GPU1)
        )
        assert code == 201, body
    for name in ("pr-a", "pr-b"):
        ck.wait_for(
            lambda n=name: _phase(lab, namespace, n).get("phase") == "Running", 60, f"{name} up"
        )
        uids[name] = _get(lab, f"/api/v1/namespaces/{namespace}/pods/{name}")["metadata"]["uid"]
    # the 8 waited for above may have been the old kubelet's last post (heartbeats have whole
    # seconds, and the old kubelet posts while the config is written); the pods ran on the new
    # one, so its device plugin is registered: wait until the Node says so again (CI saw the new
    # kubelet's 0, posted before the plugin registered, at evidence time)
    ck.wait_for(
        lambda: _posted_since(lab, node, restarted, GPU) == "8", 60, "8 GPUs allocatable again"
    )
    root = lab.machines.node_root(node) / "var/lib/kubelet"
    assert (root / "pod-resources/kubelet.sock").is_socket()

    env = ck.env(lab, tmp_path / "state")
    out = tmp_path / "evidence.json"
    args = ["evidence", "--label", "after", "-i", str(made.inventory), "--out", str(out)]
    r = ck.cli([*args, "-o", "json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    checks = {c["name"]: c for c in doc["checks"]}
    d = doc["collection"]["nodes"][node]
    assert (d["deviceSource"], d["cpuSource"], d["healthySource"]) == ("podresources",) * 3, d
    assert "podResourcesProblem" not in d, d["podResourcesProblem"]
    agree = checks["podresources-matches-checkpoint"]
    assert agree["status"] == "pass" and agree["checked"] >= 2, agree
    assert CGROUP_NOTE in agree["notes"], agree  # the fake runtime creates no container cgroup
    for name in ("unique-device-ids", "allocatable-matches-healthy", "numa-aligned"):
        assert checks[name]["status"] == "pass", json.dumps(checks[name])

    # what podresources said, against the node's own files
    cp = parse_device((root / DEVICE_CHECKPOINT_FILE).read_text())
    by_uid = {e.pod_uid: set(e.devices()) for e in cp.entries or () if e.resource == GPU}
    state = json.loads((root / CPU_STATE_FILE).read_text())
    pods = {p["name"]: p for p in d["pods"] if p["namespace"] == namespace}
    gpus = []
    for name, uid in uids.items():
        p = pods[name]
        assert p["podResourcesListed"] is True, p
        (dev,) = p["devices"][GPU]
        assert {dev} == by_uid[uid], (p, by_uid)
        assert p["podResourcesContainers"]["app"]["devices"] == {GPU: [dev]}, p
        cpus = parse_cpuset(p["cpus"])
        assert len(cpus) == 2 and cpus == parse_cpuset(state["entries"][uid]["app"]), (p, state)
        assert p["cpuSource"] == "podresources"
        gpus.append(dev)
    assert len(set(gpus)) == 2
    assert d["healthyDevices"] == {GPU: len(d["allocatableDevices"][GPU])}
    assert set(d["allocatableDevices"][GPU]) == set((cp.registered or {}).get(GPU) or ())

    # the socket gone (the kubelet still serves the unlinked one): the checkpoint is the source
    # again, the evidence says why, and the agreement is not collected (never a pass)
    (root / "pod-resources/kubelet.sock").unlink()
    r = ck.cli([*args, "-o", "json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout)
    d = doc["collection"]["nodes"][node]
    assert d["deviceSource"] == d["healthySource"] == "kubelet_internal_checkpoint", d
    assert d["podResourcesProblem"].startswith("no podresources socket"), d
    checks = {c["name"]: c for c in doc["checks"]}
    assert checks["podresources-matches-checkpoint"]["status"] == "not-collected"
    assert checks["unique-device-ids"]["status"] == "pass"
    pods = {p["name"]: p for p in d["pods"] if p["namespace"] == namespace}
    assert {n: pods[n]["devices"][GPU] for n in uids} == {
        n: sorted(by_uid[u]) for n, u in uids.items()
    }
    print(f"podresources evidence on the real kubelet: {time.monotonic() - started:.1f}s")
