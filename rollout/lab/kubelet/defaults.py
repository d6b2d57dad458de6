"""What the real kubelet's ``/configz`` shows for fields the files leave out: its defaulting.

The real kubelet serves its configuration after ``SetDefaults_KubeletConfiguration``
(``pkg/kubelet/apis/config/v1beta1/defaults.go`` of the lab's version, v1.36), converted back to
v1beta1 with its ``apiVersion`` and ``kind``. A field that is absent, or holds its Go zero value
where the Go type is not a pointer (kubeadm writes ``0s`` for every duration it does not set), gets
its default; a pointer field keeps an explicit ``false`` or ``0``. :func:`defaulted` does the same
to the sim's merged files, for ``/configz`` only: the sim's own behaviour still reads the merged
files (:mod:`rollout.kubelet.loading` has the defaults the managers use).

Checked against the real kubelet by ``tests/lab/test_sim_vs_real.py``; the differences that remain
are listed there and in ``docs/lab-real-kubelet.md``.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Mapping
from typing import Any

API_VERSION = "kubelet.config.k8s.io/v1beta1"

# (field, default, how "unset" is judged): "ptr" absent only (a Go pointer: explicit false/0 stay);
# "zero" absent or the Go zero value ("" / 0 / a zero duration).
_TOP: tuple[tuple[str, Any, str], ...] = (
    ("enableServer", True, "ptr"),
    ("syncFrequency", "1m0s", "zero"),
    ("fileCheckFrequency", "20s", "zero"),
    ("httpCheckFrequency", "20s", "zero"),
    ("address", "0.0.0.0", "zero"),
    ("port", 10250, "zero"),
    ("registryPullQPS", 5, "ptr"),
    ("registryBurst", 10, "zero"),
    ("eventRecordQPS", 50, "ptr"),
    ("eventBurst", 100, "zero"),
    ("enableDebuggingHandlers", True, "ptr"),
    ("healthzPort", 10248, "ptr"),
    ("healthzBindAddress", "127.0.0.1", "zero"),
    ("oomScoreAdj", -999, "ptr"),
    ("streamingConnectionIdleTimeout", "4h0m0s", "zero"),
    ("nodeLeaseDurationSeconds", 40, "zero"),
    ("imageMinimumGCAge", "2m0s", "zero"),
    ("imageGCHighThresholdPercent", 85, "ptr"),
    ("imageGCLowThresholdPercent", 80, "ptr"),
    ("volumeStatsAggPeriod", "1m0s", "zero"),
    ("cgroupsPerQOS", True, "ptr"),
    ("cgroupDriver", "cgroupfs", "zero"),
    ("cpuManagerPolicy", "none", "zero"),
    ("cpuManagerReconcilePeriod", "10s", "zero"),
    ("memoryManagerPolicy", "None", "zero"),
    ("topologyManagerPolicy", "none", "zero"),
    ("topologyManagerScope", "container", "zero"),
    ("runtimeRequestTimeout", "2m0s", "zero"),
    ("hairpinMode", "promiscuous-bridge", "zero"),
    ("maxPods", 110, "zero"),
    ("resolvConf", "/etc/resolv.conf", "ptr"),
    ("cpuCFSQuota", True, "ptr"),
    ("cpuCFSQuotaPeriod", "100ms", "ptr"),
    ("nodeStatusMaxImages", 50, "ptr"),
    ("maxOpenFiles", 1000000, "zero"),
    ("contentType", "application/vnd.kubernetes.protobuf", "zero"),
    ("kubeAPIQPS", 50, "ptr"),
    ("kubeAPIBurst", 100, "zero"),
    ("evictionPressureTransitionPeriod", "5m0s", "zero"),
    ("mergeDefaultEvictionSettings", False, "ptr"),
    ("enableControllerAttachDetach", True, "ptr"),
    ("makeIPTablesUtilChains", True, "ptr"),
    ("iptablesMasqueradeBit", 14, "ptr"),
    ("iptablesDropBit", 15, "ptr"),
    ("failSwapOn", True, "ptr"),
    ("containerLogMaxSize", "10Mi", "zero"),
    ("containerLogMaxFiles", 5, "ptr"),
    ("containerLogMaxWorkers", 1, "ptr"),
    ("containerLogMonitorInterval", "10s", "ptr"),
    ("configMapAndSecretChangeDetectionStrategy", "Watch", "zero"),
    ("enforceNodeAllocatable", ["pods"], "ptr"),
    ("volumePluginDir", "/usr/libexec/kubernetes/kubelet-plugins/volume/exec/", "zero"),
    ("enableSystemLogHandler", True, "ptr"),
    # not defaulted in v1beta1, but the internal bool comes back as an explicit false
    ("enableSystemLogQuery", False, "ptr"),
    ("enableProfilingHandler", True, "ptr"),
    ("enableDebugFlagsHandler", True, "ptr"),
    ("seccompDefault", False, "ptr"),
    ("failCgroupV1", True, "ptr"),
    ("memoryThrottlingFactor", 0.9, "ptr"),
    ("memoryReservationPolicy", "None", "zero"),
    ("registerNode", True, "ptr"),
    ("localStorageCapacityIsolation", True, "ptr"),
    ("containerRuntimeEndpoint", "unix:///run/containerd/containerd.sock", "zero"),
    ("podLogsDir", "/var/log/pods", "zero"),
)
# the kubelet's DefaultEvictionHard (pkg/kubelet/eviction/defaults_linux.go) when no threshold
# is set at all
EVICTION_HARD = {
    "memory.available": "100Mi",
    "nodefs.available": "10%",
    "nodefs.inodesFree": "5%",
    "imagefs.available": "15%",
    "imagefs.inodesFree": "5%",
}
# feature gates whose defaulting the v1.36 kubelet does (both on by default in v1.36)
_GATED = (
    ("KubeletCrashLoopBackOffMax", ("crashLoopBackOff", "maxContainerRestartPeriod"), "5m0s"),
    (
        "KubeletEnsureSecretPulledImages",
        ("imagePullCredentialsVerificationPolicy",),
        "NeverVerifyPreloadedImages",
    ),
)

_UNIT = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}


def _seconds(value: Any) -> float | None:
    """A Go duration string (``1m30s``, ``0s``) or a number of nanoseconds, in seconds."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int | float):
        return value / 1e9
    text = str(value).strip()
    if text in ("", "0"):
        return 0.0
    parts = re.findall(r"(\d+(?:\.\d+)?)(ns|us|µs|ms|s|m|h)", text)
    if not parts or "".join(a + b for a, b in parts) != text.lstrip("+"):
        return None
    return sum(float(n) * _UNIT[u] for n, u in parts)


def _unset(cfg: Mapping[str, Any], key: str, how: str) -> bool:
    if key not in cfg or cfg[key] is None:
        return True
    if how == "ptr":
        return False
    v = cfg[key]
    if isinstance(v, str) and re.search(r"\d(ns|us|µs|ms|s|m|h)$", v):
        return _seconds(v) == 0
    return v in ("", 0) and not isinstance(v, bool)


def _gate_on(cfg: Mapping[str, Any], gate: str) -> bool:
    gates = cfg.get("featureGates") or {}
    return bool(gates.get(gate, True)) if isinstance(gates, Mapping) else True


def defaulted(config: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` (the merged files) as the real kubelet's ``/configz`` shows it."""
    out = copy.deepcopy(dict(config))
    out["apiVersion"], out["kind"] = API_VERSION, "KubeletConfiguration"
    # nodeStatusReportFrequency follows an explicitly set nodeStatusUpdateFrequency
    if _unset(out, "nodeStatusReportFrequency", "zero"):
        update = out.get("nodeStatusUpdateFrequency")
        set_update = not _unset(out, "nodeStatusUpdateFrequency", "zero")
        out["nodeStatusReportFrequency"] = update if set_update else "5m0s"
    if _unset(out, "nodeStatusUpdateFrequency", "zero"):
        out["nodeStatusUpdateFrequency"] = "10s"
    for key, default, how in _TOP:
        if _unset(out, key, how):
            out[key] = copy.deepcopy(default)
    if out.get("podPidsLimit") is None or int(out["podPidsLimit"]) < 0:
        out["podPidsLimit"] = -1
    if out.get("serializeImagePulls") is None:
        parallel = out.get("maxParallelImagePulls")
        out["serializeImagePulls"] = parallel is None or int(parallel) < 2
    if not out.get("evictionHard"):
        out["evictionHard"] = dict(EVICTION_HARD)
    authn = out.setdefault("authentication", {})
    authn.setdefault("anonymous", {}).setdefault("enabled", False)
    hook = authn.setdefault("webhook", {})
    hook.setdefault("enabled", True)
    if _unset(hook, "cacheTTL", "zero"):
        hook["cacheTTL"] = "2m0s"
    authz = out.setdefault("authorization", {})
    if not authz.get("mode"):
        authz["mode"] = "Webhook"
    ahook = authz.setdefault("webhook", {})
    if _unset(ahook, "cacheAuthorizedTTL", "zero"):
        ahook["cacheAuthorizedTTL"] = "5m0s"
    if _unset(ahook, "cacheUnauthorizedTTL", "zero"):
        ahook["cacheUnauthorizedTTL"] = "30s"
    logging = out.setdefault("logging", {})
    if not logging.get("format"):
        logging["format"] = "text"
    if _unset(logging, "flushFrequency", "zero"):
        logging["flushFrequency"] = "5s"
    logging.setdefault("verbosity", 0)
    opts = logging.setdefault("options", {})
    for fmt in ("text", "json"):
        opts.setdefault(fmt, {}).setdefault("infoBufferSize", "0")
    for gate, path, default in _GATED:
        if _gate_on(out, gate):
            node = out
            for part in path[:-1]:
                node = node.setdefault(part, {})
            if not node.get(path[-1]):
                node[path[-1]] = default
    return out
