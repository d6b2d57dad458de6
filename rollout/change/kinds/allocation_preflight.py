"""Preflight of an allocation-path change: the cluster can carry it, or it is refused before any
node is touched, each refusal naming what is wrong.

Refused: a driver with no ResourceSlice anywhere in the cluster (its kubelet plugin is not
deployed, or the name is wrong); a DeviceClass that does not exist, or whose
``extendedResourceName`` is not the plan's (pods requesting the name would then not be served on
migrated nodes); a path label that no DaemonSet selects on (switching it would change nothing);
a node whose labels select no single path, or that serves the name through both paths now; a
batch whose pods holding GPUs would find too few free GPUs on the nodes left.

Pure: the cluster's objects in, the refusals out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout.change.plan.allocation_path_section import AllocationPath, PathSettings
from rollout.models import NodeInfo, PodRef


@dataclass(frozen=True)
class PathWorld:
    """What the preflight reads, all from the API server.

    Attributes:
        nodes: every Node, by name.
        pods: the pods on each node.
        slices: the driver's ResourceSlice devices per node (``spec.nodeName``), every driver's
            slices filtered to the plan's.
        device_classes: every DeviceClass, as the API serves them.
        daemonsets: every DaemonSet, as the API serves them.
    """

    nodes: Mapping[str, NodeInfo]
    pods: Mapping[str, Sequence[PodRef]] = field(default_factory=dict)
    slices: Mapping[str, int] = field(default_factory=dict)
    device_classes: Sequence[Mapping[str, Any]] = ()
    daemonsets: Sequence[Mapping[str, Any]] = ()


def _selector(ds: Mapping[str, Any]) -> dict[str, str]:
    """The labels a DaemonSet's pods require of a node: ``nodeSelector`` and the ``In`` terms
    of required node affinity with a single value."""
    spec = ds.get("spec", {}).get("template", {}).get("spec", {})
    out = {str(k): str(v) for k, v in (spec.get("nodeSelector") or {}).items()}
    req = (spec.get("affinity") or {}).get("nodeAffinity", {})
    terms = (req.get("requiredDuringSchedulingIgnoredDuringExecution") or {}).get(
        "nodeSelectorTerms"
    ) or []
    for t in terms:
        for e in t.get("matchExpressions") or []:
            if e.get("operator") == "In" and len(e.get("values") or []) == 1:
                out[str(e["key"])] = str(e["values"][0])
    return out


def _name(obj: Mapping[str, Any]) -> str:
    md = obj.get("metadata", {})
    ns = md.get("namespace")
    return f"{ns}/{md.get('name')}" if ns else str(md.get("name"))


def path_refusals(
    world: PathWorld,
    s: PathSettings,
    targets: Mapping[str, AllocationPath],
    batches: Sequence[Sequence[str]],
) -> list[str]:
    """Every reason the change of ``targets`` (node -> path it ends on) must not start (pure;
    empty: it may)."""
    out: list[str] = []
    if not any(world.slices.values()):
        out.append(
            f"driver {s.driver} publishes no ResourceSlice in the cluster: its kubelet plugin "
            "is not running anywhere, or the plan names another driver (allocationPath.driver)"
        )
    cls = next(
        (c for c in world.device_classes if c.get("metadata", {}).get("name") == s.device_class),
        None,
    )
    if cls is None:
        known = sorted(str(c.get("metadata", {}).get("name")) for c in world.device_classes)
        out.append(
            f'DeviceClass "{s.device_class}" not found (allocationPath.deviceClass; the cluster '
            f"has: {', '.join(known) or 'none'})"
        )
    else:
        mapped = cls.get("spec", {}).get("extendedResourceName")
        if mapped != s.resource:
            out.append(
                f"DeviceClass {s.device_class} maps extendedResourceName "
                f"{mapped or '(none)'}, not {s.resource}: pods requesting {s.resource} would not "
                "be served on migrated nodes (allocationPath.extendedResourceName)"
            )
    for label, what in ((s.device_plugin_label, "devicePluginLabel"), (s.dra_label, "draLabel")):
        selecting = [_name(d) for d in world.daemonsets if _selector(d).get(label) == "true"]
        if not selecting:
            out.append(
                f"no DaemonSet selects nodes on {label}=true (allocationPath.{what}): switching "
                "it would start or stop nothing"
            )
    for node in targets:
        info = world.nodes.get(node)
        if info is None:
            out.append(f"node {node}: no such Node")
            continue
        now = s.path_of(info.labels)
        plugin = info.allocatable.get(s.resource, "0") not in ("0", "")
        if plugin and world.slices.get(node, 0):
            out.append(
                f"node {node} serves {s.resource} through both paths now: the device plugin's "
                f"allocatable is {info.allocatable.get(s.resource)} and {s.driver} lists "
                f"{world.slices[node]} device(s) in its ResourceSlices"
            )
        if now is None:
            out.append(
                f"node {node}: labels {s.device_plugin_label}="
                f"{info.labels.get(s.device_plugin_label)!r} and {s.dra_label}="
                f"{info.labels.get(s.dra_label)!r} select no single path"
            )
    out += _capacity(world, s, targets, batches)
    return out


def _healthy(world: PathWorld, s: PathSettings, node: str) -> int:
    """GPUs the node serves on its path now: the plugin's allocatable, or the driver's devices."""
    info = world.nodes[node]
    if s.path_of(info.labels) is AllocationPath.DRA:
        return world.slices.get(node, 0)
    try:
        return int(info.allocatable.get(s.resource, "0"))
    except ValueError:
        return 0


def _used(world: PathWorld, s: PathSettings, node: str) -> int:
    return sum(p.extended.get(s.resource, 0) for p in world.pods.get(node, ()))


def _capacity(
    world: PathWorld,
    s: PathSettings,
    targets: Mapping[str, AllocationPath],
    batches: Sequence[Sequence[str]],
) -> list[str]:
    """A batch's drained GPU pods must fit on the schedulable nodes outside it."""
    out = []
    for i, batch in enumerate(batches):
        inside = [n for n in batch if n in world.nodes]
        need = sum(_used(world, s, n) for n in inside)
        if not need:
            continue
        free = sum(
            max(_healthy(world, s, n) - _used(world, s, n), 0)
            for n, info in world.nodes.items()
            if n not in inside and not info.unschedulable
        )
        if free < need:
            out.append(
                f"batch {i + 1} ({', '.join(inside)}): its pods hold {need} {s.resource}, and "
                f"the other schedulable nodes have {free} free: the drained pods would stay "
                "Pending (fewer nodes per batch, or more GPUs elsewhere)"
            )
    return out
