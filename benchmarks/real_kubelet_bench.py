"""Real-kubelet lab nodes vs simulated ones: start-up time and memory per node, side by side.

Run as root on a machine with the lab binaries and the real kubelet
(``tools/build-lab-kubelet.sh``)::

    .venv/bin/python benchmarks/real_kubelet_bench.py [--nodes 3] [--settle 20]

Method: one lab control plane; for each kind (``sim``, then ``real``) add ``--nodes`` nodes one at a
time and time ``add_nodes(..., wait_ready=True)`` (namespaces + sshd + unit start -> Node Ready in
the API). After ``--settle`` seconds, sum the RSS (``VmRSS``) of every process in each node's
network namespace (sshd, relay, holder, and the kubelet; for ``real`` also the fake CRI and the fake
device plugin) and, separately, of the kubelet process alone. Prints raw numbers per node, then
medians and the real/sim ratio, and how many real nodes fit in the machine's available memory
(``MemAvailable`` now, divided by the median real node's RSS; CPU is the other limit: idle CPU per
node over the settle period is printed too).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

from rollout.lab.cluster import Lab
from rollout.lab.network import netns_pids


def _rss_kib(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _cpu_s(pid: int) -> float:
    try:
        f = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK")


def _is_kubelet(pid: int) -> bool:
    try:
        exe = os.readlink(f"/proc/{pid}/exe")
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return exe.endswith("/kubelet") or b"rollout.lab.kubelet" in cmd


def _mem_available_kib() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1])
    return 0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=3)
    ap.add_argument("--settle", type=float, default=20.0)
    args = ap.parse_args()
    lab = Lab(f"rkb{os.getpid()}", Path(tempfile.mkdtemp(prefix="real-kubelet-bench-")))
    lab.start_control_plane()
    results: dict[str, list[tuple[float, int, int, float]]] = {}
    try:
        for kind in ("sim", "real"):
            names = [f"{kind}-{i}" for i in range(1, args.nodes + 1)]
            ready: list[float] = []
            for name in names:
                t = time.monotonic()
                lab.machines.add_nodes(
                    [name], ["kubeadm"], wait_ready=True, timeout=120, kubelet=kind
                )
                ready.append(time.monotonic() - t)
            cpu0 = {x: sum(_cpu_s(p) for p in netns_pids(lab.nodes[x].node.netns)) for x in names}
            time.sleep(args.settle)
            rows = []
            for name, secs in zip(names, ready, strict=True):
                pids = netns_pids(lab.nodes[name].node.netns)
                total = sum(_rss_kib(p) for p in pids)
                kubelet = sum(_rss_kib(p) for p in pids if _is_kubelet(p))
                idle = (sum(_cpu_s(p) for p in pids) - cpu0[name]) / args.settle
                rows.append((secs, total, kubelet, idle))
                print(
                    f"{kind:4} {name}: add->Ready {secs:6.2f} s  node RSS {total / 1024:7.1f} MiB"
                    f"  kubelet RSS {kubelet / 1024:7.1f} MiB  idle CPU {idle * 100:5.2f} %"
                )
            results[kind] = rows
            lab.machines.remove_nodes(names)
    finally:
        lab.down()
    med = {
        k: [statistics.median(r[i] for r in rows) for i in range(4)] for k, rows in results.items()
    }
    print("\nmedians            sim        real     real/sim")
    for i, (label, scale) in enumerate(
        [("add->Ready (s)", 1.0), ("node RSS (MiB)", 1024), ("kubelet RSS (MiB)", 1024)]
    ):
        s, r = med["sim"][i] / scale, med["real"][i] / scale
        print(f"{label:18} {s:9.2f}  {r:9.2f}  {r / s if s else float('nan'):9.2f}")
    s, r = med["sim"][3] * 100, med["real"][3] * 100
    print(f"{'idle CPU (%core)':18} {s:9.2f}  {r:9.2f}")
    avail = _mem_available_kib()
    per = med["real"][1]
    print(
        f"\nMemAvailable now {avail / 1024 / 1024:.1f} GiB -> about {int(avail // per)} real "
        f"nodes by memory ({per / 1024:.0f} MiB each); by idle CPU about "
        f"{int(os.cpu_count() or 1) / max(med['real'][3], 1e-6):.0f} on {os.cpu_count()} cores"
    )


if __name__ == "__main__":
    main()
