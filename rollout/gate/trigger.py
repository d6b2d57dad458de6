"""The gate on its own (``rollout watch``) and the external rollback trigger (``rollout serve``),
below the CLI: the soak over a change already applied, the Alertmanager webhook server, and the
rollback either pulls.

Why one trigger: a Failed verdict or an alert rolls back in this process through
``rollout.change.commands.session.roll_back``, the call ``rollout rollback`` makes, so there is
exactly one rollback path whoever pulls the trigger.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.change.plan.gate_section import GateConfig
from rollout.change.record.change_outcomes import ChangeOutcome, exit_code
from rollout.change.record.opening import to_stderr
from rollout.errors import InputError, Location, NodeOperationError, RolloutError
from rollout.retrying import Poll
from rollout.verdicts import Outcome, Verdict

if TYPE_CHECKING:
    from rollout.kube.client import Api


@dataclass(frozen=True)
class KubeTarget:
    """The cluster ``watch`` / ``serve`` act on: their ``--kubeconfig``, ``--context`` and
    ``--lock-namespace``; one API connection, made on first use and shared."""

    kubeconfig: str | None
    context: str | None
    lock_namespace: str
    _api: list[Any] = field(default_factory=list, compare=False, repr=False)

    def connect(self) -> Any:
        from rollout.kube.client import connect

        if not self._api:
            self._api.append(connect(self.kubeconfig, self.context))
        return self._api[0]


COVERED = "covered"
"""A trigger's outcome when another process took the change's Lease first and is rolling the
nodes back already (two ``rollout serve`` replicas given one alert)."""


def trigger_rollback(
    change_id: str,
    nodes: Sequence[str] | None,
    reason: str,
    kube: KubeTarget,
    wait: bool = True,
    say: Callable[[str], None] = to_stderr,
) -> str:
    """Trigger a rollback in this process, as ``rollout rollback`` runs it
    (``rollout.change.commands.session.roll_back``: the same request, hand-over and restore path).
    ``reason`` is who asks, as the change's owner reports it. While a live process owns the
    change, the rollback is handed to it; with ``wait`` False this returns once handed over.
    The inventory is the one the change recorded, or ``$ROLLOUT_INVENTORY``.

    Returns:
        ``handed-over`` (the owner was handed the request and did not report yet),
        ``covered`` (a process that took the change's Lease meanwhile is rolling these nodes
        back already: :func:`~rollout.change.commands.session.roll_back`) or ``rolled-back``.

    Raises:
        RolloutError: the rollback failed (a node could not be restored, the owner reported a
            failed rollback, another process took the Lease); the message says which.
    """
    import os

    from rollout.change.commands.session import RollbackRequest, roll_back

    say(f"rollback of {change_id} ({', '.join(nodes) if nodes else 'all nodes'}): {reason}")
    request = RollbackRequest(
        change=change_id,
        nodes=tuple(nodes or ()),
        requested_by=reason,
        wait=wait,
        inventory=os.environ.get("ROLLOUT_INVENTORY") or None,
        lock_namespace=kube.lock_namespace,
    )
    result = roll_back(kube.connect(), request, say=to_stderr)
    if result.covered_by is not None and result.outcome is ChangeOutcome.HANDED_OVER:
        return COVERED
    if result.outcome is ChangeOutcome.HANDED_OVER:
        return ChangeOutcome.HANDED_OVER.value
    if exit_code(result.outcome, rollback=True) != 0:
        raise NodeOperationError(
            f"rollback of {change_id} ended {result.outcome}: {result.message}"
        )
    return ChangeOutcome.ROLLED_BACK.value


def watch_config(plan_file: str | None) -> GateConfig:
    """The gate ``rollout watch`` runs: the plan's ``gate:`` section, or the defaults."""
    if not plan_file:
        return GateConfig()
    from rollout.change.plan.schema import load_plan

    plan = load_plan(plan_file)
    return plan.gate or GateConfig()


def applied_nodes(change_id: str, api: Api, lock_namespace: str) -> tuple[list[str], float, Any]:
    """The applied nodes of a change ``rollout watch`` soaks over, when the change began, and
    its journal (fetched from the cluster record when this machine lacks it; read only: what
    ``watch`` journals goes through the change's owner, :func:`owner_recorder`).

    Raises:
        InputError: the change has no applied node.
    """
    from rollout.change.record.opening import existing_journal
    from rollout.change.record.replay import replay

    journal = existing_journal(change_id, api, lock_namespace)
    entries = journal.entries()
    status = replay(entries, change_id)
    nodes = [n for n, s in status.nodes.items() if str(s.state) == "applied"]
    if not nodes:
        states = ", ".join(f"{n}: {s.state}" for n, s in status.nodes.items()) or "none"
        raise InputError(
            f"change {change_id} has no applied node to watch (nodes: {states})",
            Location(field="--change"),
        )
    started = datetime.fromisoformat(entries[0].ts).timestamp() if entries else time.time()
    return nodes, started, journal


def owner_recorder(
    change_id: str, kube: KubeTarget, say: Callable[[str], None] = to_stderr
) -> Callable[[str, Any], None]:
    """What ``rollout watch`` journals (its verdicts, its trigger) written into the change's
    record by its one writer: handed to the change's owner while a process holds its Lease, else
    under the Lease taken for the write (``rollout.change.commands.owner_records``). An entry that
    cannot be written is a warning: the verdict still stands, is printed, and a Failed one still
    rolls back (through the owner, or under the Lease)."""
    from rollout.change.commands.owner_records import OwnerRecords

    write = OwnerRecords(kube.connect(), kube.lock_namespace, change_id, say)

    def record(kind: str, data: Any) -> None:
        try:
            write(kind, data)
        except RolloutError as e:
            say(f"warning: the {kind} entry was not journaled in change {change_id}: {e}")

    return record


@dataclass(frozen=True)
class Watched:
    """One ``rollout watch`` soak: its verdict and the nodes a Failed one rolls back."""

    change: str
    verdict: Verdict
    targets: list[str]


def watch_change(
    change_id: str,
    cfg: GateConfig,
    kube: KubeTarget,
    control: Sequence[str] = (),
    listen: str | None = None,
    token_file: str | None = None,
    output: str = "text",
    no_rollback: bool = False,
    say: Callable[[str], None] = to_stderr,
    decided: Callable[[Watched], None] | None = None,
) -> Watched:
    """Soak the gate over the change's applied nodes (with ``listen``, /metrics and the webhook
    served meanwhile), hand the verdict to ``decided`` (the CLI prints it), then act on a Failed
    one: journal the trigger and roll the targets back through :func:`trigger_rollback`, unless
    ``no_rollback``.

    Raises:
        InputError: ``listen`` without ``token_file``, or no applied node.
        RolloutError: the rollback failed.
    """
    from rollout.change.record.entries import trigger_data
    from rollout.change.record.journal import Kind
    from rollout.gate.assembly import build_soak_gate
    from rollout.gate.serve import AlertReceiver, GateMetrics, make_server, parse_listen, read_token
    from rollout.gate.soaking import rollback_targets

    api = kube.connect()
    nodes, started, _ = applied_nodes(change_id, api, kube.lock_namespace)
    trigger = functools.partial(trigger_rollback, kube=kube, wait=False, say=say)
    record = owner_recorder(change_id, kube, say)

    metrics = GateMetrics()
    server = None
    if listen:
        if not token_file:
            raise InputError("--listen needs --token-file", Location(field="--token-file"))
        server = make_server(
            parse_listen(listen), read_token(token_file), AlertReceiver(trigger, metrics)
        )
        threading.Thread(target=server.serve_forever, daemon=True).start()
    gate = build_soak_gate(
        cfg, api, since=started, record=record, control=control, metrics=metrics, output=output
    )
    try:
        verdict = gate.evaluate(change_id, nodes)
    finally:
        if server is not None:
            server.shutdown()
    done = Watched(change_id, verdict, rollback_targets(verdict, cfg, nodes))
    if decided is not None:
        decided(done)
    targets = done.targets
    if verdict.status is Outcome.FAILED and not no_rollback:
        record(Kind.TRIGGER, trigger_data(None, "gate", targets, verdict.reason))
        metrics.rollbacks.labels(trigger="gate").inc()
        trigger_rollback(change_id, targets, "rollout watch: gate Failed", kube, say=say)
    return done


@dataclass(frozen=True)
class ServeOptions:
    """``rollout serve``'s listener: ``HOST:PORT``, the token file, TLS certificate and key
    files (both or neither), the body limit and the drift interval (0: no drift loop)."""

    listen: str
    token_file: str
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    max_body: int = 1 << 20
    drift_interval: float = 300.0


def alert_server(
    opts: ServeOptions,
    kube: KubeTarget,
    say: Callable[[str], None] = to_stderr,
) -> tuple[Any, Any, Path]:
    """``rollout serve``'s server, not started: the webhook routed to the change that owns each
    alert's node (journals in the state directory, fetched from the cluster record on demand),
    /metrics with every marked Node's state, and the drift loop every ``drift_interval`` seconds
    (0: none) in a thread. Returns the server, its receiver (``drain`` on shutdown) and the state
    directory.

    Raises:
        InputError: a bad ``--listen``, token file, or TLS certificate / key (or only one).
    """
    from rollout.change.commands.owner_records import OwnerRecords
    from rollout.change.record.journal import Kind, state_dir
    from rollout.change.record.opening import existing_journal
    from rollout.gate.owning import JournalOwners, export_node_states
    from rollout.gate.serve import (
        AlertReceiver,
        make_server,
        parse_listen,
        read_token,
        tls_context,
    )

    listen = parse_listen(opts.listen)
    token = read_token(opts.token_file)
    if (opts.tls_cert_file is None) != (opts.tls_key_file is None):
        raise InputError(
            "--tls-cert-file and --tls-key-file go together",
            Location(field="--tls-key-file" if opts.tls_cert_file else "--tls-cert-file"),
        )
    tls = None
    if opts.tls_cert_file and opts.tls_key_file:
        tls = tls_context(opts.tls_cert_file, opts.tls_key_file)
    lock_namespace = kube.lock_namespace
    trigger = functools.partial(trigger_rollback, kube=kube, wait=False, say=say)
    root = state_dir()
    connected = kube.connect

    def lease() -> str | None:
        from rollout.kube.lease_reading import live_lease_change

        return live_lease_change(connected(), lock_namespace)

    def refresh(node: str) -> None:
        """The change the alert's Node names, from the cluster record into ``root``."""
        from rollout.kube.mirror import node_change

        change = node_change(connected(), node)
        if change:
            existing_journal(change, connected(), lock_namespace)

    def record(change_id: str, data: Any) -> None:
        """A trigger entry, written by the change's one writer: handed to its owner, else under
        the Lease taken for the write (a failure is the webhook's 500: Alertmanager retries)."""
        OwnerRecords(connected(), lock_namespace, change_id, say)(Kind.TRIGGER, data)

    def cluster_states() -> Any:
        from rollout.kube.mirror import node_states as labelled

        return labelled(connected())

    receiver = AlertReceiver(
        trigger,
        owners=JournalOwners(root, lease, refresh),
        record=record,
        log=lambda m: say(f"rollout serve: {m}"),
    )
    server = make_server(
        listen,
        token,
        receiver,
        export_node_states(root, cluster_states),
        tls=tls,
        max_body=opts.max_body,
    )
    if opts.drift_interval > 0:
        threading.Thread(
            target=drift_loop,
            args=(connected, lock_namespace, receiver.metrics, opts.drift_interval, say),
            daemon=True,
        ).start()
    return server, receiver, root


def drift_loop(
    connected: Callable[[], Any],
    lock_namespace: str,
    metrics: Any,
    interval: float,
    say: Callable[[str], None] = to_stderr,
    sleep: Callable[[float], None] = time.sleep,
    rounds: int | None = None,
) -> None:
    """``rollout nodes``' drift on /configz of every marked Node, every ``interval`` seconds
    (between the end of one round and the start of the next), into ``rollout_node_drifted``; a
    failed round is logged and tried again next time. ``rounds``: stop after that many (None:
    never; the thread is a daemon)."""
    from rollout.fleet.survey import survey

    pace = Poll.every(interval)
    done = 0
    while rounds is None or done < rounds:
        if done:
            sleep(pace.interval(done * interval))
        try:
            metrics.set_drift(survey(connected(), lock_namespace), time.time())
        except (RolloutError, OSError) as e:
            say(f"rollout serve: drift check failed: {e}")
        done += 1
