"""Drift (rollout/fleet/drift.py): what differs on a node from what its last change left,
file by file and setting by setting; nodes no change settled are never reported."""

from __future__ import annotations

import hashlib

from rollout.change.preflight.device_checks import BOTH_PATHS, DEVICE_PLUGIN_PATH, AllocationPath
from rollout.change.record.replay import NodeStatus
from rollout.fleet.drift import configz_digest, drift, left_by, report_node
from rollout.models import FileBackup, NodeState

CONFIG = "/var/lib/kubelet/config.yaml"
DROPIN = "/var/lib/kubelet/config.d/50-rollout.conf"
NEW = b"cpuManagerPolicy: static\n"
OLD = b"cpuManagerPolicy: none\n"


def _sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


def _applied() -> NodeStatus:
    record = {
        "files": [{"path": CONFIG, "sha256": _sha(NEW)}],
        "removed": [DROPIN],
        "expected": {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,32"},
    }
    return NodeStatus(node="n1", state=NodeState.APPLIED, record=record)


LIVE = {"kubeletconfig": {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,32"}}


def test_an_applied_node_as_the_change_left_it_has_no_drift() -> None:
    left = left_by(_applied())
    assert left is not None
    assert drift(left, {CONFIG: NEW, DROPIN: None}, LIVE) == []
    # the cpuset is compared as a set, as verify compares it
    swapped = {"kubeletconfig": {**LIVE["kubeletconfig"], "reservedSystemCPUs": "32,0"}}
    assert drift(left, {CONFIG: NEW}, swapped) == []


def test_a_rewritten_file_a_reappearing_file_and_a_reverted_setting_are_each_named() -> None:
    left = left_by(_applied())
    assert left is not None
    upgraded = {"kubeletconfig": {"cpuManagerPolicy": "none", "reservedSystemCPUs": "0,32"}}
    found = drift(left, {CONFIG: OLD, DROPIN: b"x"}, upgraded)
    assert found == [
        f"{DROPIN}: present (sha256 {_sha(b'x')}), the change left it absent",
        f"{CONFIG}: sha256 {_sha(OLD)}, the change left {_sha(NEW)}",
        "/configz shows cpuManagerPolicy='none', expected 'static'",
    ]
    assert drift(left, {}, LIVE) == [f"{CONFIG}: absent, the change left sha256 {_sha(NEW)}"]
    # files not read (the node is not in the inventory): /configz only
    assert drift(left, None, upgraded) == [
        "/configz shows cpuManagerPolicy='none', expected 'static'"
    ]


def test_a_restored_node_must_have_its_backups_and_its_prior_settings() -> None:
    status = NodeStatus(
        node="n1",
        state=NodeState.RESTORED,
        backups=(FileBackup(CONFIG, True, _sha(OLD)), FileBackup(DROPIN, existed=False)),
        prior_config={"cpuManagerPolicy": "none", "maxPods": 110},
    )
    left = left_by(status)
    assert left is not None and dict(left.config) == {"cpuManagerPolicy": "none"}
    assert drift(left, {CONFIG: OLD}, {"kubeletconfig": {"cpuManagerPolicy": "none"}}) == []
    assert drift(left, {CONFIG: NEW}, {"kubeletconfig": {"cpuManagerPolicy": "static"}}) == [
        f"{CONFIG}: sha256 {_sha(NEW)}, the change left {_sha(OLD)}",
        "/configz shows cpuManagerPolicy='static', expected 'none'",
    ]


def test_nodes_no_change_settled_are_not_reported() -> None:
    for state in (NodeState.PENDING, NodeState.APPLYING, NodeState.RESTORING, NodeState.FAILED):
        assert left_by(NodeStatus(node="n1", state=state)) is None
    row = report_node("n2", True, None, None, {CONFIG: OLD}, {"kubeletconfig": {"a": 1}})
    assert row.drift == () and row.change == "" and not row.to_dict()["drifted"]


def test_the_row_carries_the_mark_the_policy_and_a_stable_digest() -> None:
    mark = {"change": "c1", "intent": "f00d", "state": "applied"}
    live = {"kubeletconfig": {"reservedSystemCPUs": "0,32", "cpuManagerPolicy": "static", "x": 1}}
    row = report_node("n1", True, mark, _applied(), {CONFIG: OLD}, live).to_dict()
    assert row["change"] == "c1" and row["state"] == "applied" and row["drifted"]
    assert row["policy"] == {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,32"}
    reordered = {"kubeletconfig": dict(reversed(list(live["kubeletconfig"].items())))}
    assert row["configzSha256"] == configz_digest(reordered) == configz_digest(live)
    unread = report_node("n1", True, mark, _applied(), None, None, "node n1 /configz answered 503")
    assert unread.drift == () and unread.to_dict()["configzSha256"] is None
    assert unread.error.endswith("503")


def test_the_row_carries_each_resources_allocation_path_and_names_two() -> None:
    dp = AllocationPath("example.com/nic", DEVICE_PLUGIN_PATH, 2, 2)
    both = AllocationPath("nvidia.com/gpu", BOTH_PATHS, 8, 8, ("c",), ("gpu.example.com",), "x")
    row = report_node("n1", True, None, None, None, LIVE, paths=(dp, both))
    assert row.two_paths == ["nvidia.com/gpu"]
    doc = row.to_dict()
    assert doc["twoPaths"] == ["nvidia.com/gpu"]
    assert doc["allocation"]["nvidia.com/gpu"]["path"] == "both"
    assert doc["allocation"]["example.com/nic"] == {
        "path": "device-plugin",
        "capacity": 2,
        "allocatable": 2,
        "deviceClasses": [],
        "drivers": [],
        "note": None,
    }
    plain = report_node("n1", True, None, None, None, LIVE).to_dict()
    assert plain["twoPaths"] == [] and plain["draDrivers"] == []
    claims_only = report_node("n1", True, None, None, None, LIVE, dra_drivers=("gpu.example.com",))
    assert claims_only.to_dict()["draDrivers"] == ["gpu.example.com"]
