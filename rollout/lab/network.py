"""A lab node's network namespace, and the ``ip`` commands that make, list and delete it.

Addresses come from the lab range ``10.213.<i>.0/30`` (host side ``.1``, node side ``.2``); they
exist only inside namespaces the lab creates (:func:`rollout.lab.nodes.create_network` picks a
free index under a lock). Deleting the namespace deletes the veth pair; the host end is never
deleted by name, since another lab may already have reused it.
"""

from __future__ import annotations

import re
import subprocess

from rollout.errors import LabError

NET_PREFIX = "10.213"


def run(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    try:
        return subprocess.run(args, check=check, capture_output=True, text=True, timeout=30)
    except subprocess.CalledProcessError as e:
        raise LabError(f"{' '.join(args)}: {e.stderr.strip() or e}") from e


def used_indexes() -> set[int]:
    """Lab-range indexes already taken by any lab on this machine (host-side veths ``rl<i>h``)."""
    out = run("ip", "-o", "link", "show", check=False).stdout
    used: set[int] = set()
    for line in out.splitlines():
        name = line.split(":")[1].strip().split("@")[0] if ":" in line else ""
        if name.startswith("rl") and name.endswith("h") and name[2:-1].isdigit():
            used.add(int(name[2:-1]))
    # Also any host-side address already in the lab range, whatever the link is called (a lab
    # from an older build, or a veth being torn down): an index is free only when both say so.
    addrs = run("ip", "-o", "-4", "addr", "show", check=False).stdout
    for m in re.finditer(rf"inet {re.escape(NET_PREFIX)}\.(\d+)\.\d+/", addrs):
        used.add(int(m.group(1)))
    return used


def delete_network(netns: str) -> None:
    """Delete the namespace. The node end of the veth pair lives in it, so the pair (and the host
    end) goes with it; the host end is never deleted by name, since after the namespace is gone
    another lab may already have created a veth with the same name."""
    run("ip", "netns", "del", netns, check=False)


def netns_pids(netns: str) -> list[int]:
    """PIDs of processes inside the lab's network namespace ``netns``."""
    out = run("ip", "netns", "pids", netns, check=False).stdout
    return [int(p) for p in out.split() if p.isdigit()]


def lab_namespaces(lab: str) -> list[str]:
    """Network namespaces named after lab ``lab`` (``rollout-<lab>-<index>``)."""
    out = run("ip", "netns", "list", check=False).stdout
    names = [line.split()[0] for line in out.splitlines() if line.strip()]
    prefix = f"rollout-{lab}-"
    return [x for x in names if x.startswith(prefix) and x[len(prefix) :].isdigit()]
