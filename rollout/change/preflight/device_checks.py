"""Preflight over each target node's devices: is every GPU advertised, and by one allocation path?

Why: a node whose device plugin is down still passes every kubelet check, and the tool would
drain it, restart its kubelet and call it verified while it advertises none of its GPUs; the
evidence after the change would then blame the change. And KEP-5004 (extended resources backed by
DRA) says *"One node in a cluster cannot have both extended resource backed by DRA, and same named
extended resource backed by device plugin at the same time"*: a DeviceClass with
``spec.extendedResourceName: nvidia.com/gpu`` whose driver publishes ResourceSlices on a node
where a device plugin advertises ``nvidia.com/gpu`` is that state, whatever the driver's domain.

And by vendor domain: a device plugin advertising ``vendor.com/x`` on a node for which a DRA
driver of the same vendor (``gpu.vendor.com``) publishes ResourceSlices manages the same devices
twice (:func:`check_vendor_domain`).

The checks run on the nodes the command changes (the canary for ``apply --canary``, the nodes
left for ``promote``), never on the rest of the inventory. Each refusal names the node and the
cause; ``rollout apply --force REASON`` (and ``promote --force``) overrides them (the reason and
the refusals are journaled). DRA-managed devices get a warning, not a refusal: the
kubelet's DRA manager is not a Topology Manager hint provider, so no policy aligns them.

Pure: the Node's capacity and allocatable, the facts' GPU count, the ResourceSlices' drivers and
the DeviceClasses in, messages out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: the kubelet's words (an UnexpectedAdmissionError) when a pod asks for a resource whose
#: devices are all unhealthy (pkg/kubelet/cm/devicemanager/manager.go)
NO_HEALTHY = (
    "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices {}, "
    "which is unexpected"
)
KEP_5004 = (
    "One node in a cluster cannot have both extended resource backed by DRA, and same named "
    "extended resource backed by device plugin at the same time"
)
_DRIVER = re.compile(r"""device\.driver\s*==\s*["']([^"']+)["']""")


@dataclass(frozen=True)
class DeviceClass:
    """A DeviceClass that backs an extended resource with DRA.

    Attributes:
        name: the class's name.
        extended_resource: its ``spec.extendedResourceName``.
        drivers: the drivers its CEL selectors name (``device.driver == "x"``); empty when no
            selector names one (then every driver's devices may match).
    """

    name: str
    extended_resource: str
    drivers: tuple[str, ...] = ()


def device_classes(objects: Iterable[Mapping[str, Any]]) -> list[DeviceClass]:
    """The DeviceClasses (API objects) that set ``spec.extendedResourceName``."""
    out = []
    for o in objects:
        spec = o.get("spec") or {}
        ext = spec.get("extendedResourceName")
        if not ext:
            continue
        drivers: list[str] = []
        for sel in spec.get("selectors") or ():
            expr = str(((sel or {}).get("cel") or {}).get("expression") or "")
            drivers += [d for d in _DRIVER.findall(expr) if d not in drivers]
        name = str((o.get("metadata") or {}).get("name", ""))
        out.append(DeviceClass(name, str(ext), tuple(drivers)))
    return out


def _int(v: Any) -> int:
    try:
        return int(str(v))
    except (TypeError, ValueError):
        return 0


def _devices(resources: Mapping[str, Any]) -> dict[str, int]:
    return {
        k: _int(v)
        for k, v in resources.items()
        if "/" in k and not k.startswith(("hugepages-", "kubernetes.io/", "k8s.io/"))
    }


def check_advertised(
    node: str,
    capacity: Mapping[str, Any],
    allocatable: Mapping[str, Any],
    pci_gpus: int,
    gpu_resource: str = "nvidia.com/gpu",
    dra_drivers: Sequence[str] = (),
) -> list[str]:
    """Refusals for a node that advertises fewer devices than it has.

    * a device resource whose capacity exceeds its allocatable: the kubelet holds that many
      devices unhealthy (the plugin reported them so, or it disconnected: then all of them);
    * GPUs on the PCI bus (the facts' vendor match) but the node advertising fewer
      ``gpu_resource`` (none of the vendor's resources at all: the plugin is down or never
      registered). Skipped when the vendor advertises other resources (MIG profiles) or the node
      has DRA ResourceSlices (its GPUs may be DRA-managed: the warning says so).
    """
    cap, alloc = _devices(capacity), _devices(allocatable)
    problems = []
    for res, c in sorted(cap.items()):
        a = alloc.get(res, 0)
        if c > a:
            problems.append(
                f"node {node}: advertises {a} of {c} {res} (capacity {c}, allocatable {a}): the "
                f"kubelet holds {c - a} device(s) unhealthy (the device plugin reports them "
                "unhealthy or has disconnected); a pod asking for more than the healthy ones "
                f'fails admission, with "{NO_HEALTHY.format(res)}" when none is healthy'
            )
    domain = gpu_resource.split("/", 1)[0]
    vendor = {r: c for r, c in cap.items() if r.split("/", 1)[0] == domain and c > 0}
    if pci_gpus > 0 and not dra_drivers and set(vendor) <= {gpu_resource}:
        advertised = alloc.get(gpu_resource, 0)
        if advertised < pci_gpus and cap.get(gpu_resource, 0) <= advertised:
            what = f"{advertised} {gpu_resource}" if vendor else f"no {domain} resource"
            problems.append(
                f"node {node}: has {pci_gpus} GPU(s) on the PCI bus but advertises {what}: its "
                "device plugin is not running or has not registered with the kubelet"
            )
    return problems


def check_vendor_domain(
    node: str, allocatable: Mapping[str, Any], dra_drivers: Sequence[str]
) -> list[str]:
    """Refusals for a node where a device plugin advertises ``vendor.com/x`` (allocatable > 0)
    while a DRA driver of the same vendor domain (``vendor.com`` or ``*.vendor.com``) publishes
    ResourceSlices for it: exactly one allocation path must own each device."""
    problems = []
    for resource, value in sorted(_devices(allocatable).items()):
        if value <= 0:
            continue
        domain = resource.split("/", 1)[0]
        for driver in dra_drivers:
            if driver == domain or driver.endswith("." + domain):
                problems.append(
                    f"node {node}: device plugin resource {resource}={value} and DRA driver "
                    f"{driver} (ResourceSlices) both manage the same devices; exactly one "
                    "allocation path must own each device"
                )
    return problems


def check_dra_extended(
    node: str,
    capacity: Mapping[str, Any],
    dra_drivers: Sequence[str],
    classes: Sequence[DeviceClass],
) -> list[str]:
    """Refusals for an extended resource served on the node by a device plugin (capacity > 0)
    and by DRA (a DeviceClass naming it as ``extendedResourceName`` whose driver, or any driver
    when its selectors name none, publishes ResourceSlices for the node)."""
    cap = _devices(capacity)
    problems = []
    for dc in classes:
        if cap.get(dc.extended_resource, 0) <= 0:
            continue
        matched = [d for d in dra_drivers if not dc.drivers or d in dc.drivers]
        if not matched:
            continue
        how = "its selectors name" if dc.drivers else "its selectors name no driver; present"
        problems.append(
            f"node {node}: {dc.extended_resource} is served by a device plugin (capacity "
            f"{cap[dc.extended_resource]}) and by DRA: DeviceClass {dc.name} has "
            f"spec.extendedResourceName {dc.extended_resource} and driver(s) "
            f"{', '.join(sorted(set(matched)))} ({how}) publish ResourceSlices for the node; "
            f'KEP-5004: "{KEP_5004}"'
        )
    return problems


DEVICE_PLUGIN_PATH = "device-plugin"
DRA_PATH = "dra"
NO_PATH = "none"
BOTH_PATHS = "both"


@dataclass(frozen=True)
class AllocationPath:
    """How a node serves one extended resource now (``rollout nodes``).

    Attributes:
        resource: the extended resource (``nvidia.com/gpu``).
        path: :data:`DEVICE_PLUGIN_PATH` (its allocatable > 0), :data:`DRA_PATH` (a DeviceClass
            maps the name to a driver with ResourceSlices on the node, allocatable 0 or absent:
            the scheduler's rule), :data:`BOTH_PATHS` (both at once: KEP-5004's forbidden
            state), or :data:`NO_PATH`.
        capacity, allocatable: the Node's, for the name.
        classes, drivers: the DeviceClasses mapping the name, and their drivers publishing
            ResourceSlices on the node (empty when DRA does not back it there).
        note: what else the numbers say ("" when nothing).
    """

    resource: str
    path: str
    capacity: int
    allocatable: int
    classes: tuple[str, ...] = ()
    drivers: tuple[str, ...] = ()
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "capacity": self.capacity,
            "allocatable": self.allocatable,
            "deviceClasses": list(self.classes),
            "drivers": list(self.drivers),
            "note": self.note or None,
        }


def allocation_paths(
    capacity: Mapping[str, Any],
    allocatable: Mapping[str, Any],
    dra_drivers: Sequence[str],
    classes: Sequence[DeviceClass],
) -> list[AllocationPath]:
    """Each extended resource the node serves or advertises, and by which path (sorted by name):
    the names its device plugins advertise (capacity > 0) and those a DeviceClass maps to a
    driver with ResourceSlices on the node.

    The device plugin serves a name while its allocatable is > 0; DRA serves it where a class
    maps it and allocatable is 0 (``filterExtendedResources`` in the scheduler, v1.36). A name
    with both is :data:`BOTH_PATHS`. A plugin that left keeps its capacity for 5 min with
    allocatable 0: DRA serves the name meanwhile, and the note says the plugin would take it back
    if it registered again (:func:`check_dra_extended`, judging by capacity, refuses that node)."""
    cap, alloc = _devices(capacity), _devices(allocatable)
    names = {dc.extended_resource for dc in classes} | {r for r, c in cap.items() if c > 0}
    out = []
    for name in sorted(names):
        backing = [dc for dc in classes if dc.extended_resource == name]
        drivers = sorted(
            {d for dc in backing for d in dra_drivers if not dc.drivers or d in dc.drivers}
        )
        used = tuple(
            dc.name for dc in backing if any(not dc.drivers or d in dc.drivers for d in drivers)
        )
        c, a = cap.get(name, 0), alloc.get(name, 0)
        note = ""
        if a > 0 and drivers:
            path = BOTH_PATHS
            note = f'KEP-5004: "{KEP_5004}"'
        elif a > 0:
            path = DEVICE_PLUGIN_PATH
        elif drivers:
            path = DRA_PATH
            if c > 0:
                note = (
                    f"the device plugin's capacity {c} is still reported with allocatable 0 (the "
                    "kubelet drops it 5 min after the plugin left); were the plugin to register "
                    "again, the node would serve the name through both paths"
                )
        elif c > 0:
            path = NO_PATH
            note = (
                f"capacity {c}, allocatable 0: the device plugin is down or every device is "
                "unhealthy, and no DeviceClass maps the name to a driver on the node"
            )
        else:
            continue
        out.append(AllocationPath(name, path, c, a, used if drivers else (), tuple(drivers), note))
    return out


def dra_topology_warnings(node: str, dra_drivers: Sequence[str], policy: str) -> list[str]:
    """A warning for a node with DRA devices whose new Topology Manager policy aligns anything:
    the kubelet's DRA manager gives the Topology Manager no hints."""
    if not dra_drivers or policy in ("", "none"):
        return []
    return [
        f"node {node}: devices of DRA driver(s) {', '.join(sorted(set(dra_drivers)))} are "
        f"DRA-managed: the Topology Manager ({policy}) gets no hints for DRA devices and will not "
        "align them with the exclusive CPUs and memory; express NUMA placement in the "
        "ResourceClaim (constraints matchAttribute resource.kubernetes.io/numaNode)"
    ]
