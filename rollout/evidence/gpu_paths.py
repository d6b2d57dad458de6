"""A GPU node's allocation path in the evidence, so a migration's evidence holds across the move
(``rollout migrate`` collects ``before`` and ``after``; ``rollout evidence --change ID`` of a
migration adds it too).

Why: the device identity the evidence proves lives in different places on the two paths. On the
device plugin the kubelet's podresources ``List`` names each pod's device IDs (``GPU-…``) and
``GetAllocatableResources`` the healthy set; on DRA the scheduler writes the allocated devices
into the claim's status (``draClaims``, :mod:`rollout.evidence.dra`), the kubelet's podresources
names the devices it prepared per container (``dynamic_resources``; the pod's
``podResourcesDra``), and the driver's ResourceSlices list the node's devices. The before and
after collections then show both, and ``gpus-served-once``
(:func:`rollout.evidence.checks.check_gpus_served_once`) judges what a migration must keep:
every GPU that was healthy before is served after, once, through one path.

Each node of such a collection carries ``gpuPath``::

    "gpuPath": {"resource": "nvidia.com/gpu", "driver": "gpu.example.com",
                "path": "dra",                       # what the node's labels select
                "allocatable": 0,                     # the device plugin's count (Node)
                "sliceDevices": ["gpu-07/gpu-0", ...],  # the driver's slices: pool/device
                "served": 8,                          # through the path that serves
                "expected": 8}                        # the healthy count in 'before' (absent there)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.kube.client import Api

KEY = "gpuPath"


def path_settings(records: Mapping[str, Mapping[str, Any]]) -> dict[str, Any] | None:
    """The allocation-path settings a change recorded with its nodes (``PathSettings`` as a
    dict: ``driver``, ``device_plugin_label``, ``dra_label``, ``resource``), None when no node
    record has them (not a migration)."""
    for rec in records.values():
        s = rec.get("settings")
        if isinstance(s, Mapping) and s.get("driver") and rec.get("target"):
            return dict(s)
    return None


def _int(v: Any) -> int:
    try:
        return int(str(v or "0"))
    except ValueError:
        return 0


def served(d: Mapping[str, Any]) -> int:
    """How many GPUs the node's ``gpuPath`` says are served: the device plugin's allocatable, or
    the driver's distinct devices when the plugin serves none."""
    g = d.get(KEY) or {}
    return _int(g.get("allocatable")) or len(set(g.get("sliceDevices") or ()))


def expected_from(document: Mapping[str, Any] | None, node: str) -> int | None:
    """The GPUs ``node`` served in the document's ``before`` collection, if it has one."""
    for col in (document or {}).get("collections") or ():
        if col.get("label") == "before":
            d = (col.get("nodes") or {}).get(node)
            if isinstance(d, Mapping) and d.get(KEY):
                return served(d)
    return None


def gpu_path(
    labels: Mapping[str, str],
    allocatable: Mapping[str, str],
    slices: list[str],
    s: Mapping[str, Any],
) -> dict[str, Any]:
    """One node's ``gpuPath`` from its labels, allocatable and the driver's devices (pure)."""
    resource = str(s.get("resource") or "nvidia.com/gpu")
    dp = labels.get(str(s.get("device_plugin_label"))) == "true"
    dra = labels.get(str(s.get("dra_label"))) == "true"
    path = "both" if dp and dra else "dra" if dra else "device-plugin" if dp else "none"
    out: dict[str, Any] = {
        "resource": resource,
        "driver": s.get("driver"),
        "path": path,
        "allocatable": _int(allocatable.get(resource)),
        "sliceDevices": sorted(slices),
    }
    out["served"] = served({KEY: out})
    return out


def add_gpu_paths(
    api: Api,
    collection: dict[str, Any],
    settings: Mapping[str, Any],
    document: Mapping[str, Any] | None,
) -> None:
    """Each node of ``collection`` gets its ``gpuPath`` (read from the API server), and outside
    ``before`` the count it served there (``expected``, from ``document``); a read that fails
    leaves ``gpuPathProblem`` (the check then says not collected, never pass)."""
    from rollout.kube.devices import slice_devices
    from rollout.kube.nodes import node_info

    for node, d in collection["nodes"].items():
        try:
            info = node_info(api, node)
            slices = slice_devices(api, str(settings["driver"]), node)
        except Exception as e:  # evidence is best effort: say what is missing
            d["gpuPathProblem"] = f"cannot read the node's allocation path: {e}"
            continue
        g = gpu_path(info.labels, info.allocatable, slices, settings)
        if collection.get("label") != "before":
            exp = expected_from(document, node)
            if exp is not None:
                g["expected"] = exp
        d[KEY] = g
