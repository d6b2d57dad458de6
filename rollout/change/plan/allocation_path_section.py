"""The allocation path's plan section (``allocationPath``) as a value: which path serves a
node's GPUs, the labels and names that select it, and the path each inventory group ends on.

Why apart from the kind's steps (:mod:`rollout.change.kinds.allocation_path`): the plan is parsed
once (:func:`rollout.change.plan.schema.parse_plan` calls :func:`parse_path_plan`), and the steps
read the typed plan; the section's value and parser import nothing of the plan or the engine.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rollout.durations import parse_go_duration
from rollout.errors import InputError, Location

DEVICE_PLUGIN_LABEL = "nvidia.com/gpu.deploy.device-plugin"
"""The default label the device plugin's DaemonSet selects on (NVIDIA's GPU Operator)."""
DRA_LABEL = "nvidia.com/dra-kubelet-plugin"
"""The default label the DRA kubelet plugin's DaemonSet selects on (NVIDIA's docs)."""
RESOURCE = "nvidia.com/gpu"
"""The default extended resource name."""
ON, OFF = "true", "false"


class AllocationPath(StrEnum):
    """Which path serves a node's GPUs."""

    DEVICE_PLUGIN = "device-plugin"
    DRA = "dra"


@dataclass(frozen=True)
class PathSettings:
    """How a node's path is selected in this cluster (the plan's ``allocationPath``).

    Attributes:
        device_plugin_label: the Node label the device plugin's DaemonSet selects (``true``).
        dra_label: the Node label the DRA kubelet plugin's DaemonSet selects (``true``).
        driver: the DRA driver's name (``ResourceSlice.spec.driver``).
        device_class: the DeviceClass whose ``extendedResourceName`` serves ``resource``.
        resource: the extended resource name pods request.
        timeout_s: how long a wait (allocatable, slices, claims) may take before the step fails.
        terminate_claims: the operator's consent to terminate pods holding claims on the way
            back (else the way back waits for them to end, up to ``timeout_s``).
        freeze_claims: on the way back, deny new claims of ``device_class`` cluster-wide while
            the nodes are restored (``rollout.change.kinds.claim_freeze``; the plan's
            ``freezeClaims``, default off).
    """

    driver: str
    device_class: str
    device_plugin_label: str = DEVICE_PLUGIN_LABEL
    dra_label: str = DRA_LABEL
    resource: str = RESOURCE
    timeout_s: float = 300.0
    terminate_claims: bool = False
    freeze_claims: bool = False

    def labels_for(self, path: AllocationPath) -> dict[str, str]:
        """The two labels as a node on ``path`` carries them."""
        dp = ON if path is AllocationPath.DEVICE_PLUGIN else OFF
        return {self.device_plugin_label: dp, self.dra_label: OFF if dp == ON else ON}

    def path_of(self, labels: Mapping[str, str]) -> AllocationPath | None:
        """The path a node's labels select (None: both, or neither)."""
        dp = labels.get(self.device_plugin_label) == ON
        dra = labels.get(self.dra_label) == ON
        if dp == dra:
            return None
        return AllocationPath.DEVICE_PLUGIN if dp else AllocationPath.DRA


@dataclass(frozen=True)
class PathPlan:
    """The plan's ``allocationPath`` section: the settings, the path each inventory group ends
    on, and how long a claim of the class or a pod asking for it may wait unallocated before
    the gate fails (``claimLimit``)."""

    settings: PathSettings
    groups: Mapping[str, AllocationPath]
    claim_limit_s: float = 300.0


_KEYS = (
    "groups",
    "driver",
    "deviceClass",
    "devicePluginLabel",
    "draLabel",
    "extendedResourceName",
    "timeout",
    "claimLimit",
    "freezeClaims",
)


def parse_path_plan(section: Mapping[str, Any], loc: Callable[[str], Location]) -> PathPlan:
    """The ``allocationPath`` section (``loc``: the plan's location of a dotted field).

    Raises:
        InputError: an unknown field, a missing driver or DeviceClass, a path that is neither
            ``device-plugin`` nor ``dra``, a bad duration; naming the field and its line.
    """
    base = "allocationPath"
    for key in section:
        if key not in _KEYS:
            raise InputError(f"unknown field; valid: {', '.join(_KEYS)}", loc(f"{base}.{key}"))

    def text(key: str, default: str | None = None) -> str:
        v = section.get(key, default)
        if not isinstance(v, str) or not v:
            raise InputError("must be a non-empty string", loc(f"{base}.{key}"))
        return v

    groups_raw = section.get("groups")
    if not isinstance(groups_raw, Mapping) or not groups_raw:
        raise InputError(
            "must map each inventory group to the path it ends on (device-plugin or dra)",
            loc(f"{base}.groups"),
        )
    groups: dict[str, AllocationPath] = {}
    for g, p in groups_raw.items():
        try:
            groups[str(g)] = AllocationPath(str(p))
        except ValueError:
            raise InputError(
                f"path {p!r} is neither {AllocationPath.DEVICE_PLUGIN} nor {AllocationPath.DRA}",
                loc(f"{base}.groups.{g}"),
            ) from None

    def duration(key: str) -> float:
        if key not in section:
            return 300.0
        try:
            return parse_go_duration(str(section[key]))
        except ValueError as e:
            raise InputError(str(e), loc(f"{base}.{key}")) from None

    timeout, claim_limit = duration("timeout"), duration("claimLimit")
    freeze = section.get("freezeClaims", False)
    if not isinstance(freeze, bool):
        raise InputError("must be true or false (default false)", loc(f"{base}.freezeClaims"))
    dp, dra = text("devicePluginLabel", DEVICE_PLUGIN_LABEL), text("draLabel", DRA_LABEL)
    if dp == dra:
        raise InputError("must differ from devicePluginLabel", loc(f"{base}.draLabel"))
    settings = PathSettings(
        driver=text("driver"),
        device_class=text("deviceClass"),
        device_plugin_label=dp,
        dra_label=dra,
        resource=text("extendedResourceName", RESOURCE),
        timeout_s=timeout,
        freeze_claims=freeze,
    )
    return PathPlan(settings, groups, claim_limit)
