"""The rejection-rate gate: soak, evaluate the signals, decide, record.

Why here and not in the orchestrator: the orchestrator asks one question after the canary batch
(``Gate.evaluate(change_id, nodes) -> Verdict``) and ``rollout watch`` asks the same question of a
change applied earlier. This module answers it: it starts the signals on the canary (and control)
nodes, evaluates every ``interval`` over the sliding window until the soak is over or the verdict
is Failed, launches probe pods when admissions are too few, and records every verdict in the
journal and as an Event on each node. The clock and ``sleep`` are parameters, so the soak loop runs
in unit tests and benchmarks in microseconds.

Failed ends the soak at once (detection latency is the interval, not the soak). Successful is
only ever returned at the end of the soak. Inconclusive and Error hold: the verdict says what the
gate waits for, and the caller holds the rollout.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from typing import Any, Protocol

from rollout.change.plan.gate_section import Baseline, GateConfig, OnFailure
from rollout.change.record.entries import recovery_data, trigger_data, verdict_data
from rollout.change.record.journal import Kind
from rollout.errors import RolloutError
from rollout.gate.analysis import Predicted, evaluate
from rollout.interrupt import Interrupt
from rollout.verdicts import Outcome, SignalState, Verdict


class Signal(Protocol):
    """A source of admission counts (API watch, kubelet metrics, Prometheus)."""

    name: str

    def start(self, nodes: Sequence[str], control: Sequence[str] = ()) -> None: ...

    def state(self, now: float, baseline_before: bool = False) -> SignalState: ...

    def stop(self) -> None: ...

    def wake(self) -> None:
        """End a wait of this signal's in progress at once (the soak was interrupted); a signal
        that never waits does nothing."""
        ...


class Probes(Protocol):
    """Creates and removes probe pods (``rollout.kube.probing.ProbePods``)."""

    def launch(self, change_id: str, nodes: Sequence[str], per_node: int) -> list[str]: ...

    def cleanup(self) -> None: ...


class NodeEventSink(Protocol):
    """Posts an Event on a Node (``rollout.kube.probing.NodeEvents``)."""

    def post(self, node: str, reason: str, message: str, warning: bool, now: datetime) -> None: ...


class Recorder(Protocol):
    """Appends a decision record (type ``verdict`` or ``trigger``) to the change's journal."""

    def __call__(self, kind: str, data: Mapping[str, Any]) -> None: ...


class MetricsSink(Protocol):
    """Counts verdicts and rejections for ``/metrics`` (``rollout.gate.serve.GateMetrics``)."""

    def observe(self, verdict: Verdict) -> None: ...


EVENT_REASONS = {
    Outcome.SUCCESSFUL: "RolloutGatePassed",
    Outcome.FAILED: "RolloutGateFailed",
    Outcome.INCONCLUSIVE: "RolloutGateInconclusive",
    Outcome.ERROR: "RolloutGateError",
}


class SoakGate:
    """The ``Gate`` the orchestrator calls after the canary batch.

    Args:
        cfg: the plan's ``gate:`` section.
        signals: the signal sources (each gets ``start``/``state``/``stop``).
        clock: seconds since the epoch (``time.time`` in production).
        sleep: waits that many seconds (``time.sleep`` in production).
        control: nodes of the control group (unchanged, equivalent), for the baseline.
        probes: probe pods, used when ``cfg.probes`` and admissions are too few.
        events: Events on nodes; record: the journal; metrics: ``/metrics``.
        progress: one line per evaluation, for the CLI.
        predicted: (node, owner) pairs preflight's admission preview predicted rejected; a
            Failed reason says of each rejected pod's owner whether it was predicted. None when
            no preview ran (``rollout watch``).
        interrupt: the change owner's stop flag (a rollback handed to it, the Lease lost): every
            wait of the soak checks it before and after, and its setting wakes the signals'
            waits, so the soak ends with ``StopRequested`` at once.
    """

    def __init__(
        self,
        cfg: GateConfig,
        signals: Sequence[Signal],
        *,
        clock: Callable[[], float],
        sleep: Callable[[float], None],
        control: Sequence[str] = (),
        probes: Probes | None = None,
        events: NodeEventSink | None = None,
        record: Recorder | None = None,
        metrics: MetricsSink | None = None,
        progress: Callable[[str], None] = lambda _m: None,
        predicted: Predicted | None = None,
        interrupt: Interrupt | None = None,
    ) -> None:
        self.cfg = cfg
        self.interrupt = interrupt
        if interrupt is not None:
            for s in signals:
                interrupt.add_waker(s.wake)
        self.predicted = predicted
        self.signals = list(signals)
        self.clock = clock
        self.sleep = sleep
        self.control = tuple(control)
        self.probes = probes
        self.events = events
        self.record = record
        self.metrics = metrics
        self.progress = progress
        self.history: list[Verdict] = []

    def evaluate(self, change_id: str, nodes: Sequence[str], until: float | None = None) -> Verdict:
        """Soak and decide over ``nodes``; see the module docstring. ``until``: end the soak then
        (a soak that goes on over fewer nodes), not ``gate.soak`` from now."""
        started = self.clock()
        deadline = started + self.cfg.soak if until is None else until
        before = self.cfg.baseline is Baseline.BEFORE
        control = self.control if self.cfg.baseline is Baseline.CONTROL_GROUP else ()
        probes_launched: list[str] = []
        last_line = ""
        for s in self.signals:
            s.start(nodes, control)
        try:
            while True:
                now = self.clock()
                states = [s.state(now, before) for s in self.signals]
                verdict = evaluate(self.cfg, states, now, self.predicted)
                self.history.append(verdict)
                line = progress_line(verdict, states)
                if line != last_line:
                    # Say what changed, not the same verdict every interval; the soak's end
                    # and the final verdict are reported by the caller.
                    self.progress(f"{line} (soak: {max(deadline - now, 0.0):.0f}s left)")
                    last_line = line
                if verdict.status is Outcome.FAILED or now >= deadline:
                    break
                if (
                    verdict.status is Outcome.INCONCLUSIVE
                    and self.cfg.probes
                    and self.probes is not None
                    and not probes_launched
                ):
                    per_node = max(1, math.ceil(self.cfg.min_admissions / max(len(nodes), 1)))
                    try:
                        probes_launched = self.probes.launch(change_id, nodes, per_node)
                        self.progress(f"probe pods: {', '.join(probes_launched)}")
                    except RolloutError as e:
                        self.progress(f"probe pods could not be created: {e}")
                        probes_launched = ["<failed>"]
                self.wait(min(self.cfg.interval, max(deadline - now, 0.0)))
        finally:
            for s in self.signals:
                s.stop()
            if probes_launched and self.probes is not None:
                try:
                    self.probes.cleanup()
                except RolloutError as e:
                    self.progress(f"probe pods could not be deleted: {e}")
        verdict = _with_inputs(verdict, started, nodes, control, probes_launched)
        self._publish(change_id, nodes, verdict)
        return verdict

    def wait(self, seconds: float) -> None:
        """``sleep``, with the interrupt checked before and after (:class:`StopRequested`)."""
        if self.interrupt is not None:
            self.interrupt.check()
        self.sleep(seconds)
        if self.interrupt is not None:
            self.interrupt.check()

    def _publish(self, change_id: str, nodes: Sequence[str], verdict: Verdict) -> None:
        if self.metrics is not None:
            self.metrics.observe(verdict)
        if self.record is not None:
            self.record(Kind.VERDICT, verdict_data(change_id, nodes, verdict.as_dict()))
        if self.events is not None:
            when = datetime.fromtimestamp(verdict.at, UTC)
            reason = EVENT_REASONS[verdict.status]
            for node in nodes:
                failed = node in verdict.failed_nodes
                text = f"change {change_id}: {verdict.status}: {verdict.reason}"
                if verdict.waiting_for:
                    text += f"; waiting for {verdict.waiting_for}"
                try:
                    self.events.post(node, reason, text, failed or verdict.holds, when)
                except RolloutError as e:
                    self.progress(f"event on {node} not posted: {e}")


def progress_line(verdict: Verdict, states: Sequence[SignalState]) -> str:
    """The soak's line for one evaluation: the verdict, except while it is Error only because
    signals have not delivered their first read (no read failed yet, as right after the soak
    starts): then it says what it waits for. The verdict itself stays Error, and a soak that
    ends so holds with it."""
    if verdict.status is Outcome.ERROR:
        erring = [f.signal for f in verdict.findings if f.outcome is Outcome.ERROR]
        pending = {s.name for s in states if not s.has_data and s.last_error is None}
        if erring and all(name in pending for name in erring):
            return f"waiting for the first samples from {', '.join(erring)}"
    return f"{verdict.status}: {verdict.reason}"


def _with_inputs(
    v: Verdict,
    started: float,
    nodes: Sequence[str],
    control: Sequence[str],
    probes: Sequence[str],
) -> Verdict:
    inputs = dict(v.inputs)
    inputs.update(
        {
            "soakStarted": started,
            "nodes": list(nodes),
            "control": list(control),
            "probes": [p for p in probes if p != "<failed>"],
        }
    )
    return Verdict(v.status, v.reason, v.at, v.failed_nodes, v.waiting_for, v.findings, inputs)


def rollback_targets(
    verdict: Verdict, cfg: GateConfig, nodes: Sequence[str], pool: Sequence[str] = ()
) -> list[str]:
    """The nodes a Failed verdict rolls back under the plan's ``onFailure`` policy:
    ``rollback-group`` (the default) the node pool, every node of the change on the new config
    (``pool``; the gate's ``nodes`` when not known), ``rollback-affected`` the nodes with
    rejections (all of ``nodes`` when the verdict names none)."""
    if verdict.status is not Outcome.FAILED:
        return []
    if cfg.on_failure is OnFailure.ROLLBACK_GROUP:
        return list(dict.fromkeys([*pool, *nodes]))
    if not verdict.failed_nodes:
        return list(nodes)
    return [n for n in nodes if n in verdict.failed_nodes]


def rejected_owners(verdicts: Sequence[Verdict]) -> list[str]:
    """The controllers (``Kind/namespace/name``) whose pods the Failed verdicts saw rejected on
    their failed nodes (bare pods have none: nothing recreates them)."""
    owners: set[str] = set()
    for v in verdicts:
        if v.status is not Outcome.FAILED:
            continue
        for sig in (v.inputs.get("signals") or {}).values():
            for node, counts in (sig.get("nodes") or {}).items():
                if node in v.failed_nodes or not v.failed_nodes:
                    owners.update(counts.get("owners") or ())
    return sorted(owners)


class OwnerPods(Protocol):
    """Whether a controller has a pod Running (``rollout.kube.workloads.owner_running``)."""

    def __call__(self, owner: str) -> bool: ...


class RollbackPolicyGate:
    """The gate ``rollout apply`` runs after the canary batch: a :class:`SoakGate` plus policy.

    The orchestrator restores the nodes named in a Failed verdict's ``failed_nodes`` (all of the
    gate's nodes when it names none). This wrapper puts the plan's ``onFailure`` policy there
    (the node pool, or the affected nodes) and journals the ``trigger`` record the moment the
    rollback is decided, so the journal shows when the automatic rollback started and why.
    Under ``rollback-affected`` it answers :meth:`keep_watching` (the soak goes on over the nodes
    not rolled back); after the rollback :meth:`after_rollback` says whether the rejected
    owners' pods run again.

    Args:
        gate: the soak gate.
        record: the journal recorder (the same one the soak gate writes ``verdict`` records to).
        pool: the change's nodes on the new config now (what ``rollback-group`` restores).
        running: whether a controller has a pod Running (None: not checked).
        rejected: the controllers whose pods were rejected on the given nodes during the change,
            read from the API (the verdict's owners miss a pod seen only by its Event).
    """

    def __init__(
        self,
        gate: SoakGate,
        record: Recorder | None = None,
        pool: Callable[[], Sequence[str]] | None = None,
        running: OwnerPods | None = None,
        rejected: Callable[[Sequence[str]], Sequence[str]] | None = None,
    ) -> None:
        self.gate = gate
        self.record = record
        self.pool = pool
        self.running = running
        self.rejected = rejected
        self.verdict: Verdict | None = None
        self.failed: list[Verdict] = []
        self._seen: set[str] = set()
        self._until: float | None = None

    def _rejected_on(self, nodes: Sequence[str]) -> list[str]:
        if self.rejected is None:
            return []
        try:
            return list(self.rejected(nodes))
        except RolloutError as e:
            self.gate.progress(f"could not read the rejected pods: {e}")
            return []

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        """Soak and decide; a Failed verdict comes back with its rollback targets."""
        self._until = self.gate.clock() + self.gate.cfg.soak
        self.verdict, self.failed, self._seen = None, [], set()
        return self._decide(change_id, nodes, self.gate.evaluate(change_id, nodes))

    def _decide(self, change_id: str, nodes: Sequence[str], verdict: Verdict) -> Verdict:
        if verdict.status is Outcome.FAILED:
            self.failed.append(verdict)
            self._seen.update(self._rejected_on(nodes))  # the pods as they are now, too
            pool = list(self.pool()) if self.pool is not None else []
            targets = rollback_targets(verdict, self.gate.cfg, nodes, pool)
            if self.record is not None:
                self.record(
                    Kind.TRIGGER,
                    trigger_data(
                        change_id,
                        "gate",
                        targets,
                        verdict.reason,
                        policy=str(self.gate.cfg.on_failure),
                    ),
                )
            verdict = replace(verdict, failed_nodes=tuple(targets))
        if self.verdict is None or self.verdict.status is not Outcome.FAILED:
            self.verdict = verdict  # the verdict that decided stays the gate's verdict
        return verdict

    def soaks_on(self) -> bool:
        """Whether, after a rollback, the soak goes on over the nodes not rolled back: under
        ``rollback-affected``, until the first soak's end."""
        return (
            self.gate.cfg.on_failure is OnFailure.ROLLBACK_AFFECTED
            and self._until is not None
            and self.gate.clock() < self._until
        )

    def keep_watching(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        """Soak on over ``nodes`` (those not rolled back) until the first soak's end (see
        :meth:`soaks_on`); a Failed verdict names the nodes to roll back next."""
        self.gate.progress(f"soak goes on over {', '.join(nodes)} (onFailure: rollback-affected)")
        return self._decide(change_id, nodes, self.gate.evaluate(change_id, nodes, self._until))

    def after_rollback(self, change_id: str, nodes: Sequence[str]) -> str:
        """After the automatic rollback of ``nodes``: wait up to ``gate.recovery`` for a Running
        pod of every owner seen rejected (by the Failed verdicts, or on those nodes through the
        API); journal a ``recovery`` record and say, in one sentence for the change's outcome,
        which run again and which do not."""
        owners = sorted({*rejected_owners(self.failed), *self._seen, *self._rejected_on(nodes)})
        if self.running is None or not owners:
            return ""
        deadline = self.gate.clock() + self.gate.cfg.recovery
        state: dict[str, bool] = dict.fromkeys(owners, False)
        while True:
            for o in owners:
                if not state[o]:
                    try:
                        state[o] = self.running(o)
                    except RolloutError as e:
                        self.gate.progress(f"could not read the pods of {o}: {e}")
            if all(state.values()) or self.gate.clock() >= deadline:
                break
            self.gate.wait(min(1.0, max(deadline - self.gate.clock(), 0.0)))
        up = [o for o in owners if state[o]]
        down = [o for o in owners if not state[o]]
        if self.record is not None:
            self.record(Kind.RECOVERY, recovery_data(change_id, up, down, self.gate.cfg.recovery))
        parts = []
        if up:
            parts.append(f"Running again after the rollback: {', '.join(up)}")
        if down:
            parts.append(
                f"NOT Running {self.gate.cfg.recovery:g}s after the rollback: {', '.join(down)}"
            )
        return "; ".join(parts)
