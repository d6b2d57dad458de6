"""Node roots built from the shared real-node fixtures (``tests/fixtures/kubelet``).

The fixtures carry ``# [fixture]`` provenance lines that are not part of the real files; they are
stripped here, as the fixtures README says.
"""

from __future__ import annotations

from pathlib import Path

from rollout.kubelet.loading import NodeFiles, node_from_files

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet"

K3S_D = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d"
RKE2_D = "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d"

NODE_FILES: dict[str, dict[str, str]] = {
    "kubeadm": {
        "kubeadm-var-lib-kubelet-config.yaml": "/var/lib/kubelet/config.yaml",
        "kubeadm-kubeadm-flags.env": "/var/lib/kubelet/kubeadm-flags.env",
        "kubeadm-10-kubeadm.conf": "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",
        "kubeadm-etc-default-kubelet": "/etc/default/kubelet",
    },
    "k3s": {
        "k3s-00-k3s-defaults.conf": K3S_D + "/00-k3s-defaults.conf",
        "k3s-config.yaml": "/etc/rancher/k3s/config.yaml",
    },
    "rke2": {
        "rke2-00-rke2-defaults.conf": RKE2_D + "/00-rke2-defaults.conf",
        "rke2-config.yaml": "/etc/rancher/rke2/config.yaml",
    },
    "eks-al2": {"eks-al2-kubelet-config.json": "/etc/kubernetes/kubelet/kubelet-config.json"},
    "eks-al2023": {
        "eks-al2023-config.json": "/etc/kubernetes/kubelet/config.json",
        "eks-al2023-40-nodeadm.conf": "/etc/kubernetes/kubelet/config.json.d/40-nodeadm.conf",
    },
    "kubespray": {"kubespray-kubelet-config.yaml": "/etc/kubernetes/kubelet-config.yaml"},
    "microk8s": {"microk8s-args-kubelet": "/var/snap/microk8s/current/args/kubelet"},
}


def strip_provenance(data: bytes) -> bytes:
    return b"".join(
        line for line in data.splitlines(keepends=True) if not line.startswith(b"# [fixture]")
    )


def fixture_files(distribution: str) -> dict[str, bytes]:
    return {
        node_path: strip_provenance((FIXTURES / name).read_bytes())
        for name, node_path in NODE_FILES[distribution].items()
    }


def real_node(distribution: str) -> NodeFiles:
    return node_from_files(distribution, fixture_files(distribution))


def write_root(root: Path, files: dict[str, bytes]) -> Path:
    for node_path, data in files.items():
        target = root / node_path.lstrip("/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return root
