"""The facts module against synthetic /sys trees shaped like real machines (no Ansible run).

The module reads ``<sys_root>/sys`` and ``<sys_root>/proc``; these trees reproduce what the
kernel shows on a 2-socket SMT GPU server (8 GPUs as PCI class 0x0302, NVSwitches that are not
GPUs), on a machine without ``/sys/devices/system/node``, and a GPU whose ``numa_node`` is -1.
Runtime: about 1 s.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from rollout.kubelet.facts import node_facts_from_dict

MODULE = (
    Path(__file__).resolve().parents[2]
    / "playbooks/roles/rollout_kubelet/library/rollout_node_facts.py"
)


def _write(root: Path, path: str, text: str) -> None:
    p = root / path
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(text + "\n")


def _cpus(root: Path, sockets: int, cores: int, threads: int) -> None:
    total = sockets * cores * threads
    _write(root, "sys/devices/system/cpu/online", f"0-{total - 1}")
    for cpu in range(total):
        core = cpu % (sockets * cores)
        siblings = ",".join(str(core + t * sockets * cores) for t in range(threads))
        topo = f"sys/devices/system/cpu/cpu{cpu}/topology"
        _write(root, f"{topo}/physical_package_id", str(core // cores))
        _write(root, f"{topo}/thread_siblings_list", siblings)
    _write(root, "proc/cpuinfo", "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+")
    _write(root, "proc/meminfo", "MemTotal:       2097152 kB")


def _pci(root: Path, addr: str, vendor: str, device: str, cls: str, numa: str) -> None:
    for name, value in (
        ("vendor", vendor),
        ("device", device),
        ("class", cls),
        ("numa_node", numa),
    ):
        _write(root, f"sys/bus/pci/devices/{addr}/{name}", value)


def _run(root: Path, **args: Any) -> dict[str, Any]:
    params = {
        "markers": [{"name": "kubeadm", "paths": ["/var/lib/kubelet/config.yaml"]}],
        "kubelet_paths": ["/var/lib/kubelet/config.yaml", "/etc/kubernetes/kubelet.conf.d/*"],
        "checkpoint_dirs": ["/var/lib/kubelet"],
        "machine_file": "",
        "sys_root": str(root),
        **args,
    }
    r = subprocess.run(
        [sys.executable, str(MODULE), json.dumps({"ANSIBLE_MODULE_ARGS": params})],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    out = json.loads(r.stdout)
    assert not out.get("failed"), out
    facts = out["node_facts"]
    assert isinstance(facts, dict)
    return facts


def test_two_socket_smt_gpu_server(tmp_path: Path) -> None:
    _cpus(tmp_path, sockets=2, cores=4, threads=2)
    for n, cpus in ((0, "0-3,8-11"), (1, "4-7,12-15")):
        _write(tmp_path, f"sys/devices/system/node/node{n}/cpulist", cpus)
        _write(tmp_path, f"sys/devices/system/node/node{n}/meminfo", f"Node {n} MemTotal: 1024 kB")
    for i in range(8):
        _pci(tmp_path, f"0000:{0x18 + i:02x}:00.0", "0x10de", "0x2335", "0x030200", str(i // 4))
    _pci(tmp_path, "0000:05:00.0", "0x10de", "0x22a3", "0x068000", "0")  # NVSwitch: not a GPU
    _pci(tmp_path, "0000:06:00.0", "0x8086", "0x1234", "0x030000", "0")  # not NVIDIA
    _write(tmp_path, "var/lib/kubelet/config.yaml", "kind: KubeletConfiguration")
    _write(tmp_path, "var/lib/kubelet/cpu_manager_state", '{"policyName":"static"}')
    _write(tmp_path, "var/lib/kubelet/device-plugins/kubelet_internal_checkpoint", '{"Data":{}}')
    _write(tmp_path, "etc/kubernetes/kubelet.conf.d/90-rollout.conf", "{}")

    facts = _run(tmp_path)

    assert facts["onlineCPUs"] == "0-15" and facts["sockets"] == 2
    assert facts["threadsPerCore"] == 2
    assert facts["smtSiblings"][:2] == ["0,8", "1,9"]
    assert facts["numaNodes"] == [
        {"id": 0, "cpus": "0-3,8-11", "memoryBytes": 1024 * 1024},
        {"id": 1, "cpus": "4-7,12-15", "memoryBytes": 1024 * 1024},
    ]
    assert [g["numaNode"] for g in facts["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert {g["device"] for g in facts["gpus"]} == {"0x2335"}
    assert facts["cpuModel"] == "Intel(R) Xeon(R) Platinum 8480+"
    assert facts["distribution"] == "kubeadm"
    assert facts["checkpoints"]["cpu_manager_state"] == {"policyName": "static"}
    assert facts["checkpoints"]["memory_manager_state"] is None
    assert facts["checkpoints"]["kubelet_internal_checkpoint"] == {"Data": {}}
    assert facts["checkpointPaths"]["kubelet_internal_checkpoint"] == (
        "/var/lib/kubelet/device-plugins/kubelet_internal_checkpoint"
    )
    assert facts["kubeletFiles"] == [
        "/var/lib/kubelet/config.yaml",
        "/etc/kubernetes/kubelet.conf.d/90-rollout.conf",
    ]
    parsed = node_facts_from_dict(facts)
    assert len(parsed.gpus) == 8 and parsed.sockets == 2


def test_no_numa_directory_and_a_gpu_without_numa_node(tmp_path: Path) -> None:
    _cpus(tmp_path, sockets=1, cores=2, threads=1)
    _pci(tmp_path, "0000:01:00.0", "0x10de", "0x2330", "0x030200", "-1")

    facts = _run(tmp_path)

    assert facts["numaSource"] == "single-node-fallback"
    assert facts["numaNodes"] == [{"id": 0, "cpus": "0-1", "memoryBytes": 2097152 * 1024}]
    assert facts["gpus"][0]["numaNode"] is None
    assert facts["distribution"] is None and facts["kubeletFiles"] == []
    assert facts["smtSiblings"] == [] and facts["threadsPerCore"] == 1


def test_a_simulated_numa_tree_wins_over_the_hosts_cpus_and_a_machine_file_fills_the_rest(
    tmp_path: Path,
) -> None:
    # the lab: /sys/devices/system/node is simulated (64 CPUs), the CPU topology is the host's
    _cpus(tmp_path, sockets=1, cores=2, threads=1)
    _write(tmp_path, "sys/devices/system/node/node0/cpulist", "0-15,32-47")
    _write(tmp_path, "sys/devices/system/node/node1/cpulist", "16-31,48-63")
    machine = tmp_path / "node.json"
    machine.write_text(
        json.dumps(
            {
                "kubeletVersion": "v1.34.2",
                "topology": {"cpuModel": "lab", "sockets": 2, "threadsPerCore": 2},
            }
        )
    )

    facts = _run(tmp_path, machine_file=str(machine))

    assert facts["onlineCPUs"] == "0-63" and facts["onlineCPUsSource"] == "numa"
    assert (facts["sockets"], facts["threadsPerCore"], facts["cpuModel"]) == (2, 2, "lab")
    assert facts["kubeletVersion"] == "v1.34.2"
    assert facts["kubeletVersionSource"] == "machine-file"
    assert "smtSiblings" not in facts  # unknown, not "no SMT"


# /proc/mounts lines as the kernel lists them on a systemd cgroup v2 host, a cgroup v1 host
# (tmpfs with one mount per controller, as on this lab machine and on Amazon Linux 2) and a
# host with the v2 hierarchy remounted over a tmpfs (the last mount wins)
V2_MOUNTS = "cgroup2 /sys/fs/cgroup cgroup2 rw,nosuid,nodev,noexec,relatime,nsdelegate 0 0"
V1_MOUNTS = (
    "tmpfs /sys/fs/cgroup tmpfs ro,nosuid,nodev,noexec,mode=755 0 0\n"
    "cgroup /sys/fs/cgroup/cpu,cpuacct cgroup rw,nosuid,nodev,noexec,relatime,cpu,cpuacct 0 0\n"
    "cgroup /sys/fs/cgroup/memory cgroup rw,nosuid,nodev,noexec,relatime,memory 0 0"
)


def test_cgroup_version_from_the_mount_table(tmp_path: Path) -> None:
    from rollout.kubelet.validation import validate

    _cpus(tmp_path, sockets=1, cores=2, threads=1)
    assert "cgroupVersion" not in _run(tmp_path)  # no mount table: unknown, not guessed
    _write(tmp_path, "proc/mounts", V2_MOUNTS)
    assert _run(tmp_path)["cgroupVersion"] == 2
    _write(tmp_path, "proc/mounts", V1_MOUNTS)
    facts = _run(tmp_path)
    assert facts["cgroupVersion"] == 1
    _write(tmp_path, "proc/mounts", V1_MOUNTS + "\n" + V2_MOUNTS)
    assert _run(tmp_path)["cgroupVersion"] == 2
    # the v1 reading is what lint's cgroup v1 rule acts on
    found = validate({}, kubelet_version="1.35", node_facts=node_facts_from_dict(facts))
    assert [f.field for f in found if f.severity.value == "error"] == ["failCgroupV1"]
    found = validate(
        {"failCgroupV1": False}, kubelet_version="1.35", node_facts=node_facts_from_dict(facts)
    )
    assert [f for f in found if f.field == "failCgroupV1"] == []


def test_container_cpusets_from_the_kubepods_cgroups(tmp_path: Path) -> None:
    a, b, pause = "a" * 64, "b" * 64, "c" * 64
    v2 = "sys/fs/cgroup/kubepods.slice/kubepods-pod1234_5678.slice"
    _write(tmp_path, f"{v2}/cri-containerd-{a}.scope/cpuset.cpus.effective", "4-5,36")
    _write(tmp_path, f"{v2}/cri-containerd-{pause}.scope/cpuset.cpus.effective", "0-63")
    _write(tmp_path, f"{v2}/cpuset.cpus.effective", "0-63")  # the pod's own cgroup: no ID
    v1 = "sys/fs/cgroup/cpuset/kubepods/burstable/pod9abc"
    _write(tmp_path, f"{v1}/{b}/cpuset.cpus", "1,2,3")
    _write(tmp_path, "sys/fs/cgroup/system.slice/containerd.service/cpuset.cpus", "0-63")

    facts = _run(tmp_path)

    assert facts["containerCpusets"] == {a: "4-5,36", pause: "0-63", b: "1-3"}
    assert _run(tmp_path / "empty")["containerCpusets"] == {}
