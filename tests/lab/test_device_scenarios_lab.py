"""Device-fault scenarios of a change on real-kubelet lab nodes, through the CLI (``rollout
apply``, ``preview``, ``evidence``, ``lab fault``), each on a fresh node with 8 GPUs from the fake
device plugin (4 per NUMA node):

* required evidence that fails: ``gate.requireEvidence: true`` and, during the soak, the device
  plugin reports every GPU on NUMA node 0 (``lab fault device-numa --numa 0``) while the PCI
  devices' ``numa_node`` says 4 and 4: the soak passes, the canary's ``after`` evidence fails
  ``numa-aligned`` naming both placements, so the gate's verdict is Failed and the canary is
  rolled back (exit 5), byte for byte, with a ``trigger`` record saying the evidence asked for
  it; ``promote`` then refuses (exit 3: the canary is not applied). Before the podresources
  client read an empty ``NUMANode`` (proto3's NUMA node 0) as NUMA node 0, this check passed.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_device_faults_lab import _fault
from tests.lab.test_gate import _apply_then, _gate_plan, _records

pytestmark = [pytest.mark.lab]
GPU = "nvidia.com/gpu"


def _node(lab_nodes: Any) -> str:
    (node,) = lab_nodes(1, kubelet="real").names
    return str(node)


@pytest.mark.timeout(240)
def test_required_evidence_that_fails_rolls_the_canary_back(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    node = _node(lab_nodes)
    inv = ck.inventory(lab, [node], [node], tmp_path / "inv.ini")
    plan = _gate_plan(
        tmp_path / "plan.yaml",
        [node],
        soak="8s",
        probes=True,
        minAdmissions=2,
        requireEvidence=True,
    )
    state = tmp_path / "state"
    env = ck.env(lab, state)
    before = ck.snapshot(lab, node)

    def misreport() -> None:
        got = _fault(lab, env, "device-numa", node, "--numa", "0")
        assert got["changed"] == ["GPU-4", "GPU-5", "GPU-6", "GPU-7"], got

    r = _apply_then(lab, plan, inv, state, node, misreport)
    assert r.returncode == 5, (r.returncode, r.stderr[-3000:])
    placed = (
        f"{node}: the device plugin places {GPU} on NUMA 0: 8, the PCI devices' numa_node on "
        "NUMA 0: 4, NUMA 1: 4: placement judged on the plugin's NUMA nodes cannot be trusted"
    )
    assert "error: gate failed the canary: " in r.stderr, r.stderr[-3000:]
    assert (
        f"gate.requireEvidence: the canary's 'after' evidence failed: numa-aligned: {placed}"
        in (r.stderr)
    )
    out = json.loads(r.stdout)
    assert out["outcome"] == "rolled-back" and out["cause"] == "gate-failed", out
    assert {n["node"]: n["state"] for n in out["nodes"]} == {node: "restored"}
    # the soak itself passed: the evidence decided
    (verdict,) = _records(state, "verdict")
    assert verdict.data["outcome"] == "Successful", verdict.data["reason"]
    (after,) = [e for e in _records(state, "evidence") if e.data["label"] == "after"]
    checks = {c["name"]: c for c in after.data["checks"]}
    assert (
        checks["numa-aligned"]["status"] == "fail" and placed in checks["numa-aligned"]["problems"]
    )
    assert checks["unique-device-ids"]["status"] == "pass"
    (trigger,) = _records(state, "trigger")
    assert trigger.data["source"] == "evidence" and trigger.data["nodes"] == [node]
    assert ck.snapshot(lab, node) == before  # byte for byte
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "none"
    # nothing left to promote: the canary is restored and the change has ended
    r = ck.cli(["promote", "--change", out["change"], "--yes"], env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert f"the canary is not applied ({node}: restored)" in r.stderr, r.stderr
    print(f"required evidence failing, rolled back: {time.monotonic() - started:.1f}s")
