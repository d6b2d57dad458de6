"""The optional third signal: a PromQL query against a Prometheus the user already runs.

Why optional and why plain ``urllib``: teams that already scrape the kubelets can point the gate
at their Prometheus and get the same counters with their retention and relabelling; nobody else
should need a Prometheus client library for one GET. The query must return an instant vector with
a ``node`` label whose value is the number of admissions rejected on that node over the window,
e.g.::

    sum by (node) (increase(kubelet_admission_rejections_total[5m]))

It counts rejections only (``SignalState.rejections_only``): it can fail the gate, never pass an
idle canary. A query that errors, times out or returns no series for a canary node counts as a
failed read (fail closed, like kured's Prometheus blocker).
"""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rollout.change.plan.gate_section import PrometheusSource
from rollout.samples import NodeCounts
from rollout.verdicts import SignalState

Fetch = Callable[[str, float], bytes]


def _http_get(url: str, timeout: float) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        body: bytes = r.read()
        return body


def parse_vector(body: bytes | str) -> dict[str, float]:
    """Read ``/api/v1/query``'s answer into {node: value}.

    Raises:
        ValueError: not a successful instant-vector answer.
    """
    data: Any = json.loads(body)
    if not isinstance(data, Mapping) or data.get("status") != "success":
        err = data.get("error") if isinstance(data, Mapping) else None
        raise ValueError(f"Prometheus answered {err or 'something else than success'}")
    result = data.get("data") or {}
    if result.get("resultType") != "vector":
        raise ValueError(f"expected an instant vector, got {result.get('resultType')!r}")
    out: dict[str, float] = {}
    for series in result.get("result") or ():
        node = (series.get("metric") or {}).get("node")
        if node:
            out[node] = out.get(node, 0.0) + float(series["value"][1])
    return out


class PrometheusSignal:
    """The gate's Prometheus signal (polled once per evaluation)."""

    name = "prometheus"

    def __init__(self, source: PrometheusSource, fetch: Fetch = _http_get, timeout: float = 5.0):
        self.source = source
        self.fetch = fetch
        self.timeout = timeout
        self.nodes: tuple[str, ...] = ()
        self.control: tuple[str, ...] = ()
        self._streak = 0
        self._last_error: str | None = None
        self._last: dict[str, float] | None = None

    def start(self, nodes: Sequence[str], control: Sequence[str] = ()) -> None:
        self.nodes, self.control = tuple(nodes), tuple(control)
        self._streak, self._last_error, self._last = 0, None, None  # a new soak, a new reading

    def state(self, now: float, baseline_before: bool = False) -> SignalState:
        url = f"{self.source.url}/api/v1/query?" + urllib.parse.urlencode(
            {"query": self.source.query, "time": f"{now:.3f}"}
        )
        try:
            values = parse_vector(self.fetch(url, self.timeout))
            missing = [n for n in self.nodes if n not in values]
            if missing:
                raise ValueError(f"no series for {', '.join(missing)} (label 'node')")
            self._last, self._streak, self._last_error = values, 0, None
        except (OSError, ValueError, KeyError, IndexError, TypeError) as e:
            self._streak += 1
            self._last_error = f"{self.source.url}: {e}"
        last = self._last or {}
        counts = {n: _rejections(last.get(n, 0.0)) for n in self.nodes}
        baseline = None
        if self.control and not baseline_before:
            baseline = NodeCounts()
            for n in self.control:
                baseline = baseline + _rejections(last.get(n, 0.0))
        return SignalState(
            self.name,
            counts,
            baseline,
            self._streak,
            self._last_error,
            self._last is not None,
            rejections_only=True,
        )

    def stop(self) -> None:
        return None

    def wake(self) -> None:
        """Nothing to wake: this signal reads on request and never waits."""
        return None


def _rejections(value: float) -> NodeCounts:
    n = round(value)
    return NodeCounts(0, {"prometheus": n} if n else {})
