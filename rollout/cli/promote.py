"""``rollout promote``: continue a held canary with the rest of the fleet, in the same change."""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

import click

from rollout.change.journal import Journal, Kind
from rollout.change.orchestrator import ROLLBACK_INFO
from rollout.change.outcomes import ChangeOutcome
from rollout.change.plan import load_plan
from rollout.change.planning import DrainOverrides
from rollout.change.previewing import predicted_rejections
from rollout.change.record import existing_journal, mirrored
from rollout.change.replaying import ChangeStatus, replay
from rollout.change.session import (
    OVERRIDES_STEP,
    holding,
    info_path,
    intent_digest,
    open_context,
    run_preflight,
)
from rollout.change.windows import guard, parse_windows
from rollout.cli.collect import evidence_refusal
from rollout.cli.gate import gate_config
from rollout.cli.wiring import (
    change_required,
    confirm,
    echo_err,
    forks_option,
    gate_for,
    lock_ns_option,
    print_status,
    progress_for,
    progress_option,
    reported_failure,
    verify_timeout_option,
)
from rollout.errors import PreflightError
from rollout.models import Phase

from .options import drain_options, inventory_option, kube_options, output_option


def last_gate(journal: Journal) -> Mapping[str, Any] | None:
    """The last ``gate`` entry's data (``status``, ``reason``, ``nodes``), or None."""
    gates = [e for e in journal.entries() if e.step == Kind.GATE and e.phase is Phase.DONE]
    return gates[-1].data if gates else None


def promote_refusal(status: ChangeStatus, gate: Mapping[str, Any] | None) -> str | None:
    """Why a change may not be promoted without ``--force`` (pure), or None when it may."""
    from rollout.models import NodeState

    if status.outcome == ChangeOutcome.RUNNING:
        return (
            f"change {status.change} is running or was interrupted (no end recorded); "
            f"`rollout resume --change {status.change} --yes` settles it first"
        )
    canary = [n for b in status.info.get("batches", ()) for n in b]
    not_applied = [n for n in canary if status.nodes[n].state is not NodeState.APPLIED]
    if not_applied:
        states = ", ".join(f"{n}: {status.nodes[n].state.value}" for n in not_applied)
        return f"the canary is not applied ({states})"
    if gate is None or gate.get("status") != "Successful":
        what = f"{gate.get('status')}: {gate.get('reason')}" if gate else "no gate verdict"
        return f"the canary's last gate verdict is not Successful ({what})"
    return None


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
    --force REASON promotes anyway (journaled).
    `rollout rollback --change ID` then restores every node of the change, canary and fleet.

    \b
    Examples:
      rollout promote --change 20261130T214802Z-a1b2c3 --dry-run
      rollout promote --change 20261130T214802Z-a1b2c3 --yes -o json
      rollout promote --change 20261130T214802Z-a1b2c3 --yes --force "gate had no traffic"
    """
    from rollout.change.orchestrator import continue_change
    from rollout.change.planning import Batch
    from rollout.change.preparing import read_inventory
    from rollout.kube.client import connect
    from rollout.kube.leases import LeaseLock, holder_identity
    from rollout.models import NodeState

    api = connect(kubeconfig, context)
    journal = existing_journal(change, api, lock_namespace)
    status = replay(journal.entries(), journal.change_id)
    refusal = promote_refusal(status, last_gate(journal))
    if refusal is None:
        canary = [n for b in status.info.get("batches", ()) for n in b]
        refusal = evidence_refusal(journal.entries(), canary)
    if refusal and status.outcome == ChangeOutcome.RUNNING:
        raise PreflightError(refusal)
    if refusal and not force:
        raise PreflightError(
            f"not promoting change {change}: {refusal}; --force REASON to override"
        )
    plan = load_plan(str(info_path(journal, "plan", plan_path)))
    recorded = status.info.get("intentSha256")
    if recorded and recorded != intent_digest(plan):
        raise PreflightError(
            f"the plan {plan.path} renders another intent than change {change} applied to its "
            "canary (kubelet settings or node overrides changed); start a new change instead"
        )
    window_check = guard(
        parse_windows(plan.windows, file=plan.path, line_of=plan.line_of), force_window
    )
    if not dry_run and not (window := window_check(datetime.now(UTC))).allowed:
        raise PreflightError(window.reason)
    inv = read_inventory(info_path(journal, "inventory", inventory))
    lock = LeaseLock(api, lock_namespace)
    lock.check()
    overrides = DrainOverrides(delete_unmanaged, delete_emptydir_data, capacity_warn_only)
    done = {n for n, s in status.nodes.items() if s.state is not NodeState.PENDING}
    prepared = run_preflight(
        plan,
        inv,
        api,
        False,
        forks=forks,
        force=force is not None,
        overrides=overrides,
        settled=done,
    )
    for w in prepared.warnings:
        echo_err(f"warning: {w}")
    remaining = [
        Batch(tuple(n for n in b.nodes if n not in done), False)
        for b in prepared.batches
        if any(n not in done for n in b.nodes)
    ]
    nodes = [n for b in remaining for n in b.nodes]
    if dry_run or not nodes:
        if output == "json":
            doc = {"change": change, "batches": [list(b.nodes) for b in remaining]}
            click.echo(json.dumps({**doc, "refusal": refusal, "dryRun": dry_run}, indent=2))
        else:
            for i, b in enumerate(remaining, 1):
                click.echo(f"batch {i}: {', '.join(b.nodes)}")
            if not nodes:
                click.echo(f"change {change}: nothing left to promote")
        return
    confirm(yes, f"promote change {change} to {len(nodes)} more node(s) ({', '.join(nodes)})")
    all_nodes = list(dict.fromkeys([*status.nodes, *nodes]))
    batches = [list(b.nodes) for b in remaining]
    promotion = {
        "by": holder_identity(),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "batches": batches,
        "forced": force if refusal or prepared.forced else None,
        "refusal": refusal,
        "forcedRefusals": list(prepared.forced),
    }
    info = {
        **{k: v for k, v in status.info.items() if k != ROLLBACK_INFO},  # a new part, no rollback
        "nodes": all_nodes,
        "batches": [*status.info.get("batches", ()), *batches],
        "canaryOnly": False,
        "promotion": promotion,
    }
    with holding(lock, journal.change_id):
        mirrored(journal, api, lock_namespace)
        if overrides.used():  # what this part's drains may lose, and which pods that is
            journal.append(
                OVERRIDES_STEP,
                Phase.DONE,
                now=datetime.now(UTC),
                data={"flags": overrides.used(), "pods": list(prepared.losses)},
            )
        progress = progress_for(progress_mode)
        progress.nodes(tuple(all_nodes))
        ctx = open_context(
            api,
            journal,
            inv.path,
            prepared.strategy.drain,
            verify_timeout,
            progress,
            inv.hostvars,
            forks,
        )
        ctx.interrupt = lock.interrupt
        has_gate = gate_config(plan) is not None
        predicted = predicted_rejections(prepared.previews)
        gate = gate_for(plan, api, journal, output, inv, progress.event, lock.interrupt, predicted)
        with reported_failure(journal, lock, output):
            final = continue_change(
                ctx,
                prepared.changes,
                remaining,
                gate if has_gate else None,
                info,
                forward=window_check,
            )
    print_status(final, output)


COMMANDS = [promote_cmd]
