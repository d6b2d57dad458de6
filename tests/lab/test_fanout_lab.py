"""``--forks`` against the lab: a batch of 6 SSH nodes applied with ``--forks 2`` never has more
than 2 ssh processes running as children of the rollout process (facts and apply over plain
ssh), and runs in 3 waves; rolled back with the default bound, the same count sees all 6 restores
at once.

How the children are counted: the test polls ``/proc`` every few milliseconds for processes named
``ssh`` whose parent is the rollout process (the SSH master connections that ``ControlPersist``
leaves behind are children of the first ssh, not of rollout, and are not counted). Polling can
miss a short-lived child, so the peak seen is a lower bound: the test also requires that it saw
2 at once, so the count does see the parallelism it bounds.
"""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab

FORKS = 2
NODES = 6


def _ssh_children(pid: int) -> set[int]:
    """The pids of the processes named ``ssh`` whose parent is ``pid``."""
    out: set[int] = set()
    try:
        entries = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for tid in entries:
        try:
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                kids = [int(x) for x in f.read().split()]
        except OSError:
            continue
        for kid in kids:
            try:
                with open(f"/proc/{kid}/comm", encoding="utf-8") as f:
                    if f.read().strip() == "ssh":
                        out.add(kid)
            except OSError:
                continue
    return out


def _watch(proc: subprocess.Popen[str]) -> tuple[int, int, str, str]:
    """Poll the children of ``proc`` until it exits: (peak ssh children at once, distinct ssh
    children seen, stdout, stderr)."""
    peak = 0
    seen: set[int] = set()
    deadline = time.monotonic() + 300
    while proc.poll() is None:
        now = _ssh_children(proc.pid)
        seen |= now
        peak = max(peak, len(now))
        if time.monotonic() > deadline:
            proc.kill()
            break
        time.sleep(0.003)
    out, err = proc.communicate()
    return peak, len(seen), out, err


def test_forks_bounds_the_ssh_children_of_an_apply(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    nodes = lab_nodes(NODES)
    names = nodes.names
    inv = ck.inventory(lab, names, names, tmp_path / "inv.ini")  # one batch of all six
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"), max_unavailable=NODES)
    env = ck.env(lab, tmp_path / "state")
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    proc = ck.start_cli([*args, "--forks", str(FORKS), "--progress", "plain"], env)
    peak, seen, out, err = _watch(proc)
    assert proc.returncode == 0, err
    doc = json.loads(out)
    assert {n["state"] for n in doc["nodes"]} == {"applied"}, doc
    assert f"{NODES} node(s) in 3 waves of at most {FORKS} (--forks {FORKS})" in err, err
    assert "wave 3/3" in err
    # every node got its facts call and its apply over ssh: 2 per node at least
    assert seen >= 2 * NODES, (seen, err)
    assert peak == FORKS, (peak, seen)
    print(f"apply --forks {FORKS}: peak {peak} ssh children at once, {seen} in all")

    # the control: the rollback with the default bound (50) restores all six at once, and the
    # same count sees it, so a peak of 2 above is the bound and not the counter's blind spot
    proc = ck.start_cli(["rollback", "--change", doc["change"], "--yes", "-o", "json"], env)
    peak, seen, out, err = _watch(proc)
    assert proc.returncode == 0, err
    assert {n["state"] for n in json.loads(out)["nodes"]} == {"restored"}
    assert seen >= NODES, (seen, err)
    assert peak > FORKS, (peak, seen)
    print(f"rollback, default forks: peak {peak}, {seen} in all")
    print(f"forks lab test: {time.monotonic() - started:.1f}s")
