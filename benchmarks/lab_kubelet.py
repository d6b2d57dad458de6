"""Measure the lab kubelet: time from `lab add` to Ready, idle CPU and memory of one kubelet.

Run as root on a machine with the lab binaries (``ROLLOUT_LAB_BIN`` or the cache dir)::

    .venv/bin/python benchmarks/lab_kubelet.py [--idle-seconds 30]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import tempfile
import time
from pathlib import Path

from rollout.lab.cluster import Lab


def _cpu_seconds(pid: str) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--idle-seconds", type=float, default=30.0)
    args = ap.parse_args()
    lab = Lab(f"bench{os.getpid()}", Path(tempfile.mkdtemp(prefix="lab-kubelet-bench-")))
    lab.start_control_plane()
    try:
        t = time.monotonic()
        lab.machines.add_nodes(["bench-1"], ["kubeadm"], wait_ready=True)
        print(f"add node -> Ready: {time.monotonic() - t:.2f} s")
        netns = lab.nodes["bench-1"].node.netns
        pids = subprocess.run(
            ["ip", "netns", "pids", netns], capture_output=True, text=True, check=True
        ).stdout.split()
        (pid,) = [
            p for p in pids if b"rollout.lab.kubelet" in Path(f"/proc/{p}/cmdline").read_bytes()
        ]
        c0 = _cpu_seconds(pid)
        time.sleep(args.idle_seconds)
        used = _cpu_seconds(pid) - c0
        print(
            f"idle CPU: {used:.3f} s over {args.idle_seconds:g} s "
            f"({used / args.idle_seconds * 100:.2f} % of a core)"
        )
        rss = next(
            line
            for line in Path(f"/proc/{pid}/status").read_text().splitlines()
            if line.startswith("VmRSS")
        )
        print(rss)
    finally:
        lab.down()


if __name__ == "__main__":
    main()
