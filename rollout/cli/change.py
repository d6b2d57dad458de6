"""``rollout apply`` and ``status``: thin commands over the orchestrator.

Parse options, build the adapters (``wiring``: API client, Lease lock, playbook runner, journal),
call the core, print. ``promote``, ``resume`` and ``rollback`` live in modules of their own.
Errors become exit codes in ``rollout.cli`` (see docs/exit-codes.md).
"""

from __future__ import annotations

import json
import sys
import threading
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from rollout.change.journal import Journal, Kind, new_change_id, state_dir
from rollout.change.orchestrator import run_change
from rollout.change.outcomes import GATE_HOLDS_EXIT
from rollout.change.plan import load_plan
from rollout.change.planning import DrainOverrides, parse_strategy
from rollout.change.previewing import predicted_rejections, render_text
from rollout.change.record import existing_journal, mirrored
from rollout.change.replaying import replay
from rollout.change.session import (
    OVERRIDES_STEP,
    FactsGathering,
    holding,
    intent_digest,
    open_context,
    run_preflight,
)
from rollout.change.windows import guard, parse_windows
from rollout.cli.gate import gate_config
from rollout.cli.wiring import (
    confirm,
    echo_err,
    forks_option,
    gate_for,
    inventory_path,
    lock_ns_option,
    print_status,
    progress_for,
    progress_option,
    reported_failure,
    verify_timeout_option,
)
from rollout.errors import InputError, Location, PreflightError
from rollout.fanout import DEFAULT_FORKS
from rollout.models import NodeState, Phase

from .options import drain_options, inventory_option, kube_options, output_option, plan_option
from .record import optional_api

__all__ = ["COMMANDS"]


def _import_kube() -> None:
    import rollout.change.preparing
    import rollout.kube.canaries
    import rollout.kube.leases  # noqa: F401


def _collect(
    journal: Journal,
    label: str,
    api: Any,
    inv: Any,
    nodes: list[str],
    raw_facts: Any = None,
    forks: int = DEFAULT_FORKS,
) -> tuple[Any, str | None]:
    """Collect ``label`` evidence of ``nodes`` into ``evidence.json`` beside the journal (at
    most ``forks`` hosts at once): the collection, or None and why it failed (a failed
    collection never stops the change)."""
    from rollout.evidence.collecting import collect
    from rollout.evidence.report import EVIDENCE_FILE

    try:
        target = journal.dir / EVIDENCE_FILE
        return collect(label, api, inv, nodes, target, raw_facts, forks=forks), None
    except Exception as e:
        return None, str(e) or type(e).__name__


def _journal_evidence(
    journal: Journal, label: str, nodes: list[str], collected: tuple[Any, str | None]
) -> None:
    """Journal what a collection showed and say it (a warning when it was not collected)."""
    from rollout.evidence.collecting import describe, journal_evidence
    from rollout.evidence.report import EVIDENCE_FILE

    collection, error = collected
    target = journal.dir / EVIDENCE_FILE
    data = journal_evidence(journal, label, nodes, target, collection, error)
    echo_err(f"warning: {describe(data)}" if error else describe(data))


def journal_consents(journal: Journal, prepared: Any, force: str | None, now: datetime) -> None:
    """Journal what the operator consented to before the first node step: device refusals
    overridden with ``--force REASON`` (``preflight-forced``, with the reason) and predicted
    rejections accepted (``predicted-rejections-accepted``)."""
    if prepared.forced:
        journal.append(
            Kind.PREFLIGHT_FORCED,
            Phase.DONE,
            now=now,
            data={"reason": force, "refusals": list(prepared.forced)},
        )
    if prepared.accepted:
        journal.append(
            Kind.REJECTIONS_ACCEPTED,
            Phase.DONE,
            now=now,
            data={"rejections": list(prepared.accepted)},
        )


@click.command("apply")
@plan_option
@inventory_option
@click.option("--canary", is_flag=True, help="Change only the canary group, then hold.")
@click.option("--dry-run", is_flag=True, help="Print the whole plan and change nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option(
    "--disable-eviction",
    is_flag=True,
    help="Delete pods instead of evicting them: bypasses PodDisruptionBudgets.",
)
@click.option(
    "--force-window",
    metavar="REASON",
    help="Run outside the plan's change windows; the reason is journaled.",
)
@click.option(
    "--accept-predicted-rejections",
    "accept_rejections",
    is_flag=True,
    help="Go on although pods running on a node in scope are predicted rejected there under "
    "the new config (see `rollout preview`); the accepted predictions are journaled.",
)
@click.option(
    "--force",
    "force",
    metavar="REASON",
    help="Change nodes the device preflight refuses (GPUs not all advertised: device plugin "
    "down or devices unhealthy; one resource served by a device plugin and DRA); the reason and "
    "the refusals are journaled.",
)
@click.option(
    "--no-evidence",
    is_flag=True,
    help="Do not collect the before/after evidence (evidence.json beside the journal); "
    "promote then refuses without --force.",
)
@drain_options
@lock_ns_option
@verify_timeout_option
@forks_option
@progress_option
@output_option
@kube_options
def apply_cmd(
    plan_path: str | None,
    inventory: str | None,
    canary: bool,
    dry_run: bool,
    yes: bool,
    disable_eviction: bool,
    force_window: str | None,
    accept_rejections: bool,
    force: str | None,
    no_evidence: bool,
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
    """Apply the plan's kubelet change: preflight, then per node cordon, drain, write, restart,
    verify, uncordon; any failure restores the node and stops. The nodes' evidence is collected
    before (at preflight) and after (once applied) into evidence.json beside the journal.

    \b
    Examples:
      rollout apply --canary --dry-run
      rollout apply --canary --yes -o json
      rollout apply --plan plan.yaml -i inventory.ini --yes
      rollout apply --yes --progress plain 2> apply.log
      rollout apply --canary --yes --accept-predicted-rejections
      rollout apply --yes --forks 20
      rollout apply --canary --yes --force "GPU-3 is being replaced, 7 of 8 is expected"
      rollout apply --canary --yes --force-delete-unmanaged --delete-emptydir-data
    """
    from rollout.change.inventory import start_inventory

    if not plan_path:
        raise InputError("no plan: pass --plan or set ROLLOUT_PLAN", Location(field="--plan"))
    if force is not None and not force.strip():
        raise InputError("--force needs a REASON (it is journaled)", Location(field="--force"))
    plan = load_plan(plan_path)
    parse_strategy(plan.strategy, plan.location)  # bad input fails before any I/O
    gate_config(plan)  # the gate: section too
    window_check = guard(
        parse_windows(plan.windows, file=plan.path, line_of=plan.line_of), force_window
    )
    if not dry_run and not (window := window_check(datetime.now(UTC))).allowed:
        raise PreflightError(window.reason)
    # preflight's slow parts overlap: the API client's import (0.2-0.3 s of CPU) runs in a
    # thread while the inventory is read and the nodes' facts calls start over ssh; the API
    # connection, Lease check and reads follow (an import started in the thread is waited for,
    # not run twice: Python's import lock)
    threading.Thread(target=_import_kube, daemon=True).start()
    inv = start_inventory(inventory_path(inventory))()
    facts = FactsGathering(inv, forks)
    try:
        from rollout.kube.canaries import canaries_in_progress
        from rollout.kube.client import connect
        from rollout.kube.leases import LeaseLock

        api = connect(kubeconfig, context)
        lock = LeaseLock(api, lock_namespace)
        lock.check()
        in_progress = canaries_in_progress(api)
    except BaseException:
        facts.close()
        raise
    for w in in_progress:
        echo_err(f"warning: {w}")
    overrides = DrainOverrides(delete_unmanaged, delete_emptydir_data, capacity_warn_only)
    prepared = run_preflight(
        plan, inv, api, canary, accept_rejections, facts, forks, force is not None, overrides
    )
    for line in prepared.report:
        echo_err(line)
    for w in prepared.warnings:
        echo_err(f"warning: {w}")
    if dry_run:
        if output == "json":
            click.echo(json.dumps(prepared.to_dict(), indent=2))
            return
        for i, b in enumerate(prepared.batches, 1):
            click.echo(f"batch {i}{' (canary)' if b.canary else ''}: {', '.join(b.nodes)}")
        for n in (n for b in prepared.batches for n in b.nodes):
            c = prepared.changes[n]
            pods = prepared.evictions.get(n, ())
            click.echo(f"\nnode {n}: evict {', '.join(pods) or 'no pods'}")
            if c.checkpoint_reset:
                click.echo(f"  checkpoint files removed: {', '.join(c.checkpoint_reset)}")
            click.echo(prepared.diffs.get(n, "") or "  (no file changes)", nl=False)
        click.echo("\nadmission preview:")
        click.echo(render_text(prepared.previews), nl=False)
        return
    nodes = [n for b in prepared.batches for n in b.nodes]
    confirm(yes, f"change {len(nodes)} node(s) ({', '.join(nodes)})")
    drain = prepared.strategy.drain
    if disable_eviction:
        drain = replace(drain, disable_eviction=True)
    from rollout.kube.lease_objects import holder_identity

    change_id = new_change_id(datetime.now(UTC))
    with holding(lock, change_id):
        journal = mirrored(Journal.create(state_dir(), change_id), api, lock_namespace)
        echo_err(f"change {change_id}: journal {journal.file}")
        if overrides.used():  # what the drains were allowed to lose, and which pods that is
            journal.append(
                OVERRIDES_STEP,
                Phase.DONE,
                now=datetime.now(UTC),
                data={"flags": overrides.used(), "pods": list(prepared.losses)},
            )
        journal_consents(journal, prepared, force, datetime.now(UTC))
        moving = [n for b in prepared.batches for n in b.nodes]
        # 'before' from the facts preflight judged, into evidence.json now; both collections are
        # journaled once the change has ended (held or completed): an evidence entry is never the
        # last one of a change that has not begun
        before = (
            None
            if no_evidence
            else _collect(journal, "before", api, inv, moving, prepared.raw_facts)
        )
        progress = progress_for(progress_mode)
        progress.nodes(tuple(nodes))
        ctx = open_context(
            api, journal, inv.path, drain, verify_timeout, progress, inv.hostvars, forks
        )
        ctx.interrupt = lock.interrupt
        predicted = predicted_rejections(prepared.previews)
        gate = gate_for(plan, api, journal, output, inv, progress.event, lock.interrupt, predicted)
        with reported_failure(journal, lock, output):
            status = run_change(
                ctx,
                prepared.changes,
                prepared.batches,
                gate,
                canary,
                info={
                    "plan": str(Path(plan.path).resolve()),
                    # the plan itself, so a machine without the file resumes and rolls back
                    # with it (rollout.change.plan.recorded_plan)
                    "planText": Path(plan.path).read_text(encoding="utf-8"),
                    "inventory": str(inv.path.resolve()),
                    "intentSha256": intent_digest(plan),
                    "by": holder_identity(),  # who ran it, in the cluster record too
                },
                forward=window_check,
            )
        if before is not None:
            _journal_evidence(journal, "before", moving, before)
            applied = [n for n in moving if status.nodes[n].state is NodeState.APPLIED]
            if applied:
                _journal_evidence(
                    journal,
                    "after",
                    applied,
                    _collect(journal, "after", api, inv, applied, forks=forks),
                )
            status = replay(journal.entries(), journal.change_id)  # with its evidence
    print_status(status, output)
    verdict = getattr(gate, "verdict", None)
    if verdict is not None and verdict.holds:  # Inconclusive / Error: held, say what it waits for
        echo_err(f"gate {verdict.status}: holding: waiting for {verdict.waiting_for}")
        sys.exit(GATE_HOLDS_EXIT)


@click.command("status")
@click.option(
    "--change", "change", help="The change id (default: the latest change, in the cluster too)."
)
@lock_ns_option
@output_option
@kube_options
def status_cmd(
    change: str | None,
    lock_namespace: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Every node's state in a change, replayed from its journal.

    A change this machine has no journal for is fetched from the cluster's record of it
    (ConfigMaps in the lock namespace) into the state directory first, so status works from any
    machine with the kubeconfig. Without --change: the latest change here or in the cluster.

    \b
    Examples:
      rollout status
      rollout status --change 20261130T214802Z-a1b2c3 -o json
    """
    api = optional_api(kubeconfig, context)
    journal = existing_journal(change, api, lock_namespace)
    print_status(replay(journal.entries(), journal.change_id), output)


COMMANDS = [apply_cmd, status_cmd]
