"""``rollout rollback``: put a change's nodes back, or hand the rollback to the change's owner."""

from __future__ import annotations

import json
import time
from typing import Any

import click

from rollout.change.orchestrator import rollback
from rollout.errors import NodeOperationError

from .options import inventory_option, kube_options, output_option
from .wiring import (
    change_required,
    confirm,
    echo_err,
    forced_context,
    forks_option,
    lock_ns_option,
    progress_option,
    settle_command,
    verify_timeout_option,
)


@click.command("rollback")
@change_required
@click.option("--node", "nodes", multiple=True, help="Only these nodes (repeatable).")
@inventory_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option(
    "--no-wait",
    is_flag=True,
    help="When a running process owns the change, return once the request is handed to it.",
)
@click.option(
    "--wait-timeout",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds to wait for the owner to report the rollback it was handed.",
)
@click.option(
    "--requested-by",
    metavar="TEXT",
    help="Who asks, as the change's owner reports it (default: user@host pid N).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Also overwrite node files that changed after this change wrote them (without it, "
    "such a node's restore is refused naming the file).",
)
@lock_ns_option
@verify_timeout_option
@forks_option
@progress_option
@output_option
@kube_options
def rollback_cmd(
    change: str,
    nodes: tuple[str, ...],
    inventory: str | None,
    yes: bool,
    no_wait: bool,
    wait_timeout: float,
    requested_by: str | None,
    force: bool,
    lock_namespace: str,
    verify_timeout: float,
    forks: int,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Put the change's nodes back byte for byte: cordon, drain, restore the journaled files,
    restart, verify against the previous config, uncordon only what this change cordoned.

    While the process that runs the change is alive (it holds the rollout-lock Lease), the
    rollback is handed to it: it stops forward work at once, rolls back, and reports here; this
    command waits for that (exit 0 when the rollback completed). When no live process owns the
    change, this command takes the Lease and rolls back itself.

    \b
    Examples:
      rollout rollback --change 20261130T214802Z-a1b2c3 --yes
      rollout rollback --change 20261130T214802Z-a1b2c3 --node gpu-7 --yes -o json
      rollout rollback --change 20261130T214802Z-a1b2c3 --yes --no-wait
      rollout rollback --change 20261130T214802Z-a1b2c3 --node gpu-7 --force --yes
    """
    from rollout.kube.client import connect
    from rollout.kube.leases import hand_over, holder_identity, wait_outcome

    confirm(yes, f"roll back change {change}")
    api = connect(kubeconfig, context)
    by = requested_by or holder_identity()
    requested_at = time.time()
    handed = hand_over(api, lock_namespace, change, list(nodes) or None, by, force)
    if handed is not None:
        echo_err(
            f"change {change} is owned by {handed.owner}: rollback handed to it "
            f"(request {handed.request.id}{', --force' if handed.request.force else ''})"
        )
        if handed.request.force != force:
            echo_err(
                "warning: joined a pending request "
                + ("with --force" if handed.request.force else "without --force")
                + "; the first request decides whether edited files are overwritten"
            )
        result: dict[str, Any] = {
            "change": change,
            "handedTo": handed.owner,
            "request": handed.request.id,
            "nodes": list(handed.request.nodes) if handed.request.nodes else None,
            "force": handed.request.force,
            "requestedAt": requested_at,
        }
        if no_wait:
            result["outcome"] = "handed-over"
            click.echo(json.dumps(result, indent=2) if output == "json" else "handed over")
            return
        outcome = wait_outcome(api, lock_namespace, handed, wait_timeout, echo_err)
        if outcome is not None:
            result.update(outcome=outcome.get("outcome"), message=outcome.get("message"))
            if output == "json":
                click.echo(json.dumps(result, indent=2))
            else:
                click.echo(f"change {change}: {outcome.get('outcome')} by {handed.owner}")
                click.echo(f"  {outcome.get('message')}")
            if outcome.get("outcome") != "rolled-back":
                raise NodeOperationError(
                    f"the owner {handed.owner} reported {outcome.get('outcome')}: "
                    f"{outcome.get('message')}"
                )
            return
        echo_err(
            f"{handed.owner} released the change without acting on the request; rolling back here"
        )
    settle_command(
        change,
        inventory,
        lock_namespace,
        verify_timeout,
        output,
        kubeconfig,
        context,
        lambda ctx, _lock: rollback(forced_context(ctx, force), list(nodes) or None, force),
        progress_mode,
        forks,
    )


COMMANDS = [rollback_cmd]
