"""The kubelet admission metrics, in Prometheus text format, with the kubelet's names and labels.

``rollout watch`` reads ``kubelet_topology_manager_admission_{requests,errors}_total`` and
``kubelet_admission_rejections_total{reason}`` through the API server's node proxy, so the lab
kubelet exposes exactly those series (all ALPHA in the kubelet's metrics reference), plus the
``kubelet_topology_manager_admission_duration_ms`` histogram with the kubelet's buckets.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

# kubelet metrics.go: TopologyManagerAdmissionDuration uses ExponentialBuckets(.05, 2, 15).
DURATION_BUCKETS = tuple(0.05 * 2**i for i in range(15))
# kubelet_admission_rejections_total reports these reasons as themselves, anything else as "Other".
KNOWN_REASONS = frozenset(
    {
        "TopologyAffinityError",
        "UnexpectedAdmissionError",
        "OutOfcpu",
        "OutOfmemory",
        "OutOfephemeral-storage",
        "OutOfpods",
        "OutOfExtendedResources",
        "NodeShutdown",
        "Evicted",
        "SysctlForbidden",
        "AppArmor",
        "NodeAffinity",
        "InitContainerRestartPolicyForbidden",
    }
)


@dataclass
class Metrics:
    requests: int = 0
    errors: int = 0
    rejections: dict[str, int] = field(default_factory=dict)
    durations: list[float] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def admission(self, duration_ms: float, rejected_reason: str | None) -> None:
        """Count one Topology Manager admission (and its rejection, if any: topology affinity or
        a failed allocation, both counted in ``..._admission_errors_total`` as the kubelet does)."""
        with self._lock:
            self.requests += 1
            self.durations.append(duration_ms)
            if rejected_reason:
                # the scopes count both unalignable hints and failed allocations as errors
                self.errors += 1
                label = rejected_reason
                if label.startswith("OutOf") and label not in KNOWN_REASONS:
                    label = "OutOfExtendedResources"
                elif label not in KNOWN_REASONS:
                    label = "Other"
                self.rejections[label] = self.rejections.get(label, 0) + 1

    def render(self) -> str:
        with self._lock:
            lines = [
                "# HELP kubelet_topology_manager_admission_requests_total "
                "[ALPHA] Number of admission requests where resources have to be aligned.",
                "# TYPE kubelet_topology_manager_admission_requests_total counter",
                f"kubelet_topology_manager_admission_requests_total {self.requests}",
                "# HELP kubelet_topology_manager_admission_errors_total "
                "[ALPHA] Number of admission request failures where resources could not be "
                "aligned.",
                "# TYPE kubelet_topology_manager_admission_errors_total counter",
                f"kubelet_topology_manager_admission_errors_total {self.errors}",
                "# HELP kubelet_topology_manager_admission_duration_ms "
                "[ALPHA] Duration in milliseconds to serve a pod admission request.",
                "# TYPE kubelet_topology_manager_admission_duration_ms histogram",
            ]
            for b in DURATION_BUCKETS:
                n = sum(1 for d in self.durations if d <= b)
                lines.append(
                    f'kubelet_topology_manager_admission_duration_ms_bucket{{le="{b:g}"}} {n}'
                )
            lines += [
                f'kubelet_topology_manager_admission_duration_ms_bucket{{le="+Inf"}} '
                f"{len(self.durations)}",
                f"kubelet_topology_manager_admission_duration_ms_sum {sum(self.durations):g}",
                f"kubelet_topology_manager_admission_duration_ms_count {len(self.durations)}",
                "# HELP kubelet_admission_rejections_total "
                "[ALPHA] Cumulative number pod admission rejections by the Kubelet.",
                "# TYPE kubelet_admission_rejections_total counter",
            ]
            for reason, n in sorted(self.rejections.items()):
                lines.append(f'kubelet_admission_rejections_total{{reason="{reason}"}} {n}')
            return "\n".join(lines) + "\n"
