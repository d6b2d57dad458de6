"""Samples the gate collects, and the pure counting over a sliding window.

Why a module of its own: the watchers (``rollout.kube.watching``), the kubelet scraper
(``rollout.kube.scraping``) and Prometheus (``rollout.gate.prometheus``) all produce the same few
plain
records, and the verdict (``rollout.gate.analysis``) only ever sees those records. Counting is pure
and
the clock is a parameter, so a storm of rejected pods, a relist after ``410 Gone`` or a kubelet
restart can be replayed in a unit test or a benchmark without a cluster.

Two rules live here because they decide what a number *means*:

* **One owner, one rejection per window.** The kubelet rejects a pod for good (``phase: Failed``)
  and its ReplicaSet creates a new one, which is rejected the same way. Fifty such pods are one
  workload that does not fit, not fifty. Within the window, all rejected pods of one owner on one
  node count as one admission attempt and one rejection; admitted pods count one each.
* **Counters are deltas.** A kubelet counter that goes down was reset by a restart; the new value
  is the increase since the restart.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

#: Pod status / Event reasons with which the kubelet rejects a pod at admission
#: (``pkg/kubelet/cm/topologymanager``, ``pkg/kubelet/cm/admission/errors.go``,
#: ``pkg/kubelet/cm/cpumanager/policy_static.go``, ``pkg/kubelet/lifecycle/predicate.go``).
ADMISSION_REASONS = frozenset(
    {
        "TopologyAffinityError",
        "UnexpectedAdmissionError",
        "SMTAlignmentError",
        "UnexpectedPredicateFailureType",
    }
)


def is_admission_reason(reason: str | None) -> bool:
    """Whether a pod/Event reason is a kubelet admission rejection (``OutOf<resource>`` too)."""
    return bool(reason) and (reason in ADMISSION_REASONS or str(reason).startswith("OutOf"))


@dataclass(frozen=True)
class AdmissionSample:
    """One pod's admission outcome on one node, as seen through the API.

    Attributes:
        node: the node the pod was bound to.
        pod_uid: the pod's UID (the dedup key across watch restarts and relists).
        time: when it was observed (seconds, same clock as the verdict's ``now``).
        rejected_reason: the kubelet's reason (``TopologyAffinityError`` ...) or None if admitted.
        owner: ``Kind/namespace/name`` of the controlling owner, or None for a bare pod.
        message: the kubelet's message, for the human reason.
    """

    node: str
    pod_uid: str
    time: float
    rejected_reason: str | None = None
    owner: str | None = None
    message: str = ""

    @property
    def rejected(self) -> bool:
        return self.rejected_reason is not None


@dataclass(frozen=True)
class NodeCounts:
    """Admission attempts and rejections (by reason) on one node, or a group, in one window."""

    admissions: int = 0
    rejections: Mapping[str, int] = field(default_factory=dict)
    owners: tuple[str, ...] = ()

    @property
    def rejected(self) -> int:
        return sum(self.rejections.values())

    @property
    def rate(self) -> float:
        return self.rejected / self.admissions if self.admissions else 0.0

    def __add__(self, other: NodeCounts) -> NodeCounts:
        reasons = dict(self.rejections)
        for r, n in other.rejections.items():
            reasons[r] = reasons.get(r, 0) + n
        return NodeCounts(
            self.admissions + other.admissions,
            reasons,
            tuple(sorted(set(self.owners) | set(other.owners))),
        )


def count_window(
    samples: Iterable[AdmissionSample], nodes: Iterable[str], now: float, window: float
) -> dict[str, NodeCounts]:
    """Count admissions and rejections per node over ``(now - window, now]``.

    Rejected pods of one owner on one node count once (one attempt, one rejection, the first reason
    seen); pods without an owner count by UID. A pod seen twice (watch resumed, relist) counts once.

    Args:
        samples: admission outcomes, in any order.
        nodes: the nodes to report; every one gets an entry, even with no samples.
        now: the evaluation time.
        window: the window length in seconds.

    Returns:
        The counts for every node in ``nodes``.
    """
    wanted = set(nodes)
    start = now - window
    admitted: dict[str, set[str]] = {n: set() for n in wanted}
    rejected: dict[str, dict[str, tuple[float, str]]] = {n: {} for n in wanted}
    for s in samples:
        if s.node not in wanted or not (start < s.time <= now):
            continue
        if s.rejected_reason is None:
            admitted[s.node].add(s.pod_uid)
            continue
        key = s.owner or f"pod/{s.pod_uid}"
        seen = rejected[s.node].get(key)
        if seen is None or s.time < seen[0]:
            rejected[s.node][key] = (s.time, s.rejected_reason)
    out: dict[str, NodeCounts] = {}
    for n in sorted(wanted):
        reasons: dict[str, int] = {}
        for _, reason in rejected[n].values():
            reasons[reason] = reasons.get(reason, 0) + 1
        out[n] = NodeCounts(
            admissions=len(admitted[n]) + len(rejected[n]),
            rejections=reasons,
            owners=tuple(sorted(k for k in rejected[n] if not k.startswith("pod/"))),
        )
    return out


def group_counts(per_node: Mapping[str, NodeCounts]) -> NodeCounts:
    """Sum per-node counts into the group's counts."""
    total = NodeCounts()
    for c in per_node.values():
        total = total + c
    return total


@dataclass(frozen=True)
class CounterReading:
    """One scrape of a node's kubelet admission counters (absolute values, as exported)."""

    node: str
    time: float
    requests: float
    errors: float
    rejections: Mapping[str, float] = field(default_factory=dict)


def counter_delta(previous: float | None, current: float) -> float:
    """The increase of a monotonic counter; a value below the previous one means a reset.

    After a kubelet restart the counter starts again from zero, so the increase since the previous
    scrape is at least ``current`` (what happened between the previous scrape and the restart is
    lost, exactly as Prometheus' ``increase()`` loses it).
    """
    if previous is None:
        return 0.0
    return current - previous if current >= previous else current


def reading_delta(previous: CounterReading | None, current: CounterReading) -> NodeCounts:
    """The admissions (topology manager requests) and rejections between two scrapes of one node.

    Admissions are the larger of the topology manager's request delta and the total rejections (pods
    rejected by resource predicates never reach the topology manager).
    """
    if previous is None:
        return NodeCounts()
    reasons: dict[str, int] = {}
    for reason, value in current.rejections.items():
        d = int(counter_delta(previous.rejections.get(reason, 0.0), value))
        if d:
            reasons[reason] = d
    topo_errors = int(counter_delta(previous.errors, current.errors))
    if topo_errors and "TopologyAffinityError" not in reasons and not current.rejections:
        # A kubelet without kubelet_admission_rejections_total: the topology manager's errors are
        # TopologyAffinityError rejections.
        reasons["TopologyAffinityError"] = topo_errors
    requests = int(counter_delta(previous.requests, current.requests))
    return NodeCounts(admissions=max(requests, sum(reasons.values())), rejections=reasons)


def sum_deltas(
    readings: Iterable[CounterReading], nodes: Iterable[str], now: float, window: float
) -> dict[str, NodeCounts]:
    """Sum the counter increases per node over the scrapes inside ``(now - window, now]``.

    The last scrape before the window is each node's base; scrapes must be in time order per node.
    """
    wanted = set(nodes)
    start = now - window
    last: dict[str, CounterReading] = {}
    out: dict[str, NodeCounts] = {n: NodeCounts() for n in sorted(wanted)}
    for r in readings:
        if r.node not in wanted or r.time > now:
            continue
        if r.time <= start:
            last[r.node] = r
            continue
        out[r.node] = out[r.node] + reading_delta(last.get(r.node), r)
        last[r.node] = r
    return out
