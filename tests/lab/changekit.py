"""Helpers for the change lab tests: inventories with a chosen canary group, plans with short drain
timeouts, the CLI as a subprocess, and sha256 snapshots of the node files a change may touch."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.lab.cluster import Lab
from rollout.lab.inventory import LAB_INTENT

ROLLOUT = str(Path(sys.executable).parent / "rollout")
# the node files a change may touch, per distribution (checkpoints and pods excluded)
WATCHED_DIRS = (
    "etc/kubernetes",
    "etc/systemd/system",
    "usr/lib/systemd/system",
    "etc/rancher",
    "etc/default",
    "etc/sysconfig",
    "etc/eks",
    "var/snap/microk8s/current/args",
)
WATCHED_FILES = ("var/lib/kubelet/config.yaml", "var/lib/kubelet/kubeadm-flags.env")
# fast failure paths: the playbook's healthz wait gives up after ~6 s instead of 60 s
FAST_VARS = "rollout_kubelet_healthz_retries=6\nrollout_kubelet_healthz_delay=1\n"


def inventory(lab: Lab, nodes: Sequence[str], canary: Sequence[str], path: Path) -> Path:
    """A lab inventory whose ``canary`` group is exactly ``canary``."""
    lab.machines.write_inventory(list(nodes), path)
    lines = path.read_text().splitlines()
    start = lines.index("[canary]")
    end = lines.index("", start)
    lines[start + 1 : end] = list(canary)
    text = "\n".join(lines) + "\n"
    text = text.replace("[all:vars]\n", "[all:vars]\n" + FAST_VARS)
    path.write_text(text)
    return path


def plan(
    path: Path,
    distributions: dict[str, str],
    max_unavailable: int = 2,
    drain_timeout: str = "20s",
) -> Path:
    """The lab's canary plan (static CPU manager reserving 0,32; single-numa-node; pod scope)."""
    lines = [
        "apiVersion: rollout.dev/v1alpha1",
        "kind: RolloutPlan",
        "metadata:",
        "  name: lab-test",
        *LAB_INTENT,
        "strategy:",
        "  canaryGroup: canary",
        f"  maxUnavailable: {max_unavailable}",
        "  drain:",
        f"    timeout: {drain_timeout}",
        "    backoffCap: 1s",
        "nodes:",
    ]
    for node, dist in distributions.items():
        lines += [f"  {node}:", f"    distribution: {dist}"]
    path.write_text("\n".join(lines) + "\n")
    return path


def env(lab: Lab, state: Path) -> dict[str, str]:
    """Environment for the CLI subprocess."""
    e = {**os.environ, "KUBECONFIG": str(lab.kubeconfig), "ROLLOUT_STATE_DIR": str(state)}
    e.pop("ROLLOUT_PLAN", None)
    e.pop("ROLLOUT_INVENTORY", None)
    return e


def cli(
    args: Sequence[str], environ: dict[str, str], timeout: float = 240
) -> subprocess.CompletedProcess[str]:
    """Run ``rollout ARGS`` and capture its output."""
    return subprocess.run(
        [ROLLOUT, *args], env=environ, capture_output=True, text=True, timeout=timeout, check=False
    )


def start_cli(args: Sequence[str], environ: dict[str, str]) -> subprocess.Popen[str]:
    """Start ``rollout ARGS`` in the background."""
    return subprocess.Popen(
        [ROLLOUT, *args], env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def latest_journal(state: Path) -> Journal | None:
    """The newest change's journal, or None before one exists."""
    try:
        return Journal.open(state)
    except Exception:
        return None


def wait_for(
    pred: Callable[[], Any], timeout: float = 30.0, what: str = "a condition", every: float = 0.05
) -> Any:
    """Poll until ``pred`` is truthy."""
    deadline = time.monotonic() + timeout
    while True:
        v = pred()
        if v:
            return v
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(every)


def signalled_once_ready(
    args: Sequence[str],
    environ: dict[str, str],
    ready: Callable[[], Any],
    what: str,
    sig: int,
    timeout: float = 120.0,
) -> tuple[Any, int, str]:
    """``rollout ARGS`` in the background, sent ``sig`` by its PID once ``ready()`` is truthy;
    (what ``ready`` returned, the exit status, stderr). The process is killed on the way out if
    it still runs (a failed wait)."""
    proc = start_cli(args, environ)
    try:
        got = wait_for(ready, timeout, what)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    return got, proc.returncode, err


def journal_has(state: Path, node: str, step: str, phase: str) -> bool:
    """Whether the newest journal holds ``step``/``phase`` for ``node``."""
    j = latest_journal(state)
    if j is None:
        return False
    return any(e.node == node and e.step == step and e.phase.value == phase for e in j.entries())


def states(state: Path) -> dict[str, str]:
    """Every node's replayed state in the newest change."""
    j = latest_journal(state)
    assert j is not None
    return {n: s.state.value for n, s in replay(j.entries()).nodes.items()}


def snapshot(lab: Lab, node: str) -> dict[str, str]:
    """sha256 of every watched node file."""
    root = lab.machines.node_root(node)
    out: dict[str, str] = {}
    for d in WATCHED_DIRS:
        base = root / d
        if not base.is_dir():
            continue
        for p in sorted(base.rglob("*")):
            if p.is_file() and not p.is_symlink():
                out["/" + str(p.relative_to(root))] = hashlib.sha256(p.read_bytes()).hexdigest()
    for f in WATCHED_FILES:
        p = root / f
        if p.is_file():
            out["/" + f] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def configz(lab: Lab, node: str) -> dict[str, Any]:
    """The running kubelet's configz through the node proxy."""
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/configz")
    assert code == 200, (code, body)
    data = body if isinstance(body, dict) else json.loads(body)
    return dict(data.get("kubeletconfig", data))


def unschedulable(lab: Lab, node: str) -> bool:
    """The Node's ``spec.unschedulable``."""
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200
    return bool(body.get("spec", {}).get("unschedulable"))


def set_unschedulable(lab: Lab, node: str, value: bool) -> None:
    """Cordon / uncordon from the test (an operator's action)."""
    code, body = lab.api.request(
        "PATCH",
        f"/api/v1/nodes/{node}",
        {"spec": {"unschedulable": value}},
        content_type="application/merge-patch+json",
    )
    assert code == 200, body
