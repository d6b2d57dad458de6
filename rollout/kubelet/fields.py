"""The fields of KubeletConfiguration v1beta1 and their Go types.

Written from ``staging/src/k8s.io/kubelet/config/v1beta1/types.go``. Lint uses it for two kubelet
behaviours: a value of the wrong JSON type makes the kubelet refuse the file
(``json: cannot unmarshal ... into Go struct field KubeletConfiguration.X of type T``), while an
unknown field only costs a warning (the kubelet falls back to lenient decoding), which is how a
typo such as ``cpuManagerPolicyy`` silently leaves the CPU manager at ``none``.
"""

from __future__ import annotations

_STR = "string"
_BOOL = "bool"
_I32 = "int32"
_I64 = "int64"
_F64 = "float64"
_DUR = "v1.Duration"
_MSS = "map[string]string"
_MSB = "map[string]bool"
_LS = "[]string"
_OBJ = "struct"

#: JSON name -> Go type (as the decoder names it in its error). Durations decode from strings.
FIELDS: dict[str, str] = {
    "apiVersion": _STR,
    "kind": _STR,
    "enableServer": _BOOL,
    "staticPodPath": _STR,
    "podLogsDir": _STR,
    "syncFrequency": _DUR,
    "fileCheckFrequency": _DUR,
    "httpCheckFrequency": _DUR,
    "staticPodURL": _STR,
    "staticPodURLHeader": "map[string][]string",
    "address": _STR,
    "port": _I32,
    "readOnlyPort": _I32,
    "tlsCertFile": _STR,
    "tlsPrivateKeyFile": _STR,
    "tlsCipherSuites": _LS,
    "tlsMinVersion": _STR,
    "rotateCertificates": _BOOL,
    "serverTLSBootstrap": _BOOL,
    "authentication": _OBJ,
    "authorization": _OBJ,
    "registryPullQPS": _I32,
    "registryBurst": _I32,
    "imagePullCredentialsVerificationPolicy": _STR,
    "preloadedImagesVerificationAllowlist": _LS,
    "eventRecordQPS": _I32,
    "eventBurst": _I32,
    "enableDebuggingHandlers": _BOOL,
    "enableContentionProfiling": _BOOL,
    "healthzPort": _I32,
    "healthzBindAddress": _STR,
    "oomScoreAdj": _I32,
    "clusterDomain": _STR,
    "clusterDNS": _LS,
    "streamingConnectionIdleTimeout": _DUR,
    "nodeStatusUpdateFrequency": _DUR,
    "nodeStatusReportFrequency": _DUR,
    "nodeLeaseDurationSeconds": _I32,
    "imageMinimumGCAge": _DUR,
    "imageMaximumGCAge": _DUR,
    "imageGCHighThresholdPercent": _I32,
    "imageGCLowThresholdPercent": _I32,
    "volumeStatsAggPeriod": _DUR,
    "kubeletCgroups": _STR,
    "systemCgroups": _STR,
    "cgroupRoot": _STR,
    "cgroupsPerQOS": _BOOL,
    "cgroupDriver": _STR,
    "cpuManagerPolicy": _STR,
    "singleProcessOOMKill": _BOOL,
    "cpuManagerPolicyOptions": _MSS,
    "cpuManagerReconcilePeriod": _DUR,
    "memoryManagerPolicy": _STR,
    "topologyManagerPolicy": _STR,
    "topologyManagerScope": _STR,
    "topologyManagerPolicyOptions": _MSS,
    "qosReserved": _MSS,
    "runtimeRequestTimeout": _DUR,
    "hairpinMode": _STR,
    "maxPods": _I32,
    "podCIDR": _STR,
    "podPidsLimit": _I64,
    "resolvConf": _STR,
    "runOnce": _BOOL,
    "cpuCFSQuota": _BOOL,
    "cpuCFSQuotaPeriod": _DUR,
    "nodeStatusMaxImages": _I32,
    "maxOpenFiles": _I64,
    "contentType": _STR,
    "kubeAPIQPS": _I32,
    "kubeAPIBurst": _I32,
    "serializeImagePulls": _BOOL,
    "maxParallelImagePulls": _I32,
    "evictionHard": _MSS,
    "evictionSoft": _MSS,
    "evictionSoftGracePeriod": _MSS,
    "evictionPressureTransitionPeriod": _DUR,
    "evictionMaxPodGracePeriod": _I32,
    "evictionMinimumReclaim": _MSS,
    "mergeDefaultEvictionSettings": _BOOL,
    "podsPerCore": _I32,
    "enableControllerAttachDetach": _BOOL,
    "protectKernelDefaults": _BOOL,
    "makeIPTablesUtilChains": _BOOL,
    "iptablesMasqueradeBit": _I32,
    "iptablesDropBit": _I32,
    "featureGates": _MSB,
    "failSwapOn": _BOOL,
    "memorySwap": _OBJ,
    "containerLogMaxSize": _STR,
    "containerLogMaxFiles": _I32,
    "containerLogMaxWorkers": _I32,
    "containerLogMonitorInterval": _DUR,
    "configMapAndSecretChangeDetectionStrategy": _STR,
    "systemReserved": _MSS,
    "kubeReserved": _MSS,
    "reservedSystemCPUs": _STR,
    "showHiddenMetricsForVersion": _STR,
    "systemReservedCgroup": _STR,
    "kubeReservedCgroup": _STR,
    "enforceNodeAllocatable": _LS,
    "allowedUnsafeSysctls": _LS,
    "volumePluginDir": _STR,
    "providerID": _STR,
    "kernelMemcgNotification": _BOOL,
    "logging": _OBJ,
    "enableSystemLogHandler": _BOOL,
    "enableSystemLogQuery": _BOOL,
    "shutdownGracePeriod": _DUR,
    "shutdownGracePeriodCriticalPods": _DUR,
    "shutdownGracePeriodByPodPriority": "[]v1beta1.ShutdownGracePeriodByPodPriority",
    "crashLoopBackOff": _OBJ,
    "reservedMemory": "[]v1beta1.MemoryReservation",
    "enableProfilingHandler": _BOOL,
    "enableDebugFlagsHandler": _BOOL,
    "seccompDefault": _BOOL,
    "memoryThrottlingFactor": _F64,
    "registerWithTaints": "[]v1.Taint",
    "registerNode": _BOOL,
    "tracing": _OBJ,
    "localStorageCapacityIsolation": _BOOL,
    "containerRuntimeEndpoint": _STR,
    "imageServiceEndpoint": _STR,
    "failCgroupV1": _BOOL,
    "userNamespaces": _OBJ,
    "memoryReservationPolicy": _STR,
}


def json_kind(value: object) -> str:
    """The JSON type name the Go decoder uses in its error ("number", "string", ...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, dict) or hasattr(value, "keys"):
        return "object"
    return "array"


def accepts(go_type: str, value: object) -> bool:
    """Whether a JSON value of this shape decodes into ``go_type`` (null always does)."""
    kind = json_kind(value)
    if kind == "null":
        return True
    if go_type in (_STR, _DUR):
        return kind == "string"
    if go_type == _BOOL:
        return kind == "bool"
    if go_type in (_I32, _I64):
        return kind == "number" and float(value).is_integer()  # type: ignore[arg-type]
    if go_type == _F64:
        return kind == "number"
    if go_type.startswith("map[") or go_type == _OBJ:
        return kind == "object"
    if go_type.startswith("[]"):
        return kind == "array"
    return True
