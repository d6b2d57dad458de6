"""The API path: watch the pods on the changed nodes, and the kubelet's Warning events.

Why watch instead of poll: a rejected pod is ``Failed`` the moment the kubelet says so, and the
gate should know within a second, not at the next analysis interval. Why per node: a field
selector ``spec.nodeName=<node>`` makes the API server send only the canary's pods, so the cost
follows the canary, not the cluster (``benchmarks/gate_bench.py`` measures it).

What makes a watch trustworthy over a soak of minutes:

* it resumes from the last ``resourceVersion`` it saw after a disconnect (an API server restart);
* on ``410 Gone`` (the version was compacted) it lists again and carries on from the list;
* the relist and the resumed watch replay pods it has already seen, so every observation goes
  through :class:`AdmissionTracker`, which keeps one sample per pod UID and outcome: nothing is
  counted twice.

Events are watched with ``type=Warning,source=kubelet`` and filtered on ``source.host``; they
catch rejected pods deleted before their status reached the watch. An Event and the pod's status
for the same UID are one sample.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.kube.client import Api

from rollout.retrying import Backoff
from rollout.samples import AdmissionSample, count_window, group_counts, is_admission_reason
from rollout.verdicts import SignalState

BACKOFF = Backoff(0.2, 5.0)
"""The wait before a watch lists or watches again after an error: 0.2 s, doubling, at most 5 s;
back to 0.2 s once an event arrives."""


def _ts(value: Any) -> float | None:
    if not value:
        return None
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


def owner_of(meta: Mapping[str, Any]) -> str | None:
    """``Kind/namespace/name`` of the pod's controller, or None for a bare pod."""
    for ref in meta.get("ownerReferences") or ():
        if ref.get("controller"):
            return f"{ref.get('kind')}/{meta.get('namespace')}/{ref.get('name')}"
    return None


class AdmissionTracker:
    """Turns pod and Event observations into admission samples, one per pod UID and outcome.

    Pure (no I/O, the time of each observation is passed in) and thread-safe, so several watches
    can feed one tracker.

    Args:
        since: pods created before this time are not the change's doing; they go to the "before"
            baseline instead of the samples.
    """

    def __init__(self, since: float) -> None:
        self.since = since
        self._lock = threading.Lock()
        self._samples: dict[tuple[str, bool], AdmissionSample] = {}
        self._before: dict[tuple[str, bool], AdmissionSample] = {}
        self._owners: dict[str, str] = {}
        self._owner_names: dict[tuple[str, str], str] = {}  # (namespace, controller name) -> owner

    def observe_pod(self, pod: Mapping[str, Any], now: float) -> AdmissionSample | None:
        """Record a pod object (as JSON); returns the sample if it is new."""
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        uid = meta.get("uid")
        if not node or not uid:
            return None
        owner = owner_of(meta)
        phase = status.get("phase")
        reason = status.get("reason")
        if phase == "Failed" and is_admission_reason(reason):
            rejected: str | None = reason
        elif phase in ("Running", "Succeeded") or (phase == "Failed" and status.get("startTime")):
            rejected = None
        else:
            return None  # not decided yet (Pending)
        if owner:
            ref = owner.split("/", 2)
            with self._lock:
                self._owner_names[(ref[1], ref[2])] = owner
        created = _ts(meta.get("creationTimestamp"))
        sample = AdmissionSample(node, uid, now, rejected, owner, status.get("message", ""))
        if created is not None and created < self.since:
            old = AdmissionSample(node, uid, created, rejected, owner, sample.message)
            with self._lock:
                self._before.setdefault((uid, rejected is not None), old)
            return None
        return self._add(sample)

    def observe_event(
        self, event: Mapping[str, Any], nodes: Iterable[str], now: float
    ) -> AdmissionSample | None:
        """Record a kubelet Warning Event about a pod; returns the sample if it is new."""
        reason = event.get("reason")
        src = event.get("source") or {}
        obj = event.get("involvedObject") or {}
        host = src.get("host")
        if (
            event.get("type") != "Warning"
            or not is_admission_reason(reason)
            or obj.get("kind") != "Pod"
            or host not in set(nodes)
            or not obj.get("uid")
        ):
            return None
        when = _ts(
            event.get("lastTimestamp") or event.get("eventTime") or event.get("firstTimestamp")
        )
        if when is not None and when < self.since:
            return None
        owner = self._owner_by_name(str(obj.get("namespace") or ""), str(obj.get("name") or ""))
        return self._add(
            AdmissionSample(host, obj["uid"], now, reason, owner, event.get("message", ""))
        )

    def _owner_by_name(self, namespace: str, pod_name: str) -> str | None:
        """The owner of a pod known only from an Event, from its controller's naming.

        The kubelet posts the rejection Event before it updates the pod's status, so in a storm
        the newest pod is often known only by its Event for a few milliseconds. Controllers name
        their pods ``<controller name>-<suffix>`` (ReplicaSet, Job: a random suffix; StatefulSet:
        the ordinal); when a pod of that controller was already seen on the node, the Event's
        pod is attributed to it, so the storm still counts once. Unknown: None (counted by UID
        until its status names the owner).
        """
        base, sep, _ = pod_name.rpartition("-")
        if not sep:
            return None
        with self._lock:
            return self._owner_names.get((namespace, base))

    def _add(self, s: AdmissionSample) -> AdmissionSample | None:
        key = (s.pod_uid, s.rejected)
        with self._lock:
            if s.owner:
                self._owners[s.pod_uid] = s.owner
            old = self._samples.get(key)
            if old is not None:
                if old.owner is None and s.owner:  # the Event came first; the pod names its owner
                    self._samples[key] = AdmissionSample(
                        old.node, old.pod_uid, old.time, old.rejected_reason, s.owner, old.message
                    )
                return None
            owner = s.owner or self._owners.get(s.pod_uid)
            if owner != s.owner:
                s = AdmissionSample(s.node, s.pod_uid, s.time, s.rejected_reason, owner, s.message)
            self._samples[key] = s
            return s

    def samples(self) -> list[AdmissionSample]:
        with self._lock:
            return list(self._samples.values())

    def before(self) -> list[AdmissionSample]:
        with self._lock:
            return list(self._before.values())


class _Watch(threading.Thread):
    """One list+watch loop (pods of one node, or kubelet Warning events), resumable."""

    def __init__(
        self,
        name: str,
        list_fn: Callable[..., Any],
        watch_fn: Callable[..., Any],
        field_selector: str,
        handle: Callable[[Mapping[str, Any]], object],
        on_error: Callable[[str], None],
        on_ok: Callable[[], None],
        stop: threading.Event,
    ) -> None:
        super().__init__(name=name, daemon=True)
        self.list_fn = list_fn
        self.watch_fn = watch_fn
        self.selector = field_selector
        self.handle = handle
        self.on_error = on_error
        self.on_ok = on_ok
        self.stop_event = stop
        self.rv: str | None = None
        self.relists = 0

    def _list(self) -> None:
        body = self.list_fn(field_selector=self.selector, _request_timeout=10)
        for item in body.get("items") or ():
            self.handle(item)
        self.rv = body["metadata"]["resourceVersion"]
        self.relists += 1

    def run(self) -> None:
        from rollout.kube.rest import AnswerError

        failures = 0  # since the last event: the backoff's attempt
        while not self.stop_event.is_set():
            try:
                if self.rv is None:
                    self._list()
                    self.on_ok()
                events = self.watch_fn(self.selector, self.rv, 30, 40)
                for ev in events:
                    if self.stop_event.is_set():
                        events.close()
                        break
                    raw = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        if raw.get("code") == 410:
                            self.rv = None
                            break
                        raise RuntimeError(raw.get("message") or "watch error")
                    rv = (raw.get("metadata") or {}).get("resourceVersion")
                    if rv:
                        self.rv = rv
                    if ev.get("type") != "BOOKMARK":
                        self.handle(raw)
                    self.on_ok()
                    failures = 0
            except AnswerError as e:
                if e.status == 410:
                    self.rv = None  # compacted: list again (the tracker drops what it has seen)
                    continue
                self.on_error(f"{self.name}: {e.status} {e.reason}")
                self.stop_event.wait(BACKOFF.delay(failures))
                failures += 1
            except Exception as e:  # connection refused / reset while the API server restarts
                self.on_error(f"{self.name}: {type(e).__name__}: {e}")
                self.stop_event.wait(BACKOFF.delay(failures))
                failures += 1


class ApiSignal:
    """The gate's API signal: pod watches per canary and control node, plus kubelet events.

    Args:
        api: the connection (:func:`rollout.kube.client.connect`).
        since: the change's start (pods created before it are baseline, not samples).
        window: the sliding window, seconds.
        clock: returns the current time in seconds (the tracker's observation time).
    """

    name = "api"

    def __init__(
        self, api: Api, since: float, window: float, clock: Callable[[], float] = time.time
    ) -> None:
        self._core = api.core
        self.tracker = AdmissionTracker(since)
        self.window = window
        self.clock = clock
        self._stop = threading.Event()
        self._threads: list[_Watch] = []
        self._lock = threading.Lock()
        self._errors = 0  # read errors since the previous state()
        self._streak = 0  # state() calls in a row that saw read errors
        self._last_error: str | None = None
        self._has_data = False
        self.nodes: tuple[str, ...] = ()
        self.control: tuple[str, ...] = ()
        self._changed = threading.Event()

    def _seen(self, sample: AdmissionSample | None) -> None:
        if sample is not None and sample.rejected:
            self._changed.set()

    def wait(self, timeout: float) -> None:
        """Sleep up to ``timeout`` seconds, waking at once when a new rejection arrives.

        Passed as the gate's ``sleep``: the verdict follows a rejection within milliseconds
        instead of at the next interval.
        """
        self._changed.wait(timeout)
        self._changed.clear()

    def wake(self) -> None:
        """End the current :meth:`wait` at once (an interrupted soak)."""
        self._changed.set()

    def _error(self, msg: str) -> None:
        with self._lock:
            self._errors += 1
            self._last_error = msg

    def _ok(self) -> None:
        with self._lock:
            self._has_data = True

    def start(self, nodes: Sequence[str], control: Sequence[str] = ()) -> None:
        """Start one pod watch per node (canary and control) and one kubelet-event watch.

        A signal is started once per soak: ``promote`` gates every batch with the same signal, so
        each start begins with fresh watch threads, a fresh stop flag and no read errors carried
        over (the tracker keeps its samples: counts are per node and window)."""
        self.nodes, self.control = tuple(nodes), tuple(control)
        self._stop = threading.Event()
        self._threads = []
        with self._lock:
            self._errors, self._streak, self._last_error, self._has_data = 0, 0, None, False
        watched = self.nodes + self.control
        for node in watched:
            self._threads.append(
                _Watch(
                    f"pods on {node}",
                    self._core.list_pod_for_all_namespaces,
                    self._core.watch_pod_for_all_namespaces,
                    f"spec.nodeName={node}",
                    lambda pod: self._seen(self.tracker.observe_pod(pod, self.clock())),
                    self._error,
                    self._ok,
                    self._stop,
                )
            )
        self._threads.append(
            _Watch(
                "kubelet events",
                self._core.list_event_for_all_namespaces,
                self._core.watch_event_for_all_namespaces,
                "type=Warning,source=kubelet",
                lambda ev: self._seen(self.tracker.observe_event(ev, watched, self.clock())),
                self._error,
                self._ok,
                self._stop,
            )
        )
        for t in self._threads:
            t.start()

    def state(self, now: float, baseline_before: bool = False) -> SignalState:
        """The signal's counts over the window ending at ``now``."""
        samples = self.tracker.samples()
        counts = count_window(samples, self.nodes, now, self.window)
        baseline = None
        if baseline_before:
            before = self.tracker.before()
            baseline = group_counts(
                count_window(before, self.nodes, self.tracker.since, self.window)
            )
            if not before:
                baseline = None
        elif self.control:
            baseline = group_counts(count_window(samples, self.control, now, self.window))
        with self._lock:
            # One evaluation with read errors is one failed read, however many retries it took.
            self._streak = self._streak + 1 if self._errors else 0
            self._errors = 0
            return SignalState(
                self.name, counts, baseline, self._streak, self._last_error, self._has_data
            )

    @property
    def relists(self) -> int:
        return sum(t.relists for t in self._threads)

    def stop(self) -> None:
        self._stop.set()
        # one deadline for all: a thread blocked in a quiet watch ends at its next event or
        # timeout anyway (daemon), and an interrupted soak must not wait 2 s per thread
        deadline = time.monotonic() + 1.0
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
