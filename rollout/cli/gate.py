"""``rollout watch`` and ``rollout serve``: the gate on its own, and the external rollback trigger.

Thin: parse, build the gate from its parts (``rollout.gate.soaking``, ``rollout.kube.*``), print. A
Failed verdict or an alert rolls back in this process through ``rollout.change.session.roll_back``,
the call ``rollout rollback`` makes, so there is exactly one rollback path whoever pulls the
trigger.
"""

from __future__ import annotations

import functools
import json
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import click

from rollout.change.journal import Kind
from rollout.change.outcomes import GATE_HOLDS_EXIT, ChangeOutcome, exit_code
from rollout.cli.options import kube_options, output_option
from rollout.errors import InputError, Location, NodeOperationError, RolloutError
from rollout.gate.analysis import GateConfig, parse_gate_config
from rollout.gate.assembly import build_soak_gate
from rollout.verdicts import Outcome


def cli_rollback(
    change_id: str,
    nodes: Sequence[str] | None,
    reason: str,
    kube: KubeTarget,
    wait: bool = True,
) -> str:
    """Trigger a rollback in this process, as ``rollout rollback`` runs it
    (``rollout.change.session.roll_back``: the same request, hand-over and restore path).
    ``reason`` is who asks, as the change's owner reports it. While a live process owns the
    change, the rollback is handed to it; with ``wait`` False this returns once handed over.
    The inventory is the one the change recorded, or ``$ROLLOUT_INVENTORY``.

    Returns:
        ``handed-over`` (the owner was handed the request and did not report yet) or
        ``rolled-back``.

    Raises:
        RolloutError: the rollback failed (a node could not be restored, the owner reported a
            failed rollback, another process took the Lease); the message says which.
    """
    import os

    from rollout.change.session import RollbackRequest, roll_back

    click.echo(f"rollback of {change_id} ({', '.join(nodes) if nodes else 'all nodes'}): {reason}")
    request = RollbackRequest(
        change=change_id,
        nodes=tuple(nodes or ()),
        requested_by=reason,
        wait=wait,
        inventory=os.environ.get("ROLLOUT_INVENTORY") or None,
        lock_namespace=kube.lock_namespace,
    )
    result = roll_back(kube.connect(), request, say=lambda m: click.echo(m, err=True))
    if result.outcome is ChangeOutcome.HANDED_OVER:
        return ChangeOutcome.HANDED_OVER.value
    if exit_code(result.outcome, rollback=True) != 0:
        raise NodeOperationError(
            f"rollback of {change_id} ended {result.outcome}: {result.message}"
        )
    return ChangeOutcome.ROLLED_BACK.value


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


def _gate_config(plan_file: str | None) -> GateConfig:
    if not plan_file:
        return GateConfig()
    from rollout.change.plan import load_plan

    plan = load_plan(plan_file)
    return parse_gate_config(plan.gate or None, file=plan.path, line_of=plan.line_of)


def _change_nodes(change_id: str, api: Any, lock_namespace: str) -> tuple[list[str], float, Any]:
    from rollout.change.record import existing_journal, mirrored
    from rollout.change.replaying import replay

    journal = mirrored(existing_journal(change_id, api, lock_namespace), api, lock_namespace)
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


@click.command("watch")
@click.option("--change", "change_id", required=True, help="The change to watch (its id).")
@click.option(
    "--plan",
    "plan_file",
    envvar="ROLLOUT_PLAN",
    type=click.Path(dir_okay=False),
    help="Plan file whose gate: section configures the gate (default: $ROLLOUT_PLAN).",
)
@click.option("--control", multiple=True, help="A control-group node (unchanged); repeatable.")
@click.option("--no-rollback", is_flag=True, help="Report a Failed verdict, do not roll back.")
@click.option("--listen", help="Also serve /metrics and the webhook on HOST:PORT.")
@click.option("--token-file", type=click.Path(dir_okay=False), help="Bearer token for --listen.")
@click.option(
    "--lock-namespace",
    default="kube-system",
    show_default=True,
    help="Namespace of the rollout-lock Lease (the change's owner is found there).",
)
@kube_options
@output_option
def watch(
    change_id: str,
    plan_file: str | None,
    control: tuple[str, ...],
    no_rollback: bool,
    listen: str | None,
    token_file: str | None,
    lock_namespace: str,
    kubeconfig: str | None,
    context: str | None,
    output: str,
) -> None:
    """Run the rejection-rate gate on a change that is already applied.

    Soaks for gate.soak, evaluating every gate.interval over gate.window. Failed rolls back the
    affected nodes (or the group, by gate.onFailure); Inconclusive and Error hold and say what they
    wait for (exit 8). Every verdict goes to the journal and as an Event on each node.

    \b
    Examples:
      rollout watch --change 20261130-1200-ab12cd
      rollout watch --change 20261130-1200-ab12cd --control lab-4 -o json
    """
    from rollout.gate.serve import AlertReceiver, GateMetrics, make_server, parse_listen, read_token
    from rollout.gate.soaking import rollback_targets
    from rollout.models import Phase

    cfg = _gate_config(plan_file)
    kube = KubeTarget(kubeconfig, context, lock_namespace)
    api = kube.connect()
    nodes, started, journal = _change_nodes(change_id, api, lock_namespace)
    trigger = functools.partial(cli_rollback, kube=kube, wait=False)

    def record(kind: str, data: Any) -> None:
        journal.append(kind, Phase.DONE, now=datetime.now(UTC), data=data)

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
    targets = rollback_targets(verdict, cfg, nodes)
    if output == "json":
        click.echo(json.dumps({"change": change_id, **verdict.as_dict(), "rollback": targets}))
    else:
        click.echo(f"{verdict.status}: {verdict.reason}")
        if verdict.waiting_for:
            click.echo(f"holding: waiting for {verdict.waiting_for}")
    if verdict.status is Outcome.FAILED:
        if no_rollback:
            raise NodeOperationError(f"gate Failed; not rolled back (--no-rollback): {targets}")
        record(Kind.TRIGGER, {"trigger": "gate", "nodes": targets, "reason": verdict.reason})
        metrics.rollbacks.labels(trigger="gate").inc()
        cli_rollback(change_id, targets, "rollout watch: gate Failed", kube)
        raise NodeOperationError(f"gate Failed; rolled back {', '.join(targets)}")
    if verdict.holds:
        sys.exit(GATE_HOLDS_EXIT)


@click.command("serve")
@click.option("--listen", required=True, help="HOST:PORT to listen on, e.g. 127.0.0.1:9099.")
@click.option(
    "--token-file",
    required=True,
    type=click.Path(dir_okay=False),
    help="File holding the bearer token webhook callers must send.",
)
@click.option(
    "--lock-namespace",
    default="kube-system",
    show_default=True,
    help="Namespace of the rollout-lock Lease (the change's owner is found there).",
)
@click.option(
    "--drift-interval",
    type=float,
    default=300.0,
    show_default=True,
    help="Seconds between drift checks of every marked Node (rollout_node_drifted); 0: none.",
)
@output_option
@kube_options
def serve(
    listen: str,
    token_file: str,
    lock_namespace: str,
    drift_interval: float,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Accept Alertmanager webhooks that roll back the change owning the alert's node; serve
    /metrics.

    POST /webhook (Alertmanager webhook_config) or /api/v2/alerts with
    "Authorization: Bearer <token>". An alert's label node names the node: the change that owns
    it now (the newest change that touched it and whose files are on it; the change the Node's
    rollout.dev/change label names is fetched from the cluster record into $ROLLOUT_STATE_DIR
    first, so no disk is shared with the machine that applied) is rolled back on that node, or
    on its batch when the plan says onFailure: rollback-group. An alert with label change_id
    rolls back that change. Alerts for nodes no change owns: 200, logged, counted, nothing
    changed. Without the token: 401, nothing happens.
    The same alert twice, or a second alert for a node already rolled back, rolls back once.
    Each rollback is journaled as a trigger record naming the alert. While a process owns the
    change (apply, promote, resume), the rollback is handed to it and the webhook answers
    "handed-over" at once; otherwise this server runs the rollback (with its --kubeconfig /
    --context / --lock-namespace) and answers "rolled-back" when it is done.
    With -o json the start-up line is one JSON object on stdout ({"listen", "port", "endpoints"}).

    \b
    Examples:
      rollout serve --listen 127.0.0.1:9099 --token-file /etc/rollout/webhook-token
      rollout serve --listen 127.0.0.1:0 --token-file token -o json --context prod-east
    """
    from rollout.change.journal import state_dir
    from rollout.change.record import existing_journal, mirrored
    from rollout.gate.owning import JournalOwners, export_node_states, journal_recorder
    from rollout.gate.serve import AlertReceiver, make_server, parse_listen, read_token

    kube = KubeTarget(kubeconfig, context, lock_namespace)
    trigger = functools.partial(cli_rollback, kube=kube, wait=False)
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

    def opener(change_id: str) -> Any:
        return mirrored(
            existing_journal(change_id, connected(), lock_namespace), connected(), lock_namespace
        )

    def cluster_states() -> Any:
        from rollout.kube.mirror import node_states as labelled

        return labelled(connected())

    receiver = AlertReceiver(
        trigger,
        owners=JournalOwners(root, lease, refresh),
        record=journal_recorder(root, opener),
        log=lambda m: click.echo(f"rollout serve: {m}", err=True),
    )
    server = make_server(
        parse_listen(listen),
        read_token(token_file),
        receiver,
        export_node_states(root, cluster_states),
    )
    if drift_interval > 0:
        threading.Thread(
            target=_drift_loop,
            args=(connected, lock_namespace, receiver.metrics, drift_interval),
            daemon=True,
        ).start()
    port = server.server_address[1]
    host = listen.rpartition(":")[0]
    if output == "json":
        endpoints = ["POST /webhook", "POST /api/v2/alerts", "GET /metrics", "GET /healthz"]
        doc = {"listen": f"{host}:{port}", "port": port, "endpoints": endpoints}
        click.echo(json.dumps(doc), nl=True)
        sys.stdout.flush()
    else:
        click.echo(
            f"rollout serve: listening on {host}:{port} (POST /webhook, GET /metrics); "
            f"journals in {root}",
            err=True,
        )
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _drift_loop(
    connected: Callable[[], Any], lock_namespace: str, metrics: Any, interval: float
) -> None:
    """``rollout nodes``' drift on /configz of every marked Node, every ``interval`` seconds,
    into ``rollout_node_drifted``; a failed round is logged and tried again next time."""
    from rollout.change.fleet import survey

    while True:
        try:
            metrics.set_drift(survey(connected(), lock_namespace), time.time())
        except (RolloutError, OSError) as e:
            click.echo(f"rollout serve: drift check failed: {e}", err=True)
        time.sleep(interval)


COMMANDS = [watch, serve]
