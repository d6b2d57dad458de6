"""``rollout watch`` and ``rollout serve``: parse, call ``rollout.gate.trigger``, print.

The soak over an applied change, the webhook server and the rollback either pulls live in
``rollout.gate.trigger``; a Failed verdict or an alert rolls back in this process through the
call ``rollout rollback`` makes.
"""

from __future__ import annotations

import json
import sys

import click

from rollout.change.record.change_outcomes import GATE_HOLDS_EXIT
from rollout.cli.options import kube_options, output_option
from rollout.errors import NodeOperationError
from rollout.verdicts import Outcome


def _err(msg: str) -> None:
    click.echo(msg, err=True)


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
    wait for (exit 8). Every verdict goes to the journal and as an Event on each node. The
    journal has one writer: while a process owns the change (holds its Lease), watch hands the
    entry to it; otherwise watch takes the Lease for the write.

    \b
    Examples:
      rollout watch --change 20261130-1200-ab12cd
      rollout watch --change 20261130-1200-ab12cd --control lab-4 -o json
    """
    from rollout.gate.trigger import KubeTarget, Watched, watch_change, watch_config

    cfg = watch_config(plan_file)
    kube = KubeTarget(kubeconfig, context, lock_namespace)

    def decided(w: Watched) -> None:
        if output == "json":
            doc = {"change": change_id, **w.verdict.as_dict(), "rollback": w.targets}
            click.echo(json.dumps(doc))
        else:
            click.echo(f"{w.verdict.status}: {w.verdict.reason}")
            if w.verdict.waiting_for:
                click.echo(f"holding: waiting for {w.verdict.waiting_for}")

    done = watch_change(
        change_id,
        cfg,
        kube,
        control,
        listen,
        token_file,
        output,
        no_rollback,
        say=_err,
        decided=decided,
    )
    verdict, targets = done.verdict, done.targets
    if verdict.status is Outcome.FAILED:
        if no_rollback:
            raise NodeOperationError(f"gate Failed; not rolled back (--no-rollback): {targets}")
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
    "--tls-cert-file",
    type=click.Path(dir_okay=False),
    help="Serve HTTPS with this certificate chain (PEM); needs --tls-key-file.",
)
@click.option(
    "--tls-key-file",
    type=click.Path(dir_okay=False),
    help="The private key (PEM) of --tls-cert-file.",
)
@click.option(
    "--max-body-bytes",
    type=click.IntRange(min=1024),
    default=1 << 20,
    show_default=True,
    help="Larger request bodies are answered 413 and never read.",
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
    tls_cert_file: str | None,
    tls_key_file: str | None,
    max_body_bytes: int,
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
    rolls back that change.
    The webhook answers at once: 202 with a trigger id per rollback started (journaled as a
    trigger record naming the alert), which runs in the background; GET /triggers/ID (with the
    token) and rollout status show how it ended. While a process owns the change (apply,
    promote, resume) the rollback is handed to it; otherwise this server runs it (with its
    --kubeconfig / --context / --lock-namespace), under the change's Lease, so two replicas
    given one alert roll back once. The trigger record and its outcome are written the same
    way: by the owner, handed to it, or under the Lease by this server.
    The same alert twice, or a second alert for a node already rolled back: 200, nothing more.
    Refused, nothing changed: 401 without the token (before the body is read); 413 for a body
    over --max-body-bytes (not read); 411 without Content-Length; 400 naming the field for a
    body that is truncated, not UTF-8, not JSON, or not Alertmanager's payload (unknown fields,
    wrong types, a change_id that is not a change id); 422 for an alert on a node no change
    owns, or naming no node and no change.
    SIGTERM: new alerts get 503 (Alertmanager retries them) while the rollbacks under way
    finish; then the server exits. A rollback cut short by SIGKILL is finished by
    rollout resume. With --tls-cert-file / --tls-key-file the server speaks HTTPS only.
    With -o json the start-up line is one JSON object on stdout ({"listen", "port", "endpoints"}).

    \b
    Examples:
      rollout serve --listen 127.0.0.1:9099 --token-file /etc/rollout/webhook-token
      rollout serve --listen 0.0.0.0:9099 --token-file t --tls-cert-file c.pem --tls-key-file k.pem
      rollout serve --listen 127.0.0.1:0 --token-file token -o json --context prod-east
    """
    import signal
    import threading

    from rollout.gate.trigger import KubeTarget, ServeOptions, alert_server

    kube = KubeTarget(kubeconfig, context, lock_namespace)
    opts = ServeOptions(
        listen, token_file, tls_cert_file, tls_key_file, max_body_bytes, drift_interval
    )
    server, receiver, root = alert_server(opts, kube, say=_err)
    port = server.server_address[1]
    host = listen.rpartition(":")[0]
    scheme = "https" if tls_cert_file else "http"
    if output == "json":
        endpoints = [
            "POST /webhook",
            "POST /api/v2/alerts",
            "GET /triggers/ID",
            "GET /metrics",
            "GET /healthz",
        ]
        doc = {"listen": f"{host}:{port}", "port": port, "scheme": scheme, "endpoints": endpoints}
        click.echo(json.dumps(doc), nl=True)
        sys.stdout.flush()
    else:
        _err(
            f"rollout serve: listening on {host}:{port} ({scheme}; POST /webhook, GET /metrics); "
            f"journals in {root}"
        )

    def drain_then_stop() -> None:
        running = [r for r in receiver.runs() if r.state == "running"]
        _err(
            f"rollout serve: stopping: new alerts get 503; waiting for {len(running)} "
            "rollback(s) under way"
        )
        receiver.drain()
        server.shutdown()

    def on_term(_signum: int, _frame: object) -> None:
        threading.Thread(target=drain_then_stop, name="drain", daemon=True).start()

    signal.signal(signal.SIGTERM, on_term)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        receiver.drain()
    finally:
        server.server_close()
    _err("rollout serve: stopped; no rollback left under way")


COMMANDS = [watch, serve]
