"""The real kubelet binary in lab nodes (``--kubelet real``): Ready, /configz from the node's own
files, the real CPU manager's checkpoint and exclusive CPUs, a real Topology Manager rejection,
GPUs with their NUMA node from the fake device plugin, and nothing of the host changed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.kubelet import checkpoints as ck
from rollout.kubelet import quantity
from rollout.kubelet.cpuset import parse
from rollout.lab import realhw, realnode
from rollout.lab.cluster import Lab
from rollout.lab.hardware import NodeShape
from rollout.lab.labnodes import UNINITIALIZED_TAINT
from rollout.lab.network import netns_pids
from tests.lab.changekit import wait_for as _wait

REJECTED = "Pod was rejected: Resources cannot be allocated with Topology locality"


def _get(lab: Lab, path: str) -> Any:
    code, body = lab.api.request("GET", path)
    assert code == 200, (path, code, body)
    return body


def _configz(lab: Lab, node: str) -> dict[str, Any] | None:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/configz", timeout=3)
    return body.get("kubeletconfig") if code == 200 and isinstance(body, dict) else None


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


def _host_tunables() -> dict[str, str]:
    return {
        t: Path("/proc/sys", t).read_text()
        for t in realhw.KERNEL_TUNABLES
        if Path("/proc/sys", t).exists()
    }


def _host_mounts() -> set[str]:
    """The host's mounts, less network namespaces (other labs on the machine add and remove
    theirs at any time; ours are checked by name)."""
    mounts = (" ".join(x.split()[3:5]) for x in Path("/proc/1/mountinfo").read_text().splitlines())
    return {m for m in mounts if not m.split()[1].startswith("/run/netns/")}


def _cgroups() -> set[str]:
    out: set[str] = set()
    for sub in ("cpu", "memory", "cpuset", "pids", "systemd", "unified"):
        base = Path("/sys/fs/cgroup", sub)
        if base.is_dir():
            out |= {str(p) for p in base.iterdir() if p.is_dir()}
    return out


def _kube_entries() -> set[str]:
    return {
        str(p)
        for d in (Path("/run"), Path("/tmp"))
        for p in d.iterdir()
        if any(w in p.name for w in ("kube", "cri", "device-plugin", "rollout-lab-node"))
    }


def _exe(pid: int) -> Path | None:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe"))
    except OSError:
        return None


@pytest.mark.lab
@pytest.mark.timeout(300)
def test_real_kubelet_nodes(lab: Lab, lab_nodes: Any, namespace: str) -> None:
    tunables, mounts, cgroups = _host_tunables(), _host_mounts(), _cgroups()
    run = _kube_entries()
    made = lab_nodes(2, kubelet="real")
    a, b = made.names
    version = str(lab.api.version()["gitVersion"])

    # --- Ready, registered by the real kubelet of the lab's version, on the simulated hardware
    for name in (a, b):
        obj = _get(lab, f"/api/v1/nodes/{name}")
        ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "KubeletReady")
        assert obj["status"]["nodeInfo"]["kubeletVersion"] == version
        assert obj["status"]["nodeInfo"]["containerRuntimeVersion"].startswith("fakeRuntime")
        shape = NodeShape()
        assert obj["status"]["capacity"]["cpu"] == str(shape.cpus)
        assert quantity.parse(obj["status"]["capacity"]["memory"]).value == shape.memory_bytes
        assert obj["metadata"]["labels"]["rollout.dev/lab"] == lab.name

    # --- GPUs from the fake device plugin (registration is asynchronous)
    def gpus() -> bool:
        cap = _get(lab, f"/api/v1/nodes/{a}")["status"]["capacity"]
        return cap.get("nvidia.com/gpu") == "8"

    _wait(gpus, 60, f"{a} advertising 8 nvidia.com/gpu")

    # --- /configz is the node's own file merged by the real kubelet (plus the lab flags)
    cfg = _wait(lambda: _configz(lab, a), 30, "configz through the node proxy")
    on_node = yaml.safe_load(
        (lab.machines.node_root(a) / "var/lib/kubelet/config.yaml").read_text()
    )
    assert cfg["staticPodPath"] == on_node["staticPodPath"]
    assert cfg["clusterDNS"] == on_node["clusterDNS"]
    assert cfg["cpuManagerPolicy"] == "none"
    assert (cfg["failSwapOn"], cfg["cgroupsPerQOS"]) == (False, False)  # lab flags
    # the kubelet wrote its tunables inside the node only
    for sysctl, want in (("vm/overcommit_memory", "1"), ("kernel/panic", "10")):
        r = lab.machines.node_exec(a, "cat", f"/proc/sys/{sysctl}")
        assert r.stdout.strip() == want, (sysctl, r.stdout, r.stderr)

    # --- static CPU manager + single-numa-node Topology Manager, as apply would write them
    root = lab.machines.node_root(a)
    path = root / "var/lib/kubelet/config.yaml"
    lab.machines.stop_kubelet(a)
    on_node.update(
        {
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0,32",
            "topologyManagerPolicy": "single-numa-node",
        }
    )
    path.write_text(yaml.safe_dump(on_node, sort_keys=True))
    (root / "var/lib/kubelet" / ck.CPU_STATE_FILE).unlink(missing_ok=True)
    lab.machines.start_kubelet(a)

    def static() -> bool:
        c = _configz(lab, a)
        return bool(c and c.get("topologyManagerPolicy") == "single-numa-node")

    _wait(static, 60, f"{a} serving the static/single-numa-node config")
    cpu_state = root / "var/lib/kubelet" / ck.CPU_STATE_FILE

    def filled() -> Any:
        # the real kubelet writes the checkpoint twice at start: empty when it finds none
        # (state_checkpoint restoreState), then with the shared pool once the static policy's
        # Start has set it; the first write is a moment, not a bug
        if not cpu_state.exists():
            return None
        s = json.loads(cpu_state.read_text())
        return s if s.get("defaultCpuSet") else None

    state = _wait(filled, 30, "the real CPU manager's checkpoint with its shared pool")
    assert state["policyName"] == "static" and "checksum" in state
    assert parse(state["defaultCpuSet"]) == set(range(64))
    _wait(gpus, 60, f"{a} advertising GPUs again after the restart")

    # --- a Guaranteed pod gets exclusive CPUs on one NUMA node; a GPU comes from that node
    ns = f"/api/v1/namespaces/{namespace}/pods"
    code, body = lab.api.request("POST", ns, _pod("fits", a, {"cpu": "4", "memory": "1Gi"}))
    assert code == 201, body
    pod = _get(lab, f"{ns}/fits")
    uid = pod["metadata"]["uid"]

    def assigned() -> Any:
        s = json.loads((root / "var/lib/kubelet" / ck.CPU_STATE_FILE).read_text())
        return (s.get("entries") or {}).get(uid)

    entry = _wait(assigned, 60, "the real CPU manager's assignment for pod fits")
    cpus = parse(entry["app"])
    assert len(cpus) == 4 and not cpus & {0, 32}
    numa0, numa1 = set(NodeShape().numa_cpus(0)), set(NodeShape().numa_cpus(1))
    assert cpus <= numa0 or cpus <= numa1
    state = json.loads((root / "var/lib/kubelet" / ck.CPU_STATE_FILE).read_text())
    assert not parse(state["defaultCpuSet"]) & cpus  # exclusive

    def running() -> bool:
        return bool(_get(lab, f"{ns}/fits").get("status", {}).get("phase") == "Running")

    _wait(running, 60, "pod fits Running (sandbox and container from the fake CRI)")

    # --- more CPUs than one NUMA node has: the real Topology Manager rejects it
    code, body = lab.api.request("POST", ns, _pod("too-big", a, {"cpu": "40", "memory": "1Gi"}))
    assert code == 201, body

    def rejected() -> Any:
        st = _get(lab, f"{ns}/too-big").get("status", {})
        return st if st.get("phase") == "Failed" else None

    st = _wait(rejected, 60, "pod too-big rejected")
    assert (st["reason"], st["message"]) == ("TopologyAffinityError", REJECTED)

    # --- a GPU pod: the device manager's real checkpoint names the device, on the CPUs' node
    gpu = {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "1"}
    code, body = lab.api.request("POST", ns, _pod("gpu", a, gpu))
    assert code == 201, body
    gpu_uid = _get(lab, f"{ns}/gpu")["metadata"]["uid"]
    dev_ck = root / "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"

    def device() -> Any:
        if not dev_ck.exists():
            return None
        data = json.loads(dev_ck.read_text())["Data"]
        for e in data.get("PodDeviceEntries") or ():
            if e["PodUID"] == gpu_uid:
                return e
        return None

    e = _wait(device, 60, "the device manager's checkpoint entry for pod gpu")
    gpu_numa = {f"GPU-{i}": 0 if i < 4 else 1 for i in range(8)}
    dev_nodes = {gpu_numa[d] for ids in e["DeviceIDs"].values() for d in ids}

    def gpu_cpus() -> Any:
        s = json.loads((root / "var/lib/kubelet" / ck.CPU_STATE_FILE).read_text())
        return (s.get("entries") or {}).get(gpu_uid, {}).get("app")

    cpus_of_gpu_pod = parse(_wait(gpu_cpus, 30, "the CPUs of pod gpu"))
    want = numa0 if dev_nodes == {0} else numa1
    assert len(dev_nodes) == 1 and cpus_of_gpu_pod <= want

    # --- nothing of the host changed; removing the nodes leaves no process, mount or cgroup
    assert _host_tunables() == tunables
    bin_dir = realnode.find_kubelet_bin_dir().resolve()
    pids = [p for x in made.nodes for p in netns_pids(x.netns)]
    exes = {_exe(p) for p in pids}
    assert {bin_dir / b for b in realnode.BINARIES} <= exes, exes
    lab.machines.remove_nodes([a, b])
    _wait(lambda: not any(_exe(p) for p in pids), 15, "no process of the real-kubelet nodes")
    assert _host_mounts() == mounts
    assert _cgroups() == cgroups
    assert _kube_entries() == run  # /run is not a node overlay: nothing kubelet-ish was left there
    assert _host_tunables() == tunables
    for x in made.nodes:
        assert not (lab.dir / "nodes" / x.name).exists()
        assert not Path("/run/netns", x.netns).exists()


#: the distributions whose kubelet config sets protectKernelDefaults: true, and that config's path
PROTECTED = {
    "eks-al2": "etc/kubernetes/kubelet/kubelet-config.json",
    "eks-al2023": "etc/kubernetes/kubelet/config.json",
    "kubespray": "etc/kubernetes/kubelet-config.yaml",
}


@pytest.mark.lab
@pytest.mark.timeout(240)
def test_protect_kernel_defaults_distributions_register(lab: Lab, lab_nodes: Any) -> None:
    """EKS AL2, EKS AL2023 and kubespray run their kubelet with ``protectKernelDefaults: true``:
    the real kubelet then checks the kernel tunables instead of setting them and exits ("invalid
    kernel flag: vm/overcommit_memory, expected value: 1, actual value: 0") unless the machine
    already has its values, which those distributions' images and installers set in a sysctl
    file. The nodes boot with that file's values and register, with the distribution's
    ``protectKernelDefaults`` and flags unchanged."""
    tunables, cgroups = _host_tunables(), _cgroups()
    made = lab_nodes(3, distribution=",".join(PROTECTED), kubelet="real")
    for node in made.nodes:
        obj = _get(lab, f"/api/v1/nodes/{node.name}")
        ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
        assert (ready["status"], ready["reason"]) == ("True", "KubeletReady"), node.distribution
        # the lab stands in for the cloud controller that initialises an external-cloud Node
        taints = {t["key"] for t in obj.get("spec", {}).get("taints") or ()}
        assert UNINITIALIZED_TAINT not in taints, node.distribution
        on_node = yaml.safe_load(
            (lab.machines.node_root(node.name) / PROTECTED[node.distribution]).read_text()
        )
        assert on_node["protectKernelDefaults"] is True
        cfg = _wait(lambda n=node.name: _configz(lab, n), 30, f"configz of {node.name}")
        assert cfg["protectKernelDefaults"] is True, node.distribution
        # the node's tunables are its sysctl file's values (the kubelet only read them)
        path, _content = realhw.DISTRIBUTION_SYSCTL_FILES[node.distribution]
        assert (lab.machines.node_root(node.name) / path.lstrip("/")).exists()
        for sysctl, want in (
            ("vm/overcommit_memory", "1"),
            ("kernel/panic", "10"),
            ("kernel/panic_on_oops", "1"),
        ):
            r = lab.machines.node_exec(node.name, "cat", f"/proc/sys/{sysctl}")
            assert r.stdout.strip() == want, (node.distribution, sysctl, r.stdout, r.stderr)
        log = (lab.machines.node_root(node.name) / "var/log/kubelet.log").read_text(
            errors="replace"
        )
        assert "invalid kernel flag" not in log, node.distribution
    assert _host_tunables() == tunables
    assert _cgroups() == cgroups  # kubespray's kubeletCgroups did not make a host cgroup
