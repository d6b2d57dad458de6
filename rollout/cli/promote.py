"""``rollout promote``: continue a held canary with the rest of the fleet, in the same change."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import click

from rollout.change.commands.change_options import PromoteOptions
from rollout.change.commands.progress import Progress
from rollout.change.plan.drain_rules import DrainOverrides
from rollout.change.plan.schema import Plan
from rollout.change.record.opening import existing_journal
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
from rollout.errors import InputError, Location
from rollout.gate.assembly import gate_for
from rollout.protocols import Gate

from .options import (
    drain_options,
    force_serving_option,
    inventory_option,
    kube_options,
    output_option,
)

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.change.record.journal import Journal
    from rollout.gate.analysis import Predicted
    from rollout.kube.client import Api
    from rollout.kube.leases import LeaseLock


@click.command("promote")
@change_required
@click.option("--plan", "plan_path", help="The plan (default: the one the change recorded).")
@inventory_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option("--dry-run", is_flag=True, help="Print the remaining batches and change nothing.")
@click.option(
    "--force",
    "force",
    metavar="REASON",
    help="Promote although the canary is not applied, its gate did not pass, its 'after' "
    "evidence failed or is missing, or the device preflight refuses a node (see apply "
    "--force); journaled.",
)
@click.option(
    "--force-window",
    metavar="REASON",
    help="Run outside the plan's change windows; the reason is journaled.",
)
@force_serving_option
@click.option(
    "--no-evidence",
    is_flag=True,
    help="Do not collect the promoted nodes' before/after evidence (evidence.json beside the "
    "journal, beside the canary's).",
)
@click.option(
    "--recreate-workloads",
    is_flag=True,
    help="Once the promoted nodes are applied and their after evidence taken, recreate their "
    "GPU and Guaranteed pods of a controller one controller at a time and collect the "
    "after-recreate evidence, as apply --recreate-workloads does. Journaled. Without it no pod "
    "of yours is recreated.",
)
@click.option(
    "--terminate-claims",
    is_flag=True,
    help="A migration (rollout migrate): consent that the way back to the device plugin lets "
    "the drain terminate pods holding DRA claims on a node, for every node of the change; "
    "recorded in the change record, so resume and a rollback from any machine or the webhook "
    "receiver use it. Once given (to migrate or promote) it stays.",
)
@drain_options
@lock_ns_option
@verify_timeout_option
@forks_option
@progress_option
@output_option
@kube_options
def promote_cmd(
    change: str,
    plan_path: str | None,
    inventory: str | None,
    yes: bool,
    dry_run: bool,
    force: str | None,
    force_window: str | None,
    force_serving: str | None,
    no_evidence: bool,
    recreate_workloads: bool,
    terminate_claims: bool,
    delete_unmanaged: bool,
    delete_emptydir_data: bool,
    capacity_warn_only: bool,
    lock_namespace: str,
    verify_timeout: float,
    forks: int,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Continue a held canary with the rest of the fleet: the same change (id, journal,
    backups), the plan's remaining batches, the gate after each batch when the plan has one,
    change windows respected. Refused (exit 3) unless every canary node is applied, the
    canary's last gate verdict is Successful and its 'after' evidence (collected by apply, or
    `rollout evidence --label after --change ID`) covers every canary node and fails no check;
    --force REASON promotes anyway (journaled). The promoted nodes' before and after evidence is
    collected beside the canary's and journaled (--no-evidence: not).
    `rollout rollback --change ID` then restores every node of the change, canary and fleet.

    \b
    Examples:
      rollout promote --change 20261130T214802Z-a1b2c3 --dry-run
      rollout promote --change 20261130T214802Z-a1b2c3 --yes -o json
      rollout promote --change 20261130T214802Z-a1b2c3 --yes --force "gate had no traffic"
    """
    from rollout.change.commands.promote_change import prepare_promotion, run_promotion
    from rollout.evidence.collecting import ChangeEvidence
    from rollout.kube.client import connect
    from rollout.kube.leases import LeaseLock

    if recreate_workloads and no_evidence:
        raise InputError(
            "--recreate-workloads collects the after-recreate evidence; --no-evidence "
            "contradicts it",
            Location(field="--recreate-workloads"),
        )
    if force_serving is not None and not force_serving.strip():
        raise InputError(
            "--force-serving needs a REASON (it is journaled)", Location(field="--force-serving")
        )
    api = connect(kubeconfig, context)
    journal = existing_journal(change, api, lock_namespace, echo_err)
    lock = LeaseLock(api, lock_namespace)
    if _is_migration(journal):
        _promote_migration(
            api, journal, lock, yes, dry_run, force, force_window, inventory, lock_namespace,
            verify_timeout, forks, progress_mode, output, terminate_claims,
        )  # fmt: skip
        return
    if terminate_claims:
        raise InputError(
            f"change {change} is not a migration: --terminate-claims applies to the way back "
            "of rollout migrate",
            Location(field="--terminate-claims"),
        )
    opts = PromoteOptions(
        plan_path=plan_path,
        inventory=inventory,
        dry_run=dry_run,
        force=force,
        force_window=force_window,
        force_serving=force_serving,
        overrides=DrainOverrides(delete_unmanaged, delete_emptydir_data, capacity_warn_only),
        lock_namespace=lock_namespace,
        verify_timeout=verify_timeout,
        forks=forks,
        recreate_workloads=recreate_workloads,
    )
    promo = prepare_promotion(api, journal, lock, opts)
    for w in promo.prepared.warnings:
        echo_err(f"warning: {w}")
    nodes = promo.nodes
    if dry_run or not nodes:
        if output == "json":
            doc = {"change": change, "batches": [list(b.nodes) for b in promo.remaining]}
            click.echo(json.dumps({**doc, "refusal": promo.refusal, "dryRun": dry_run}, indent=2))
        else:
            for i, b in enumerate(promo.remaining, 1):
                click.echo(f"batch {i}: {', '.join(b.nodes)}")
            if not nodes:
                click.echo(f"change {change}: nothing left to promote")
        return
    confirm(yes, f"promote change {change} to {len(nodes)} more node(s) ({', '.join(nodes)})")

    def make_gate(
        plan: Plan, inv: Inventory, predicted: Predicted | None, progress: Progress
    ) -> Gate:
        return gate_for(plan, api, journal, output, inv, progress.event, lock.interrupt, predicted)

    hooks = ChangeEvidence(
        api, promo.inventory, forks, echo_err, keep_nodes=True, tenancy=promo.plan.tenancy
    )
    final = run_promotion(
        api,
        promo,
        lock,
        make_gate,
        progress=progress_for(progress_mode),
        failed=json_status(output),
        evidence=None if no_evidence else hooks,
    )
    finish(final, output)


def _is_migration(journal: Journal) -> bool:
    from rollout.change.kinds.allocation_path import ALLOCATION_PATH
    from rollout.change.record.replay import status_of

    return status_of(journal).info.kind == ALLOCATION_PATH.name


def _promote_migration(
    api: Api,
    journal: Journal,
    lock: LeaseLock,
    yes: bool,
    dry_run: bool,
    force: str | None,
    force_window: str | None,
    inventory: str | None,
    lock_namespace: str,
    verify_timeout: float,
    forks: int,
    progress_mode: str,
    output: str,
    terminate_claims: bool = False,
) -> None:
    """``promote`` of a held migration (``rollout migrate --canary``): the batches left, the
    DRA pool's gate after each; ``terminate_claims`` (or the consent the change recorded)
    carried by every node promoted and recorded again."""
    from rollout.change.commands.migrate_pool import (
        prepare_migration_promotion,
        run_migration_promotion,
    )
    from rollout.cli.migrate import pool_gate

    promo = prepare_migration_promotion(
        journal, force, dry_run, force_window, inventory, terminate_claims
    )
    nodes = [n for b in promo.remaining for n in b.nodes]
    if dry_run or not nodes:
        if output == "json":
            doc = {"change": journal.change_id, "batches": [list(b.nodes) for b in promo.remaining]}
            more = {"refusal": promo.refusal, "terminateClaims": promo.terminate_claims}
            click.echo(json.dumps({**doc, **more, "dryRun": dry_run}, indent=2))
        else:
            for i, b in enumerate(promo.remaining, 1):
                click.echo(f"batch {i}: {', '.join(b.nodes)}")
            if not nodes:
                click.echo(f"change {journal.change_id}: nothing left to promote")
        return
    confirm(yes, f"promote change {journal.change_id} to {len(nodes)} more node(s)")
    final = run_migration_promotion(
        api,
        lock,
        promo,
        journal,
        lambda j: pool_gate(api, j, promo.plan, promo.inventory, output),
        force=force,
        lock_namespace=lock_namespace,
        verify_timeout=verify_timeout,
        forks=forks,
        progress=progress_for(progress_mode),
        say=echo_err,
    )
    finish(final, output)


COMMANDS = [promote_cmd]
