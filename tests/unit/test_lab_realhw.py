"""A real-kubelet node's kernel tunables at boot: what the node's own sysctl files set (as
systemd-sysctl applies them), so a ``protectKernelDefaults: true`` kubelet finds its values."""

from __future__ import annotations

from pathlib import Path

from rollout.lab import realhw
from rollout.lab.hardware import NodeShape

#: what the kubelet's setupKernelTunables requires (pkg/util/sysctl: VMOvercommitMemoryAlways,
#: KernelPanicRebootTimeout, KernelPanicOnOopsAlways)
KUBELET_WANTS = {"vm/overcommit_memory": "1", "kernel/panic": "10", "kernel/panic_on_oops": "1"}


def test_boot_sysctls_follow_systemd_sysctl_order() -> None:
    files = {
        "/usr/lib/sysctl.d/50-default.conf": "kernel.panic = 5\nvm.overcommit_memory=0\n",
        "/etc/sysctl.d/99-amazon.conf": "vm.overcommit_memory=1\n# comment\nkernel.panic=10\n",
        "/etc/sysctl.d/10-a.conf": "kernel.panic=7\n",
        # same name in /etc hides the vendor file
        "/usr/lib/sysctl.d/10-a.conf": "kernel.panic_on_oops=0\n",
        "/etc/sysctl.conf": "kernel/keys/root_maxkeys = 2000000\n",
        "/etc/sysctl.d/sub/x.conf": "kernel.panic=1\n",  # not a sysctl.d file
        "/etc/kubernetes/kubelet.conf": "kernel.panic=2\n",
    }
    assert realhw.boot_sysctls(files) == {
        "kernel/panic": "10",
        "vm/overcommit_memory": "1",
        "kernel/keys/root_maxkeys": "2000000",
    }


def test_protect_kernel_defaults_distributions_ship_the_kubelets_values() -> None:
    # the three seeded distributions whose kubelet config has protectKernelDefaults: true
    assert set(realhw.DISTRIBUTION_SYSCTL_FILES) == {"eks-al2", "eks-al2023", "kubespray"}
    for path, content in realhw.DISTRIBUTION_SYSCTL_FILES.values():
        got = realhw.boot_sysctls({path: content})
        assert {k: got[k] for k in KUBELET_WANTS} == KUBELET_WANTS


def test_node_tunables_start_from_the_nodes_sysctl_files(tmp_path: Path) -> None:
    path, content = realhw.DISTRIBUTION_SYSCTL_FILES["kubespray"]
    shape = NodeShape()
    realhw.hardware_tree(shape, tmp_path, realhw.gpus(shape.topology()), {path: content})
    for t, want in KUBELET_WANTS.items():
        assert (tmp_path / "proc-sys" / t.replace("/", ".")).read_text() == want + "\n"
    # a tunable the file does not set starts from the host's value
    host = Path("/proc/sys/vm/panic_on_oom")
    if host.exists():
        assert (tmp_path / "proc-sys/vm.panic_on_oom").read_text() == host.read_text()
