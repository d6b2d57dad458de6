"""A real-kubelet lab node's machine as the kubelet sees it: CPUs, NUMA nodes, memory, GPUs and the
kernel tunables it checks or sets.

cadvisor (inside the kubelet) reads ``/sys/devices/system/{cpu,node}``, ``/proc/cpuinfo`` and
``/proc/meminfo``; :func:`hardware_tree` writes those trees for the node's :class:`NodeShape
<rollout.lab.hardware.NodeShape>` and :func:`holder_binds` binds them over the real paths inside
the node's mount namespace only.

The kernel tunables the kubelet's container manager checks at start (``setupKernelTunables``) are
per-node files bound over their ``/proc/sys`` paths, so a kubelet that sets them writes into the
node directory. Their values at "boot" are what the node's own sysctl files set
(:func:`boot_sysctls`, the way systemd-sysctl applies ``/etc/sysctl.d`` at boot), else the host's.
That matters for the distributions whose kubelet runs with ``protectKernelDefaults: true`` (EKS
AL2, EKS AL2023, kubespray): that kubelet does not set the tunables, it refuses to start unless the
kernel already has its values, and those distributions' images or installers ship the sysctl
file that sets them (:data:`DISTRIBUTION_SYSCTL_FILES`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

#: sysctls the kubelet's container manager sets at start (``setupKernelTunables``; the kubelet
#: writes them unless ``protectKernelDefaults``): bound over, per node.
KERNEL_TUNABLES = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)


#: The sysctl file a distribution's node image or installer writes because its kubelet runs with
#: ``protectKernelDefaults: true`` (the kubelet then checks, and does not set, the tunables above):
#: ``{distribution: (path, content)}``.
#:
#: * EKS AL2: the AMI's ``install-worker.sh`` ("Stuff required by protectKernelDefaults=true")
#:   appends ``vm.overcommit_memory=1``, ``kernel.panic=10``, ``kernel.panic_on_oops=1`` to
#:   ``/etc/sysctl.d/99-amazon.conf``.
#: * EKS AL2023: nodeadm writes ``protectKernelDefaults: true`` as well; the AL2023 EKS AMI's own
#:   file for these values was not found in the sources at hand, so the lab uses the AL2 AMI's
#:   file and values (the ones the kubelet requires; see docs/lab-real-kubelet.md).
#: * kubespray: ``roles/kubernetes/preinstall`` ("Ensure kube-bench parameters are set", when
#:   ``kubelet_protect_kernel_defaults``, the default) sets the same three with Ansible's
#:   ``sysctl`` module in ``sysctl_file_path`` (``/etc/sysctl.d/99-sysctl.conf``), after
#:   ``net.ipv4.ip_forward=1``.
DISTRIBUTION_SYSCTL_FILES: dict[str, tuple[str, str]] = {
    "eks-al2": (
        "/etc/sysctl.d/99-amazon.conf",
        "vm.overcommit_memory=1\nkernel.panic=10\nkernel.panic_on_oops=1\n",
    ),
    "eks-al2023": (
        "/etc/sysctl.d/99-amazon.conf",
        "vm.overcommit_memory=1\nkernel.panic=10\nkernel.panic_on_oops=1\n",
    ),
    "kubespray": (
        "/etc/sysctl.d/99-sysctl.conf",
        "net.ipv4.ip_forward=1\nvm.overcommit_memory=1\nkernel.panic=10\nkernel.panic_on_oops=1\n",
    ),
}

_SYSCTL_DIRS = ("/usr/lib/sysctl.d/", "/run/sysctl.d/", "/etc/sysctl.d/")


def boot_sysctls(files: Mapping[str, str]) -> dict[str, str]:
    """``{"vm/overcommit_memory": "1", ...}``: the values the node's sysctl files (``files``:
    ``{absolute path: content}``) set at boot, applied as systemd-sysctl does: every
    ``*.conf`` of ``/usr/lib/sysctl.d``, ``/run/sysctl.d`` and ``/etc/sysctl.d`` in the order of
    their file names (a name in ``/etc`` hides the same name in the others), ``/etc/sysctl.conf``
    last; a later setting wins."""
    by_name: dict[str, str] = {}
    for d in _SYSCTL_DIRS:  # later directories hide the same file name in earlier ones
        for path in files:
            if path.startswith(d) and path.endswith(".conf") and "/" not in path[len(d) :]:
                by_name[path[len(d) :]] = path
    order = [by_name[name] for name in sorted(by_name)]
    if "/etc/sysctl.conf" in files:
        order.append("/etc/sysctl.conf")
    out: dict[str, str] = {}
    for path in order:
        for line in files[path].splitlines():
            line = line.strip()
            if not line or line[0] in "#;" or "=" not in line:
                continue
            key, value = (x.strip() for x in line.split("=", 1))
            out[re.sub(r"[./]", "/", key.lstrip("-"))] = value
    return out


def _cpu_layout(shape: Any) -> dict[int, tuple[int, int]]:
    """cpu id -> (socket, core id in socket), Linux thread-major numbering as the sim uses."""
    out: dict[int, tuple[int, int]] = {}
    for numa in range(shape.sockets):
        for k, cpu in enumerate(shape.numa_cpus(numa)):
            out[cpu] = (numa, k % shape.cores_per_socket)
    return out


def _cpulist(ids: Sequence[int]) -> str:
    from rollout.kubelet.cpuset import format_cpus

    return format_cpus(ids)


def hardware_tree(
    shape: Any,
    node_dir: Path,
    gpus: Sequence[tuple[str, int]],
    node_files: Mapping[str, str] | None = None,
) -> None:
    """Write the files bound over ``/sys/devices/system/{cpu,node}``, ``/proc/{cpuinfo,meminfo}``
    and the kernel tunables, under ``node_dir`` (``sys/`` already holds the sim's node tree).
    ``node_files``: the node's seeded files; the tunables their sysctl files set start at those
    values (:func:`boot_sysctls`), the others at the host's."""
    boot = boot_sysctls(node_files or {})
    layout = _cpu_layout(shape)
    n = shape.cpus
    cpu_root = node_dir / "sys" / "cpu"
    cpu_root.mkdir(parents=True, exist_ok=True)
    all_cpus = _cpulist(range(n))
    for f in ("online", "possible", "present"):
        (cpu_root / f).write_text(all_cpus + "\n")
    (cpu_root / "offline").write_text("\n")
    (cpu_root / "kernel_max").write_text(f"{max(n - 1, 8191)}\n")
    for cpu, (sock, core) in layout.items():
        siblings = [c for c, sc in layout.items() if sc == (sock, core)]
        package = [c for c, sc in layout.items() if sc[0] == sock]
        top = cpu_root / f"cpu{cpu}" / "topology"
        top.mkdir(parents=True, exist_ok=True)
        (cpu_root / f"cpu{cpu}" / "online").write_text("1\n")
        for name, value in (
            ("core_id", str(core)),
            ("physical_package_id", str(sock)),
            ("die_id", "0"),
            ("thread_siblings_list", _cpulist(siblings)),
            ("core_cpus_list", _cpulist(siblings)),
            ("core_siblings_list", _cpulist(package)),
            ("package_cpus_list", _cpulist(package)),
        ):
            (top / name).write_text(value + "\n")
    node_root = node_dir / "sys" / "node"
    kib = shape.memory_bytes // shape.sockets // 1024
    for numa in range(shape.sockets):
        nd = node_root / f"node{numa}"
        nd.mkdir(parents=True, exist_ok=True)
        for cpu in shape.numa_cpus(numa):
            link = nd / f"cpu{cpu}"
            if not link.is_symlink():
                link.symlink_to(f"../../cpu/cpu{cpu}")
        (nd / "cpumap").write_text("\n")
        for size in ("2048kB", "1048576kB"):
            hp = nd / "hugepages" / f"hugepages-{size}"
            hp.mkdir(parents=True, exist_ok=True)
            for f in ("nr_hugepages", "free_hugepages", "surplus_hugepages"):
                (hp / f).write_text("0\n")
        (nd / "meminfo").write_text(
            f"Node {numa} MemTotal:       {kib} kB\n"
            f"Node {numa} MemFree:        {kib * 9 // 10} kB\n"
            f"Node {numa} MemUsed:        {kib // 10} kB\n"
            f"Node {numa} HugePages_Total:     0\nNode {numa} HugePages_Free:      0\n"
        )
    proc = node_dir / "proc"
    proc.mkdir(exist_ok=True)
    blocks = []
    for cpu in range(n):
        sock, core = layout[cpu]
        blocks.append(
            f"processor\t: {cpu}\nvendor_id\t: GenuineIntel\ncpu family\t: 6\nmodel\t\t: 143\n"
            f"model name\t: {shape.cpu_model}\nstepping\t: 8\ncpu MHz\t\t: 2000.000\n"
            f"cache size\t: 107520 KB\nphysical id\t: {sock}\n"
            f"siblings\t: {shape.cores_per_socket * shape.threads_per_core}\n"
            f"core id\t\t: {core}\ncpu cores\t: {shape.cores_per_socket}\n"
            f"apicid\t\t: {cpu}\nfpu\t\t: yes\nflags\t\t: fpu vme de pse tsc msr pae mce cx8 "
            "apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht syscall nx "
            "lm constant_tsc nopl xtopology cpuid pni ssse3 sse4_1 sse4_2 avx avx2 avx512f\n"
            "bogomips\t: 4000.00\n"
        )
    (proc / "cpuinfo").write_text("\n".join(blocks) + "\n")
    total = shape.memory_bytes // 1024
    (proc / "meminfo").write_text(
        f"MemTotal:       {total} kB\nMemFree:        {total * 9 // 10} kB\n"
        f"MemAvailable:   {total * 9 // 10} kB\nBuffers:               0 kB\n"
        "Cached:                0 kB\nSwapCached:            0 kB\n"
        "SwapTotal:             0 kB\nSwapFree:              0 kB\n"
        "HugePages_Total:       0\nHugePages_Free:        0\nHugePages_Rsvd:        0\n"
        "HugePages_Surp:        0\nHugepagesize:       2048 kB\n"
    )
    try:
        resolv = Path("/etc/resolv.conf").read_text()
    except OSError:
        resolv = ""
    (node_dir / "resolv.conf").write_text(resolv or "nameserver 127.0.0.53\n")
    sysctl = node_dir / "proc-sys"
    for t in KERNEL_TUNABLES:
        dest = sysctl / t.replace("/", ".")
        dest.parent.mkdir(parents=True, exist_ok=True)
        if t in boot:  # what the node's sysctl files set at boot (systemd-sysctl)
            dest.write_text(boot[t] + "\n")
            continue
        try:  # else the host's value, as a fresh machine would have its own defaults
            dest.write_text(Path("/proc/sys", t).read_text())
        except OSError:
            dest.write_text("0\n")


def holder_binds(node_dir: Path) -> list[str]:
    """Shell lines for the node's holder: bind the generated hardware and tunables (node mount
    namespace only; propagation is private, so the host never sees them)."""
    lines = [
        # a private /run, as a node has its own: the kubelet reads the node's resolvConf
        # (/run/systemd/resolve/resolv.conf in the distributions' files) to build every sandbox
        "mount -t tmpfs -o mode=755 rollout-lab-run /run",
        "mkdir -p /run/sshd /run/systemd/resolve",
        f"cp {node_dir}/resolv.conf /run/systemd/resolve/resolv.conf",
        f"mount --bind {node_dir}/sys/cpu /sys/devices/system/cpu",
        f"mount --bind {node_dir}/proc/cpuinfo /proc/cpuinfo",
        f"mount --bind {node_dir}/proc/meminfo /proc/meminfo",
    ]
    for t in KERNEL_TUNABLES:
        if Path("/proc/sys", t).exists():
            lines.append(f"mount --bind {node_dir}/proc-sys/{t.replace('/', '.')} /proc/sys/{t}")
    return lines


def gpus(topology: Mapping[str, Any]) -> list[tuple[str, int]]:
    """(device id, NUMA node) of the node's simulated GPUs."""
    return [
        (str(g), int(n["id"])) for n in topology.get("numaNodes") or () for g in n.get("gpus") or ()
    ]
