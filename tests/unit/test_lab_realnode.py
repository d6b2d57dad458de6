"""The real-kubelet node's generated hardware and kubelet command line (no processes)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.kubelet import distributions
from rollout.kubelet.cpuset import parse
from rollout.lab import nodefiles, realhw, realnode
from rollout.lab.hardware import NodeShape
from rollout.lab.nodefiles import LabNode, node_config
from rollout.lab.seeds import DISTRIBUTIONS, SeedContext, seed_files

CTX = SeedContext("n1", "10.213.1.2", "apiVersion: v1\nkind: Config\n", "-----BEGIN CERT")


def _tree(tmp_path: Path, shape: NodeShape) -> Path:
    gpus = realhw.gpus(shape.topology())
    realhw.hardware_tree(shape, tmp_path, gpus)
    return tmp_path


def test_cpu_tree_matches_the_sim_layout(tmp_path: Path) -> None:
    shape = NodeShape()
    root = _tree(tmp_path, shape)
    cpu = root / "sys" / "cpu"
    assert (cpu / "online").read_text() == "0-63\n"
    for numa in range(shape.sockets):
        ids = shape.numa_cpus(numa)
        node = root / "sys" / "node" / f"node{numa}"
        linked = sorted(int(p.name[3:]) for p in node.glob("cpu[0-9]*"))
        assert linked == sorted(ids)
        for c in ids:
            assert (cpu / f"cpu{c}" / "topology" / "physical_package_id").read_text() == f"{numa}\n"
            # the link resolves inside the generated tree, as /sys/devices/system/... does
            assert (node / f"cpu{c}" / "topology" / "core_id").exists()
    # SMT: cpu N and N + 32 are the two threads of one core (thread-major numbering)
    assert parse((cpu / "cpu0/topology/thread_siblings_list").read_text().strip()) == {0, 32}
    assert parse((cpu / "cpu47/topology/thread_siblings_list").read_text().strip()) == {15, 47}
    assert (cpu / "cpu47/topology/core_id").read_text() == "15\n"
    assert (cpu / "cpu47/topology/physical_package_id").read_text() == "0\n"
    assert (cpu / "cpu16/topology/physical_package_id").read_text() == "1\n"


def test_proc_files_describe_the_same_machine(tmp_path: Path) -> None:
    shape = NodeShape(sockets=2, cores_per_socket=4, threads_per_core=2, memory_bytes=64 << 30)
    root = _tree(tmp_path, shape)
    info = (root / "proc" / "cpuinfo").read_text()
    assert info.count("processor\t:") == 16
    assert {
        line.split(":")[1].strip() for line in info.splitlines() if line.startswith("physical id")
    } == {"0", "1"}
    meminfo = (root / "proc" / "meminfo").read_text()
    assert f"MemTotal:       {(64 << 30) // 1024} kB" in meminfo
    assert "SwapTotal:             0 kB" in meminfo
    node1 = (root / "sys" / "node" / "node1" / "meminfo").read_text()
    assert f"Node 1 MemTotal:       {(32 << 30) // 1024} kB" in node1


def test_tunables_start_from_host_values_and_are_bound_per_node(tmp_path: Path) -> None:
    root = _tree(tmp_path, NodeShape())
    for t in realhw.KERNEL_TUNABLES:
        host = Path("/proc/sys", t)
        if host.exists():
            assert (root / "proc-sys" / t.replace("/", ".")).read_text() == host.read_text()
    binds = realhw.holder_binds(root)
    assert f"mount --bind {root}/sys/cpu /sys/devices/system/cpu" in binds
    assert any(b.endswith(" /proc/sys/vm/overcommit_memory") for b in binds)
    assert all(b.startswith(("mount ", "mkdir -p /run/", "cp ")) for b in binds)
    # a private /run with the resolv.conf the distributions' kubelet configs name
    assert binds[0] == "mount -t tmpfs -o mode=755 rollout-lab-run /run"
    assert f"cp {root}/resolv.conf /run/systemd/resolve/resolv.conf" in binds


def test_gpus_carry_their_numa_node() -> None:
    g = realhw.gpus(NodeShape(gpus_per_numa=2).topology())
    assert g == [("GPU-0", 0), ("GPU-1", 0), ("GPU-2", 1), ("GPU-3", 1)]


def _node_root(tmp_path: Path, dist: str) -> Path:
    for path, content in seed_files(dist, CTX).items():
        dest = tmp_path / path.lstrip("/")
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_text(content)
    return tmp_path


def test_kubeadm_argv_is_the_units_flags_then_the_lab_flags(tmp_path: Path) -> None:
    root = _node_root(tmp_path, "kubeadm")
    node = LabNode("n1", 1, "kubeadm", "t")
    cfg = node_config(node, Path("/x.sock"), "/etc/kubernetes/kubelet.conf")
    argv = realnode.kubelet_argv(cfg, Path("/bin-dir"), root)
    assert argv[0] == "/bin-dir/kubelet"
    assert "--config=/var/lib/kubelet/config.yaml" in argv
    assert "--kubeconfig=/etc/kubernetes/kubelet.conf" in argv
    lab = realnode.lab_flags(node.ip, cfg["labels"])  # type: ignore[arg-type]
    assert argv[-len(lab) :] == lab
    assert "--fail-swap-on=false" in lab and "--cgroups-per-qos=false" in lab
    assert f"--node-ip={node.ip}" in lab
    assert any(a.startswith("--node-labels=") and "rollout.dev/lab=t" in a for a in lab)


@pytest.mark.parametrize("dist", DISTRIBUTIONS)
def test_every_distribution_gets_a_config_source_and_a_kubeconfig(
    tmp_path: Path, dist: str
) -> None:
    root = _node_root(tmp_path, dist)
    node = LabNode("n1", 1, dist, "t")
    cfg = node_config(node, Path("/x.sock"), "/etc/kubernetes/kubelet.conf")
    argv = realnode.kubelet_argv(cfg, Path("/b"), root)
    d = distributions.get(dist)
    has_config = any(a.startswith(("--config=", "--config-dir=")) for a in argv)
    # MicroK8s configures its kubelet with flags only (args/kubelet), no config file
    assert has_config == bool(d.config_file or d.dropin_always), argv
    assert sum(a.startswith("--kubeconfig=") for a in argv) >= 1


def test_real_node_seeds_gpu_file_and_real_unit(tmp_path: Path) -> None:
    from rollout.lab import nodes

    node = LabNode("n1", 1, "kubeadm", "t", kubelet="real")
    creds = nodefiles.NodeCredentials("ca", "c", "k", "sc", "sk", "apiVersion: v1\n", 6443)
    nodefiles.write_node_files(node, tmp_path, creds, Path("/s.sock"), "v1.36.3", Path("/kb"))
    etc = tmp_path / "upper" / "etc" / "rollout-lab"
    assert (etc / "gpus.txt").read_text().splitlines()[:2] == ["GPU-0=0", "GPU-1=0"]
    units = (etc / "units.json").read_text()
    assert "rollout.lab.realnode" in units and "/kb" in units
    assert "rollout.lab.kubelet" not in units
    assert (tmp_path / "sys" / "cpu" / "cpu63" / "topology" / "core_id").exists()
    assert "mount --bind" in nodes._holder_script(node, tmp_path, Path("/shim"))
    assert "/sys/devices/system/cpu" in nodes._holder_script(node, tmp_path, Path("/shim"))
    sim = LabNode("n1", 1, "kubeadm", "t")
    assert "/sys/devices/system/cpu" not in nodes._holder_script(sim, tmp_path, Path("/shim"))


def test_flags_the_labs_kubelet_no_longer_knows_are_not_seeded() -> None:
    for dist in ("kubeadm", "eks-al2"):
        files = seed_files(dist, CTX)
        assert any("--pod-infra-container-image" in t for t in files.values())
        out = realnode.current_flags(files)
        assert not any("--pod-infra-container-image" in t for t in out.values())
        changed = [p for p in files if files[p] != out[p]]
        assert changed and all(out[p].strip() for p in changed)
    flags = realnode.current_flags(seed_files("kubeadm", CTX))["/var/lib/kubelet/kubeadm-flags.env"]
    assert flags == (
        'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint='
        'unix:///var/run/containerd/containerd.sock"\n'
    )


def test_a_lab_node_sources_an_empty_bashrc_not_the_workstations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout.lab import nodes

    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    sim = LabNode("n1", 1, "kubeadm", "t")
    assert ".bashrc" not in nodes._holder_script(sim, tmp_path, Path("/shim"))
    (home / ".bashrc").write_text('eval "$(pyenv init -)"\n')
    script = nodes._holder_script(sim, tmp_path, Path("/shim"))
    assert f"mount --bind {tmp_path}/bashrc {home}/.bashrc" in script.splitlines()
