"""The admission preview through the CLI, in the lab: facts gathered by the real facts playbook,
pods and Deployments read from the real API server, the rejection made by the lab kubelet.

A Deployment of Guaranteed pods asking for 6 GPUs (the lab's nodes have 4 per NUMA node, 8 in
all) and one asking for 2 run on the canary under the old config (Topology Manager ``none``).
``rollout preview`` predicts the 6-GPU pod rejected under the plan's ``single-numa-node``, with
the numbers, and the 2-GPU pod admitted;
``rollout runbook`` says NO-GO in its admission preview section;
``apply --canary`` refuses (exit 3) and leaves the node untouched; with
``--accept-predicted-rejections`` it goes on, journals the accepted prediction, and the
recreated pods match the prediction pod for pod.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_gate import TAE, _deployment, _pods, _running

pytestmark = pytest.mark.lab


@pytest.mark.timeout(240)
def test_predicted_rejection_refuses_the_canary_until_accepted(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    # a second node takes the evicted pod's requests (preflight's capacity check)
    node, spare = lab_nodes(2).names
    inv = ck.inventory(lab, [node, spare], [node], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", {node: "kubeadm", spare: "kubeadm"})
    state = tmp_path / "state"
    env = ck.env(lab, state)
    _deployment(lab, namespace, "numa-misfit", node, 6)
    ck.wait_for(lambda: _running(lab, namespace), 60, "the 6-GPU pod running on the old config")
    _deployment(lab, namespace, "numa-fit", node, 2)
    ck.wait_for(lambda: len(_running(lab, namespace)) == 2, 60, "the 2-GPU pod running too")
    workload = f"Deployment/{namespace}/numa-misfit"
    fitting = f"Deployment/{namespace}/numa-fit"
    numbers = f"needs 6 nvidia.com/gpu on one NUMA node; the largest NUMA node of {node} has 4"
    common = ["--plan", str(plan), "-i", str(inv), "--canary"]

    r = ck.cli(["preview", *common, "-o", "json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    (pv,) = json.loads(r.stdout)["nodes"]
    assert pv["node"] == node
    (pred,) = [p for p in pv["pods"] if p["workload"] == workload]
    assert pred["running"] and pred["verdict"] == "rejected"
    assert pred["reason"] == TAE
    assert pred["message"] == "Resources cannot be allocated with Topology locality"
    assert pred["numbers"] == numbers
    (fit,) = [p for p in pv["pods"] if p["workload"] == fitting]
    assert fit["running"] and fit["verdict"] == "admitted" and not fit["reason"]
    assert fit["numbers"].startswith("admitted on NUMA node(s) ")

    before = ck.snapshot(lab, node)
    r = ck.cli(["apply", *common, "--yes"], env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert workload in r.stderr and f"node {node}" in r.stderr and numbers in r.stderr
    assert "--accept-predicted-rejections" in r.stderr
    assert ck.snapshot(lab, node) == before and not ck.unschedulable(lab, node)
    assert ck.latest_journal(state) is None
    assert len(_running(lab, namespace)) == 2  # nothing evicted

    # the runbook's admission preview section: NO-GO, naming the running pod and the numbers
    r = ck.cli(["runbook", "--plan", str(plan), "-i", str(inv), "-o", "json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    section = json.loads(r.stdout)["preview"]
    assert section["ran"] and section["go"] is False
    assert any(workload in x and numbers in x for x in section["rejectedRunning"])
    assert ck.snapshot(lab, node) == before and not ck.unschedulable(lab, node)

    r = ck.cli(["apply", *common, "--dry-run", "--accept-predicted-rejections"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "admission preview:" in r.stdout and f"REJECTED {TAE}" in r.stdout
    assert numbers in r.stdout

    r = ck.cli(["apply", *common, "--yes", "--accept-predicted-rejections", "-o", "json"], env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    states = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert states == {node: "applied", spare: "pending"}
    journal = ck.latest_journal(state)
    assert journal is not None
    (accepted,) = [e for e in journal.entries() if e.step == "predicted-rejections-accepted"]
    (line,) = accepted.data["rejections"]
    assert workload in line and numbers in line
    # only the predicted rejection is named as one; the fitting pod only in the warning that
    # in-place resize of a Guaranteed pod is refused under the static policy
    named = [ln for ln in r.stderr.splitlines() if fitting in ln]
    assert all("in-place resize" in ln for ln in named), named
    # the recreated pods, pod for pod: the misfit rejected as predicted, the fit admitted
    rejected = ck.wait_for(
        lambda: [p for p in _pods(lab, namespace) if p["status"].get("reason") == TAE],
        60,
        "the recreated 6-GPU pod rejected",
    )
    assert {p["metadata"]["labels"]["app"] for p in rejected} == {"numa-misfit"}
    assert pred["message"] in rejected[0]["status"]["message"]
    running = ck.wait_for(
        lambda: [p for p in _running(lab, namespace) if p["spec"].get("nodeName") == node],
        60,
        "the recreated 2-GPU pod running on the changed node",
    )
    assert {p["metadata"]["labels"]["app"] for p in running} == {"numa-fit"}
    print(f"test {time.monotonic() - started:.1f}s")
