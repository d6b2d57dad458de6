"""Verify on a DRA node waits for the node's ResourceSlices after the kubelet restart
(``rollout.change.kinds.kubelet_verify``): the kubelet wipes them at its start and the driver
publishes them again about 30 s later; a node verified before that shows no DRA devices."""

from __future__ import annotations

from collections.abc import Mapping

import pytest

from rollout.change.kinds.kubelet_verify import WIPE_GRACE_S, slice_mismatches, verify
from rollout.errors import NodeOperationError
from tests.unit.fakes_change import EXPECTED, FakeClock, FakeCluster, make_node

DRIVER = "gpu.example.com"
BEFORE = {DRIVER: {"uid-old": 8}}


def test_fewer_devices_than_before_is_named() -> None:
    (msg,) = slice_mismatches(BEFORE, {}, 5.0)
    assert msg.startswith(
        f"ResourceSlices of DRA driver {DRIVER} list 0 device(s) for the node, 8 before"
    )
    (msg,) = slice_mismatches(BEFORE, {DRIVER: {"uid-new": 4}}, 5.0)
    assert "list 4 device(s)" in msg


def test_the_slices_from_before_the_restart_wait_for_the_wipe_then_count() -> None:
    (msg,) = slice_mismatches(BEFORE, BEFORE, 1.0)
    assert "still those from before the kubelet restart" in msg
    # a kubelet that does not wipe: taken as current after the grace
    assert slice_mismatches(BEFORE, BEFORE, WIPE_GRACE_S) == []


def test_republished_slices_pass_at_once_and_other_drivers_do_not_matter() -> None:
    assert slice_mismatches(BEFORE, {DRIVER: {"a": 4, "b": 4}}, 0.0) == []
    assert slice_mismatches({}, {DRIVER: {"x": 8}}, 0.0) == []
    assert slice_mismatches({DRIVER: {"u": 0}}, {}, 0.0) == []


class _Republishing(FakeCluster):
    """The node's slices as the kubelet and the driver leave them after a restart: the old ones
    for ``wipe_at`` looks, none until ``back_at``, then new ones."""

    def __init__(self, wipe_at: int, back_at: int) -> None:
        super().__init__({"n1": make_node("n1")})
        self.nodes["n1"].config = dict(EXPECTED)
        self.looks, self.wipe_at, self.back_at = 0, wipe_at, back_at

    def dra_slices(self, node: str) -> Mapping[str, Mapping[str, int]]:
        self.looks += 1
        if self.looks < self.wipe_at:
            return BEFORE
        return {} if self.looks < self.back_at else {DRIVER: {"uid-new": 8}}


def test_verify_returns_only_once_the_slices_are_back() -> None:
    cluster, clock = _Republishing(wipe_at=3, back_at=120), FakeClock()
    devices = {"nvidia.com/gpu": "2"}
    verify(cluster, "n1", EXPECTED, devices, clock, 300.0, 0.25, slices_before=BEFORE)
    assert cluster.looks == 120
    assert clock.monotonic() == pytest.approx(119 * 0.25)


def test_verify_fails_at_the_timeout_naming_the_driver() -> None:
    cluster, clock = _Republishing(wipe_at=1, back_at=10**6), FakeClock()
    with pytest.raises(NodeOperationError) as e:
        verify(cluster, "n1", EXPECTED, {"nvidia.com/gpu": "2"}, clock, 10.0, slices_before=BEFORE)
    assert f"verify of node n1 failed after 10s: ResourceSlices of DRA driver {DRIVER}" in str(
        e.value
    )


def test_a_node_without_dra_slices_is_not_asked() -> None:
    cluster, clock = _Republishing(wipe_at=1, back_at=10**6), FakeClock()
    verify(cluster, "n1", EXPECTED, {"nvidia.com/gpu": "2"}, clock, 10.0, slices_before={})
    assert cluster.looks == 0
