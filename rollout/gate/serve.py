"""``rollout serve``: an Alertmanager webhook that rolls a change back, and the gate's metrics.

Why: the gate is not the only thing that can know a change is bad. A team that already alerts on
``kubelet_admission_rejections_total`` (see ``deploy/prometheus-rule.yaml``) should be able to
route that alert here and have the named change rolled back, outside a change window and while a
manual gate is pending (flagger #1801: failed checks piled up behind a pending gate and nothing
rolled back).

Rules, because a webhook that rolls back production nodes must be boring:

* **Authenticated.** ``Authorization: Bearer <token>`` with the token from ``--token-file``;
  anything else gets ``401`` and changes nothing (not even the dedup memory).
* **Idempotent.** Alertmanager re-sends firing alerts on every ``repeat_interval`` and on every
  group change; the same alert (by ``fingerprint``, or by its labels when there is none) triggers
  at most one rollback, and one change is rolled back at most once per server.
* **The change is found from the alert.** A kubelet counter knows its node, not the change: an
  alert with label ``node`` (never guessed from ``instance``) rolls back the change that owns that
  node now (:func:`rollout.gate.alerting.owner_of`: the newest change whose journal touched it,
  while
  the node carries its files), that node or its batch per the plan's ``onFailure``. An alert that
  names a change (label or annotation ``change_id``) rolls back that change. Alerts for nodes no
  change owns, or that name neither, are answered 200, logged and counted
  (``rollout_webhook_alerts_total{action}``) and change nothing.
* **One seam.** The rollback itself is the :class:`RollbackTrigger` (``rollout rollback``, which
  hands over to the change's owner); before calling it the receiver journals a ``trigger`` record
  naming the alert in the change's journal, as the gate does for its own verdicts.

Both payload shapes are accepted: the webhook receiver's ``{"version": "4", "alerts": [...]}`` on
any path (``/webhook``) and the Alertmanager API's bare list on ``POST /api/v2/alerts``.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rollout.errors import InputError, Location, RolloutError
from rollout.gate.alerting import Owner

#: Names of the metrics rollout exports (the monitoring assets are checked against this list).
ROLLOUT_METRICS = (
    "rollout_bench_verdict",
    "rollout_gate_rejections_seen_total",
    "rollout_gate_verdicts_total",
    "rollout_node_state",
    "rollout_rollbacks_total",
    "rollout_webhook_alerts_total",
    "rollout_webhook_requests_total",
)


class RollbackTrigger(Protocol):
    """Starts the rollback of a change (``rollout rollback``, or a fake in tests).

    ``nodes`` None means every node the change touched; ``reason`` is who asks, as the change's
    owner reports it (``alert <fingerprint> (<alertname>)``). Returns the action to answer with:
    ``handed-over`` (the change's live owner was handed the rollback) or ``rolled-back`` (None
    means ``rolled-back``).
    """

    def __call__(self, change_id: str, nodes: Sequence[str] | None, reason: str) -> str | None: ...


class GateMetrics:
    """The gate's Prometheus metrics, in a registry of their own (never the global one)."""

    def __init__(self, registry: CollectorRegistry | None = None) -> None:
        self.registry = registry or CollectorRegistry()
        self._seen: dict[tuple[str, str], int] = {}
        self.rejections = Counter(
            "rollout_gate_rejections_seen",
            "Pod admission rejections the gate saw on changed nodes, after per-owner dedup.",
            ["node", "reason"],
            registry=self.registry,
        )
        self.verdicts = Counter(
            "rollout_gate_verdicts",
            "Gate verdicts, by outcome.",
            ["outcome"],
            registry=self.registry,
        )
        self.bench_verdict = Gauge(
            "rollout_bench_verdict",
            "1 for the outcome of each change's gate.bench verdict: regression (after against "
            "before) and aligned-advantage (whether a tighter next stage may start).",
            ["change", "stage", "check", "outcome"],
            registry=self.registry,
        )
        self.node_state = Gauge(
            "rollout_node_state",
            "1 for the state each node of the change is in (applied, rolled-back, failed, ...).",
            ["node", "state"],
            registry=self.registry,
        )
        self.rollbacks = Counter(
            "rollout_rollbacks",
            "Rollbacks started, by trigger (gate, webhook, manual).",
            ["trigger"],
            registry=self.registry,
        )
        self.alerts = Counter(
            "rollout_webhook_alerts",
            "Alerts the webhook received, by what it did with them (rolled-back, unowned, ...).",
            ["action"],
            registry=self.registry,
        )
        self.drifted = Gauge(
            "rollout_node_drifted",
            "1 when the node's live kubelet config differs from what its last change left "
            "(rollout nodes' drift, on /configz), else 0; by node and change.",
            ["node", "change"],
            registry=self.registry,
        )
        self.drift_checked = Gauge(
            "rollout_drift_last_check_timestamp_seconds",
            "When rollout serve last compared every marked Node with its change (Unix time).",
            registry=self.registry,
        )
        self.requests = Counter(
            "rollout_webhook_requests",
            "Webhook requests, by HTTP status code.",
            ["code"],
            registry=self.registry,
        )

    def observe(self, verdict: Any) -> None:
        """Count a gate verdict, and the rejections it saw that were not counted before."""
        self.verdicts.labels(outcome=str(verdict.status)).inc()
        api = (verdict.inputs.get("signals") or {}).get("api") or {}
        for node, c in (api.get("nodes") or {}).items():
            for reason, n in (c.get("rejections") or {}).items():
                key = (node, reason)
                new = n - self._seen.get(key, 0)
                if new > 0:
                    self.rejections.labels(node=node, reason=reason).inc(new)
                self._seen[key] = max(n, self._seen.get(key, 0))

    def set_bench_verdict(self, change: str, stage: str, check: str, outcome: str) -> None:
        """Mark the change's ``gate.bench`` verdict ``check`` (``regression``,
        ``aligned-advantage``) as ``outcome`` (and as none of the other three)."""
        for o in ("Successful", "Failed", "Inconclusive", "Error"):
            self.bench_verdict.labels(change, stage, check, o).set(1 if o == outcome else 0)

    def set_node_state(self, node: str, state: str, states: Sequence[str]) -> None:
        """Mark ``node`` as being in ``state`` (and in none of the other ``states``)."""
        for s in states:
            self.node_state.labels(node=node, state=s).set(1 if s == state else 0)

    def set_drift(self, rows: Sequence[Any], at: float) -> None:
        """Each node's drift from ``rollout nodes``-style rows (a node no longer marked drops
        out of the series)."""
        self.drifted.clear()
        for r in rows:
            if r.change:
                self.drifted.labels(node=r.node, change=r.change).set(1 if r.drift else 0)
        self.drift_checked.set(at)

    def exposition(self) -> bytes:
        return generate_latest(self.registry)


@dataclass(frozen=True)
class AlertOutcome:
    """What the receiver did with one alert."""

    fingerprint: str
    change_id: str | None
    # rolled-back | handed-over | duplicate | already-rolled-back | ignored | unowned |
    # resolved | failed
    action: str
    detail: str = ""
    nodes: tuple[str, ...] | None = None


def fingerprint_of(alert: Mapping[str, Any]) -> str:
    """Alertmanager's fingerprint, or a stable hash of the labels when there is none."""
    fp = alert.get("fingerprint")
    if isinstance(fp, str) and fp:
        return fp
    labels = alert.get("labels") or {}
    blob = json.dumps(labels, sort_keys=True, separators=(",", ":"))
    return "labels:" + hashlib.sha256(blob.encode()).hexdigest()[:16]


class OwnerResolver(Protocol):
    """The change that owns a node now (``rollout.gate.alerting.owner_of`` over journals +
    Lease)."""

    def __call__(self, node: str) -> Owner | None: ...


#: Writes the ``trigger`` record ``(change_id, data)`` to the change's journal before the
#: rollback is asked for.
TriggerRecorder = Callable[[str, Mapping[str, Any]], None]


class AlertReceiver:
    """Dedup and dispatch of alerts; thread-safe, independent of HTTP.

    Args:
        trigger: starts a rollback (the single seam to the change's owner).
        metrics: where the counters go.
        owners: maps an alert's ``node`` to the change that owns it (None: only alerts that name
            their change with ``change_id`` are acted on).
        record: journals the ``trigger`` record (None: not journaled, e.g. unit tests).
        log: one line per alert handled.
    """

    def __init__(
        self,
        trigger: RollbackTrigger,
        metrics: GateMetrics | None = None,
        *,
        owners: OwnerResolver | None = None,
        record: TriggerRecorder | None = None,
        log: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self._trigger = trigger
        self._metrics = metrics or GateMetrics()
        self._owners = owners
        self._record = record
        self._log = log
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        # (change, node) pairs rolled back; node "*" means every node of the change
        self._rolled_back: set[tuple[str, str]] = set()

    @property
    def metrics(self) -> GateMetrics:
        return self._metrics

    def receive(self, alerts: Sequence[Mapping[str, Any]]) -> list[AlertOutcome]:
        """Handle the alerts of one request, in order."""
        out = []
        for alert in alerts:
            o = self._one(alert)
            self._metrics.alerts.labels(action=o.action).inc()
            name = (alert.get("labels") or {}).get("alertname", "alert")
            node = (alert.get("labels") or {}).get("node")
            self._log(
                f"alert {name} ({o.fingerprint}{', node ' + node if node else ''}): {o.action}"
                f"{' change ' + o.change_id if o.change_id else ''}"
                f"{': ' + o.detail if o.detail else ''}"
            )
            out.append(o)
        return out

    def _done(self, change: str, nodes: Sequence[str] | None) -> bool:
        if (change, "*") in self._rolled_back:
            return True
        return nodes is not None and all((change, n) in self._rolled_back for n in nodes)

    def _one(self, alert: Mapping[str, Any]) -> AlertOutcome:
        fp = fingerprint_of(alert)
        labels = alert.get("labels") or {}
        annotations = alert.get("annotations") or {}
        change = labels.get("change_id") or annotations.get("change_id")
        status = alert.get("status", "firing")
        if status != "firing":
            return AlertOutcome(fp, change, "resolved", "only firing alerts trigger a rollback")
        node = labels.get("node")
        node = node if isinstance(node, str) and node else None
        if not change and node is None:
            return AlertOutcome(fp, None, "ignored", "the alert names no node and no change")
        if not change and self._owners is None:
            return AlertOutcome(fp, None, "ignored", "the alert names no change (change_id)")
        # Decided under the lock, run outside it: a rollback takes minutes, and a repeat
        # delivery meanwhile must be answered (duplicate) at once, not queued behind it.
        with self._lock:
            if fp in self._seen:
                return AlertOutcome(fp, change, "duplicate", "this alert already triggered")
            decided = self._decide(fp, change, node)
            if isinstance(decided, AlertOutcome):
                return decided
            change, nodes, owner = decided
            self._seen.add(fp)
            marks = [(change, n) for n in nodes or ("*",)]
            self._rolled_back.update(marks)
        name = labels.get("alertname", "alert")
        reason = f"alert {fp} ({name})"
        try:
            if self._record is not None:
                self._record(
                    change,
                    {
                        "change": change,
                        "trigger": "alert",
                        "alert": name,
                        "fingerprint": fp,
                        "node": node,
                        "nodes": list(nodes) if nodes else None,
                        "labels": dict(labels),
                        "startsAt": alert.get("startsAt"),
                        "ownerLive": owner.live if owner else None,
                        "reason": reason,
                    },
                )
            action = self._trigger(change, nodes, reason) or "rolled-back"
        except (RolloutError, OSError) as e:
            with self._lock:  # not remembered: Alertmanager's next delivery retries
                self._seen.discard(fp)
                self._rolled_back.difference_update(marks)
            return AlertOutcome(fp, change, "failed", str(e), nodes)
        self._metrics.rollbacks.labels(trigger="webhook").inc()
        return AlertOutcome(fp, change, action, f"alert {name}", nodes)

    def _decide(
        self, fp: str, change: str | None, node: str | None
    ) -> AlertOutcome | tuple[str, tuple[str, ...] | None, Owner | None]:
        """Under the lock: the change and nodes to roll back, or the final outcome."""
        nodes: tuple[str, ...] | None = (node,) if node else None
        owner: Owner | None = None
        if not change:
            assert node is not None and self._owners is not None
            try:
                owner = self._owners(node)
            except RolloutError as e:
                return AlertOutcome(fp, None, "failed", f"cannot tell who owns {node}: {e}")
            if owner is None:
                return AlertOutcome(fp, None, "unowned", f"no change owns node {node} now")
            change, nodes = owner.change, owner.nodes
        if self._done(change, nodes):
            self._seen.add(fp)
            return AlertOutcome(fp, change, "already-rolled-back", "", nodes)
        if owner is not None and owner.state.value == "restoring":
            self._seen.add(fp)
            return AlertOutcome(
                fp, change, "already-rolled-back", f"{node} is being restored already", nodes
            )
        return change, nodes, owner


def read_token(path: str | Path) -> str:
    """Read the bearer token; an unreadable or empty file is bad input."""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise InputError(f"cannot read the token: {e.strerror}", Location(str(path))) from e
    if not token:
        raise InputError("the token file is empty", Location(str(path)))
    return token


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); only loopback hosts are accepted without a proxy in front."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InputError(f"--listen must be HOST:PORT, not {value!r}", Location(field="--listen"))
    return host.strip("[]"), int(port)


def make_server(
    listen: tuple[str, int],
    token: str,
    receiver: AlertReceiver,
    before_metrics: Callable[[GateMetrics], None] | None = None,
) -> ThreadingHTTPServer:
    """Build (not start) the HTTP server: POST webhook/alerts with the token, GET /metrics.

    ``before_metrics`` refreshes gauges read from elsewhere (``rollout serve``: node states from
    the journals) before each scrape; an error there never fails the scrape."""
    expected = f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        server_version = "rollout-serve"

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            receiver.metrics.requests.labels(code=str(code)).inc()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="rollout"')
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: Any) -> None:
            self._reply(code, json.dumps(obj).encode())

        def do_GET(self) -> None:
            if self.path == "/metrics":
                if before_metrics is not None:
                    # an error there: the other series are still worth serving
                    with contextlib.suppress(RolloutError, OSError):
                        before_metrics(receiver.metrics)
                self._reply(200, receiver.metrics.exposition(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._reply(200, b"ok", "text/plain")
            else:
                self._json(404, {"error": "not found"})

        def do_POST(self) -> None:
            given = (self.headers.get("Authorization") or "").encode()
            if not hmac.compare_digest(given, expected):
                self._json(401, {"error": "missing or wrong bearer token"})
                return
            try:
                length = int(self.headers.get("Content-Length") or 0)
                payload = json.loads(self.rfile.read(length) or b"null")
            except ValueError as e:
                self._json(400, {"error": f"body is not JSON: {e}"})
                return
            if isinstance(payload, list):
                alerts = payload
            elif isinstance(payload, dict) and isinstance(payload.get("alerts"), list):
                alerts = payload["alerts"]
            else:
                self._json(400, {"error": "expected Alertmanager's payload with 'alerts'"})
                return
            if not all(isinstance(a, dict) for a in alerts):
                self._json(400, {"error": "every alert must be an object"})
                return
            outcomes = receiver.receive(alerts)
            code = 500 if any(o.action == "failed" for o in outcomes) else 200
            self._json(code, {"alerts": [o.__dict__ for o in outcomes]})

    return ThreadingHTTPServer(listen, Handler)
