"""A lab node's simulated hardware: CPUs, NUMA nodes, memory and GPUs, and the sysfs tree for it.

The facts playbook reads ``/sys/devices/system/node`` and ``/sys/bus/pci/devices`` on a real node;
a lab node gets the same files, written here and bound over those paths inside its mount
namespace, so facts collection runs the same code on both. The shape is also what the lab
kubelets (simulated, or real through cadvisor's files) see.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rollout.kubelet.cpuset import format_cpus


@dataclass(frozen=True)
class NodeShape:
    """Simulated hardware of a node: CPU numbering as Linux does it (thread-major)."""

    sockets: int = 2
    cores_per_socket: int = 16
    threads_per_core: int = 2
    gpus_per_numa: int = 4
    memory_bytes: int = 1 << 40
    cpu_model: str = "Intel(R) Xeon(R) Platinum 8480+ (lab)"
    max_pods: int = 110
    #: the GPUs' PCI device id (vendor 0x10de): 0x2330 H100 SXM5, 0x2335 H200 SXM
    gpu_device: str = "0x2330"

    @property
    def cpus(self) -> int:
        return self.sockets * self.cores_per_socket * self.threads_per_core

    def numa_cpus(self, numa: int) -> list[int]:
        """CPU ids of NUMA node ``numa`` (one NUMA node per socket; sibling = id + cores)."""
        cores = self.sockets * self.cores_per_socket
        first = numa * self.cores_per_socket
        return [
            t * cores + first + c
            for t in range(self.threads_per_core)
            for c in range(self.cores_per_socket)
        ]

    def topology(self) -> dict[str, object]:
        """The ``topology`` block of node.json."""
        per_numa_mem = self.memory_bytes // self.sockets
        return {
            "cpuModel": self.cpu_model,
            "sockets": self.sockets,
            "coresPerSocket": self.cores_per_socket,
            "threadsPerCore": self.threads_per_core,
            "numaNodes": [
                {
                    "id": n,
                    "cpus": format_cpus(self.numa_cpus(n)),
                    "memoryBytes": per_numa_mem,
                    "gpus": [
                        f"GPU-{n * self.gpus_per_numa + g}" for g in range(self.gpus_per_numa)
                    ],
                    "gpuPciAddresses": [gpu_pci(n, g) for g in range(self.gpus_per_numa)],
                }
                for n in range(self.sockets)
            ],
        }


def gpu_pci(numa: int, g: int) -> str:
    return f"0000:{0x18 + numa * 0x80 + g * 0x10:02x}:00.0"


def sysfs_tree(shape: NodeShape, root: Path) -> None:
    """Write a sysfs-like tree the facts playbook reads as on real hardware:

    ``node/nodeN/{cpulist,meminfo}``, ``node/{online,possible}`` (bound over
    ``/sys/devices/system/node``) and ``pci/<addr>/{vendor,device,class,numa_node}`` for the GPUs
    (bound over ``/sys/bus/pci/devices``).
    """
    node_dir, pci = root / "node", root / "pci"
    online = f"0-{shape.sockets - 1}" if shape.sockets > 1 else "0"
    for d in (node_dir, pci):
        d.mkdir(parents=True, exist_ok=True)
    for f in ("online", "possible", "has_cpu", "has_memory", "has_normal_memory"):
        (node_dir / f).write_text(online + "\n")
    kib = shape.memory_bytes // shape.sockets // 1024
    for n in range(shape.sockets):
        nd = node_dir / f"node{n}"
        nd.mkdir(exist_ok=True)
        (nd / "cpulist").write_text(format_cpus(shape.numa_cpus(n)) + "\n")
        (nd / "meminfo").write_text(
            f"Node {n} MemTotal:       {kib} kB\nNode {n} MemFree:        {kib * 9 // 10} kB\n"
        )
        (nd / "distance").write_text(
            " ".join("10" if m == n else "21" for m in range(shape.sockets)) + "\n"
        )
        for g in range(shape.gpus_per_numa):
            gd = pci / gpu_pci(n, g)
            gd.mkdir(exist_ok=True)
            (gd / "vendor").write_text("0x10de\n")
            (gd / "device").write_text(shape.gpu_device + "\n")
            (gd / "class").write_text("0x030200\n")
            (gd / "numa_node").write_text(f"{n}\n")
