"""The kubelet path: admission counters scraped through the API server's node proxy.

Why a second path next to the pod watch: the watch sees what the API server was told; the kubelet's
own counters (``kubelet_topology_manager_admission_requests_total`` / ``..._errors_total`` and
``kubelet_admission_rejections_total{reason}``) see every admission, including pods deleted before
the watch saw their status. The two fail independently, and the verdict takes the worst of them.

The scrape goes through ``/api/v1/nodes/<node>/proxy/metrics`` so it needs nothing but the
kubeconfig the tool already has (RBAC: ``nodes/proxy`` get). Counters are turned into deltas by
``rollout.samples``; a counter that went down means the kubelet restarted.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from prometheus_client.parser import text_string_to_metric_families

if TYPE_CHECKING:
    from rollout.kube.client import Api

from rollout.errors import ExternalError, truncate
from rollout.samples import CounterReading, NodeCounts, group_counts, sum_deltas
from rollout.verdicts import SignalState

REQUESTS = "kubelet_topology_manager_admission_requests_total"
ERRORS = "kubelet_topology_manager_admission_errors_total"
REJECTIONS = "kubelet_admission_rejections_total"
#: Every kubelet metric the gate reads (the monitoring assets are checked against this list).
KUBELET_METRICS = (REQUESTS, ERRORS, REJECTIONS)


def parse_metrics(node: str, text: str, now: float) -> CounterReading:
    """Read the admission counters out of a kubelet's ``/metrics`` text.

    Args:
        node: the node the text came from.
        text: Prometheus text exposition format.
        now: the scrape time.

    Returns:
        The absolute counter values.

    Raises:
        ValueError: the text does not parse, or the topology manager counters are missing (a
            kubelet that does not export them gives the gate no signal).
    """
    values: dict[str, float] = {}
    rejections: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == REJECTIONS:
                    reason = s.labels.get("reason", "")
                    rejections[reason] = rejections.get(reason, 0.0) + float(s.value)
                elif s.name in (REQUESTS, ERRORS):
                    values[s.name] = values.get(s.name, 0.0) + float(s.value)
    except (ValueError, TypeError, IndexError) as e:
        raise ValueError(f"/metrics of {node} does not parse: {e}") from e
    missing = [m for m in (REQUESTS, ERRORS) if m not in values]
    if missing:
        raise ValueError(f"the kubelet on {node} does not export {', '.join(missing)}")
    return CounterReading(node, now, values[REQUESTS], values[ERRORS], rejections)


class MetricsFetcher(Protocol):
    """Fetches one node's kubelet ``/metrics`` text (raises on failure)."""

    def fetch(self, node: str) -> str: ...


class NodeProxyFetcher:
    """``GET /api/v1/nodes/<node>/proxy/metrics`` through the API server."""

    def __init__(self, api: Api, timeout: float = 5.0) -> None:
        """Args: api: the connection (:func:`rollout.kube.client.connect`); timeout: per
        request, seconds."""
        self._core = api.core
        self._timeout = timeout

    def fetch(self, node: str) -> str:
        from rollout.kube.rest import AnswerError

        try:
            _, body = self._core.connect_get_node_proxy_with_path(
                node, "metrics", _request_timeout=self._timeout
            )
        except AnswerError as e:
            raise ExternalError(
                f"GET nodes/{node}/proxy/metrics: {e.status} {e.reason}: {truncate(str(e.body))}"
            ) from e
        except Exception as e:  # urllib3 connection / timeout errors
            raise ExternalError(f"GET nodes/{node}/proxy/metrics: {e}") from e
        return body.decode("utf-8", "replace")


@dataclass
class KubeletCounters:
    """The scrape history of the canary nodes and the read-error streak of this signal.

    Mutable on purpose: it is the signal's memory between evaluations; the verdict only ever sees
    the frozen :class:`rollout.samples.NodeCounts` it derives.
    """

    nodes: tuple[str, ...]
    readings: list[CounterReading] = field(default_factory=list)
    consecutive_errors: int = 0
    last_error: str | None = None
    has_data: bool = False

    def scrape(self, fetcher: MetricsFetcher, now: float) -> None:
        """Scrape every node once; any node failing counts as one failed read of the signal."""
        batch: list[CounterReading] = []
        errors: list[str] = []
        for node in self.nodes:
            try:
                batch.append(parse_metrics(node, fetcher.fetch(node), now))
            except (ValueError, ExternalError) as e:
                errors.append(str(e))
        self.readings.extend(batch)
        if errors:
            self.consecutive_errors += 1
            self.last_error = "; ".join(errors)
        elif len(batch) == len(self.nodes):
            self.consecutive_errors = 0
            self.last_error = None
            # One scrape is only a base for deltas; data starts with the second.
            self.has_data = self.has_data or self._scraped_twice()

    def _scraped_twice(self) -> bool:
        seen: dict[str, int] = {}
        for r in self.readings:
            seen[r.node] = seen.get(r.node, 0) + 1
        return all(seen.get(n, 0) >= 2 for n in self.nodes)

    def counts(self, now: float, window: float) -> dict[str, NodeCounts]:
        """Counter increases per node over the window."""
        return sum_deltas(self.readings, self.nodes, now, window)

    def forget_before(self, t: float) -> None:
        """Drop readings older than ``t``, but keep each node's newest (the next delta's base)."""
        keep: list[CounterReading] = []
        newest_old: dict[str, CounterReading] = {}
        for r in self.readings:
            if r.time < t:
                newest_old[r.node] = r
            else:
                keep.append(r)
        self.readings = list(newest_old.values()) + keep


class KubeletSignal:
    """The gate's kubelet signal: one scrape of every watched node per evaluation."""

    name = "kubelet"

    def __init__(self, fetcher: MetricsFetcher, window: float) -> None:
        self.fetcher = fetcher
        self.window = window
        self.canary = KubeletCounters(())
        self.control = KubeletCounters(())
        self._before: dict[str, NodeCounts] | None = None

    def start(self, nodes: Sequence[str], control: Sequence[str] = ()) -> None:
        self.canary = KubeletCounters(tuple(nodes))
        self.control = KubeletCounters(tuple(control))

    def state(self, now: float, baseline_before: bool = False) -> SignalState:
        self.canary.scrape(self.fetcher, now)
        if self.control.nodes:
            self.control.scrape(self.fetcher, now)
        self.canary.forget_before(now - self.window)
        self.control.forget_before(now - self.window)
        baseline = None
        if self.control.nodes and self.control.has_data and not baseline_before:
            baseline = group_counts(self.control.counts(now, self.window))
        return SignalState(
            self.name,
            self.canary.counts(now, self.window),
            baseline,
            self.canary.consecutive_errors,
            self.canary.last_error,
            self.canary.has_data,
        )

    def stop(self) -> None:
        return None

    def wake(self) -> None:
        """Nothing to wake: this signal reads on request and never waits."""
        return None
