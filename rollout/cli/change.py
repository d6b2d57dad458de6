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

from rollout.change.journal import Journal, new_change_id, state_dir
from rollout.change.orchestrator import run_change
from rollout.change.plan import load_plan
from rollout.change.planning import DrainOverrides, parse_strategy
from rollout.change.previewing import predicted_rejections, render_text
from rollout.change.replaying import replay
from rollout.change.windows import guard, parse_windows
from rollout.cli.gate import GATE_HOLDS_EXIT, gate_config
from rollout.errors import InputError, Location, PreflightError
from rollout.models import Phase

from .options import drain_options, inventory_option, kube_options, output_option, plan_option
from .wiring import (
    OVERRIDES_STEP,
    _confirm,
    _context,
    _echo,
    _existing,
    _Facts,
    _inventory,
    _lock_ns,
    _locked,
    _mirrored,
    _preflight,
    _print_status,
    _progress,
    _progress_option,
    _reported_failure,
    _verify_timeout,
    gate_for,
    intent_digest,
)

__all__ = ["COMMANDS", "_inventory", "_preflight"]  # rollout.cli.preview imports the two


def _import_kube() -> None:
    import rollout.change.preparing
    import rollout.kube.canaries
    import rollout.kube.leases  # noqa: F401


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
@drain_options
@_lock_ns
@_verify_timeout
@_progress_option
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
    delete_unmanaged: bool,
    delete_emptydir_data: bool,
    capacity_warn_only: bool,
    lock_namespace: str,
    verify_timeout: float,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Apply the plan's kubelet change: preflight, then per node cordon, drain, write, restart,
    verify, uncordon; any failure restores the node and stops.

    \b
    Examples:
      rollout apply --canary --dry-run
      rollout apply --canary --yes -o json
      rollout apply --plan plan.yaml -i inventory.ini --yes
      rollout apply --yes --progress plain 2> apply.log
      rollout apply --canary --yes --accept-predicted-rejections
      rollout apply --canary --yes --force-delete-unmanaged --delete-emptydir-data
    """
    from rollout.change.inventory import start_inventory

    if not plan_path:
        raise InputError("no plan: pass --plan or set ROLLOUT_PLAN", Location(field="--plan"))
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
    inv = start_inventory(_inventory(inventory))()
    facts = _Facts(inv)
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
        _echo(f"warning: {w}")
    overrides = DrainOverrides(delete_unmanaged, delete_emptydir_data, capacity_warn_only)
    prepared = _preflight(plan, inv, api, canary, accept_rejections, facts, overrides)
    for line in prepared.report:
        _echo(line)
    for w in prepared.warnings:
        _echo(f"warning: {w}")
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
    _confirm(yes, f"change {len(nodes)} node(s) ({', '.join(nodes)})")
    drain = prepared.strategy.drain
    if disable_eviction:
        drain = replace(drain, disable_eviction=True)
    change_id = new_change_id(datetime.now(UTC))
    with _locked(lock, change_id):
        journal = _mirrored(Journal.create(state_dir(), change_id), api, lock_namespace)
        _echo(f"change {change_id}: journal {journal.file}")
        if overrides.used():  # what the drains were allowed to lose, and which pods that is
            journal.append(
                OVERRIDES_STEP,
                Phase.DONE,
                now=datetime.now(UTC),
                data={"flags": overrides.used(), "pods": list(prepared.losses)},
            )
        if prepared.accepted:
            journal.append(
                "predicted-rejections-accepted",
                Phase.DONE,
                now=datetime.now(UTC),
                data={"rejections": list(prepared.accepted)},
            )
        progress = _progress(progress_mode)
        progress.nodes(tuple(nodes))
        ctx = _context(api, journal, inv.path, drain, verify_timeout, progress, inv.hostvars)
        ctx.interrupt = lock.interrupt
        predicted = predicted_rejections(prepared.previews)
        gate = gate_for(plan, api, journal, output, inv, progress.event, lock.interrupt, predicted)
        with _reported_failure(journal, lock, output):
            status = run_change(
                ctx,
                prepared.changes,
                prepared.batches,
                gate,
                canary,
                info={
                    "plan": str(Path(plan.path).resolve()),
                    "inventory": str(inv.path.resolve()),
                    "intentSha256": intent_digest(plan),
                },
                forward=window_check,
            )
    _print_status(status, output)
    verdict = getattr(gate, "verdict", None)
    if verdict is not None and verdict.holds:  # Inconclusive / Error: held, say what it waits for
        _echo(f"gate {verdict.status}: holding: waiting for {verdict.waiting_for}")
        sys.exit(GATE_HOLDS_EXIT)


@click.command("status")
@click.option(
    "--change", "change", help="The change id (default: the latest change, in the cluster too)."
)
@_lock_ns
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
    from rollout.change.journal import latest_change

    api = _optional_api(kubeconfig, context)
    if change is None and api is not None:
        from rollout.kube.mirror import latest_change as cluster_latest

        try:
            remote = cluster_latest(api, lock_namespace, retry_s=2.0)
        except Exception as e:  # the local journal still answers
            _echo(f"warning: cannot read the cluster's change record: {e}")
            remote = None
        local = latest_change(state_dir())
        if remote is not None and (local is None or remote > local):
            change = remote
    journal = _existing(change, api, lock_namespace)
    _print_status(replay(journal.entries(), journal.change_id), output)


def _optional_api(kubeconfig: str | None, context: str | None) -> Any:
    """An API connection when a kubeconfig loads, else None (status reads local journals)."""
    from rollout.kube.client import connect

    try:
        return connect(kubeconfig, context)
    except InputError:
        return None


COMMANDS = [apply_cmd, status_cmd]
