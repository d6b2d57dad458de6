"""The simulated kubelet checked against the real one: the same scenarios on a ``sim`` and a
``real`` node side by side (config merge as ``/configz`` shows it, the start-up refusal on a stale
``cpu_manager_state``, the checkpoint the CPU manager writes, admission of the same pods under
``static`` + ``single-numa-node``). Differences that are known and explained are listed in
``docs/lab-real-kubelet.md`` ("Known differences"); anything else fails here."""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml

from rollout.kubelet import checkpoints as ck
from rollout.lab.cluster import Lab
from rollout.lab.kubelet.klog import unquote
from rollout.lab.realnode import LAB_FLAG_FIELDS
from tests.lab.changekit import wait_for as _wait

# Known difference (docs/lab-real-kubelet.md, "Known differences"): the real kubelet takes the
# runtime's cgroup driver (the fake CRI says cgroupfs; the node's file says systemd). The sim's
# /configz applies the kubelet's defaulting (rollout/lab/kubelet/defaults.py), so no other field
# may differ.
SIM_DIFFERS = frozenset(["cgroupDriver"])
# what the tool changes and verifies: these must agree exactly
MANAGER_FIELDS = (
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "cpuManagerReconcilePeriod",
    "memoryManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
    "reservedSystemCPUs",
    "reservedMemory",
    "kubeReserved",
    "systemReserved",
    "featureGates",
    "staticPodPath",
    "clusterDNS",
    "clusterDomain",
    "maxPods",
)
STALE = (
    'could not restore state from checkpoint: configured policy "static" differs from state '
    'checkpoint policy "none", please drain this node and delete the CPU manager checkpoint '
    'file "/var/lib/kubelet/cpu_manager_state" before restarting Kubelet'
)
STATIC = {
    "cpuManagerPolicy": "static",
    "reservedSystemCPUs": "0,32",
    "topologyManagerPolicy": "single-numa-node",
}
PODS = {
    "cpu4": {"cpu": "4", "memory": "1Gi"},
    "cpu40": {"cpu": "40", "memory": "1Gi"},
    "gpu1": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"},
    "gpu5": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "5"},
}


def _configz(lab: Lab, node: str) -> dict[str, Any] | None:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/configz", timeout=3)
    return body.get("kubeletconfig") if code == 200 and isinstance(body, dict) else None


def _flat(d: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(d, dict):
        out: dict[str, Any] = {}
        for k, v in d.items():
            out.update(_flat(v, f"{prefix}.{k}" if prefix else k))
        return out
    return {prefix: d}


def _pod(name: str, node: str, requests: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": requests, "limits": requests},
                }
            ],
        },
    }


def _outcome(lab: Lab, ns: str, name: str) -> Any:
    """("Failed", reason) once rejected, ("Admitted", None) once the kubelet has accepted it."""
    code, pod = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    st = pod.get("status", {}) if code == 200 else {}
    if st.get("phase") == "Failed":
        return ("Failed", st.get("reason"))
    if st.get("phase") in ("Running", "Pending") and st.get("containerStatuses"):
        return ("Admitted", None)
    return None


@pytest.mark.lab
@pytest.mark.timeout(300)
def test_sim_and_real_kubelet_agree(lab: Lab, lab_nodes: Any, namespace: str) -> None:
    (sim,) = lab_nodes(1, kubelet="sim").names
    (real,) = lab_nodes(1, kubelet="real").names
    nodes = {"sim": sim, "real": real}

    # --- config merge: /configz of the same files
    cz = {k: _wait(lambda n=n: _configz(lab, n), 30, f"{n} configz") for k, n in nodes.items()}
    fs, fr = _flat(cz["sim"]), _flat(cz["real"])
    differ = {k.split(".")[0] for k in set(fs) | set(fr) if fs.get(k) != fr.get(k)}
    unknown = differ - LAB_FLAG_FIELDS - SIM_DIFFERS
    assert unknown == set(), {k: (cz["sim"].get(k), cz["real"].get(k)) for k in unknown}
    assert {k: cz["sim"].get(k) for k in MANAGER_FIELDS} == {
        k: cz["real"].get(k) for k in MANAGER_FIELDS
    }

    # --- the CPU manager's first checkpoint under policy none
    for n in nodes.values():
        st = json.loads(
            (lab.machines.node_root(n) / "var/lib/kubelet" / ck.CPU_STATE_FILE).read_text()
        )
        assert st["policyName"] == "none", (n, st)

    # --- start-up refusal: static policy over the stale "none" checkpoint, same words
    for n in nodes.values():
        root = lab.machines.node_root(n)
        lab.machines.stop_kubelet(n)
        path = root / "var/lib/kubelet/config.yaml"
        cfg = yaml.safe_load(path.read_text())
        cfg.update(STATIC)
        path.write_text(yaml.safe_dump(cfg, sort_keys=True))
        lab.machines.start_kubelet(n)
    for n in nodes.values():
        log = lab.machines.node_root(n) / "var/log/kubelet.log"
        _wait(lambda log=log: STALE in unquote(log.read_text(errors="replace")), 30, f"{n} error")

    # --- removing the checkpoint lets both start; the new checkpoint agrees
    for n in nodes.values():
        (lab.machines.node_root(n) / "var/lib/kubelet" / ck.CPU_STATE_FILE).unlink()
    lab.machines.wait_ready(list(nodes.values()), timeout=60)
    states = {}
    for k, n in nodes.items():

        def fresh(n: str = n) -> Any:
            c = _configz(lab, n)
            if not (c and c.get("cpuManagerPolicy") == "static"):
                return None
            p = lab.machines.node_root(n) / "var/lib/kubelet" / ck.CPU_STATE_FILE
            return ck.parse_cpu(p.read_text()) if p.exists() else None

        states[k] = _wait(fresh, 60, f"{n} static checkpoint")
    # the real kubelet creates the file, then its static policy fills in the default set: wait
    # (a lasting difference times out here)
    want = (states["sim"].policy_name, states["sim"].default_cpu_set)

    def same() -> bool:
        st = fresh(real)
        return bool(st and (st.policy_name, st.default_cpu_set) == want)

    _wait(same, 30, f"the real checkpoint to match the sim's {want}")
    assert want == ("static", "0-63")

    def gpus(n: str) -> bool:
        code, obj = lab.api.request("GET", f"/api/v1/nodes/{n}")
        return code == 200 and obj["status"]["allocatable"].get("nvidia.com/gpu") == "8"

    _wait(lambda: gpus(real), 60, "GPUs on the real node")

    # --- admission of the same pods, one at a time, in the same order
    got: dict[str, dict[str, Any]] = {"sim": {}, "real": {}}
    for pod, req in PODS.items():
        for k, n in nodes.items():
            name = f"{k}-{pod}"
            code, body = lab.api.request(
                "POST", f"/api/v1/namespaces/{namespace}/pods", _pod(name, n, req)
            )
            assert code == 201, body
            got[k][pod] = _wait(
                lambda name=name: _outcome(lab, namespace, name), 60, f"{name} admitted/rejected"
            )
    assert got["sim"] == got["real"], got
    assert got["real"]["cpu40"] == ("Failed", "TopologyAffinityError")
    assert got["real"]["cpu4"] == ("Admitted", None)
