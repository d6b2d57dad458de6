"""Preflight over the target nodes' devices: a node advertising fewer GPUs than it has (plugin
down, devices unhealthy) and one extended resource served by a device plugin and a DRA
DeviceClass are refused, naming node and cause, unless ``--force REASON``; DRA-managed devices
under an aligning Topology Manager policy are a warning. Pure rules in tables, then ``prepare``
over a fake cluster reader (the real render of a kubeadm node's files)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout.ansible.hosts import Inventory
from rollout.change.plan.schema import load_plan
from rollout.change.preflight.checking import PreviewedRefusal, prepare
from rollout.change.preflight.device_checks import (
    BOTH_PATHS,
    DEVICE_PLUGIN_PATH,
    DRA_PATH,
    NO_PATH,
    AllocationPath,
    DeviceClass,
    allocation_paths,
    check_advertised,
    check_dra_extended,
    check_vendor_domain,
    device_classes,
    dra_topology_warnings,
)
from rollout.kube.nodes import to_node_info
from rollout.lab.inventory import LAB_INTENT
from rollout.models import PodListing, ServingReads
from tests.unit.test_node_runner_cas import _facts

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
    assert check_vendor_domain("n1", {GPU: "8"}, ["gpu.example.com"]) == []  # the old check
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


def _paths(cap: dict[str, str], alloc: dict[str, str], drivers: list[str]) -> list[AllocationPath]:
    return allocation_paths(cap, alloc, drivers, device_classes([CLASS]))


def test_the_allocation_path_follows_the_schedulers_rule() -> None:
    """The device plugin serves a name while its allocatable is > 0; DRA where a class maps it
    to a driver with slices on the node and allocatable is 0 (filterExtendedResources)."""
    (p,) = _paths({GPU: "8"}, {GPU: "8"}, [])
    assert p == AllocationPath(GPU, DEVICE_PLUGIN_PATH, 8, 8)
    (p,) = _paths({}, {}, ["gpu.example.com"])
    assert (p.path, p.classes, p.drivers, p.note) == (
        DRA_PATH,
        ("gpu.example.com",),
        ("gpu.example.com",),
        "",
    )
    # the plugin left: capacity kept 5 min, allocatable 0: DRA serves it, the note says why the
    # preflight (by capacity) would still refuse the node
    (p,) = _paths({GPU: "8"}, {GPU: "0"}, ["gpu.example.com"])
    assert p.path == DRA_PATH and "capacity 8 is still reported with allocatable 0" in p.note
    # both at once: the forbidden state, in KEP-5004's words
    (p,) = _paths({GPU: "8"}, {GPU: "8"}, ["gpu.example.com"])
    assert p.path == BOTH_PATHS and "One node in a cluster cannot have both" in p.note
    assert p.to_dict()["path"] == "both" and p.to_dict()["drivers"] == ["gpu.example.com"]
    # a plugin down and no DRA: none, and why
    (p,) = _paths({GPU: "8"}, {GPU: "0"}, [])
    assert p.path == NO_PATH and "the device plugin is down" in p.note
    # another driver's slices do not back the class; nothing advertised, nothing mapped: no row
    (p,) = _paths({GPU: "8"}, {GPU: "8"}, ["other.example.com"])
    assert p.path == DEVICE_PLUGIN_PATH
    assert _paths({}, {}, ["other.example.com"]) == []


def test_every_advertised_or_mapped_name_gets_a_row() -> None:
    paths = allocation_paths(
        {GPU: "8", "example.com/nic": "2", "hugepages-2Mi": "0", "cpu": "64"},
        {GPU: "0", "example.com/nic": "2"},
        ["gpu.example.com"],
        device_classes([CLASS]),
    )
    assert [(p.resource, p.path) for p in paths] == [
        ("example.com/nic", DEVICE_PLUGIN_PATH),
        (GPU, DRA_PATH),
    ]


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
        serving: ServingReads | None = None,
        pods: dict[str, list[dict[str, Any]]] | None = None,
    ) -> None:
        self.objects, self._dra, self._classes = objects, dra or {}, classes or []
        self._serving, self._pods = serving or ServingReads(), pods or {}

    def version(self) -> str:
        return "v1.36.3"

    def resource_versions(self) -> list[str]:
        return ["v1"]

    def nodes(self) -> dict[str, Any]:
        return {n: to_node_info(o) for n, o in self.objects.items()}

    def pod_listing(self) -> PodListing:
        return PodListing({}, self._pods, {})

    def pdbs(self) -> list[Any]:
        return []

    def dra(self, versions: list[str]) -> dict[str, list[str]]:
        return self._dra

    def serving(self) -> ServingReads:
        return self._serving

    def device_classes(self, versions: list[str]) -> list[dict[str, Any]]:
        return self._classes

    def node_objects(self) -> dict[str, dict[str, Any]]:
        return self.objects

    def controllers(self, nodes: Any = None) -> list[dict[str, Any]]:
        return []


def _prepare(
    tmp: Path,
    reader: Reader,
    force: bool = False,
    canary_only: bool = True,
    settled: tuple[str, ...] = (),
    force_serving: bool = False,
    tenancy: Any = None,
) -> Any:
    """``prepare`` of the lab's intent (static CPU manager, single-numa-node) with n1 the canary,
    both nodes with 8 NVIDIA GPUs on the PCI bus."""
    plan = tmp / "plan.yaml"
    lines = ["kind: RolloutPlan", "metadata:", "  name: t", *LAB_INTENT]
    plan.write_text("\n".join([*lines, "strategy:", "  canaryGroup: canary"]) + "\n")
    inv = Inventory(tmp / "inv", ("n1", "n2"), {"canary": ("n1",)}, {})
    facts = _facts()
    facts["gpus"] = [{"id": f"0000:{i:02x}:00.0", "numaNode": i // 4} for i in range(8)]
    raw = {"n1": facts, "n2": facts}
    return prepare(
        load_plan(plan),
        inv,
        reader,
        raw,
        tmp,
        canary_only,
        force=force,
        settled=settled,
        force_serving=force_serving,
        tenancy=tenancy,
    )


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

    from rollout.change.commands.apply_change import journal_consents
    from rollout.change.record.journal import Journal

    objects = {"n1": _node("n1", {GPU: "8"}, {GPU: "7"}), "n2": _node("n2", {GPU: "8"}, {})}
    prepared = _prepare(tmp_path, Reader(objects), force=True)
    journal = Journal.create(tmp_path / "state", "20261202T000000Z-abcdef")
    journal_consents(journal, prepared, "GPU-3 is being replaced", datetime.now(UTC))
    (entry,) = journal.entries()
    assert entry.step == "preflight-forced"
    assert entry.data["reason"] == "GPU-3 is being replaced"
    assert entry.data["refusals"] == list(prepared.forced)
    assert entry.data["refusals"][0].startswith("node n1: advertises 7 of 8 nvidia.com/gpu")


VENDOR_DOMAIN = [
    # case, allocatable, DRA drivers, expected refusal ("" = none)
    ("no DRA driver", {"cpu": "8", GPU: "8"}, [], ""),
    ("another vendor's driver", {GPU: "8"}, ["dra.example.com"], ""),
    ("a driver named by a domain that only ends alike", {GPU: "8"}, ["gpu.notnvidia.com"], ""),
    (
        "driver under the vendor's domain",
        {GPU: "8"},
        ["gpu.nvidia.com"],
        "node n1: device plugin resource nvidia.com/gpu=8 and DRA driver gpu.nvidia.com",
    ),
    ("driver named by the domain itself", {GPU: "8"}, ["nvidia.com"], "DRA driver nvidia.com "),
    ("nothing advertised", {GPU: "0"}, ["gpu.nvidia.com"], ""),
    ("hugepages are not devices", {"hugepages-1Gi": "4"}, ["hugepages-1Gi"], ""),
]


@pytest.mark.parametrize(
    ("case", "alloc", "drivers", "want"), VENDOR_DOMAIN, ids=[c[0] for c in VENDOR_DOMAIN]
)
def test_vendor_domain(case: str, alloc: dict[str, str], drivers: list[str], want: str) -> None:
    got = check_vendor_domain("n1", alloc, drivers)
    if not want:
        assert got == [], case
    else:
        (msg,) = got
        assert want in msg, (case, msg)
        assert "exactly one allocation path must own each device" in msg


def test_vendor_domain_is_judged_on_the_nodes_the_command_changes_and_force_covers_it(
    tmp_path: Path,
) -> None:
    """``apply --canary`` judges the canary (n1) only, ``apply`` and ``promote`` the nodes they
    change (n2 once n1 is settled); ``--force`` overrides it like the other device refusals."""
    objects = {n: _node(n, {GPU: "8"}, {GPU: "8"}) for n in ("n1", "n2")}
    outside = Reader(objects, {"n2": ["gpu.nvidia.com"]})
    assert _prepare(tmp_path, outside).forced == ()  # n2 is not in the canary
    with pytest.raises(PreviewedRefusal) as e:
        _prepare(tmp_path, outside, canary_only=False)
    assert "node n2: device plugin resource nvidia.com/gpu=8 and DRA driver gpu.nvidia.com" in str(
        e.value
    )
    assert "`rollout apply --force REASON` overrides" in str(e.value)
    inside = Reader(objects, {"n1": ["gpu.nvidia.com"]})
    with pytest.raises(PreviewedRefusal) as e:
        _prepare(tmp_path, inside)
    assert "node n1: device plugin resource nvidia.com/gpu=8" in str(e.value)
    # promote: n1 was moved by the canary, n2 is what it changes
    assert _prepare(tmp_path, inside, canary_only=False, settled=("n1",)).forced == ()
    (forced,) = _prepare(tmp_path, inside, force=True).forced
    assert forced.startswith("node n1: device plugin resource nvidia.com/gpu=8")


def _rolling(name: str, ns: str = "ml") -> dict[str, Any]:
    return {
        "metadata": {"name": name, "namespace": ns},
        "spec": {"replicas": 2, "selector": {"matchLabels": {"app": name}}},
        "status": {"replicas": 3, "updatedReplicas": 1},
    }


def _pod(name: str, app: str, ns: str = "ml") -> dict[str, Any]:
    return {"metadata": {"name": name, "namespace": ns, "labels": {"app": app}}}


def test_a_serving_canary_refuses_and_force_serving_overrides(tmp_path: Path) -> None:
    """Custom resources in progress refuse wherever they are; a Deployment rolling out only
    with a pod on a node the command changes (n1 with --canary); --force-serving turns them
    into warnings and ``Prepared.serving_forced``; unreadable listings are warnings."""
    objects = {n: _node(n, {GPU: "8"}, {GPU: "8"}) for n in ("n1", "n2")}
    serving = ServingReads(
        canaries=("Argo Rollout ml/llm is Paused: change them apart",),
        deployments=(_rolling("embed"), _rolling("rank")),
        unread=("could not list canaries.flagger.app (403 Forbidden)",),
    )
    pods = {"n1": [_pod("embed-a", "embed")], "n2": [_pod("rank-a", "rank")]}
    reader = Reader(objects, serving=serving, pods=pods)
    with pytest.raises(PreviewedRefusal) as e:
        _prepare(tmp_path, reader)
    text = str(e.value)
    assert "Argo Rollout ml/llm is Paused" in text
    assert "Deployment ml/embed is rolling out (ml/embed-a on n1): Waiting for deployment" in text
    assert "ml/rank" not in text  # its pod is on n2, which --canary does not change
    assert "`--force-serving REASON` overrides" in text
    prepared = _prepare(tmp_path, reader, force_serving=True)
    assert [s.split(":")[0] for s in prepared.serving_forced] == [
        "Argo Rollout ml/llm is Paused",
        "Deployment ml/embed is rolling out (ml/embed-a on n1)",
    ]
    assert "could not list canaries.flagger.app (403 Forbidden)" in prepared.warnings
    assert prepared.to_dict()["forcedServingCanaries"] == list(prepared.serving_forced)
    everything = _prepare(tmp_path, reader, canary_only=False, force_serving=True)
    assert any("ml/rank-a on n2" in s for s in everything.serving_forced)


def test_apply_journals_the_forced_serving_canaries_with_the_reason(tmp_path: Path) -> None:
    from datetime import UTC, datetime

    from rollout.change.commands.apply_change import journal_consents
    from rollout.change.record.journal import Journal

    objects = {n: _node(n, {GPU: "8"}, {GPU: "8"}) for n in ("n1", "n2")}
    serving = ServingReads(canaries=("Flagger Canary ml/llm is Progressing: apart",))
    prepared = _prepare(tmp_path, Reader(objects, serving=serving), force_serving=True)
    journal = Journal.create(tmp_path / "state", "20261202T000000Z-abcdef")
    journal_consents(journal, prepared, None, datetime.now(UTC), "the canary is on other nodes")
    (entry,) = journal.entries()
    assert entry.step == "serving-canary-forced"
    assert entry.data == {
        "reason": "the canary is on other nodes",
        "inProgress": ["Flagger Canary ml/llm is Progressing: apart"],
    }
