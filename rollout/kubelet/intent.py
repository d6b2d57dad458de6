"""The intent: the KubeletConfiguration fragment we own on a node, with the project's defaults.

Defaults are the change this tool exists for (static CPU manager, pod-scope single-numa-node
topology
manager). A static CPU policy without a CPU reservation makes the kubelet exit at start
("[cpumanager] unable to determine reserved CPU resources for static policy"), so the intent
refuses it
up front. ``restricted`` is allowed as a first step ("validate with restricted first, then
tighten").
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.errors import InputError, Location, suggest

DEFAULT_INTENT: dict[str, Any] = {
    "cpuManagerPolicy": "static",
    "topologyManagerPolicy": "single-numa-node",
    "topologyManagerScope": "pod",
}

# KubeletConfiguration (kubelet.config.k8s.io/v1beta1) top-level fields, for "did you mean".
_FIELD_NAMES = """apiVersion kind enableServer staticPodPath podLogsDir syncFrequency
    fileCheckFrequency
    httpCheckFrequency staticPodURL staticPodURLHeader address port readOnlyPort tlsCertFile
    tlsPrivateKeyFile tlsCipherSuites tlsMinVersion rotateCertificates serverTLSBootstrap
    authentication authorization registryPullQPS registryBurst
    imagePullCredentialsVerificationPolicy
    preloadedImagesVerificationAllowlist eventRecordQPS eventBurst enableDebuggingHandlers
    enableContentionProfiling healthzPort healthzBindAddress oomScoreAdj clusterDomain clusterDNS
    streamingConnectionIdleTimeout nodeStatusUpdateFrequency nodeStatusReportFrequency
    nodeLeaseDurationSeconds imageMinimumGCAge imageMaximumGCAge imageGCHighThresholdPercent
    imageGCLowThresholdPercent volumeStatsAggPeriod kubeletCgroups systemCgroups cgroupRoot
    cgroupsPerQOS cgroupDriver cpuManagerPolicy singleProcessOOMKill cpuManagerPolicyOptions
    cpuManagerReconcilePeriod memoryManagerPolicy topologyManagerPolicy topologyManagerScope
    topologyManagerPolicyOptions qosReserved runtimeRequestTimeout hairpinMode maxPods podCIDR
    podPidsLimit resolvConf runOnce cpuCFSQuota cpuCFSQuotaPeriod nodeStatusMaxImages
    maxOpenFiles contentType kubeAPIQPS kubeAPIBurst serializeImagePulls maxParallelImagePulls
    evictionHard evictionSoft evictionSoftGracePeriod evictionPressureTransitionPeriod
    evictionMaxPodGracePeriod evictionMinimumReclaim mergeDefaultEvictionSettings
    podsPerCore enableControllerAttachDetach protectKernelDefaults makeIPTablesUtilChains
    iptablesMasqueradeBit iptablesDropBit featureGates failSwapOn failCgroupV1 memorySwap
    containerLogMaxSize containerLogMaxFiles containerLogMaxWorkers containerLogMonitorInterval
    configMapAndSecretChangeDetectionStrategy systemReserved kubeReserved reservedSystemCPUs
    showHiddenMetricsForVersion systemReservedCgroup kubeReservedCgroup enforceNodeAllocatable
    allowedUnsafeSysctls volumePluginDir providerID kernelMemcgNotification logging
    enableSystemLogHandler enableSystemLogQuery shutdownGracePeriod
    shutdownGracePeriodCriticalPods shutdownGracePeriodByPodPriority crashLoopBackOff
    reservedMemory enableProfilingHandler enableDebugFlagsHandler seccompDefault
    memoryThrottlingFactor registerWithTaints registerNode tracing localStorageCapacityIsolation
    containerRuntimeEndpoint imageServiceEndpoint failSwapOn userNamespaces"""
KNOWN_FIELDS = frozenset(_FIELD_NAMES.split())

_CPU_POLICIES = ("none", "static")
_TOPOLOGY_POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
_SCOPES = ("container", "pod")
_MEMORY_POLICIES = ("None", "Static")


@dataclass(frozen=True)
class Intent:
    """The fields we set on a node (top-level KubeletConfiguration fields) and what we warned about.

    Attributes:
        fields: the fragment, with defaults filled in.
        source: where each field came from (``default``, ``plan``, ``flag``, ``--set``), for
        messages.
        warnings: unknown fields (with a suggestion) and similar non-fatal remarks.
    """

    fields: Mapping[str, Any]
    source: Mapping[str, str] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    plan_file: str | None = None
    plan_lines: Mapping[str, int] = field(default_factory=dict)

    def location(self, name: str) -> Location:
        if self.source.get(name) == "plan" and self.plan_file:
            return Location(
                file=self.plan_file,
                field=f"kubelet.{name}",
                line=self.plan_lines.get(f"kubelet.{name}"),
            )
        return Location(field=name)


def _has_cpu_reservation(fields: Mapping[str, Any]) -> bool:
    rsc = fields.get("reservedSystemCPUs")
    if isinstance(rsc, str) and rsc.strip():
        return True
    for section in ("kubeReserved", "systemReserved"):
        v = fields.get(section)
        if isinstance(v, Mapping) and str(v.get("cpu", "")).strip() not in ("", "0", "0m"):
            return True
    return False


def build_intent(
    plan_fragment: Mapping[str, Any] | None = None,
    *,
    flags: Mapping[str, Any] | None = None,
    sets: Iterable[tuple[str, Any]] = (),
    plan_file: str | None = None,
    plan_lines: Mapping[str, int] | None = None,
    existing_reservation: bool = False,
) -> Intent:
    """Combine defaults, the plan's fragment, kubelet-style CLI flags and ``--set`` (later wins).

    Args:
        plan_fragment: the plan's ``kubelet`` section (already per-node).
        flags: field -> value from ``--cpu-manager-policy`` and friends (None values ignored).
        sets: ``(dotted field, value)`` pairs from ``--set``; ``a.b`` sets key ``b`` of map ``a``.
        existing_reservation: the node already reserves CPU (e.g. kubespray's kubeReserved.cpu), so
        a
            static policy without a reservation in the intent is still startable.

    Raises:
        InputError: a value of the wrong type or case, or static CPU policy without a reservation.
    """
    fields: dict[str, Any] = dict(DEFAULT_INTENT)
    source = dict.fromkeys(DEFAULT_INTENT, "default")
    warnings: list[str] = []
    lines = dict(plan_lines or {})

    def loc(name: str) -> Location:
        if source.get(name) == "plan" and plan_file:
            return Location(
                file=plan_file, field=f"kubelet.{name}", line=lines.get(f"kubelet.{name}")
            )
        return Location(field=name)

    for k, v in (plan_fragment or {}).items():
        fields[str(k)] = v
        source[str(k)] = "plan"
    for k, v in (flags or {}).items():
        if v is not None:
            fields[k] = v
            source[k] = "flag"
    for dotted, v in sets:
        head, _, rest = dotted.partition(".")
        if rest:
            cur = fields.get(head)
            fields[head] = {**(cur if isinstance(cur, Mapping) else {}), rest: v}
        else:
            fields[head] = v
        source[head] = "--set"

    for k in fields:
        if k not in KNOWN_FIELDS:
            where = loc(k).describe()
            warnings.append(
                f"{where}: unknown KubeletConfiguration field{suggest(k, sorted(KNOWN_FIELDS))}; "
                "the kubelet ignores unknown fields"
            )
    for name in ("apiVersion", "kind"):
        if name in fields:
            raise InputError("set by rollout; remove it from the fragment", loc(name))

    for name, choices in (
        ("cpuManagerPolicy", _CPU_POLICIES),
        ("topologyManagerPolicy", _TOPOLOGY_POLICIES),
        ("topologyManagerScope", _SCOPES),
        ("memoryManagerPolicy", _MEMORY_POLICIES),
    ):
        if name in fields and fields[name] not in choices:
            v = fields[name]
            hint = ""
            matches = [c for c in choices if isinstance(v, str) and c.lower() == v.lower()]
            if matches:
                hint = f' (values are case-sensitive: "{matches[0]}")'
            raise InputError(
                f"{v!r} must be one of: {', '.join(repr(c) for c in choices)}{hint}", loc(name)
            )
    for name in (
        "reservedSystemCPUs",
        "kubeReservedCgroup",
        "systemReservedCgroup",
    ):
        if name in fields and not isinstance(fields[name], str):
            raise InputError(f"must be a string, got {fields[name]!r}", loc(name))
    for name in (
        "kubeReserved",
        "systemReserved",
        "featureGates",
        "cpuManagerPolicyOptions",
        "topologyManagerPolicyOptions",
        "evictionHard",
    ):
        if name in fields and not isinstance(fields[name], Mapping):
            raise InputError(f"must be a mapping, got {fields[name]!r}", loc(name))
    if "reservedMemory" in fields and not isinstance(fields["reservedMemory"], list):
        raise InputError("must be a list of {numaNode, limits}", loc("reservedMemory"))
    if "reservedSystemCPUs" in fields:
        from rollout.kubelet import cpuset

        try:
            cpuset.parse(fields["reservedSystemCPUs"])
        except cpuset.CPUSetError as e:
            raise InputError(
                "invalid configuration: unable to parse reservedSystemCPUs (--reserved-cpus) "
                f"{fields['reservedSystemCPUs']}, error: {e}",
                loc("reservedSystemCPUs"),
            ) from e
    if (
        fields.get("cpuManagerPolicy") == "static"
        and not _has_cpu_reservation(fields)
        and not existing_reservation
    ):
        raise InputError(
            "the static CPU manager policy needs a CPU reservation: set reservedSystemCPUs "
            "(--reserved-cpus) or kubeReserved/systemReserved cpu; the kubelet would exit with "
            '"[cpumanager] unable to determine reserved CPU resources for static policy"',
            loc("reservedSystemCPUs") if plan_file else Location(field="reservedSystemCPUs"),
        )
    return Intent(
        fields=dict(fields),
        source=source,
        warnings=tuple(warnings),
        plan_file=plan_file,
        plan_lines=lines,
    )
