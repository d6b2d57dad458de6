"""The gate on a DRA pool: an unallocated claim, a pod Pending on the class and an unhealthy
device each fail it, naming what; the inner gate's verdict comes first."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from rollout.gate.dra_pool import DraPoolGate, PoolObjects, PoolSignals, pool_problems
from rollout.verdicts import VerdictStatus
from tests.unit.fakes_change import ScriptedGate

NOW = datetime(2026, 12, 6, 8, 0, tzinfo=UTC)
OLD = "2026-12-06T07:50:00Z"  # ten minutes before NOW
NEW = "2026-12-06T07:59:30Z"
SIG = PoolSignals(device_class="gpu.example.com", resource="nvidia.com/gpu", limit_s=300)


def _claim(name: str, born: str, allocated: bool = False, v1: bool = True) -> dict[str, Any]:
    req: dict[str, Any] = {"name": "gpu"}
    if v1:
        req["exactly"] = {"deviceClassName": "gpu.example.com"}
    else:
        req["deviceClassName"] = "gpu.example.com"
    return {
        "metadata": {"namespace": "ml", "name": name, "creationTimestamp": born},
        "spec": {"devices": {"requests": [req]}},
        "status": {"allocation": {"devices": {"results": [{"pool": "n1"}]}}} if allocated else {},
    }


def _pending(name: str, born: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {"namespace": "ml", "name": name, "creationTimestamp": born},
        "spec": spec,
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False"}],
        },
    }


def test_a_claim_left_unallocated_past_the_limit_fails_the_pool() -> None:
    objs = PoolObjects(
        claims=[
            _claim("stuck", OLD),
            _claim("young", NEW),
            _claim("done", OLD, allocated=True),
            _claim("beta", OLD, v1=False),
        ]
    )
    reasons = [p.reason for p in pool_problems(objs, SIG, NOW)]
    assert len(reasons) == 2
    assert reasons[0] == (
        "ResourceClaim ml/stuck of DeviceClass gpu.example.com unallocated for 600s (limit 300s)"
    )
    assert "ml/beta" in reasons[1]


def test_a_pod_pending_on_the_class_or_the_extended_resource_fails_the_pool() -> None:
    gpu = {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]}
    cpu = {"containers": [{"name": "c", "resources": {"limits": {"cpu": "1"}}}]}
    claim = {"containers": [{"name": "c"}], "resourceClaims": [{"resourceClaimName": "stuck"}]}
    objs = PoolObjects(
        claims=[_claim("stuck", NEW)],
        pods=[_pending("er", OLD, **gpu), _pending("cpu", OLD, **cpu), _pending("c", OLD, **claim)],
    )
    reasons = [p.reason for p in pool_problems(objs, SIG, NOW)]
    assert [r.split()[1] for r in reasons] == ["ml/er", "ml/c"]
    assert "Pending, unscheduled, for 600s" in reasons[0]


def test_an_unhealthy_device_fails_its_node() -> None:
    pod = {
        "metadata": {"namespace": "ml", "name": "train"},
        "spec": {"nodeName": "n2"},
        "status": {
            "phase": "Running",
            "containerStatuses": [
                {
                    "name": "c",
                    "allocatedResourcesStatus": [
                        {
                            "name": "claim:gpu-claim/gpu",
                            "resources": [{"resourceID": "gpu-3", "health": "Unhealthy"}],
                        }
                    ],
                }
            ],
        },
    }
    (p,) = pool_problems(PoolObjects(pods=[pod]), SIG, NOW)
    assert p.node == "n2" and "device gpu-3 of claim:gpu-claim/gpu reported Unhealthy" in p.reason
    gate = DraPoolGate(
        ScriptedGate(VerdictStatus.SUCCESSFUL), lambda: PoolObjects(pods=[pod]), SIG, lambda: NOW
    )
    v = gate.evaluate("c1", ["n1", "n2"])
    assert v.status is VerdictStatus.FAILED and v.failed_nodes == ("n2",)
    assert gate.verdict is v


def test_the_inner_gate_decides_first_and_a_quiet_pool_passes() -> None:
    stuck = PoolObjects(claims=[_claim("stuck", OLD)])
    held = DraPoolGate(ScriptedGate(VerdictStatus.INCONCLUSIVE), lambda: stuck, SIG, lambda: NOW)
    assert held.evaluate("c1", ["n1"]).status is VerdictStatus.INCONCLUSIVE
    quiet = DraPoolGate(
        ScriptedGate(VerdictStatus.SUCCESSFUL), lambda: PoolObjects(), SIG, lambda: NOW
    )
    assert quiet.evaluate("c1", ["n1"]).status is VerdictStatus.SUCCESSFUL
    failing = DraPoolGate(ScriptedGate(VerdictStatus.SUCCESSFUL), lambda: stuck, SIG, lambda: NOW)
    v = failing.evaluate("c1", ["n1"])
    assert v.status is VerdictStatus.FAILED and v.failed_nodes == ()  # the pool: every node
    assert v.reason.startswith("DRA pool: ResourceClaim ml/stuck")
