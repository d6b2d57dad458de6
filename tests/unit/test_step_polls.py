"""How often the forward path looks while a batch waits on a node: the drain's looks at the
evicted pods and verify's looks at the restarted kubelet (the node step's own /healthz wait is in
``tests/unit/test_node_step_module.py``). Every batch waits for its slowest node, so a look that
misses the moment by a tick costs the whole batch that tick; these pin the schedules on a fake
clock (the lab tests run the same code against the real API server and kubelet).

Runtime: well under 1 s.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import pytest

from rollout.change.engine.drain import drain
from rollout.change.kinds import kubelet_verify
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.errors import NodeOperationError
from rollout.models import NodeInfo, PodRef
from rollout.protocols import Eviction, EvictionResult
from tests.unit.fakes_change import FakeClock


class _Lingering:
    """One node whose evicted pods stay (terminating) until ``gone_at`` on the clock."""

    def __init__(self, clock: FakeClock, pods: list[PodRef], gone_at: float) -> None:
        self.clock = clock
        self.pods = pods
        self.gone_at = gone_at
        self.looks: list[float] = []

    def pods_on_node(self, _name: str) -> list[PodRef]:
        return list(self.pods)

    def evict(self, _pod: PodRef, _grace: int | None) -> EvictionResult:
        return EvictionResult(Eviction.EVICTED)

    def pod_gone(self, _pod: PodRef) -> bool:
        self.looks.append(self.clock.t)
        return self.clock.t >= self.gone_at

    def pdbs_for(self, _pod: PodRef) -> list[str]:
        return []


def _pod(name: str) -> PodRef:
    return PodRef("default", name, "n1")


@pytest.mark.parametrize("gone_at", [0.03, 0.2, 0.45, 1.3])
def test_the_drain_sees_a_pod_gone_within_a_tenth_of_a_second(gone_at: float) -> None:
    """0.02 s, doubling, at most 0.1 s between looks: a pod gone at 0.2 s is seen by 0.3 s (at
    0.05 s doubling to 0.25 s it was seen at 0.35 s, one gone at 0.45 s at 0.6 s)."""
    clock = FakeClock()
    cluster = _Lingering(clock, [_pod("a"), _pod("b")], gone_at)
    report = drain(cluster, "n1", DrainPolicy(), clock)  # type: ignore[arg-type]
    assert report.evicted == ("default/a", "default/b")
    done = clock.t
    assert gone_at <= done < gone_at + 0.1 + 1e-9
    looks = sorted(set(cluster.looks))
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(looks)]
    assert gaps[:3] == [0.02, 0.04, 0.08][: len(gaps)]
    assert all(g <= 0.1 + 1e-9 for g in gaps)


class _Kubelet:
    """A restarted node whose /configz shows the new policy from ``ready_at`` on."""

    def __init__(self, clock: FakeClock, ready_at: float) -> None:
        self.clock = clock
        self.ready_at = ready_at
        self.looks: list[float] = []

    def healthz(self, _node: str) -> bool:
        self.looks.append(self.clock.t)
        return True

    def node(self, name: str) -> NodeInfo:
        return NodeInfo(name)

    def configz(self, _node: str) -> Mapping[str, Any]:
        policy = "static" if self.clock.t >= self.ready_at else "none"
        return {"kubeletconfig": {"cpuManagerPolicy": policy}}


@pytest.mark.parametrize("ready_at", [0.0, 0.12, 0.8])
def test_verify_looks_every_50ms_in_its_first_two_seconds(ready_at: float) -> None:
    clock = FakeClock()
    k = _Kubelet(clock, ready_at)
    kubelet_verify.verify(k, "n1", {"cpuManagerPolicy": "static"}, {}, clock, 120.0)  # type: ignore[arg-type]
    assert ready_at <= clock.t < ready_at + 0.05 + 1e-9
    gaps = {round(b - a, 3) for a, b in itertools.pairwise(k.looks)}
    assert gaps <= {0.05}


def test_verify_then_looks_at_its_own_pace_and_gives_up_naming_what_is_off() -> None:
    clock = FakeClock()
    k = _Kubelet(clock, ready_at=1e9)
    with pytest.raises(NodeOperationError, match="cpuManagerPolicy='none', expected 'static'"):
        kubelet_verify.verify(k, "n1", {"cpuManagerPolicy": "static"}, {}, clock, 5.0)
    gaps = [round(b - a, 3) for a, b in itertools.pairwise(k.looks)]
    fast = [g for g in gaps if g == 0.05]
    assert gaps == fast + [0.25] * (len(gaps) - len(fast))  # fast first, then 0.25 s
    assert 39 <= len(fast) <= 41 and 5.0 <= clock.t < 5.3
