"""``rollout migrate``: move GPU nodes between the device plugin and DRA, a node at a time.

Parse options, call ``rollout.change.commands.migrate_pool`` (the allocation-path change through the
same engine as ``apply``), print. ``status``, ``resume``, ``rollback`` and ``promote`` carry a
migration as they carry a kubelet-config change: the journal names its kind.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import TYPE_CHECKING

import click

from rollout.cli.wiring import (
    confirm,
    echo_err,
    finish,
    forks_option,
    inventory_path,
    lock_ns_option,
    progress_for,
    progress_option,
)
from rollout.errors import InputError, Location

from .options import inventory_option, kube_options, output_option, plan_option

if TYPE_CHECKING:
    from collections.abc import Callable

    from rollout.ansible.hosts import Inventory
    from rollout.change.commands.migrate_pool import PreparedMigration
    from rollout.change.plan.schema import Plan
    from rollout.change.record.journal import Journal
    from rollout.interrupt import Interrupt
    from rollout.kube.client import Api
    from rollout.protocols import Gate

__all__ = ["COMMANDS"]


def pool_gate(
    api: Api,
    journal: Journal,
    plan: Plan,
    inv: Inventory,
    output: str,
    progress: Callable[[str], None] = echo_err,
    interrupt: Interrupt | None = None,
) -> Gate:
    """The plan's gate (``gate:``; none without it) with the DRA pool's failure signals over
    it (``rollout.gate.dra_pool``): claims unallocated, pods Pending on the class, devices
    Unhealthy, past the plan's ``allocationPath.claimLimit``. ``migrate``, ``promote`` and
    ``resume`` of a migration build it alike (``interrupt``: resume's soak ends on a handed-over
    rollback)."""
    from rollout.change.kinds.allocation_path import path_plan_of
    from rollout.gate.assembly import gate_for
    from rollout.gate.dra_pool import DraPoolGate, PoolSignals, read_pool

    pp = path_plan_of(plan)
    s = pp.settings
    inner = gate_for(plan, api, journal, output, inv, progress, interrupt)
    signals = PoolSignals(s.device_class, s.resource, pp.claim_limit_s)
    return DraPoolGate(inner, lambda: read_pool(api), signals, lambda: datetime.now(UTC))


def _print_dry_run(ready: PreparedMigration, output: str) -> None:
    doc = ready.to_dict()
    if output == "json":
        click.echo(json.dumps({**doc, "dryRun": True}, indent=2))
        return
    if ready.tenancy is not None:
        a = ready.tenancy
        click.echo(f"tenancy audit of {a.policy}: {a.result} ({len(a.rows)} checks)")
    for r in ready.forced:
        click.echo(f"forced (--force): {r}")
    for i, b in enumerate(doc["batches"], 1):
        what = "canary " if b["canary"] else ""
        click.echo(f"{what}batch {i}: {', '.join(b['nodes'])}")
    for n in doc["nodes"]:
        click.echo(f"{n['node']} -> {n['target']}:")
        for j, step in enumerate(n["steps"], 1):
            click.echo(f"  {j}. {step}")
        click.echo(f"  evicts: {', '.join(n['evicts']) or 'none'}")


@click.command("migrate")
@plan_option
@inventory_option
@click.option("--canary", is_flag=True, help="Move only the canary group, then hold.")
@click.option("--dry-run", is_flag=True, help="Print every batch, step and pod; change nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option(
    "--terminate-claims",
    is_flag=True,
    help="On the way back to the device plugin (rollback), let the drain terminate pods that "
    "hold DRA claims on the node; without it the way back waits for them to end, up to "
    "allocationPath.timeout, and fails naming them. Recorded in the change record: promote, "
    "resume and a rollback from any machine or the webhook receiver use it.",
)
@click.option(
    "--force-window",
    metavar="REASON",
    help="Run outside the plan's change windows; the reason is journaled.",
)
@click.option(
    "--force",
    metavar="REASON",
    help="Move the pool although the audit of the plan's tenancy file (tenancy:) does not "
    "pass; the reason and the refusals are journaled (preflight-forced).",
)
@click.option(
    "--no-evidence",
    is_flag=True,
    help="Do not collect the before/after evidence (evidence.json beside the journal): the "
    "nodes' devices from podresources and claim status, and each node's allocation path "
    "(gpus-served-once: every healthy GPU served after, once, through one path).",
)
@lock_ns_option
@forks_option
@progress_option
@output_option
@kube_options
def migrate_cmd(
    plan_path: str | None,
    inventory: str | None,
    canary: bool,
    dry_run: bool,
    yes: bool,
    terminate_claims: bool,
    force_window: str | None,
    force: str | None,
    no_evidence: bool,
    lock_namespace: str,
    forks: int,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Move GPU nodes between the device plugin and a DRA driver, node by node, as the plan's
    allocationPath section says (each inventory group: device-plugin or dra). Per node:
    cordon, drain, then to DRA: release, switch (the device plugin's label off, allocatable 0),
    start-driver (the DRA label on), verify (the driver's ResourceSlices list the healthy
    GPUs); to the device plugin, the design's rollback order: release (no claim allocated from
    the node's pool), stop-driver, slices-gone, switch, verify; uncordon. The node never serves
    the extended resource through both paths. Refused before any change: a driver with no
    slices, a DeviceClass missing or mapping another name, labels no DaemonSet selects, too
    few GPUs left for a batch's pods, and (where the plan names a tenancy file) a tenancy audit
    that does not pass, unless --force REASON. `rollout rollback --change ID` moves the nodes
    back in the design's order; `status`, `resume` and `promote` work as for apply. The
    moving nodes' evidence is collected before and after into evidence.json beside the
    journal (--no-evidence skips it).

    \b
    Examples:
      rollout migrate --plan gpu-pool.yaml -i inventory.ini --dry-run
      rollout migrate --plan gpu-pool.yaml -i inventory.ini --canary --yes -o json
    """
    from rollout.change.commands.migrate_pool import prepare_migration, run_migration
    from rollout.kube.client import connect
    from rollout.kube.leases import LeaseLock

    if not plan_path:
        raise InputError("no plan: pass --plan or set ROLLOUT_PLAN", Location(field="--plan"))
    api = connect(kubeconfig, context)
    ready = prepare_migration(
        api,
        plan_path,
        inventory_path(inventory),
        canary,
        terminate_claims,
        force_window=force_window,
        dry_run=dry_run,
        force=force,
    )
    if dry_run:
        _print_dry_run(ready, output)
        return
    nodes = [n for b in ready.batches for n in b.nodes]
    confirm(yes, f"move {len(nodes)} node(s) ({', '.join(nodes)})")
    lock = LeaseLock(api, lock_namespace)
    evidence = None
    if not no_evidence:
        from dataclasses import asdict

        from rollout.evidence.collecting import ChangeEvidence

        settings = asdict(ready.path_plan.settings)
        evidence = ChangeEvidence(
            api, ready.inventory, forks, echo_err, tenancy=ready.plan.tenancy, gpu_paths=settings
        )
    status = run_migration(
        api,
        lock,
        ready,
        lambda journal: pool_gate(api, journal, ready.plan, ready.inventory, output),
        canary_only=canary,
        lock_namespace=lock_namespace,
        verify_timeout=ready.path_plan.settings.timeout_s,
        forks=forks,
        progress=progress_for(progress_mode),
        say=echo_err,
        evidence=evidence,
    )
    finish(status, output)


COMMANDS = [migrate_cmd]
