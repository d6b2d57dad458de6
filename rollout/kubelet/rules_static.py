"""Rules the kubelet applies when it loads its configuration, before any manager starts.

Decoding (wrong JSON types, unknown fields, durations), feature gates, and the checks of
``pkg/kubelet/apis/config/validation/validation.go`` and ``validation_reserved_memory.go`` that
concern CPU, memory and topology settings. Messages are the kubelet's format strings, filled in.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from typing import Any

from rollout.durations import is_go_duration
from rollout.kubelet import cpuset, quantity
from rollout.kubelet.distributions import DISTRIBUTIONS
from rollout.kubelet.fields import FIELDS, accepts, json_kind
from rollout.kubelet.options import GATES, SPECIAL_GATES
from rollout.kubelet.rules_base import Ctx, Stage, go_quote

_API_VERSION = "kubelet.config.k8s.io/v1beta1"

#: cAdvisor flags the kubelet registered as deprecated since 1.10 and dropped in 1.37 (#139870,
#: "the long-deprecated cAdvisor kubelet flags"; ``cmd/kubelet/app/options/globalflags_linux.go``
#: up to 1.36). ``housekeeping-interval`` stays. Names as the kubelet normalizes them
#: (``_`` -> ``-``).
CADVISOR_FLAGS_REMOVED = (
    "application-metrics-count-limit",
    "boot-id-file",
    "container-hints",
    "containerd",
    "containerd-namespace",
    "enable-load-reader",
    "event-storage-age-limit",
    "event-storage-event-limit",
    "global-housekeeping-interval",
    "log-cadvisor-usage",
    "machine-id-file",
    "storage-driver-buffer-duration",
    "storage-driver-db",
    "storage-driver-host",
    "storage-driver-password",
    "storage-driver-secure",
    "storage-driver-table",
    "storage-driver-user",
)
CADVISOR_FLAGS_GONE_IN = (1, 37)


def check_flags(ctx: Ctx) -> None:
    """The kubelet parses its command line before it reads any file: a flag it no longer
    registers stops it there (``failed to parse kubelet flag: unknown flag: --<name>``)."""
    if ctx.version < CADVISOR_FLAGS_GONE_IN:
        return
    for name, at in ctx.flags.items():
        if name.replace("_", "-") in CADVISOR_FLAGS_REMOVED:
            ctx.error(
                Stage.DECODE,
                f"--{name}",
                f"failed to parse kubelet flag: unknown flag: --{name} (a cAdvisor flag, "
                "deprecated since 1.10, removed in kubelet 1.37: kubernetes#139870; delete it)",
                at=at,
            )


_TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")


def check_decode(ctx: Ctx) -> None:
    """apiVersion/kind, unknown fields (warning + suggestion), wrong types, malformed durations."""
    cfg = ctx.config
    api, kind = cfg.get("apiVersion"), cfg.get("kind")
    if api is not None and api != _API_VERSION:
        ctx.error(
            Stage.DECODE,
            "apiVersion",
            f"apiVersion {go_quote(str(api))} is not {_API_VERSION}: the kubelet cannot load "
            "this file",
        )
    if kind is not None and kind != "KubeletConfiguration":
        ctx.error(Stage.DECODE, "kind", f"kind {go_quote(str(kind))} is not KubeletConfiguration")
    for name, value in cfg.items():
        name = str(name)
        go_type = FIELDS.get(name)
        if go_type is None:
            ctx.warn(Stage.DECODE, name, _unknown_field(name))
            continue
        if not accepts(go_type, value):
            ctx.bad_fields.add(name)
            shown = "string" if go_type == "v1.Duration" else go_type
            ctx.error(Stage.DECODE, name, _unmarshal(json_kind(value), name, shown))
            continue
        if go_type.startswith("map[string]") and isinstance(value, Mapping):
            elem = go_type[len("map[string]") :]
            for k, v in value.items():
                if elem in ("string", "bool") and not accepts(elem, v):
                    ctx.bad_fields.add(name)
                    ctx.error(Stage.DECODE, f"{name}.{k}", _unmarshal(json_kind(v), name, elem))
        if go_type == "v1.Duration" and isinstance(value, str) and not is_go_duration(value):
            ctx.bad_fields.add(name)
            ctx.error(Stage.DECODE, name, f"time: invalid duration {go_quote(value)}")


def _unmarshal(kind: str, name: str, go_type: str) -> str:
    return (
        f"json: cannot unmarshal {kind} into Go struct field KubeletConfiguration.{name} "
        f"of type {go_type}"
    )


def _unknown_field(name: str) -> str:
    by_lower = {f.lower(): f for f in FIELDS}
    guess = by_lower.get(name.lower())
    if guess is None:
        close = difflib.get_close_matches(name, list(FIELDS), n=1, cutoff=0.75)
        guess = close[0] if close else None
    hint = f" (did you mean {go_quote(guess)}?)" if guess else ""
    return (
        f"unknown field {go_quote(name)}{hint}: the kubelet ignores it "
        "(strict decoding fails, it falls back to lenient decoding)"
    )


def check_feature_gates(ctx: Ctx) -> None:
    """``featureGate.SetFromMap``: gates that do not exist in this version, locked gates."""
    if "featureGates" in ctx.bad_fields:
        return
    raw = ctx.config.get("featureGates")
    if not isinstance(raw, Mapping):
        return
    for name, value in raw.items():
        name = str(name)
        if name in SPECIAL_GATES:
            continue
        gate = GATES.get(name)
        if gate is None:
            # Only the managers' gates are catalogued: flag a near-miss of one of those (a typo
            # the kubelet refuses with "unrecognized feature gate"), stay silent about the rest.
            close = difflib.get_close_matches(name, list(GATES), n=1, cutoff=0.85)
            if close:
                ctx.warn(
                    Stage.GATES,
                    f"featureGates.{name}",
                    f"unrecognized feature gate: {name} (did you mean {go_quote(close[0])}?)",
                )
            continue
        state = gate.at(ctx.version)
        if state is None:
            ctx.error(Stage.GATES, f"featureGates.{name}", f"unrecognized feature gate: {name}")
            continue
        default, locked = state
        if locked and value != default:
            v, d = str(value).lower(), str(default).lower()
            ctx.error(
                Stage.GATES,
                f"featureGates.{name}",
                f"cannot set feature gate {name} to {v}, feature is locked to {d}",
            )


#: ``failCgroupV1`` exists since 1.31 (KEP-4569) and defaults to true since 1.35 (#134298)
FAIL_CGROUP_V1_SINCE = (1, 31)
FAIL_CGROUP_V1_DEFAULT_TRUE = (1, 35)


def cgroup_version(ctx: Ctx) -> tuple[int | None, str]:
    """The node's cgroup version and how lint knows it (node facts win over the distribution)."""
    if ctx.facts is not None and ctx.facts.cgroup_version is not None:
        return ctx.facts.cgroup_version, "node facts cgroupVersion"
    dist = DISTRIBUTIONS.get(ctx.distribution or "")
    if dist is not None and dist.cgroup_version is not None:
        return dist.cgroup_version, f"distribution {dist.name}"
    return None, ""


def check_cgroup_v1(ctx: Ctx) -> None:
    """``validateKubeletOSConfiguration``: ``failCgroupV1`` on a cgroup v1 host."""
    if ctx.version < FAIL_CGROUP_V1_SINCE:
        return
    version, why = cgroup_version(ctx)
    if version != 1:
        return
    value = None if "failCgroupV1" in ctx.bad_fields else ctx.config.get("failCgroupV1")
    fail = value if isinstance(value, bool) else ctx.version >= FAIL_CGROUP_V1_DEFAULT_TRUE
    if not fail:
        return
    status = (
        "unsupported and will be removed in a future release"
        if ctx.version >= FAIL_CGROUP_V1_DEFAULT_TRUE
        else "in maintenance mode"
    )
    unset = "" if isinstance(value, bool) else " (failCgroupV1 defaults to true since 1.35)"
    extra = (
        "; EKS publishes no Amazon Linux 2 AMIs for 1.33 and later: move the node group to AL2023"
        if ctx.distribution == "eks-al2"
        else ""
    )
    ctx.error(
        Stage.VALIDATION,
        "failCgroupV1",
        "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is "
        f"{status} (cgroup v1 from {why}{unset}; set failCgroupV1: false to run on it{extra})",
    )


def check_validation(ctx: Ctx) -> None:
    """The CPU / memory / topology checks of ``ValidateKubeletConfiguration``, in its order."""
    v = Stage.VALIDATION
    policy = ctx.get("topologyManagerPolicy")
    if policy not in _TOPOLOGY_POLICIES:
        listed = "[" + " ".join(go_quote(p) for p in _TOPOLOGY_POLICIES) + "]"
        ctx.error(
            v,
            "topologyManagerPolicy",
            "invalid configuration: topologyManagerPolicy (--topology-manager-policy) "
            f"{go_quote(str(policy))} must be one of: {listed}",
        )
    scope = ctx.get("topologyManagerScope")
    if scope not in ("container", "pod"):
        ctx.error(
            v,
            "topologyManagerScope",
            "invalid configuration: topologyManagerScope (--topology-manager-scope) "
            f'{go_quote(str(scope))} must be one of: "container", or "pod"',
        )
    _check_enforce_node_allocatable(ctx)
    reserved = ctx.get("reservedSystemCPUs")
    if isinstance(reserved, str) and reserved:
        if ctx.get("systemReservedCgroup") or ctx.get("kubeReservedCgroup"):
            ctx.error(
                v,
                "reservedSystemCPUs",
                "invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with "
                "systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup "
                "(--kube-reserved-cgroup)",
            )
        why = cpuset_error(reserved)
        if why:
            ctx.error(
                v,
                "reservedSystemCPUs",
                "invalid configuration: unable to parse reservedSystemCPUs (--reserved-cpus) "
                f"{reserved}, error: {why}",
            )
    _check_reserved_memory(ctx)
    check_cgroup_v1(ctx)  # validateKubeletOSConfiguration, last in ValidateKubeletConfiguration


def cpuset_error(text: str) -> str | None:
    """The error of ``k8s.io/utils/cpuset.Parse`` for ``text``, or None when it parses."""
    try:
        cpuset.parse(text)
    except cpuset.CPUSetError as e:
        return str(e)
    return None


def _check_enforce_node_allocatable(ctx: Ctx) -> None:
    values = ctx.get("enforceNodeAllocatable")
    if not isinstance(values, list):
        return
    for val in values:
        if val in ("system-reserved", "system-reserved-compressible") and not ctx.get(
            "systemReservedCgroup"
        ):
            ctx.error(
                Stage.VALIDATION,
                "enforceNodeAllocatable",
                "invalid configuration: systemReservedCgroup (--system-reserved-cgroup) must be "
                'specified when "system-reserved" or "system-reserved-compressible" included in '
                "enforceNodeAllocatable (--enforce-node-allocatable)",
            )
        if val in ("kube-reserved", "kube-reserved-compressible") and not ctx.get(
            "kubeReservedCgroup"
        ):
            ctx.error(
                Stage.VALIDATION,
                "enforceNodeAllocatable",
                "invalid configuration: kubeReservedCgroup (--kube-reserved-cgroup) must be "
                'specified when "kube-reserved" or "kube-reserved-compressible" included in '
                "enforceNodeAllocatable (--enforce-node-allocatable)",
            )


def reserved_memory_entries(ctx: Ctx) -> list[tuple[int, int, Mapping[str, Any]]]:
    """``(index, numaNode, limits)`` for each well-formed ``reservedMemory`` entry."""
    raw = ctx.get("reservedMemory")
    out: list[tuple[int, int, Mapping[str, Any]]] = []
    if not isinstance(raw, list):
        return out
    for i, entry in enumerate(raw):
        if not isinstance(entry, Mapping):
            continue
        node = entry.get("numaNode", 0)
        limits = entry.get("limits") or {}
        if isinstance(node, int) and not isinstance(node, bool) and isinstance(limits, Mapping):
            out.append((i, node, limits))
    return out


def _check_reserved_memory(ctx: Ctx) -> None:
    seen: dict[int, set[str]] = {}
    for i, node, limits in reserved_memory_entries(ctx):
        f = f"reservedMemory[{i}]"
        for resource, value in limits.items():
            resource = str(resource)
            if resource != "memory" and not resource.startswith("hugepages-"):
                ctx.error(
                    Stage.VALIDATION,
                    f,
                    f"invalid configuration: the limit type {go_quote(resource)} for NUMA node "
                    f"{node} is not supported, only [memory hugepages-<HugePageSize>] is accepted",
                )
            try:
                q = quantity.parse(value)
            except quantity.QuantityError as e:
                ctx.error(Stage.DECODE, f"{f}.limits.{resource}", str(e))
                continue
            if q.value == 0:
                ctx.error(
                    Stage.VALIDATION,
                    f,
                    f"invalid configuration: reserved memory may not be zero for NUMA node {node} "
                    f"and resource {go_quote(resource)}",
                )
            if resource in seen.setdefault(node, set()):
                ctx.error(
                    Stage.VALIDATION,
                    f,
                    "invalid configuration: the reserved memory has a duplicate value for NUMA "
                    f"node {node} and resource {go_quote(resource)}",
                )
            seen[node].add(resource)
