"""Preflight of an allocation-path change: each bad input refused by name before any change."""

from __future__ import annotations

from typing import Any

from rollout.change.kinds.allocation_preflight import PathWorld, path_refusals
from rollout.change.plan.allocation_path_section import (
    DEVICE_PLUGIN_LABEL,
    DRA_LABEL,
    AllocationPath,
    PathSettings,
)
from rollout.models import NodeInfo, PodRef

S = PathSettings(driver="gpu.example.com", device_class="gpu.example.com")
DP = {DEVICE_PLUGIN_LABEL: "true"}
DRA = {DRA_LABEL: "true", DEVICE_PLUGIN_LABEL: "false"}


def _ds(name: str, label: str, affinity: bool = False) -> dict[str, Any]:
    spec: dict[str, Any] = {"nodeSelector": {label: "true"}}
    if affinity:
        term = {"matchExpressions": [{"key": label, "operator": "In", "values": ["true"]}]}
        spec = {
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}
                }
            }
        }
    return {
        "metadata": {"namespace": "gpu", "name": name},
        "spec": {"template": {"spec": spec}},
    }


def _world(**over: Any) -> PathWorld:
    base: dict[str, Any] = {
        "nodes": {
            "a": NodeInfo("a", labels=DP, allocatable={"nvidia.com/gpu": "4"}),
            "b": NodeInfo("b", labels=DP, allocatable={"nvidia.com/gpu": "4"}),
            "c": NodeInfo("c", labels=DRA, allocatable={"nvidia.com/gpu": "0"}),
        },
        "pods": {"a": [PodRef("ml", "p", node="a", uid="1", extended={"nvidia.com/gpu": 2})]},
        "slices": {"c": 4},
        "device_classes": [
            {
                "metadata": {"name": "gpu.example.com"},
                "spec": {"extendedResourceName": "nvidia.com/gpu"},
            }
        ],
        "daemonsets": [_ds("device-plugin", DEVICE_PLUGIN_LABEL), _ds("dra", DRA_LABEL, True)],
    }
    base.update(over)
    return PathWorld(**base)


TARGETS = {"a": AllocationPath.DRA}


def test_a_cluster_that_can_carry_the_change_has_no_refusal() -> None:
    assert path_refusals(_world(), S, TARGETS, [["a"]]) == []


def test_a_driver_with_no_slices_anywhere_is_refused() -> None:
    (why,) = path_refusals(_world(slices={}), S, TARGETS, [["a"]])
    assert "driver gpu.example.com publishes no ResourceSlice in the cluster" in why
    assert "allocationPath.driver" in why


def test_a_missing_device_class_and_one_mapping_another_name_are_refused() -> None:
    (why,) = path_refusals(_world(device_classes=[]), S, TARGETS, [["a"]])
    assert 'DeviceClass "gpu.example.com" not found' in why
    other = [{"metadata": {"name": "gpu.example.com"}, "spec": {"extendedResourceName": "x.com/y"}}]
    (why,) = path_refusals(_world(device_classes=other), S, TARGETS, [["a"]])
    assert "maps extendedResourceName x.com/y, not nvidia.com/gpu" in why


def test_labels_that_select_no_daemonset_are_refused() -> None:
    (why,) = path_refusals(_world(daemonsets=[_ds("dp", DEVICE_PLUGIN_LABEL)]), S, TARGETS, [["a"]])
    assert f"no DaemonSet selects nodes on {DRA_LABEL}=true (allocationPath.draLabel)" in why


def test_a_node_on_no_single_path_or_on_both_is_refused() -> None:
    nodes = dict(_world().nodes)
    nodes["a"] = NodeInfo("a", labels={}, allocatable={"nvidia.com/gpu": "4"})
    (why,) = path_refusals(_world(nodes=nodes), S, TARGETS, [["a"]])
    assert "node a: labels" in why and "select no single path" in why
    both = path_refusals(_world(slices={"a": 4, "c": 4}), S, TARGETS, [["a"]])
    assert any("node a serves nvidia.com/gpu through both paths now" in w for w in both)


def test_too_few_gpus_left_elsewhere_for_the_drained_pods_is_refused() -> None:
    pods = {
        "a": [PodRef("ml", "p", node="a", uid="1", extended={"nvidia.com/gpu": 4})],
        "b": [PodRef("ml", "q", node="b", uid="2", extended={"nvidia.com/gpu": 3})],
    }
    nodes = dict(_world().nodes)
    nodes["c"] = NodeInfo("c", unschedulable=True, labels=DRA)  # cordoned: takes nothing
    (why,) = path_refusals(_world(pods=pods, nodes=nodes), S, TARGETS, [["a"]])
    assert "batch 1 (a): its pods hold 4 nvidia.com/gpu" in why
    assert "have 1 free" in why and "Pending" in why
    # a DRA node's free devices count too: 1 on b + 4 on c
    assert path_refusals(_world(pods=pods), S, TARGETS, [["a"]]) == []
