#!/usr/bin/python
# ruff: noqa: E402, UP031  (Ansible module layout; runs on the node's own Python)
"""Collect a node's kubelet and machine facts in one round trip.

Why a module and not a string of ``command`` tasks: every task costs an SSH round trip, and the
facts play runs before every change on every node. This module reads ``/sys``, ``/proc`` and the
kubelet's files with the node's own Python, asks the kubelet's podresources API (its unix socket,
through ``module_utils/rollout_podresources.py``, stdlib only) for its device and CPU assignments,
and returns the NodeFacts record that render and lint consume. It never writes anything.

Missing pieces are normal on real machines and are reported, not fatal: no
``/sys/devices/system/node`` (one NUMA node), no GPUs, no kubelet binary.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_node_facts
short_description: Read kubelet, CPU, NUMA, GPU and checkpoint facts from a node
description:
  - Read-only. Returns C(node_facts) in the NodeFacts format and C(kubelet_files), the kubelet
    files present on the node.
options:
  markers:
    description: Ordered C({name, paths}) list; the first with any path present wins.
    type: list
    elements: dict
    required: true
  kubelet_paths:
    description: Node paths (globs allowed) of kubelet configuration and flag files to report.
    type: list
    elements: str
    required: true
  checkpoint_dirs:
    description: Kubelet root directories to look for cpu_manager_state, memory_manager_state,
      device-plugins/kubelet_internal_checkpoint, dra_manager_state and the podresources socket
      pod-resources/kubelet.sock in (the first with the socket is asked, List and
      GetAllocatableResources).
    type: list
    elements: str
    required: true
  machine_file:
    description: Optional JSON machine description whose NodeFacts keys override /sys readings.
    type: str
    default: ""
  gpu_vendors:
    description: PCI vendor ids counted as GPUs.
    type: list
    elements: str
    default: ["0x10de"]
  gpu_classes:
    description: PCI class prefixes counted as GPUs.
    type: list
    elements: str
    default: ["0x0300", "0x0302"]
  sys_root:
    description: Root of /sys and /proc (tests point it elsewhere).
    type: str
    default: "/"
author: rollout
"""

import base64
import glob
import grp
import hashlib
import json
import os
import pwd
import re
import shutil
import socket
import subprocess

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # sent over plain ssh by the rollout tool (rollout/ansible/direct.py)
    AnsibleModule = None
try:  # Ansible ships the role's module_utils with the module
    from ansible.module_utils.rollout_podresources import read as read_pod_resources
except ImportError:  # over plain ssh direct.py loaded it first; from a checkout it is beside us
    import sys

    if "rollout_podresources" not in sys.modules and "__file__" in globals():
        here = os.path.dirname(os.path.abspath(__file__))
        sys.path.insert(0, os.path.join(here, os.pardir, "module_utils"))
    from rollout_podresources import read as read_pod_resources

# The NodeFacts keys (rollout/kubelet/facts.py) a machine file may set instead of /sys.
MACHINE_KEYS = (
    "cpuModel",
    "sockets",
    "threadsPerCore",
    "onlineCPUs",
    "smtSiblings",
    "numaNodes",
    "gpus",
    "cgroupVersion",
)


def _read(path, default=None):
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return default


def parse_cpuset(text):
    """Turn '0-3,8' into [0, 1, 2, 3, 8]."""
    cpus = []
    for part in (text or "").split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return sorted(set(cpus))


def format_cpuset(cpus):
    """Turn [0, 1, 2, 3, 8] into '0-3,8'."""
    out = []
    cpus = sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else "%d-%d" % (cpus[i], cpus[j]))
        i = j + 1
    return ",".join(out)


def detect_distribution(markers, root):
    for marker in markers:
        for path in marker.get("paths", []):
            if glob.glob(os.path.join(root, path.lstrip("/"))):
                return marker["name"], path
    return None, None


def kubelet_version(machine):
    exe = shutil.which("kubelet")
    if exe:
        try:
            out = subprocess.run(
                [exe, "--version"], capture_output=True, text=True, timeout=10, check=False
            ).stdout
            m = re.search(r"v\d+\.\d+\.\d+\S*", out)
            if m:
                return m.group(0), exe
        except (OSError, subprocess.SubprocessError):
            pass
    if machine.get("kubeletVersion"):
        return machine["kubeletVersion"], "machine-file"
    return None, None


def cpu_facts(sysfs, procfs, cpus):
    """Sockets, SMT and model for ``cpus``; sockets and siblings are None when sysfs lacks a
    CPU's topology (then they are unknown, not 1)."""
    packages = set()
    siblings_seen = []
    threads = 1
    complete = True
    for cpu in cpus:
        topo = os.path.join(sysfs, "devices/system/cpu/cpu%d/topology" % cpu)
        pkg = _read(os.path.join(topo, "physical_package_id"))
        siblings = _read(os.path.join(topo, "thread_siblings_list"))
        if pkg is None or not siblings:
            complete = False
            continue
        packages.add(pkg)
        group = format_cpuset(parse_cpuset(siblings))
        if group not in siblings_seen:
            siblings_seen.append(group)
        threads = max(threads, len(parse_cpuset(siblings)))
    model = None
    for line in (_read(os.path.join(procfs, "cpuinfo"), "") or "").splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("model name", "Model", "cpu model") and value.strip():
            model = value.strip()
            break
    facts = {"cpuModel": model}
    if complete and cpus:
        facts["sockets"] = len(packages)
        facts["threadsPerCore"] = threads
        facts["smtSiblings"] = siblings_seen if threads > 1 else []
    else:
        facts["sockets"] = None
        facts["threadsPerCore"] = None
    return facts


def numa_facts(sysfs, procfs, online):
    nodes = []
    for path in glob.glob(os.path.join(sysfs, "devices/system/node/node[0-9]*")):
        node_id = int(os.path.basename(path)[4:])
        memory = None
        for line in (_read(os.path.join(path, "meminfo"), "") or "").splitlines():
            m = re.match(r"Node\s+\d+\s+MemTotal:\s+(\d+)\s*kB", line)
            if m:
                memory = int(m.group(1)) * 1024
        cpus = _read(os.path.join(path, "cpulist"), "")
        nodes.append(
            {"id": node_id, "cpus": format_cpuset(parse_cpuset(cpus)), "memoryBytes": memory}
        )
    if nodes:
        return sorted(nodes, key=lambda n: n["id"]), "sysfs"
    # No NUMA directory (kernel without CONFIG_NUMA, some VMs): one node holding everything.
    memory = None
    for line in (_read(os.path.join(procfs, "meminfo"), "") or "").splitlines():
        m = re.match(r"MemTotal:\s+(\d+)\s*kB", line)
        if m:
            memory = int(m.group(1)) * 1024
    return [{"id": 0, "cpus": online, "memoryBytes": memory}], "single-node-fallback"


def gpu_facts(sysfs, vendors, classes):
    gpus = []
    vendors = {v.lower() for v in vendors}
    classes = tuple(c.lower() for c in classes)
    for dev in sorted(glob.glob(os.path.join(sysfs, "bus/pci/devices/*"))):
        vendor = (_read(os.path.join(dev, "vendor"), "") or "").lower()
        pci_class = (_read(os.path.join(dev, "class"), "") or "").lower()
        if vendor not in vendors or not pci_class.startswith(classes):
            continue
        numa = _read(os.path.join(dev, "numa_node"))
        numa_node = int(numa) if numa not in (None, "") and int(numa) >= 0 else None
        gpus.append(
            {
                "id": os.path.basename(dev),
                "vendor": vendor,
                "device": (_read(os.path.join(dev, "device"), "") or "").lower(),
                "class": pci_class,
                "numaNode": numa_node,
            }
        )
    return gpus


# name in the facts -> path under the kubelet's root dir. The device manager's checkpoint says
# which device IDs each pod holds, per NUMA node (the evidence report's uniqueness check).
CHECKPOINT_FILES = {
    "cpu_manager_state": "cpu_manager_state",
    "memory_manager_state": "memory_manager_state",
    "kubelet_internal_checkpoint": "device-plugins/kubelet_internal_checkpoint",
    "dra_manager_state": "dra_manager_state",
}


def cgroup_version(procfs):
    """2 when /sys/fs/cgroup is a cgroup2 mount (``stat -f`` says cgroup2fs: the kubelet's
    IsCgroup2UnifiedMode), 1 when it is anything else (tmpfs holding v1 hierarchies), None when
    the mount table does not list it. The last mount of the path wins, as the kernel's does."""
    found = None
    for line in (_read(os.path.join(procfs, "mounts"), "") or "").splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "/sys/fs/cgroup":
            found = 2 if parts[2] == "cgroup2" else 1
    return found


# A container's cgroup directory ends in its runtime ID: cri-containerd-<id>.scope, crio-<id>.scope,
# docker-<id>.scope (systemd driver) or <id> (cgroupfs driver).
CONTAINER_CGROUP = re.compile(r"(?:^|[-_])([0-9a-f]{64})(?:\.scope)?$")


def container_cpusets(root):
    """Container ID -> its cgroup's cpuset, for the containers in the kubelet's pod hierarchy at
    the top of the cgroup tree (``kubepods*``: cgroup v2's ``cpuset.cpus.effective``, v1's cpuset
    controller's ``cpuset.cpus``), at most 4 levels down. Empty when there is none: a runtime
    that creates no cgroups (the lab's fake one), ``cgroupsPerQOS: false``, a ``cgroupRoot``
    elsewhere."""
    base = os.path.join(root, "sys/fs/cgroup")
    out = {}
    for start in sorted(glob.glob(os.path.join(base, "kubepods*"))) + sorted(
        glob.glob(os.path.join(base, "cpuset", "kubepods*"))
    ):
        for dirpath, dirnames, _ in os.walk(start):
            if os.path.relpath(dirpath, start).count(os.sep) >= 3:
                dirnames[:] = []
            m = CONTAINER_CGROUP.search(os.path.basename(dirpath))
            if not m:
                continue
            for name in ("cpuset.cpus.effective", "cpuset.cpus"):
                text = _read(os.path.join(dirpath, name))
                if text:
                    out[m.group(1)] = format_cpuset(parse_cpuset(text))
                    break
    return out


def checkpoint_facts(dirs, root):
    out = dict.fromkeys(CHECKPOINT_FILES)
    paths = {}
    for name, rel in CHECKPOINT_FILES.items():
        for d in dirs:
            path = os.path.join(d, rel)
            text = _read(os.path.join(root, path.lstrip("/")))
            if text is None:
                continue
            paths[name] = path
            try:
                out[name] = json.loads(text)
            except ValueError:
                out[name] = {"unparsable": text[:2000]}
            break
    return out, paths


def kubelet_files(patterns, root):
    found = []
    for pattern in patterns:
        for path in sorted(glob.glob(os.path.join(root, pattern.lstrip("/")))):
            if os.path.isfile(path):
                node_path = "/" + os.path.relpath(path, root) if root != "/" else path
                if node_path not in found:
                    found.append(node_path)
    return found


def load_machine_file(path):
    if not path or not os.path.isfile(path):
        return {}
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    machine = dict(data.get("machine") or {})
    for key, value in (data.get("topology") or {}).items():
        if key in ("cpuModel", "sockets", "threadsPerCore") and key not in machine:
            machine[key] = value
    for key in (*MACHINE_KEYS, "kubeletVersion"):
        if data.get(key) not in (None, "") and key not in machine:
            machine[key] = data[key]
    if "onlineCpus" in machine and "onlineCPUs" not in machine:
        machine["onlineCPUs"] = machine.pop("onlineCpus")
    return machine


def collect(params):
    root = params["sys_root"]
    sysfs = os.path.join(root, "sys")
    procfs = os.path.join(root, "proc")
    try:
        machine = load_machine_file(params["machine_file"])
    except (OSError, ValueError) as e:
        raise ValueError("machine file %s: %s" % (params["machine_file"], e)) from e
    distribution, evidence = detect_distribution(params["markers"], root)
    version, version_source = kubelet_version(machine)
    facts = {"hostname": socket.gethostname(), "distribution": distribution}
    facts["distributionEvidence"] = evidence
    facts["kubeletVersion"] = version
    facts["kubeletVersionSource"] = version_source
    online = parse_cpuset(_read(os.path.join(sysfs, "devices/system/cpu/online"), ""))
    numa, facts["numaSource"] = numa_facts(sysfs, procfs, format_cpuset(online))
    overridden = sorted(k for k in MACHINE_KEYS if k in machine)
    if "numaNodes" in machine:
        numa = machine["numaNodes"]
    in_numa = sorted({c for n in numa for c in parse_cpuset(str(n.get("cpus", "")))})
    # A NUMA node's cpulist holds online CPUs only, so the union normally lies within
    # cpu/online. When it does not (a simulated /sys/devices/system/node, as in the lab),
    # the NUMA view is the one the kubelet's cAdvisor would see.
    facts["onlineCPUsSource"] = "cpu/online"
    if in_numa and not set(in_numa) <= set(online):
        online = in_numa
        facts["onlineCPUsSource"] = "numa"
    facts["onlineCPUs"] = format_cpuset(online)
    facts.update(cpu_facts(sysfs, procfs, online))
    facts["numaNodes"] = numa
    facts["gpus"] = gpu_facts(sysfs, params["gpu_vendors"], params["gpu_classes"])
    facts["cgroupVersion"] = cgroup_version(procfs)
    for key in overridden:
        facts[key] = machine[key]
    if facts.get("smtSiblings") is None:
        facts.pop("smtSiblings", None)
    if facts.get("cgroupVersion") is None:
        facts.pop("cgroupVersion", None)
    facts["machineSource"] = params["machine_file"] if overridden else "sysfs"
    facts["checkpoints"], facts["checkpointPaths"] = checkpoint_facts(
        params["checkpoint_dirs"], root
    )
    # the kubelet's own account of device and CPU assignments (its podresources gRPC API)
    facts["podResources"] = read_pod_resources(params["checkpoint_dirs"], root)
    facts["containerCpusets"] = container_cpusets(root)
    files = kubelet_files(params["kubelet_paths"], root)
    facts["kubeletFiles"] = files
    facts["kubeletFileMeta"] = {p: file_record(os.path.join(root, p.lstrip("/"))) for p in files}
    return facts


def file_record(path):
    """sha256, mode, owner, group and bytes of one kubelet file, read once: render works from
    these bytes and the apply's compare-and-swap checks the node still holds this sha256."""
    with open(path, "rb") as f:
        data = f.read()
        st = os.fstat(f.fileno())
    return {
        "sha256": hashlib.sha256(data).hexdigest(),
        "mode": "%04o" % (st.st_mode & 0o7777),
        "owner": _owner(pwd.getpwuid, st.st_uid),
        "group": _owner(grp.getgrgid, st.st_gid),
        "content_b64": base64.b64encode(data).decode("ascii"),
    }


def _owner(lookup, ident):
    try:
        return lookup(ident)[0]
    except KeyError:
        return str(ident)


DEFAULTS = {
    "machine_file": "",
    "gpu_vendors": ["0x10de"],
    "gpu_classes": ["0x0300", "0x0302"],
    "sys_root": "/",
}


def direct(args):
    """Entry point when the rollout tool runs this file over plain ssh (no Ansible): the same
    arguments as the module, the same result."""
    try:
        facts = collect(dict(DEFAULTS, **args))
    except (ValueError, KeyError, OSError) as e:
        return {"failed": True, "msg": str(e)}
    return {"changed": False, "node_facts": facts, "kubelet_files": facts["kubeletFiles"]}


def main():
    module = AnsibleModule(
        argument_spec={
            "markers": {"type": "list", "elements": "dict", "required": True},
            "kubelet_paths": {"type": "list", "elements": "str", "required": True},
            "checkpoint_dirs": {"type": "list", "elements": "str", "required": True},
            "machine_file": {"type": "str", "default": ""},
            "gpu_vendors": {"type": "list", "elements": "str", "default": ["0x10de"]},
            "gpu_classes": {"type": "list", "elements": "str", "default": ["0x0300", "0x0302"]},
            "sys_root": {"type": "str", "default": "/"},
        },
        supports_check_mode=True,
    )
    try:
        facts = collect(module.params)
    except ValueError as e:
        module.fail_json(msg=str(e))
    module.exit_json(changed=False, node_facts=facts, kubelet_files=facts["kubeletFiles"])


if __name__ == "__main__":
    main()
