"""Lab nodes against the real control plane: SSH, files, the systemctl shim through Ansible, the
real scheduler and the Eviction API with a PodDisruptionBudget, and a clean ``lab down``.

Runtime (2-core machine, warm binaries): about 60-90 s for the whole module.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import testinfra

from rollout.lab.cluster import Lab
from tests.lab.changekit import wait_for as _wait
from tests.lab.conftest import Nodes

pytestmark = [pytest.mark.lab, pytest.mark.timeout(240)]


def _host(nodes: Nodes, name: str) -> Any:
    return testinfra.get_host(f"ansible://{name}?ansible_inventory={nodes.inventory}")


def test_ssh_gives_each_node_its_own_hostname_and_files(lab: Lab, lab_nodes: Any) -> None:
    nodes = lab_nodes(2, "kubeadm,k3s", ready=False)
    a, b = (_host(nodes, n) for n in nodes.names)
    assert a.check_output("hostname") == nodes[0].name
    assert b.check_output("hostname") == nodes[1].name
    # kubeadm's layout on the first, k3s's on the second; neither leaks to the other or the host
    assert a.file("/var/lib/kubelet/config.yaml").contains("kind: KubeletConfiguration")
    assert a.file("/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf").exists
    assert not b.file("/var/lib/kubelet/config.yaml").exists
    dropin = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf"
    assert b.file(dropin).exists
    assert not Path(dropin).exists() and not Path("/var/lib/kubelet/config.yaml").exists()
    # the simulated topology, where the facts playbook reads it on real hardware
    assert a.file("/sys/devices/system/node/node1/cpulist").content_string.strip() == "16-31,48-63"
    # a file written over SSH is visible byte for byte from the host through node_root
    a.run_expect([0], "printf 'x\\0y' > /etc/kubernetes/probe")
    assert (lab.machines.node_root(nodes[0].name) / "etc/kubernetes/probe").read_bytes() == b"x\0y"
    assert not Path("/etc/kubernetes/probe").exists()


def test_sshd_fault_makes_the_node_unreachable_until_started(lab: Lab, lab_nodes: Any) -> None:
    nodes = lab_nodes(1, ready=False)
    name = nodes.names[0]
    ssh = [
        "ssh", "-i", str(lab.machines.ssh_key), "-o", "StrictHostKeyChecking=no", "-o",
        "UserKnownHostsFile=/dev/null", "-o", "ConnectTimeout=3", "-o", "BatchMode=yes",
        f"root@{nodes[0].ip}", "hostname",
    ]  # fmt: skip
    lab.machines.stop_sshd(name)
    assert subprocess.run(ssh, capture_output=True, timeout=20).returncode == 255
    # the node itself lives on: its kubelet unit is still managed
    assert lab.machines.node_exec(name, "systemctl", "is-active", nodes[0].unit).stdout.strip() in (
        "active",
        "activating",
    )
    lab.machines.start_sshd(name)
    assert subprocess.run(ssh, capture_output=True, text=True, timeout=20).stdout.strip() == name


def test_nodes_get_ready_and_kubelet_restarts_through_ansible(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    nodes = lab_nodes(2)
    status = {s["name"]: s for s in lab.machines.node_status()}
    assert all(status[n]["ready"] == "True" for n in nodes.names)
    host = _host(nodes, nodes.names[0])
    before = host.check_output("systemctl show kubelet -p MainPID --value")
    play = tmp_path / "restart.yml"
    play.write_text(
        "- hosts: canary\n  gather_facts: false\n  tasks:\n"
        "    - ansible.builtin.systemd_service: {name: kubelet, state: restarted,"
        " daemon_reload: true}\n"
    )
    env = {**os.environ, "ANSIBLE_HOST_KEY_CHECKING": "False", "ANSIBLE_NOCOLOR": "1"}
    r = subprocess.run(
        [str(Path(sys.executable).parent / "ansible-playbook"), "-i", str(nodes.inventory),
         str(play)],
        capture_output=True, text=True, env=env, timeout=120,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "changed=1" in r.stdout
    after = host.check_output("systemctl show kubelet -p MainPID --value")
    assert after not in ("0", before)
    assert host.check_output("systemctl is-active kubelet") == "active"
    # only the canary (first quarter, at least one) was touched
    other = _host(nodes, nodes.names[1])
    assert other.check_output("systemctl show kubelet -p NRestarts --value") == "0"
    lab.machines.wait_ready([nodes.names[0]], timeout=30)


def test_every_distribution_gets_ready(lab: Lab, lab_nodes: Any) -> None:
    nodes = lab_nodes(7, "kubeadm,k3s,rke2,eks-al2,eks-al2023,microk8s,kubespray")
    units = {s["name"]: (s["ready"], s["kubelet"], s["unit"]) for s in lab.machines.node_status()}
    assert [units[n][:2] for n in nodes.names] == [("True", "active")] * 7
    assert [units[n][2] for n in nodes.names] == [
        "kubelet", "k3s", "rke2-server", "kubelet", "kubelet", "snap.microk8s.daemon-kubelite",
        "kubelet",
    ]  # fmt: skip


def _deployment(name: str, replicas: int, hosts: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
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
                                                "values": hosts,
                                            }
                                        ]
                                    }
                                ]
                            }
                        }
                    },
                    "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
                },
            },
        },
    }


def _pods(core: Any, ns: str, app: str) -> list[Any]:
    return list(core.list_namespaced_pod(ns, label_selector=f"app={app}").items)


def test_cordoned_node_receives_no_new_pods(
    lab: Lab, lab_nodes: Any, namespace: str, kube: Any
) -> None:
    from kubernetes import client, utils

    nodes = lab_nodes(2)
    core = client.CoreV1Api(kube)
    cordoned, open_ = nodes.names
    core.patch_node(cordoned, {"spec": {"unschedulable": True}})
    utils.create_from_dict(kube, _deployment("web", 4, nodes.names), namespace=namespace)
    pods = _wait(
        lambda: (p := _pods(core, namespace, "web")) and len(p) == 4
        and all(x.spec.node_name for x in p) and p,
        60, "4 scheduled pods",
    )  # fmt: skip
    assert {p.spec.node_name for p in pods} == {open_}
    core.patch_node(cordoned, {"spec": {"unschedulable": False}})


def test_eviction_refused_with_429_while_pdb_forbids_it(
    lab: Lab, lab_nodes: Any, namespace: str, kube: Any
) -> None:
    from kubernetes import client, utils

    nodes = lab_nodes(1)
    core, policy = client.CoreV1Api(kube), client.PolicyV1Api(kube)
    utils.create_from_dict(kube, _deployment("db", 2, nodes.names), namespace=namespace)
    policy.create_namespaced_pod_disruption_budget(
        namespace,
        {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": {"name": "db"},
            "spec": {"minAvailable": 2, "selector": {"matchLabels": {"app": "db"}}},
        },
    )

    def pdb_status(allowed: int) -> bool:
        st = policy.read_namespaced_pod_disruption_budget("db", namespace).status
        return bool(st and st.current_healthy == 2 and st.disruptions_allowed == allowed)

    _wait(lambda: pdb_status(0), 60, "PDB with 2 healthy pods and 0 disruptions allowed")
    victim = _pods(core, namespace, "db")[0].metadata.name
    body = client.V1Eviction(metadata=client.V1ObjectMeta(name=victim, namespace=namespace))
    with pytest.raises(client.ApiException) as e:
        core.create_namespaced_pod_eviction(victim, namespace, body)
    assert e.value.status == 429
    assert "disruption budget" in json.loads(e.value.body)["message"]
    policy.patch_namespaced_pod_disruption_budget("db", namespace, {"spec": {"minAvailable": 1}})
    _wait(lambda: pdb_status(1), 30, "PDB allowing 1 disruption")
    core.create_namespaced_pod_eviction(victim, namespace, body)
    _wait(
        lambda: all(p.metadata.name != victim for p in _pods(core, namespace, "db")),
        30, "evicted pod gone",
    )  # fmt: skip


def _running(pid: int) -> bool:
    """Alive and not a zombie. (Exited children of an exited ``lab up`` are reparented to PID 1;
    where PID 1 does not reap, as in some sandboxes, they stay zombies: no process is left.)"""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


def _leftovers(lab_dir: Path, state: dict[str, Any]) -> list[str]:
    out = []
    pids = [state["relayPid"], *state["controlplane"].values()]
    pids += [p for n in state["nodes"] for p in (n["procs"]["holder_pid"], n["procs"]["sshd_pid"])]
    out += [f"process {p}" for p in pids if _running(p)]
    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    out += [f"netns {line}" for line in netns.splitlines() if f"rollout-{state['name']}-" in line]
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    for n in state["nodes"]:
        if f" rl{n['node']['index']}h@" in links or f" rl{n['node']['index']}h:" in links:
            out.append(f"veth rl{n['node']['index']}h")
    mounts = Path("/proc/mounts").read_text()
    out += [f"mount {m}" for m in mounts.splitlines() if str(lab_dir) in m]
    if (lab_dir / "apiserver.sock").exists():
        out.append("relay socket")
    return out


def test_lab_up_and_down_from_the_cli_leave_nothing_behind(tmp_path: Path, lab: Lab) -> None:
    # ``lab`` only to share its skip/fail rule for missing binaries; this lab is separate
    lab_dir = tmp_path / "cli-lab"
    rollout = [str(Path(sys.executable).parent / "rollout")]
    args = ["--name", "clitest", "--workdir", str(lab_dir)]
    up = subprocess.run([*rollout, "lab", "up", "--nodes", "1", *args],
                        capture_output=True, text=True, timeout=180)  # fmt: skip
    assert up.returncode == 0, up.stderr
    state = json.loads((lab_dir / "lab.json").read_text())
    try:
        st = subprocess.run([*rollout, "lab", "status", "-o", "json", *args],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        assert st.returncode == 0, st.stderr
        assert [n["ready"] for n in json.loads(st.stdout)["nodes"]] == ["True"]
        env = subprocess.run([*rollout, "lab", "env", *args], capture_output=True, text=True)
        assert f"export ROLLOUT_INVENTORY={lab_dir / 'inventory.ini'}" in env.stdout
        assert "[canary]\nclitest-node1\n" in (lab_dir / "inventory.ini").read_text()
        path_line = [ln for ln in env.stdout.splitlines() if ln.startswith("export PATH=")]
        assert len(path_line) == 1
        kubectl = subprocess.run(
            ["bash", "-c", env.stdout + "\nkubectl get nodes -o name"],
            capture_output=True, text=True, timeout=60,
        )  # fmt: skip
        assert kubectl.stdout.split() == ["node/clitest-node1"], kubectl.stderr
        assert _leftovers(lab_dir, state) != []  # sanity: the probe sees a running lab
        # faults from another process than the one that ran `lab up`
        for f in (["kubelet-stop", "clitest-node1"], ["apiserver-restart"]):
            r = subprocess.run([*rollout, "lab", "fault", *f, *args],
                               capture_output=True, text=True, timeout=120)  # fmt: skip
            assert r.returncode == 0, r.stderr
        st = subprocess.run([*rollout, "lab", "status", "-o", "json", *args],
                            capture_output=True, text=True, timeout=60)  # fmt: skip
        report = json.loads(st.stdout)
        assert report["apiserver"] is True
        assert report["nodes"][0]["kubelet"] == "inactive"
        state = json.loads((lab_dir / "lab.json").read_text())  # the new apiserver PID
    finally:
        down = subprocess.run([*rollout, "lab", "down", *args],
                              capture_output=True, text=True, timeout=120)  # fmt: skip
    assert down.returncode == 0, down.stderr
    assert _leftovers(lab_dir, state) == []
