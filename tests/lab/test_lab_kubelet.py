"""The lab kubelet against the real control plane: Ready/Lease, configz and metrics through the node
proxy, Topology Manager rejections, Deployments that keep producing rejected pods, the checkpoint
crash loop, NotReady when stopped. Plus start-up behaviour as a plain process (no lab needed).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.kubelet import checkpoints as ck
from rollout.kubelet import memory_state as mck
from rollout.lab.cluster import Lab
from rollout.lab.kubelet.klog import unquote
from tests.lab.changekit import wait_for as _wait

CPU40 = {"cpu": "40", "memory": "1Gi"}
REJECTED = "Pod was rejected: Resources cannot be allocated with Topology locality"


def _get(lab: Lab, path: str) -> Any:
    code, body = lab.api.request("GET", path)
    assert code == 200, (path, code, body)
    return body


def _configure(lab: Lab, node: str, fields: dict[str, Any], *, reset: bool = True) -> None:
    """Edit the node's kubeadm KubeletConfiguration and restart its kubelet (as ``apply`` does:
    stop, remove the checkpoints, write, start)."""
    root = lab.machines.node_root(node)
    path = root / "var/lib/kubelet/config.yaml"
    lab.machines.stop_kubelet(node)
    cfg = yaml.safe_load(path.read_text())
    cfg.update(fields)
    path.write_text(yaml.safe_dump(cfg, sort_keys=True))
    if reset:
        for f in (ck.CPU_STATE_FILE, ck.MEMORY_STATE_FILE):
            (root / "var/lib/kubelet" / f).unlink(missing_ok=True)
    lab.machines.start_kubelet(node)


def _configz(lab: Lab, node: str) -> dict[str, Any] | None:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/configz", timeout=3)
    return body.get("kubeletconfig") if code == 200 and isinstance(body, dict) else None


def _wait_policy(lab: Lab, node: str, topology: str) -> None:
    def live() -> bool:
        cfg = _configz(lab, node)
        return bool(cfg and cfg.get("topologyManagerPolicy") == topology)

    _wait(live, 20, f"{node} serving topologyManagerPolicy={topology}")


def _pod(name: str, node: str, requests: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": name}},
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


def _phase(lab: Lab, ns: str, name: str) -> dict[str, Any]:
    return _get(lab, f"/api/v1/namespaces/{ns}/pods/{name}").get("status", {})


STATIC = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,32"}


@pytest.mark.lab
@pytest.mark.timeout(90)
def test_node_ready_lease_configz_and_metrics(lab: Lab, lab_nodes: Any) -> None:
    (node,) = lab_nodes(1).names
    obj = _get(lab, f"/api/v1/nodes/{node}")
    ready = next(c for c in obj["status"]["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "True",
        "KubeletReady",
        "kubelet is posting ready status",
    )
    assert obj["status"]["capacity"]["nvidia.com/gpu"] == "8"
    assert obj["status"]["daemonEndpoints"]["kubeletEndpoint"]["Port"] == 10250
    lease = _get(lab, f"/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases/{node}")
    assert lease["spec"]["holderIdentity"] == node
    cfg = _wait(lambda: _configz(lab, node), 10, "configz through the node proxy")
    # as the real kubelet serves it: the versioned config with its TypeMeta, defaults filled in
    # (kubeadm's "0s" durations included)
    assert cfg["kind"] == "KubeletConfiguration" and cfg["cpuManagerPolicy"] == "none"
    assert cfg["runtimeRequestTimeout"] == "2m0s" and cfg["port"] == 10250
    code, text = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/metrics")
    assert code == 200 and "kubelet_topology_manager_admission_requests_total 0" in text
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/healthz")
    assert (code, body) == (200, "ok")
    # the plain-HTTP healthz port the restart step polls, on the node's own loopback
    r = lab.machines.node_exec(
        node, sys.executable, "-c",
        "import urllib.request as u; print(u.urlopen('http://127.0.0.1:10248/healthz').read())",
    )  # fmt: skip
    assert r.stdout.strip() == "b'ok'", r.stderr


@pytest.mark.lab
@pytest.mark.timeout(120)
def test_single_numa_node_rejects_what_none_admits(
    lab: Lab, lab_nodes: Any, namespace: str
) -> None:
    strict, loose = lab_nodes(2).names
    _configure(lab, strict, {**STATIC, "topologyManagerPolicy": "single-numa-node"})
    _configure(lab, loose, {**STATIC, "topologyManagerPolicy": "none"})
    _wait_policy(lab, strict, "single-numa-node")
    _wait_policy(lab, loose, "none")
    lab.machines.wait_ready([strict, loose], timeout=20)
    ns = namespace
    # 40 CPUs fit the node (62 allocatable) but not one NUMA node (32 CPUs each)
    for name, node in (("big-strict", strict), ("big-loose", loose)):
        code, body = lab.api.request(
            "POST", f"/api/v1/namespaces/{ns}/pods", _pod(name, node, CPU40)
        )
        assert code == 201, body
    failed = _wait(
        lambda: (s := _phase(lab, ns, "big-strict")).get("phase") == "Failed" and s,
        30,
        "the rejection",
    )
    assert failed["reason"] == "TopologyAffinityError"
    assert failed["message"] == REJECTED
    _wait(lambda: _phase(lab, ns, "big-loose").get("phase") == "Running", 30, "admission")
    events = _get(lab, f"/api/v1/namespaces/{ns}/events")["items"]
    ev = next(
        e
        for e in events
        if e["involvedObject"]["name"] == "big-strict" and e["source"].get("component") == "kubelet"
    )
    assert (ev["type"], ev["reason"], ev["source"]) == (
        "Warning",
        "TopologyAffinityError",
        {"component": "kubelet", "host": strict},
    )
    assert ev["message"] == "Resources cannot be allocated with Topology locality"
    code, text = lab.api.request("GET", f"/api/v1/nodes/{strict}/proxy/metrics")
    assert "kubelet_topology_manager_admission_errors_total 1" in text
    assert 'kubelet_admission_rejections_total{reason="TopologyAffinityError"} 1' in text
    # the admitted pod holds 40 exclusive CPUs, recorded in the kubelet's checkpoint
    uid = _get(lab, f"/api/v1/namespaces/{ns}/pods/big-loose")["metadata"]["uid"]
    state = ck.parse_cpu(
        (lab.machines.node_root(loose) / "var/lib/kubelet/cpu_manager_state").read_text()
    )
    assert len(state.assigned()) == 40 and uid in state.entries
    # 6 GPUs fit the node (8) but not one NUMA node (4 each); 2 GPUs do
    gpus6 = {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "6"}
    gpus2 = {**gpus6, "nvidia.com/gpu": "2"}
    for name, req in (("gpu6", gpus6), ("gpu2", gpus2)):
        code, body = lab.api.request(
            "POST", f"/api/v1/namespaces/{ns}/pods", _pod(name, strict, req)
        )
        assert code == 201, body
    _wait(lambda: _phase(lab, ns, "gpu6").get("reason") == "TopologyAffinityError", 30, "gpu6")
    _wait(lambda: _phase(lab, ns, "gpu2").get("phase") == "Running", 30, "gpu2 admitted")


@pytest.mark.lab
@pytest.mark.timeout(90)
def test_deployment_keeps_producing_rejected_pods(lab: Lab, lab_nodes: Any, namespace: str) -> None:
    (node,) = lab_nodes(1).names
    _configure(lab, node, {**STATIC, "topologyManagerPolicy": "single-numa-node"})
    _wait_policy(lab, node, "single-numa-node")
    lab.machines.wait_ready([node], timeout=20)
    pod = _pod("gpu-job", node, CPU40)
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "gpu-job"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "gpu-job"}},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }
    path = f"/apis/apps/v1/namespaces/{namespace}/deployments"
    assert lab.api.request("POST", path, deploy)[0] == 201

    def rejected() -> list[dict[str, Any]]:
        items = _get(lab, f"/api/v1/namespaces/{namespace}/pods")["items"]
        return [p for p in items if p["status"].get("reason") == "TopologyAffinityError"]

    got = _wait(lambda: len(rejected()) >= 3 and rejected(), 40, "three rejected replicas")
    assert all(p["status"]["phase"] == "Failed" for p in got)
    assert len({p["metadata"]["uid"] for p in got}) == len(got)
    lab.api.request("DELETE", f"{path}/gpu-job")


@pytest.mark.lab
@pytest.mark.timeout(120)
def test_checkpoint_mismatch_keeps_kubelet_down_until_removed(lab: Lab, lab_nodes: Any) -> None:
    nodes = lab_nodes(1)
    (node,) = nodes.names
    root = lab.machines.node_root(node)
    log = root / "var/log/kubelet.log"
    assert json.loads((root / "var/lib/kubelet/cpu_manager_state").read_text())["policyName"] == (
        "none"
    )
    _configure(lab, node, STATIC, reset=False)
    want = (
        'could not restore state from checkpoint: configured policy "static" differs from state '
        'checkpoint policy "none", please drain this node and delete the CPU manager checkpoint '
        'file "/var/lib/kubelet/cpu_manager_state" before restarting Kubelet'
    )
    _wait(lambda: want in unquote(log.read_text(errors="replace")), 15, "the kubelet's error")
    unit = nodes[0].unit
    # crash-looping: between two short-lived attempts the unit waits in "activating"
    _wait(
        lambda: (
            lab.machines.node_exec(node, "systemctl", "is-active", unit).stdout.strip()
            == "activating"
        ),
        10,
        "the unit to crash-loop",
    )
    lab.machines.wait_ready([node], timeout=30, want="Unknown")
    (root / "var/lib/kubelet/cpu_manager_state").unlink()
    lab.machines.wait_ready([node], timeout=20)
    state = ck.parse_cpu((root / "var/lib/kubelet/cpu_manager_state").read_text())
    assert (state.policy_name, state.default_cpu_set) == ("static", "0-63")


@pytest.mark.lab
@pytest.mark.timeout(60)
def test_stopped_kubelet_makes_the_node_not_ready(lab: Lab, lab_nodes: Any) -> None:
    (node,) = lab_nodes(1).names
    lab.machines.stop_kubelet(node)
    lab.machines.wait_ready([node], timeout=30, want="Unknown")
    lab.machines.start_kubelet(node)
    lab.machines.wait_ready([node], timeout=20)


# ----------------------------------------------------------- start-up as a plain process (no lab)
def _node_root(tmp_path: Path, config: dict[str, Any], version: str = "v1.36.3") -> Path:
    kdir = tmp_path / "var/lib/kubelet"
    kdir.mkdir(parents=True)
    cfg = {"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration", **config}
    (kdir / "config.yaml").write_text(yaml.safe_dump(cfg))
    node = {
        "nodeName": "solo",
        "nodeIP": "127.0.0.1",
        "distribution": "kubeadm",
        "kubeletPort": 0,
        "nodeRoot": str(tmp_path),
        "apiserverURL": "https://127.0.0.1:1",
        "apiserverCA": "/ca.crt",
        "clientCert": "/c.crt",
        "clientKey": "/c.key",
        "servingCert": "/s.crt",
        "servingKey": "/s.key",
        "topology": {
            "threadsPerCore": 2,
            "numaNodes": [
                {"id": 0, "cpus": "0-15,32-47", "memoryBytes": 1 << 39, "gpus": ["GPU-0"]},
                {"id": 1, "cpus": "16-31,48-63", "memoryBytes": 1 << 39, "gpus": ["GPU-4"]},
            ],
        },
        "capacity": {"cpu": "64", "memory": "1073741824Ki", "pods": "110", "nvidia.com/gpu": "2"},
        "kubeletVersion": version,
    }
    (tmp_path / "node.json").write_text(json.dumps(node))
    return tmp_path


def _run(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    return subprocess.run(
        [sys.executable, "-m", "rollout.lab.kubelet", "--node-config", str(root / "node.json")],
        capture_output=True,
        text=True,
        timeout=20,
        env=env,
    )


def test_policy_change_without_reset_exits_1_with_the_kubelets_words(tmp_path: Path) -> None:
    root = _node_root(tmp_path, {"cpuManagerPolicy": "none", "memoryManagerPolicy": "None"})
    kdir = root / "var/lib/kubelet"
    (kdir / ck.CPU_STATE_FILE).write_text(ck.render_cpu(ck.cpu_checkpoint("static", range(64), {})))
    started = time.monotonic()
    r = _run(root)
    elapsed = time.monotonic() - started
    assert r.returncode == 1
    assert elapsed < 3.0  # well under the 1.5 s budget when the machine is idle
    err = unquote(r.stderr)
    assert (
        'could not restore state from checkpoint: configured policy "none" differs from state '
        'checkpoint policy "static", please drain this node and delete the CPU manager checkpoint '
        'file "/var/lib/kubelet/cpu_manager_state" before restarting Kubelet'
    ) in err
    assert '"Failed to start ContainerManager" err="start cpu manager error: ' in r.stderr
    # the refused file is left alone, as the kubelet leaves it
    assert ck.parse_cpu((kdir / ck.CPU_STATE_FILE).read_text()).policy_name == "static"


def test_memory_policy_change_without_reset_exits_1(tmp_path: Path) -> None:
    root = _node_root(tmp_path, {"memoryManagerPolicy": "None"})
    kdir = root / "var/lib/kubelet"
    ms = mck.memory_machine_state({0: 1 << 39, 1: 1 << 39}, {0: 1 << 30})
    (kdir / ck.MEMORY_STATE_FILE).write_text(mck.render_memory(mck.memory_checkpoint("Static", ms)))
    r = _run(root)
    assert r.returncode == 1
    assert (
        '[memorymanager] configured policy "None" differs from state checkpoint policy "Static", '
        "please drain this node and delete the memory manager checkpoint file "
        '"/var/lib/kubelet/memory_manager_state" before restarting Kubelet'
    ) in unquote(r.stderr)


#: cpu_manager_state files written (and damaged) by the kubelet's own v1.37.2 checkpoint code
CKPT = Path(__file__).resolve().parents[1] / "fixtures/kubelet/checkpoints-v1.37.2"


@pytest.mark.parametrize(
    ("version", "fixture", "inner"),
    [
        # 1.37 reads V4's data and verifies its dataChecksum, and does not fall back
        (
            "v1.37.2",
            "cpu-v4-bad-datachecksum.json",
            "could not load v4 checkpoint: checkpoint is corrupted",
        ),
        (
            "v1.37.2",
            "cpu-v4-static-entries.json",
            'configured policy "none" differs from state checkpoint policy "static"',
        ),
        # rolled back to 1.36: the inline V2 fields are read (the same policy refusal) ...
        (
            "v1.36.3",
            "cpu-v4-static-entries.json",
            'configured policy "none" differs from state checkpoint policy "static"',
        ),
        # ... and a V4 file whose data was edited but whose inline part still says static
        (
            "v1.36.3",
            "cpu-v4-bad-datachecksum.json",
            'configured policy "none" differs from state checkpoint policy "static"',
        ),
    ],
)
def test_a_v4_cpu_checkpoint_at_start_as_each_kubelet_reads_it(
    tmp_path: Path, version: str, fixture: str, inner: str
) -> None:
    root = _node_root(tmp_path, {"cpuManagerPolicy": "none"}, version)
    kdir = root / "var/lib/kubelet"
    text = (CKPT / "read" / fixture).read_text()
    (kdir / ck.CPU_STATE_FILE).write_text(text)
    r = _run(root)
    assert r.returncode == 1, r.stderr[-2000:]
    assert (
        f"could not restore state from checkpoint: {inner}, please drain this node and delete the "
        'CPU manager checkpoint file "/var/lib/kubelet/cpu_manager_state" before restarting Kubelet'
    ) in unquote(r.stderr)
    # the refused file is left alone
    assert (kdir / ck.CPU_STATE_FILE).read_text() == text
