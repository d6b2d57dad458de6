"""``rollout rollback``: put a change's nodes back, or hand the rollback to the change's owner."""

from __future__ import annotations

import json

import click

from rollout.change.record.change_outcomes import ChangeOutcome, exit_code
from rollout.errors import NodeOperationError

from .options import inventory_option, kube_options, output_option
from .wiring import (
    change_required,
    confirm,
    echo_err,
    finish,
    forks_option,
    json_status,
    lock_ns_option,
    progress_for,
    progress_option,
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
    from rollout.change.commands.session import RollbackRequest, roll_back
    from rollout.kube.client import connect

    confirm(yes, f"roll back change {change}")
    request = RollbackRequest(
        change=change,
        nodes=nodes,
        requested_by=requested_by or "",
        force=force,
        wait=not no_wait,
        wait_timeout=wait_timeout,
        inventory=inventory,
        lock_namespace=lock_namespace,
        verify_timeout=verify_timeout,
        forks=forks,
    )
    result = roll_back(
        connect(kubeconfig, context),
        request,
        progress=progress_for(progress_mode),
        failed=json_status(output),
        say=echo_err,
    )
    if result.status is not None and result.handed_to is None:
        finish(result.status, output)  # exits as docs/exit-codes.md's rollback column says
        return
    if output == "json":
        click.echo(json.dumps(result.to_dict(), indent=2))
    elif result.outcome is ChangeOutcome.HANDED_OVER:
        click.echo("handed over")
    else:
        click.echo(f"change {change}: {result.outcome} by {result.handed_to}")
        click.echo(f"  {result.message}")
    if exit_code(result.outcome, rollback=True) != 0:
        who = f"the owner {result.handed_to} reported" if result.handed_to else "the rollback ended"
        raise NodeOperationError(f"{who} {result.outcome}: {result.message}")


COMMANDS = [rollback_cmd]
