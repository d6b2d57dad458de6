"""``rollout resume``: finish an interrupted change (nodes in flight, a cut gate, later batches)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from rollout.change.commands.change_options import ChangeOptions
from rollout.change.commands.session import settle
from rollout.change.engine.context import Context
from rollout.change.plan.schema import Plan
from rollout.change.record.replay import ChangeStatus
from rollout.cli.wiring import (
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
from rollout.errors import RolloutError
from rollout.gate.assembly import gate_for
from rollout.protocols import Gate, Lock

from .options import inventory_option, kube_options, output_option

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.gate.analysis import Predicted


@click.command("resume")
@change_required
@inventory_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option(
    "--dry-run",
    is_flag=True,
    help="Say what resume would do (each node in flight, a rollback or gate owed, the batches "
    "left), decided from the journal as resume decides; take no Lease and change nothing.",
)
@lock_ns_option
@verify_timeout_option
@forks_option
@progress_option
@output_option
@kube_options
def resume_cmd(
    change: str,
    inventory: str | None,
    yes: bool,
    dry_run: bool,
    lock_namespace: str,
    verify_timeout: float,
    forks: int,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Finish an interrupted change: each node in flight is finished or restored (a node caught
    before any file was written gets its cordon undone and runs again in its batch), a gate the
    crash cut short is soaked again, then the batches the interrupted apply or promote had not
    started yet are run (with the gate where that command would have run it), unless a node had
    failed (the change had stopped). An interrupted rollback (`rollout rollback`, or one handed
    to the change's owner) is finished instead: every node it names ends restored.

    \b
    Examples:
      rollout resume --change 20261130T214802Z-a1b2c3 --yes
      rollout resume --change 20261130T214802Z-a1b2c3 --yes -o json --progress plain
      rollout resume --change 20261130T214802Z-a1b2c3 --dry-run
    """
    if dry_run:
        _preview(change, lock_namespace, output, kubeconfig, context)
        return
    from rollout.change.commands.session import resume_change
    from rollout.kube.client import connect

    confirm(yes, f"resume change {change}")
    api = connect(kubeconfig, context)

    def work(ctx: Context, _lock: Lock) -> ChangeStatus:
        def make_gate(plan: Plan, inv: Inventory, predicted: Predicted | None) -> Gate:
            if ctx.kind is not None and ctx.kind.name == "allocation-path":
                # a migration's gate: the DRA pool's signals over the plan's, as migrate and
                # promote wire it (never the plain gate alone)
                from rollout.cli.migrate import pool_gate

                return pool_gate(api, ctx.journal, plan, inv, output, ctx.on_event, ctx.interrupt)
            gate = gate_for(
                plan, api, ctx.journal, output, inv, ctx.on_event, ctx.interrupt, predicted
            )
            cfg = plan.gate
            if cfg is None or cfg.bench is None:
                return gate
            from rollout.bench.canary_gate import resumed_gate

            # the canary's gate as apply wired it: the soak, then the benchmark (gate.bench)
            group = str(cfg.on_failure) == "rollback-group"
            return resumed_gate(gate, cfg.bench, ctx.journal, inv, api, group, ctx.on_event)

        return resume_change(ctx, api, inventory, make_gate)

    status = settle(
        api,
        change,
        work,
        ChangeOptions(lock_namespace=lock_namespace, verify_timeout=verify_timeout, forks=forks),
        inventory=inventory,
        progress=progress_for(progress_mode),
        failed=json_status(output),
        say=echo_err,
    )
    finish(status, output)


def _preview(
    change: str, lock_namespace: str, output: str, kubeconfig: str | None, context: str | None
) -> None:
    """``--dry-run``: the journal (fetched or brought up to date from the cluster record when a
    kubeconfig loads) and what resume would do with it, printed."""
    import json

    from rollout.change.engine.resumption import resume_preview
    from rollout.change.plan.schema import recorded_plan
    from rollout.change.record.opening import existing_journal
    from rollout.change.record.replay import replay

    from .record import optional_api

    journal = existing_journal(change, optional_api(kubeconfig, context), lock_namespace, echo_err)
    entries = journal.entries()
    info = replay(entries, journal.change_id).info
    try:
        plan = recorded_plan(info, journal.change_id)
    except RolloutError as e:  # resume names it too, when it reaches the later batches
        echo_err(f"warning: the change's plan does not load: {e}")
        plan = None
    preview = resume_preview(entries, journal.change_id, plan is not None and plan.has_gate)
    if output == "json":
        click.echo(json.dumps({"dryRun": True, **preview.to_dict()}, indent=2))
        return
    click.echo(
        f"change {preview.change} ({preview.outcome}); resume would (dry run, nothing done):"
    )
    for n, (state, action) in preview.nodes.items():
        click.echo(f"  {n} ({state}): {action}")
    if not preview.nodes:
        click.echo("  no node in flight")
    if preview.rerun:
        click.echo(f"  run again in their batch (cut before any write): {', '.join(preview.rerun)}")
    if preview.gate is not None:
        click.echo(f"  soak the gate owed over {', '.join(preview.gate)} first")
    for i, b in enumerate(preview.batches, 1):
        click.echo(f"  then batch {i}/{len(preview.batches)}: {', '.join(b)}")
    if preview.stops:
        click.echo(f"  no later batch: {preview.stops}")


COMMANDS = [resume_cmd]
