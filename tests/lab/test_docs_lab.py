"""In the lab: change windows on a real apply, and the runbook and report of a real change.

A 2-node lab (1 canary). Apply outside the window is refused with the next opening and nothing is
journaled; a forced canary apply journals its reason; rollback outside the window works; the
runbook and the report of that change are checked against the journal. Every command runs with
ONLY the ServiceAccount kubeconfig bound to deploy/rbac.yaml (``restricted_kubeconfig``), so this
test also proves the shipped role is enough.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.change.plan.windows import DAY_NAMES
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.lab.cluster import Lab
from rollout.lab.inventory import plan_text
from tests.lab.test_rbac import restricted_kubeconfig as restricted_kubeconfig

pytestmark = pytest.mark.lab


def rollout(
    args: list[str], env: dict[str, str], timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(Path(sys.executable).parent / "rollout"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def closed_window_plan(lab: Lab, nodes: Any) -> str:
    day = DAY_NAMES[(datetime.now(UTC).weekday() + 3) % 7]  # opens in three days: closed now
    return plan_text([lab.nodes[n].node for n in nodes.names], "docs") + (
        f"windows:\n  - {{name: later, days: [{day}], start: '02:00', end: '03:00'}}\n"
    )


def guaranteed_pod(kube: Any, namespace: str, node: str) -> str:
    """A Guaranteed pod (2 exclusive CPUs, 1 GPU) on ``node``; returns its name once Running."""
    from kubernetes import client

    core = client.CoreV1Api(kube)
    req = {"cpu": "2", "memory": "64Mi", "nvidia.com/gpu": "1"}
    core.create_namespaced_pod(
        namespace,
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "evidence"},
            "spec": {
                "nodeSelector": {"kubernetes.io/hostname": node},
                "containers": [
                    {
                        "name": "app",
                        "image": "registry.k8s.io/pause:3.10",
                        "resources": {"requests": req, "limits": req},
                    }
                ],
            },
        },
    )
    deadline = time.monotonic() + 60
    while core.read_namespaced_pod("evidence", namespace).status.phase != "Running":
        assert time.monotonic() < deadline, "evidence pod never ran"
        time.sleep(0.5)
    return "evidence"


def test_windows_runbook_and_report_on_a_lab_change(
    lab: Lab,
    lab_nodes: Callable[..., Any],
    tmp_path: Path,
    restricted_kubeconfig: Path,
    kube: Any,
    namespace: str,
) -> None:
    nodes = lab_nodes(2)
    plan = tmp_path / "plan.yaml"
    plan.write_text(closed_window_plan(lab, nodes))
    state = tmp_path / "state"
    env = {
        **os.environ,
        "KUBECONFIG": str(restricted_kubeconfig),
        "ROLLOUT_STATE_DIR": str(state),
        "ROLLOUT_PLAN": str(plan),
        "ROLLOUT_INVENTORY": str(nodes.inventory),
    }
    evidence = tmp_path / "evidence.json"
    before = rollout(["evidence", "--label", "before", "--out", str(evidence)], env)
    assert before.returncode == 0, before.stderr
    refused = rollout(["apply", "--canary", "--yes"], env)
    assert refused.returncode == 3, refused.stderr
    assert (
        "outside every change window" in refused.stderr and "the next one opens" in refused.stderr
    )
    assert not state.exists()

    forced = rollout(
        ["apply", "--canary", "--yes", "-o", "json", "--force-window", "lab test 42"], env
    )
    assert forced.returncode == 0, forced.stderr
    # the role allows the change's cluster record (ConfigMaps, Node annotations): no write failed
    assert "cluster record" not in forced.stderr, forced.stderr
    change = json.loads(forced.stdout)["change"]
    canary = nodes.names[0]
    # no terminal here: progress is plain lines on stderr, one per journaled node step
    for step in ("cordon begin", "apply done", "verify done", "uncordon done"):
        assert f" {canary} forward {step}\n" in forced.stderr, forced.stderr
    journal = Journal.open(state, change)
    begin = replay(journal.entries()).info
    assert begin.window is not None
    assert begin.window["forced"] is True and begin.window["forceReason"] == "lab test 42"

    pod = guaranteed_pod(kube, namespace, canary)
    after = rollout(
        ["evidence", "--label", "after", "--change", change, "--out", str(evidence), "-o", "json"],
        env,
    )
    assert after.returncode == 0, after.stderr
    printed = {c["name"]: c["status"] for c in json.loads(after.stdout)["checks"]}
    assert printed["unique-device-ids"] == "pass", after.stdout
    from kubernetes import client

    client.CoreV1Api(kube).delete_namespaced_pod(pod, namespace, grace_period_seconds=0)

    back = rollout(["rollback", "--change", change, "--yes"], env)  # still outside the window
    assert back.returncode == 0, back.stderr
    assert f" {canary} restore restore done\n" in back.stderr, back.stderr
    assert "cluster record" not in back.stderr, back.stderr

    md = rollout(["report", "--change", change, "--evidence", str(evidence)], env)
    assert md.returncode == 0, md.stderr
    status = replay(journal.entries())
    for heading in (
        "## Nodes",
        "## Timeline",
        "## Gate decisions",
        "## Files changed",
        "## Evidence checks",
    ):
        assert heading in md.stdout
    assert "forced**: lab test 42" in md.stdout
    data = json.loads(
        rollout(
            ["report", "--change", change, "-o", "json", "--evidence", str(evidence)], env
        ).stdout
    )
    checks = {(c["label"], c["name"]): c for c in data["evidence"]["checks"]}
    for label in ("before", "after"):
        alloc = checks[(label, "allocatable-matches-healthy")]
        assert alloc["status"] == "pass" and alloc["checked"] == 2, alloc
    # device assignments come from the lab kubelet (podresources, else kubelet_internal_checkpoint)
    assert checks[("before", "unique-device-ids")]["status"] == "pass"
    unique = checks[("after", "unique-device-ids")]
    assert unique["status"] == "pass" and unique["checked"] == 1, unique  # the evidence pod's GPU
    collected = {c["label"]: c for c in json.loads(evidence.read_text())["collections"]}
    on_canary = collected["after"]["nodes"][canary]
    # the real kubelet answers on its podresources socket; the simulated one has none
    live = "podResourcesProblem" not in on_canary
    assert on_canary["deviceSource"] == ("podresources" if live else "kubelet_internal_checkpoint")
    (ev_pod,) = [p for p in on_canary["pods"] if p["name"] == pod]
    (gpu,) = ev_pod["devices"]["nvidia.com/gpu"]
    assert gpu in on_canary["deviceNuma"], on_canary
    numa = checks[("after", "numa-aligned")]
    assert numa["status"] == "pass" and numa["checked"] == 1, numa  # the evidence pod
    assert checks[("after-recreate", "numa-aligned")]["status"] == "not-collected"
    assert data["outcome"] == status.outcome == "rolled-back"
    assert data["nodes"] == {n: s.state.value for n, s in status.nodes.items()}
    assert len(data["timeline"]) == sum(1 for e in journal.entries() if e.node is not None)
    backups = {b.path: b.sha256 for b in status.nodes[canary].backups}
    reported = {f["path"]: f["before_sha256"] for f in data["files"] if f["node"] == canary}
    assert reported == backups
    html = rollout(["report", "--change", change, "-o", "html"], env).stdout
    assert html.count("<svg") == 2

    rb = rollout(["runbook", "-o", "markdown"], env, timeout=300)
    assert rb.returncode == 0, rb.stderr
    assert "Result: **passed**" in rb.stdout, rb.stdout
    assert f"| 1 | yes | {canary} |" in rb.stdout
    assert f"--node {canary} --yes" in rb.stdout
