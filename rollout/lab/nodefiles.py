"""A lab node's identity and its seeded files: name, address, distribution, node shape, the
credentials the control plane issued, and what :func:`write_node_files` puts into the node's
overlay upper dirs (the distribution's files from :mod:`rollout.lab.seeds`, the lab kubelet's
``/etc/rollout-lab`` files, the units the ``systemctl`` shim runs).

Nothing here starts a process: :mod:`rollout.lab.nodes` creates the namespaces and processes.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rollout import assets
from rollout.errors import LabError
from rollout.lab import realhw
from rollout.lab.hardware import NodeShape, sysfs_tree
from rollout.lab.network import NET_PREFIX
from rollout.lab.seeds import DISTRIBUTIONS, LAYOUTS, SeedContext, seed_files

KUBELET_PORT = 10250
OVERLAYS = ("/etc", "/var", "/usr/lib/systemd")


@dataclass(frozen=True)
class LabNode:
    """One lab node: its name (= hostname = Node name), index in the lab range, distribution."""

    name: str
    index: int
    distribution: str
    lab: str
    shape: NodeShape = field(default_factory=NodeShape)
    kubelet: str = "sim"  # "real": the real kubelet binary (rollout.lab.realnode)

    @property
    def ip(self) -> str:
        return f"{NET_PREFIX}.{self.index}.2"

    @property
    def host_ip(self) -> str:
        return f"{NET_PREFIX}.{self.index}.1"

    @property
    def netns(self) -> str:
        return f"rollout-{self.lab}-{self.index}"

    @property
    def veth_host(self) -> str:
        return f"rl{self.index}h"

    @property
    def veth_node(self) -> str:
        return f"rl{self.index}n"

    @property
    def ssh_port(self) -> int:
        return 22

    @property
    def unit(self) -> str:
        return LAYOUTS[self.distribution].unit


@dataclass(frozen=True)
class NodeCredentials:
    """PEM material and kubeconfig the node's kubelet uses (issued by the control plane)."""

    ca_pem: str
    client_cert_pem: str
    client_key_pem: str
    serving_cert_pem: str
    serving_key_pem: str
    kubeconfig: str
    apiserver_port: int


def node_config(node: LabNode, socket_path: Path, kubeconfig_path: str) -> dict[str, object]:
    """The lab kubelet's ``/etc/rollout-lab/node.json``."""
    s = node.shape
    return {
        "nodeName": node.name,
        "nodeIP": node.ip,
        "distribution": node.distribution,
        "kubeletPort": KUBELET_PORT,
        "apiserverSocket": str(socket_path),
        "apiserverURL": "",  # filled by write_node_files
        "kubeconfig": kubeconfig_path,
        "apiserverCA": "/etc/rollout-lab/pki/ca.crt",
        "clientCert": "/etc/rollout-lab/pki/kubelet-client.crt",
        "clientKey": "/etc/rollout-lab/pki/kubelet-client.key",
        "servingCert": "/etc/rollout-lab/pki/kubelet-serving.crt",
        "servingKey": "/etc/rollout-lab/pki/kubelet-serving.key",
        "rootDir": LAYOUTS[node.distribution].root_dir,
        "unit": node.unit,
        "topology": s.topology(),
        "capacity": {
            "cpu": str(s.cpus),
            "memory": f"{s.memory_bytes // 1024}Ki",
            "pods": str(s.max_pods),
            "nvidia.com/gpu": str(s.gpus_per_numa * s.sockets),
        },
        "labels": {
            "kubernetes.io/hostname": node.name,
            "kubernetes.io/os": "linux",
            "kubernetes.io/arch": "amd64",
            "node.kubernetes.io/instance-type": "lab.gpu-8x",
            "nvidia.com/gpu.present": "true",
            "nvidia.com/gpu.count": str(s.gpus_per_numa * s.sockets),
            "rollout.dev/lab": node.lab,
            "rollout.dev/distribution": node.distribution,
        },
        "kubeletVersion": "",  # filled by write_node_files
    }


def _overlay_for(path: str) -> tuple[str, str]:
    for o in OVERLAYS:
        if path == o or path.startswith(o + "/"):
            return o, path[len(o) :].lstrip("/")
    raise LabError(f"seed path {path} is outside the node overlays {OVERLAYS}")


def _upper(node_dir: Path, overlay: str) -> Path:
    return node_dir / "upper" / overlay.strip("/").replace("/", "-")


def write_node_files(
    node: LabNode,
    node_dir: Path,
    creds: NodeCredentials,
    socket_path: Path,
    kubelet_version: str,
    kubelet_bin: Path | None = None,
    dra_bin: Path | None = None,
    path_labels: Mapping[str, str] | None = None,
    path: str = "device-plugin",
) -> None:
    """Seed the node's overlay upper dirs (before its namespaces exist). ``kubelet_bin``: the
    real kubelet's bin dir, for a ``kubelet="real"`` node; ``dra_bin``: the DRA driver's, and
    ``path_labels``: the label keys its device plugin and DRA driver follow
    (:mod:`rollout.lab.daemonsets`; default NVIDIA's), and ``path`` the one it starts on."""
    if node.distribution not in DISTRIBUTIONS:
        raise LabError(f"unknown distribution {node.distribution!r}; one of {DISTRIBUTIONS}")
    lay = LAYOUTS[node.distribution]
    ctx = SeedContext(node.name, node.ip, creds.kubeconfig, creds.ca_pem)
    files = seed_files(node.distribution, ctx, kubelet_version)
    cfg = node_config(node, socket_path, lay.kubeconfig_path)
    cfg["apiserverURL"] = f"https://127.0.0.1:{creds.apiserver_port}"
    cfg["kubeletVersion"] = kubelet_version
    if node.kubelet == "real":
        from rollout.lab import daemonsets

        keys = daemonsets.label_keys({"pathLabels": dict(path_labels or {})})
        cfg["pathLabels"] = keys
        labels = cfg["labels"]
        assert isinstance(labels, dict)
        labels.update(daemonsets.initial_labels(keys, path))
    files["/etc/rollout-lab/node.json"] = json.dumps(cfg, indent=2) + "\n"
    files["/etc/rollout-lab/topology.json"] = json.dumps(cfg["topology"], indent=2) + "\n"
    files["/etc/rollout-lab/pki/ca.crt"] = creds.ca_pem
    files["/etc/rollout-lab/pki/kubelet-client.crt"] = creds.client_cert_pem
    files["/etc/rollout-lab/pki/kubelet-client.key"] = creds.client_key_pem
    files["/etc/rollout-lab/pki/kubelet-serving.crt"] = creds.serving_cert_pem
    files["/etc/rollout-lab/pki/kubelet-serving.key"] = creds.serving_key_pem
    files["/etc/hostname"] = node.name + "\n"
    files["/etc/hosts"] = f"127.0.0.1\tlocalhost\n{node.ip}\t{node.name}\n"
    paths = (str(assets.import_root()), os.environ.get("PYTHONPATH"))
    pythonpath = os.pathsep.join(p for p in paths if p)
    units = {
        node.unit: {
            "execStart": [
                sys.executable,
                "-m",
                "rollout.lab.kubelet",
                "--node-config",
                "/etc/rollout-lab/node.json",
            ],
            "log": "/var/log/kubelet.log",
            "restartSec": 1.0,
            "description": f"lab kubelet ({node.distribution} {node.unit}.service)",
            "fragmentPath": lay.unit_path,
            "dropInPaths": list(lay.drop_ins),
            "environment": {"PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"},
        }
    }
    if node.kubelet == "real":
        from rollout.lab import realnode

        assert kubelet_bin is not None, "a real-kubelet node needs the kubelet's bin dir"
        files = realnode.current_flags(files)
        # the sysctl file the distribution ships for its protectKernelDefaults kubelet (the real
        # kubelet refuses to start without those values; the sim does not check them)
        if node.distribution in realhw.DISTRIBUTION_SYSCTL_FILES:
            path, content = realhw.DISTRIBUTION_SYSCTL_FILES[node.distribution]
            files[path] = content
        units = realnode.unit(node.unit, kubelet_bin, lay.unit_path, lay.drop_ins, dra_bin)
        gpus = realhw.gpus(node.shape.topology())
        files[realnode.GPU_FILE] = "".join(f"{g}={numa}\n" for g, numa in gpus)
        files.update(daemonsets.initial_files(path))
    files["/etc/rollout-lab/units.json"] = json.dumps(units, indent=2) + "\n"
    for o in OVERLAYS:
        _upper(node_dir, o).mkdir(parents=True, exist_ok=True)
        (node_dir / "work" / o.strip("/").replace("/", "-")).mkdir(parents=True, exist_ok=True)
    for path, content in files.items():
        o, rel = _overlay_for(path)
        dest = _upper(node_dir, o) / rel
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(content)
        if path.endswith(".key") or "kubeconfig" in path or path.endswith(".conf"):
            dest.chmod(0o600)
    sysfs_tree(node.shape, node_dir / "sys")
    if node.kubelet == "real":
        realhw.hardware_tree(node.shape, node_dir, gpus, files)
