"""issue 38: the gate's probe pods left by a killed tool (``rollout.kube.owned_pods``).

``rollout watch`` with probes on, killed by its PID (SIGKILL) once its probe pods exist, leaves
them on the node; the next ``watch`` deletes them before launching its own (their creator, named
on each pod, no longer runs) and says so. A pod of the tool made by a live process is never
deleted. A ``watch`` sent SIGTERM deletes its own probes before it dies.
"""

from __future__ import annotations

import getpass
import json
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_gate import _gate_plan

pytestmark = pytest.mark.lab

NS = "rollout-probes"


def _probes(lab: Lab, node: str | None = None) -> list[str]:
    """The probe pods of the namespace (on ``node``), not being deleted."""
    code, body = lab.api.request("GET", f"/api/v1/namespaces/{NS}/pods")
    if code == 404:
        return []
    assert code == 200, body
    return sorted(
        p["metadata"]["name"]
        for p in body["items"]
        if p["metadata"]["name"].startswith("rollout-probe-")
        and not p["metadata"].get("deletionTimestamp")
        and (node is None or (p.get("spec") or {}).get("nodeName") == node)
    )


def _live(name: str, creator: str) -> dict[str, Any]:
    """A probe pod of a live process (this test's): never the next run's to delete. It stays
    Pending (a nodeSelector no node matches)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "labels": {"app.kubernetes.io/managed-by": "rollout", "rollout.io/probe": "true"},
            "annotations": {"rollout.io/created-by": creator},
        },
        "spec": {
            "nodeSelector": {"rollout.test/nowhere": "true"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


@pytest.mark.timeout(420)
def test_probe_pods_left_by_a_killed_watch_are_deleted_by_the_next_run_and_sigterm_deletes_its_own(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    (node,) = lab_nodes(1).names
    inv = ck.inventory(lab, [node], [node], tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", [node], soak="2s", minAdmissions=3)
    env = ck.env(lab, tmp_path / "state")
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 8, (r.returncode, r.stderr[-3000:])  # no traffic: the gate holds
    change = json.loads(r.stdout)["change"]

    def watch(soak: str) -> list[str]:
        p = tmp_path / f"probes-{soak}.yaml"
        _gate_plan(p, [node], soak=soak, minAdmissions=3, probes=True)
        return ["watch", "--change", change, "--plan", str(p), "-o", "text"]

    def killed(sig: signal.Signals) -> tuple[list[str], int, str]:
        """A long watch, sent ``sig`` by its PID once its probes exist: (probes, rc, stderr)."""
        pods, rc, err = ck.signalled_once_ready(
            watch("300s"), env, lambda: _probes(lab, node), "the watch's probe pods", sig
        )
        return list(pods), rc, err

    me = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
    code, body = lab.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert code in (201, 409), body
    live = f"rollout-probe-live-{os.getpid()}"
    code, body = lab.api.request("POST", f"/api/v1/namespaces/{NS}/pods", _live(live, me))
    assert code == 201, body
    try:
        # 1. SIGKILL: nothing runs in the tool; its probes stay on the node
        left, rc, _ = killed(signal.SIGKILL)
        assert rc == -signal.SIGKILL
        time.sleep(1.0)  # nothing of the tool runs any more: the probes stay
        assert set(left) <= set(_probes(lab, node)), (left, _probes(lab))

        # 2. the next watch deletes them before launching its own, and says so
        r = ck.cli(watch("6s"), env, timeout=300)
        assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
        for name in left:
            assert f"deleting probe pod {NS}/{name} on {node}: left by " in r.stderr, r.stderr
            assert "which no longer runs" in r.stderr
        assert not set(left) & set(_probes(lab)), _probes(lab)
        assert _probes(lab, node) == []  # its own deleted too
        assert live in _probes(lab)  # a live process's pod of the tool stays

        # 3. SIGTERM: the watch deletes its own probes, then dies by the signal as before
        mine, rc, err = killed(signal.SIGTERM)
        assert rc == -signal.SIGTERM, (rc, err[-2000:])
        try:
            ck.wait_for(lambda: not set(mine) & set(_probes(lab)), 60, "deleted on SIGTERM")
        except AssertionError:
            still = set(mine) & set(_probes(lab))
            raise AssertionError(
                f"{still} left after SIGTERM; the watch said: {err[-2000:]}"
            ) from None

        assert live in _probes(lab)
    finally:
        lab.api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{live}?gracePeriodSeconds=0")
    print(f"probe pods left by a killed watch: {time.monotonic() - started:.1f}s")
