"""``rollout serve``: an Alertmanager webhook that rolls a change back, and the gate's metrics.

Why: the gate is not the only thing that can know a change is bad. A team that already alerts on
``kubelet_admission_rejections_total`` (see ``deploy/prometheus-rule.yaml``) should be able to
route that alert here and have the named change rolled back, outside a change window and while a
manual gate is pending (flagger #1801: failed checks piled up behind a pending gate and nothing
rolled back).

Rules, because a webhook that rolls back production nodes must be boring:

* **Authenticated.** ``Authorization: Bearer <token>`` with the token from ``--token-file``;
  anything else gets ``401`` before a byte of the body is read, and changes nothing (not even
  the dedup memory).
* **Bounded.** A body over ``max_body`` bytes is ``413`` from its ``Content-Length`` alone (never
  read); a body without one is ``411``; a body that stops short is ``400`` (or ``408`` when the
  peer stalls past the read timeout). Every field is checked (:mod:`rollout.gate.payloads`):
  ``400`` naming the field, before anything acts on the alert.
* **Idempotent.** Alertmanager re-sends firing alerts on every ``repeat_interval`` and on every
  group change; the same alert (by ``fingerprint``, or by its labels when there is none) triggers
  at most one rollback, and one change is rolled back at most once per server.
* **The change is found from the alert.** A kubelet counter knows its node, not the change: an
  alert with label ``node`` (never guessed from ``instance``) rolls back the change that owns that
  node now (:func:`rollout.gate.alerting.owner_of`: the newest change whose journal touched it,
  while the node carries its files), that node or its batch per the plan's ``onFailure``. An
  alert that names a change (label or annotation ``change_id``) rolls back that change. An alert
  for a node no change owns, or that names neither, is ``422`` naming the problem (Alertmanager
  does not retry a 4xx), logged and counted (``rollout_webhook_alerts_total{action}``), and
  changes nothing.
* **Answered at once.** A rollback takes minutes; Alertmanager's webhook times out long before.
  The receiver journals a ``trigger`` record naming the alert and a trigger id, answers ``202``
  with that id, and runs the rollback in a thread of its own. Its outcome is journaled as a
  second ``trigger`` record (``outcome``), counted in ``rollout_webhook_rollbacks_total{outcome}``
  and served at ``GET /triggers/<id>``; the rollback's own records are in the change's journal
  (``rollout status``).
* **Drained, not dropped.** :meth:`AlertReceiver.drain` (``rollout serve`` on SIGTERM) refuses
  new alerts with ``503`` (Alertmanager retries them, on another replica) and waits for every
  rollback under way. A process killed before one finished left its restore journaled under
  the change's Lease: ``rollout resume`` finishes it, as after any crash.
* **One seam.** The rollback itself is the :class:`RollbackTrigger` (``rollout rollback``, which
  hands over to the change's owner, and takes the Lease otherwise: two replicas given one alert
  roll back once).

Both payload shapes are accepted: the webhook receiver's ``{"version": "4", "alerts": [...]}`` on
any path (``/webhook``) and the Alertmanager API's bare list on ``POST /api/v2/alerts``; over TLS
when ``make_server`` is given a certificate and key.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import json
import secrets
import ssl
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from rollout.change.record.entries import alert_trigger_data, trigger_ended_data
from rollout.errors import InputError, Location, RolloutError
from rollout.gate.alerting import Owner
from rollout.gate.payloads import BadBody, parse_alerts

#: Names of the metrics rollout exports (the monitoring assets are checked against this list).
ROLLOUT_METRICS = (
    "rollout_bench_verdict",
    "rollout_gate_rejections_seen_total",
    "rollout_gate_verdicts_total",
    "rollout_node_state",
    "rollout_rollbacks_total",
    "rollout_webhook_alerts_total",
    "rollout_webhook_requests_total",
    "rollout_webhook_rollbacks_running",
    "rollout_webhook_rollbacks_total",
)


class RollbackTrigger(Protocol):
    """Starts the rollback of a change (``rollout rollback``, or a fake in tests).

    ``nodes`` None means every node the change touched; ``reason`` is who asks, as the change's
    owner reports it (``alert <fingerprint> (<alertname>)``). Returns the action to answer with:
    ``handed-over`` (the change's live owner was handed the rollback), ``covered`` (a process
    that took the Lease first is rolling these nodes back already) or ``rolled-back`` (None
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
        self.webhook_rollbacks = Counter(
            "rollout_webhook_rollbacks",
            "Rollbacks the webhook started that ended, by outcome (rolled-back, handed-over, "
            "covered, failed).",
            ["outcome"],
            registry=self.registry,
        )
        self.running = Gauge(
            "rollout_webhook_rollbacks_running",
            "Rollbacks the webhook started that have not ended yet.",
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
    # triggered | rolled-back | handed-over | duplicate | already-rolled-back | ignored |
    # unowned | resolved | refused | failed
    action: str
    detail: str = ""
    nodes: tuple[str, ...] | None = None
    trigger: str | None = None  # the trigger id of the rollback this alert started

    def to_dict(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        if doc["nodes"] is not None:
            doc["nodes"] = list(doc["nodes"])
        return doc


@dataclass
class TriggerRun:
    """One rollback the receiver started: ``state`` is ``running`` until the trigger returns,
    then its outcome (``rolled-back``, ``handed-over``, ``covered``) or ``failed`` with
    ``detail``."""

    id: str
    change: str
    nodes: tuple[str, ...] | None
    alert: str
    fingerprint: str
    started: float
    state: str = "running"
    detail: str = ""
    ended: float | None = None

    def to_dict(self) -> dict[str, Any]:
        doc = dict(self.__dict__)
        doc["nodes"] = list(self.nodes) if self.nodes is not None else None
        return doc


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


#: Writes a ``trigger`` record ``(change_id, data)`` to the change's journal: before the
#: rollback is started, and with its outcome when it ends.
TriggerRecorder = Callable[[str, Mapping[str, Any]], None]


class AlertReceiver:
    """Dedup and dispatch of alerts; thread-safe, independent of HTTP.

    Args:
        trigger: starts a rollback (the single seam to the change's owner).
        metrics: where the counters go.
        owners: maps an alert's ``node`` to the change that owns it (None: only alerts that name
            their change with ``change_id`` are acted on).
        record: journals the ``trigger`` records (None: not journaled, e.g. unit tests).
        log: one line per alert handled.
        background: run each rollback in a thread of its own and answer ``triggered`` at once
            (False: run it in the request, the receiver of rollout 0.1; the storm benchmark
            compares the two).
    """

    def __init__(
        self,
        trigger: RollbackTrigger,
        metrics: GateMetrics | None = None,
        *,
        owners: OwnerResolver | None = None,
        record: TriggerRecorder | None = None,
        log: Callable[[str], None] = lambda _m: None,
        background: bool = True,
    ) -> None:
        self._trigger = trigger
        self._metrics = metrics or GateMetrics()
        self._owners = owners
        self._record = record
        self._log = log
        self._background = background
        self._lock = threading.Lock()
        self._seen: set[str] = set()
        # (change, node) pairs rolled back; node "*" means every node of the change
        self._rolled_back: set[tuple[str, str]] = set()
        self._runs: dict[str, TriggerRun] = {}
        self._threads: dict[str, threading.Thread] = {}
        self._draining = False

    @property
    def metrics(self) -> GateMetrics:
        return self._metrics

    @property
    def draining(self) -> bool:
        return self._draining

    def run(self, trigger_id: str) -> TriggerRun | None:
        """The rollback started under ``trigger_id`` (None: no such trigger here)."""
        with self._lock:
            return self._runs.get(trigger_id)

    def runs(self) -> list[TriggerRun]:
        with self._lock:
            return list(self._runs.values())

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
                f"{' trigger ' + o.trigger if o.trigger else ''}"
                f"{': ' + o.detail if o.detail else ''}"
            )
            out.append(o)
        return out

    def drain(self, timeout: float | None = None) -> list[TriggerRun]:
        """Refuse new alerts from now on and wait for every rollback under way (``timeout``
        seconds at most, None: as long as they take). Returns those still running."""
        with self._lock:
            self._draining = True
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                threads = list(self._threads.values())
            if not threads:
                return []
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                return [r for r in self.runs() if r.state == "running"]
            threads[0].join(left)

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
            return AlertOutcome(fp, None, "ignored", "the alert names no node and no change_id")
        if not change and self._owners is None:
            return AlertOutcome(fp, None, "ignored", "the alert names no change (change_id)")
        if self._draining:
            return AlertOutcome(fp, change, "refused", "shutting down: deliver it again")
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
        run = TriggerRun(secrets.token_hex(6), change, nodes, name, fp, time.time())
        reason = f"alert {fp} ({name})"
        try:
            if self._record is not None:
                self._record(
                    change,
                    alert_trigger_data(
                        change,
                        run.id,
                        name,
                        fp,
                        node,
                        nodes,
                        labels,
                        alert.get("startsAt"),
                        owner.live if owner else None,
                        reason,
                    ),
                )
        except (RolloutError, OSError) as e:
            self._forget(fp, marks)
            return AlertOutcome(fp, change, "failed", f"cannot journal the trigger: {e}", nodes)
        self._metrics.rollbacks.labels(trigger="webhook").inc()
        if not self._background:
            self._execute(run, reason, marks)
            action = "failed" if run.state == "failed" else run.state
            return AlertOutcome(fp, change, action, run.detail or f"alert {name}", nodes, run.id)
        thread = threading.Thread(
            target=self._execute, args=(run, reason, marks), name=f"rollback-{run.id}"
        )
        with self._lock:
            self._runs[run.id] = run
            self._threads[run.id] = thread
        self._metrics.running.inc()
        thread.start()
        return AlertOutcome(fp, change, "triggered", f"alert {name}", nodes, run.id)

    def _execute(self, run: TriggerRun, reason: str, marks: list[tuple[str, str]]) -> None:
        """Run the rollback; record, count and remember its outcome (a failed one is forgotten:
        Alertmanager's next delivery tries again). The run shows its outcome only once that is
        journaled, so whoever sees it ended finds it in ``rollout status`` too."""
        detail = ""
        try:
            state = self._trigger(run.change, run.nodes, reason) or "rolled-back"
        except (RolloutError, OSError) as e:
            state, detail = "failed", str(e)
        except Exception as e:  # a bug: the outcome must still be visible, never a lost thread
            state, detail = "failed", f"{type(e).__name__}: {e}"
        ended = time.time()
        if state == "failed":
            self._forget(run.fingerprint, marks)
        self._metrics.webhook_rollbacks.labels(outcome=state).inc()
        self._log(f"trigger {run.id} change {run.change}: {state}{': ' + detail if detail else ''}")
        if self._record is not None:
            # the rollback's own records are journaled already; this one says who asked
            with contextlib.suppress(RolloutError, OSError):
                self._record(
                    run.change,
                    trigger_ended_data(
                        run.change, run.id, state, detail, round(ended - run.started, 3)
                    ),
                )
        run.detail, run.ended, run.state = detail, ended, state
        with self._lock:
            if self._threads.pop(run.id, None) is not None:
                self._metrics.running.dec()

    def _forget(self, fp: str, marks: Sequence[tuple[str, str]]) -> None:
        with self._lock:
            self._seen.discard(fp)
            self._rolled_back.difference_update(marks)

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


def status_of(outcomes: Sequence[AlertOutcome]) -> int:
    """The HTTP code for one request's outcomes: 500 when an alert could not be handled (the
    owner could not be read, the trigger not journaled: Alertmanager retries), 503 while
    draining, 202 when a rollback was started, 422 when an alert names nothing to roll back
    (no node and no change, or a node no change owns), else 200."""
    actions = {o.action for o in outcomes}
    if "failed" in actions:
        return 500
    if "refused" in actions:
        return 503
    if "triggered" in actions:
        return 202
    if actions & {"unowned", "ignored"}:
        return 422
    return 200


def read_token(path: str | Path) -> str:
    """Read the bearer token; an unreadable or empty file is bad input."""
    try:
        token = Path(path).read_text().strip()
    except OSError as e:
        raise InputError(f"cannot read the token: {e.strerror}", Location(str(path))) from e
    if not token:
        raise InputError("the token file is empty", Location(str(path)))
    return token


def tls_context(cert_file: str | Path, key_file: str | Path) -> ssl.SSLContext:
    """A server TLS context (TLS 1.2 at least) with the certificate chain and key from files.

    Raises:
        InputError: a file cannot be read, or the key does not match the certificate.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    for f, field in ((cert_file, "--tls-cert-file"), (key_file, "--tls-key-file")):
        if not Path(f).is_file():
            raise InputError("no such file", Location(str(f), field=field))
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
    except (ssl.SSLError, OSError) as e:
        raise InputError(
            f"cannot load the certificate and key: {e}", Location(str(cert_file), "--tls-cert-file")
        ) from e
    return ctx


def parse_listen(value: str) -> tuple[str, int]:
    """``HOST:PORT`` → (host, port); only loopback hosts are accepted without a proxy in front."""
    host, sep, port = value.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise InputError(f"--listen must be HOST:PORT, not {value!r}", Location(field="--listen"))
    return host.strip("[]"), int(port)


#: The largest request body read (bytes): Alertmanager's webhook for a group of ~1,000 alerts
#: (its ``max_alerts`` caps a group); ``rollout serve --max-body-bytes`` changes it.
MAX_BODY_BYTES = 1 << 20
#: Seconds a client may take to send its request (headers, then body) before ``408``.
READ_TIMEOUT_S = 10.0
_TRIGGER_PATH = "/triggers/"


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128

    def handle_error(self, _request: Any, _client_address: Any) -> None:
        # a failed TLS handshake or a peer gone mid-request: nothing to answer, nothing to log
        return


def make_server(
    listen: tuple[str, int],
    token: str,
    receiver: AlertReceiver,
    before_metrics: Callable[[GateMetrics], None] | None = None,
    *,
    tls: ssl.SSLContext | None = None,
    max_body: int = MAX_BODY_BYTES,
    read_timeout: float = READ_TIMEOUT_S,
) -> ThreadingHTTPServer:
    """Build (not start) the HTTP server: POST webhook/alerts with the token, GET
    /triggers/<id> with the token, GET /metrics and /healthz; over TLS with ``tls``.

    ``before_metrics`` refreshes gauges read from elsewhere (``rollout serve``: node states from
    the journals) before each scrape; an error there never fails the scrape."""
    expected = f"Bearer {token}".encode()

    class Handler(BaseHTTPRequestHandler):
        server_version = "rollout-serve"
        timeout = read_timeout

        def setup(self) -> None:
            super().setup()
            if isinstance(self.connection, ssl.SSLSocket):
                self.connection.do_handshake()  # in this request's thread, under the timeout

        def log_message(self, format: str, *args: Any) -> None:
            return

        def _reply(self, code: int, body: bytes, ctype: str = "application/json") -> None:
            receiver.metrics.requests.labels(code=str(code)).inc()
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(body)))
            if code == 401:
                self.send_header("WWW-Authenticate", 'Bearer realm="rollout"')
            if code == 503:
                self.send_header("Retry-After", "10")
            if code in (400, 408, 411, 413):
                self.send_header("Connection", "close")
                self.close_connection = True
            self.end_headers()
            self.wfile.write(body)

        def _json(self, code: int, obj: Any) -> None:
            self._reply(code, json.dumps(obj).encode())

        def _error(self, code: int, field: str, problem: str) -> None:
            self._json(code, BadBody(code, field, problem).to_dict())

        def _authorized(self) -> bool:
            given = (self.headers.get("Authorization") or "").encode()
            if hmac.compare_digest(given, expected):
                return True
            self._error(401, "Authorization", "missing or wrong bearer token")
            return False

        def do_GET(self) -> None:
            if self.path == "/metrics":
                if before_metrics is not None:
                    # an error there: the other series are still worth serving
                    with contextlib.suppress(RolloutError, OSError):
                        before_metrics(receiver.metrics)
                self._reply(200, receiver.metrics.exposition(), CONTENT_TYPE_LATEST)
            elif self.path == "/healthz":
                self._reply(200, b"ok", "text/plain")
            elif self.path.startswith(_TRIGGER_PATH):
                if not self._authorized():
                    return
                run = receiver.run(self.path[len(_TRIGGER_PATH) :])
                if run is None:
                    self._error(404, "id", "no such trigger on this server")
                else:
                    self._json(200, run.to_dict())
            else:
                self._error(404, "", "not found")

        def _body(self) -> bytes | None:
            """The body, or None once an error was answered (nothing read past the limit)."""
            if self.headers.get("Transfer-Encoding"):
                self._error(411, "Transfer-Encoding", "not accepted: send Content-Length")
                return None
            lengths = self.headers.get_all("Content-Length") or []
            if not lengths:
                self._error(411, "Content-Length", "missing")
                return None
            if len(set(lengths)) != 1 or not lengths[0].isdigit():
                self._error(400, "Content-Length", f"not one byte count: {lengths!r}"[:200])
                return None
            size = int(lengths[0])
            if size > max_body:
                self._error(413, "Content-Length", f"{size} bytes is over the limit of {max_body}")
                return None
            try:
                body = self.rfile.read(size)
            except TimeoutError:
                self._error(408, "", f"the body did not arrive within {read_timeout:g}s")
                return None
            if len(body) < size:
                self._error(400, "", f"body truncated: {len(body)} of {size} bytes arrived")
                return None
            return body

        def do_POST(self) -> None:
            if not self._authorized():
                return
            if receiver.draining:
                self._error(503, "", "shutting down: deliver it again")
                return
            body = self._body()
            if body is None:
                return
            try:
                alerts = parse_alerts(body)
            except BadBody as e:
                self._json(e.code, e.to_dict())
                return
            outcomes = receiver.receive(alerts)
            code = status_of(outcomes)
            doc: dict[str, Any] = {"alerts": [o.to_dict() for o in outcomes]}
            if code == 422:
                doc["error"] = "; ".join(
                    f"alerts[{i}]: {o.detail}"
                    for i, o in enumerate(outcomes)
                    if o.action in ("unowned", "ignored")
                )
            self._json(code, doc)

    server = _Server(listen, Handler)
    if tls is not None:
        # the handshake happens in the request's thread (Handler.setup), never in accept()
        server.socket = tls.wrap_socket(
            server.socket, server_side=True, do_handshake_on_connect=False
        )
    return server
