"""Preflight over the target nodes' devices: a node advertising fewer GPUs than it has (plugin
down, devices unhealthy) and one extended resource served by a device plugin and a DRA
DeviceClass are refused, naming node and cause, unless ``--force REASON``; DRA-managed devices
under an aligning Topology Manager policy are a warning. Pure rules in tables, then ``prepare``
over a fake cluster reader (the real render of a kubeadm node's files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout.change.devicechecks import (
    DeviceClass,
    check_advertised,
    check_dra_extended,
    device_classes,
    dra_topology_warnings,
)
from rollout.change.inventory import Inventory
from rollout.change.plan import load_plan
from rollout.change.planning import check_double_ownership
from rollout.change.preparing import PreviewedRefusal, prepare
from rollout.kube.nodes import to_node_info
from rollout.lab.inventory import LAB_INTENT
from rollout.models import PodListing
from tests.unit.test_shipping_cas import _facts

GPU = "nvidia.com/gpu"
ADVERTISED = [
    # case, capacity, allocatable, PCI GPUs, DRA drivers, expected refusal ("" = none)
    ("all 8 advertised", {GPU: "8"}, {GPU: "8"}, 8, [], ""),
    (
        "one unhealthy",
        {GPU: "8"},
        {GPU: "7"},
        8,
        [],
        "node n1: advertises 7 of 8 nvidia.com/gpu (capacity 8, allocatable 7): the kubelet "
        "holds 1 device(s) unhealthy",
    ),
    (
        "plugin disconnected: every device unhealthy until the grace period ends",
        {GPU: "8"},
        {GPU: "0"},
        8,
        [],
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
        "nvidia.com/gpu, which is unexpected",
    ),
    (
        "plugin gone after the grace period: capacity 0",
        {GPU: "0"},
        {GPU: "0"},
        8,
        [],
        "node n1: has 8 GPU(s) on the PCI bus but advertises no nvidia.com resource: its device "
        "plugin is not running or has not registered",
    ),
    (
        "plugin never registered: no resource at all",
        {},
        {},
        8,
        [],
        "advertises no nvidia.com resource",
    ),
    (
        "fewer advertised than on the bus",
        {GPU: "6"},
        {GPU: "6"},
        8,
        [],
        "node n1: has 8 GPU(s) on the PCI bus but advertises 6 nvidia.com/gpu",
    ),
    ("time-slicing: 4 replicas each", {GPU: "32"}, {GPU: "32"}, 8, [], ""),
    (
        "MIG mixed strategy: the vendor advertises profiles, not the GPU count",
        {"nvidia.com/mig-1g.10gb": "14", GPU: "6"},
        {"nvidia.com/mig-1g.10gb": "14", GPU: "6"},
        8,
        [],
        "",
    ),
    (
        "an unhealthy MIG instance is refused like a GPU",
        {"nvidia.com/mig-1g.10gb": "14"},
        {"nvidia.com/mig-1g.10gb": "13"},
        2,
        [],
        "advertises 13 of 14 nvidia.com/mig-1g.10gb",
    ),
    ("no GPUs, no plugin: nothing to say", {}, {}, 0, [], ""),
    ("GPUs with DRA ResourceSlices: DRA-managed", {}, {}, 8, ["gpu.nvidia.com"], ""),
]


@pytest.mark.parametrize(
    ("case", "cap", "alloc", "pci", "dra", "want"), ADVERTISED, ids=[a[0] for a in ADVERTISED]
)
def test_advertised(
    case: str, cap: dict[str, str], alloc: dict[str, str], pci: int, dra: list[str], want: str
) -> None:
    got = check_advertised("n1", cap, alloc, pci, dra_drivers=dra)
    if want:
        assert len(got) == 1, got
        assert want in got[0], got
    else:
        assert got == []


CLASS = {
    "metadata": {"name": "gpu.example.com"},
    "spec": {
        "extendedResourceName": GPU,
        "selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}],
    },
}


def test_device_classes_keep_the_extended_resource_and_the_drivers_their_selectors_name() -> None:
    plain = {"metadata": {"name": "plain"}, "spec": {"selectors": []}}
    any_driver = {"metadata": {"name": "any"}, "spec": {"extendedResourceName": "example.com/x"}}
    assert device_classes([CLASS, plain, any_driver]) == [
        DeviceClass("gpu.example.com", GPU, ("gpu.example.com",)),
        DeviceClass("any", "example.com/x", ()),
    ]


def test_a_resource_served_by_a_device_plugin_and_a_dra_device_class_is_refused() -> None:
    """The old check matched vendor domains only: driver gpu.example.com is not of nvidia.com,
    so it passed this node."""
    classes = device_classes([CLASS])
    assert check_double_ownership("n1", {GPU: "8"}, ["gpu.example.com"]) == []  # the old check
    (msg,) = check_dra_extended("n1", {GPU: "8"}, ["gpu.example.com"], classes)
    assert msg.startswith("node n1: nvidia.com/gpu is served by a device plugin (capacity 8)")
    assert "DeviceClass gpu.example.com has spec.extendedResourceName nvidia.com/gpu" in msg
    assert "One node in a cluster cannot have both extended resource backed by DRA" in msg
    # another driver's slices, no device plugin resource, or no slices: one path only
    assert check_dra_extended("n1", {GPU: "8"}, ["other.example.com"], classes) == []
    assert check_dra_extended("n1", {GPU: "0"}, ["gpu.example.com"], classes) == []
    assert check_dra_extended("n1", {GPU: "8"}, [], classes) == []
    # selectors that name no driver: any driver on the node may back it
    unnamed = [DeviceClass("c", GPU)]
    (msg,) = check_dra_extended("n1", {GPU: "8"}, ["other.example.com"], unnamed)
    assert "its selectors name no driver" in msg


def test_dra_devices_under_an_aligning_policy_are_a_warning() -> None:
    (w,) = dra_topology_warnings("n1", ["gpu.nvidia.com"], "single-numa-node")
    assert "node n1: devices of DRA driver(s) gpu.nvidia.com are DRA-managed" in w
    assert "gets no hints for DRA devices" in w and "resource.kubernetes.io/numaNode" in w
    assert dra_topology_warnings("n1", ["gpu.nvidia.com"], "none") == []
    assert dra_topology_warnings("n1", [], "restricted") == []


# ------------------------------------------------------------------ prepare over a fake reader
def _node(name: str, cap: dict[str, str], alloc: dict[str, str]) -> dict[str, Any]:
    base = {"cpu": "64", "memory": "256Gi", "pods": "110"}
    return {
        "metadata": {"name": name, "labels": {}},
        "spec": {},
        "status": {
            "capacity": {**base, **cap},
            "allocatable": {**base, **alloc},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


class Reader:
    """What ``prepare`` reads from the API server, from memory."""

    def __init__(
        self,
        objects: dict[str, dict[str, Any]],
        dra: dict[str, list[str]] | None = None,
        classes: list[dict[str, Any]] | None = None,
    ) -> None:
        self.objects, self._dra, self._classes = objects, dra or {}, classes or []

    def version(self) -> str:
        return "v1.36.3"

    def resource_versions(self) -> list[str]:
        return ["v1"]

    def nodes(self) -> dict[str, Any]:
        return {n: to_node_info(o) for n, o in self.objects.items()}

    def pod_listing(self) -> PodListing:
        return PodListing({}, {}, {})

    def pdbs(self) -> list[Any]:
        return []

    def dra(self, versions: list[str]) -> dict[str, list[str]]:
        return self._dra

    def device_classes(self, versions: list[str]) -> list[dict[str, Any]]:
        return self._classes

    def node_objects(self) -> dict[str, dict[str, Any]]:
        return self.objects

    def controllers(self, nodes: Any = None) -> list[dict[str, Any]]:
        return []


def _prepare(tmp: Path, reader: Reader, force: bool = False, tenancy: Any = None) -> Any:
    """``prepare`` of the lab's intent (static CPU manager, single-numa-node) with n1 the canary,
    both nodes with 8 NVIDIA GPUs on the PCI bus."""
    plan = tmp / "plan.yaml"
    lines = ["kind: RolloutPlan", "metadata:", "  name: t", *LAB_INTENT]
    plan.write_text("\n".join([*lines, "strategy:", "  canaryGroup: canary"]) + "\n")
    inv = Inventory(tmp / "inv", ("n1", "n2"), {"canary": ("n1",)}, {})
    facts = _facts()
    facts["gpus"] = [{"id": f"0000:{i:02x}:00.0", "numaNode": i // 4} for i in range(8)]
    raw = {"n1": facts, "n2": facts}
    return prepare(load_plan(plan), inv, reader, raw, tmp, True, force=force, tenancy=tenancy)


def test_preflight_refuses_a_canary_whose_plugin_is_down_and_force_overrides(
    tmp_path: Path,
) -> None:
    objects = {"n1": _node("n1", {GPU: "8"}, {GPU: "0"}), "n2": _node("n2", {GPU: "0"}, {})}
    with pytest.raises(PreviewedRefusal) as e:
        _prepare(tmp_path, Reader(objects))
    text = str(e.value)
    assert "node n1: advertises 0 of 8 nvidia.com/gpu" in text
    assert "`rollout apply --force REASON` overrides" in text
    assert "n2" not in text  # not moving with --canary: not judged
    prepared = _prepare(tmp_path, Reader(objects), force=True)
    (forced,) = prepared.forced
    assert forced.startswith("node n1: advertises 0 of 8")
    assert any(w.startswith("forced (--force): node n1") for w in prepared.warnings)
    assert prepared.to_dict()["forcedRefusals"] == [forced]


def test_preflight_refuses_the_dual_path_and_warns_of_dra_devices(tmp_path: Path) -> None:
    objects = {"n1": _node("n1", {GPU: "8"}, {GPU: "8"}), "n2": _node("n2", {GPU: "8"}, {GPU: "8"})}
    dra = {"n1": ["gpu.example.com"]}
    with pytest.raises(PreviewedRefusal) as e:
        _prepare(tmp_path, Reader(objects, dra, [CLASS]))
    assert "node n1: nvidia.com/gpu is served by a device plugin" in str(e.value)
    prepared = _prepare(tmp_path, Reader(objects, dra))  # the class gone: one path
    assert prepared.forced == ()
    assert any("node n1: devices of DRA driver(s) gpu.example.com" in w for w in prepared.warnings)


def test_apply_journals_the_forced_refusals_with_the_reason(tmp_path: Path) -> None:
    """What ``rollout apply --force REASON`` appends before the first node step (and ``resume``
    reads back as the change's consent)."""
    from datetime import UTC, datetime

    from rollout.change.journal import Journal
    from rollout.change.launching import journal_consents

    objects = {"n1": _node("n1", {GPU: "8"}, {GPU: "7"}), "n2": _node("n2", {GPU: "8"}, {})}
    prepared = _prepare(tmp_path, Reader(objects), force=True)
    journal = Journal.create(tmp_path / "state", "20261202T000000Z-abcdef")
    journal_consents(journal, prepared, "GPU-3 is being replaced", datetime.now(UTC))
    (entry,) = journal.entries()
    assert entry.step == "preflight-forced"
    assert entry.data["reason"] == "GPU-3 is being replaced"
    assert entry.data["refusals"] == list(prepared.forced)
    assert entry.data["refusals"][0].startswith("node n1: advertises 7 of 8 nvidia.com/gpu")
