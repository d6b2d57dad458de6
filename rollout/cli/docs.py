"""``rollout runbook`` and ``rollout report``: the documents before and after a change window.

Thin: parse options, gather what is live (preflight, application canaries), call the pure builders
in ``rollout.evidence.runbook`` / ``rollout.evidence.report``, write. Nothing is written when
anything fails.
"""

from __future__ import annotations

import os
import tempfile
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING

import click

from rollout.errors import InputError, Location

from .options import inventory_option, kube_options, output_option, plan_option

if TYPE_CHECKING:
    from rollout.change.record.entries import ChangeBegin


def _write(text: str, out: str | None) -> None:
    """Print, or write ``out`` atomically (a temporary file renamed over it)."""
    if not out:
        click.echo(text, nl=not text.endswith("\n"))
        return
    target = Path(out)
    fd, tmp = tempfile.mkstemp(dir=target.parent or Path("."), prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    click.echo(f"wrote {target}", err=True)


_out = click.option(
    "--out", type=click.Path(dir_okay=False), help="Write to FILE instead of standard output."
)


@click.command("runbook")
@plan_option
@inventory_option
@click.option(
    "-o",
    "--output",
    type=click.Choice(["markdown", "html", "json"]),
    default="markdown",
    show_default=True,
    help="Markdown, one self-contained HTML page, or JSON (every section's data).",
)
@_out
@click.option("--offline", is_flag=True, help="Skip the cluster checks (the runbook says so).")
@click.option(
    "--gpu-resource",
    default="nvidia.com/gpu",
    show_default=True,
    help="Device resource name shown in the inspection commands.",
)
@kube_options
def runbook_cmd(
    plan_path: str | None,
    inventory: str | None,
    output: str,
    out: str | None,
    offline: bool,
    gpu_resource: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Write the change's runbook from the real plan and inventory: nodes by batch, preflight,
    inspection commands, go / no-go criteria, rollback by node pool, and the rules.

    \b
    Examples:
      rollout runbook --plan plan.yaml -i inventory.ini --offline
      rollout runbook -o html --out runbook.html
      rollout runbook --offline -o json | jq '.batches'
    """
    from rollout.ansible.hosts import read_inventory
    from rollout.change.plan.schema import load_plan
    from rollout.evidence.runbook import Preflight, build_runbook, render

    if not plan_path:
        raise InputError("no plan: pass --plan or set ROLLOUT_PLAN", Location(field="--plan"))
    if not inventory:
        raise InputError("no inventory: pass -i or set ROLLOUT_INVENTORY", Location(field="-i"))
    plan = load_plan(plan_path)  # every section parsed: bad input fails before any I/O
    inv = read_inventory(Path(inventory))
    now = datetime.now(UTC)
    warnings: list[str] = []
    preflight = Preflight(ran=False)
    if not offline:
        from rollout.evidence.runbook import live_preflight
        from rollout.kube.client import connect

        preflight, warnings = live_preflight(plan, inv, connect(kubeconfig, context))
    rb = build_runbook(plan, inv, now, preflight, warnings, gpu_resource)
    _write(render(rb, output), out)


@click.command("report")
@click.option("--change", "change", help="The change id (default: the latest change).")
@click.option(
    "-o",
    "--output",
    type=click.Choice(["markdown", "html", "json"]),
    default="markdown",
    show_default=True,
    help="Markdown, one self-contained HTML page with charts, or JSON.",
)
@_out
@click.option(
    "--evidence",
    type=click.Path(exists=True, dir_okay=False),
    help="Collected node data (default: evidence.json in the change's directory, if any).",
)
@click.option(
    "--lock-namespace",
    default="kube-system",
    show_default=True,
    help="Namespace of the change's cluster record (a change this machine lacks is read there).",
)
@kube_options
def report_cmd(
    change: str | None,
    output: str,
    out: str | None,
    evidence: str | None,
    lock_namespace: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Write the change's evidence report from its journal: every node's states over time, the
    gate's decisions with their inputs, files changed with hashes, and the evidence checks. A
    change this machine has no journal for is read from the cluster's record (kubeconfig).

    \b
    Examples:
      rollout report --change 20261130T214802Z-a1b2c3
      rollout report -o html --out report.html
      rollout report -o json | jq .evidence
    """
    from rollout.change.record.opening import existing_journal
    from rollout.cli.record import optional_api
    from rollout.evidence.report import load_report, render

    journal = existing_journal(change, optional_api(kubeconfig, context), lock_namespace)
    report = load_report(journal, Path(evidence) if evidence else None)
    _write(render(report, output), out)


@click.command("evidence")
@click.option(
    "--change",
    "change",
    help="The change whose nodes to collect (default: every inventory host; needs --out).",
)
@click.option(
    "--label",
    type=click.Choice(["before", "after", "after-recreate"]),
    required=True,
    help="Which collection this is (one of each is expected).",
)
@inventory_option
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    help="The evidence file to add to (default: evidence.json in the change's directory).",
)
@click.option(
    "--gpu-resource",
    default="nvidia.com/gpu",
    show_default=True,
    help="Device resource the node's NVIDIA PCI functions are counted for (shown, not judged: "
    "the healthy count is the kubelet's RegisteredDevices).",
)
@click.option(
    "--lock-namespace",
    default="kube-system",
    show_default=True,
    help="Namespace of the change's cluster record (a change this machine lacks is read there).",
)
@output_option
@kube_options
def evidence_cmd(
    change: str | None,
    label: str,
    inventory: str | None,
    out: str | None,
    gpu_resource: str,
    lock_namespace: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Collect the evidence data of a change's nodes (read-only) into its evidence.json: the
    Nodes' allocatable and capacity, the kubelet's podresources API (each pod's devices and
    exclusive CPUs, the healthy devices), the device manager's kubelet_internal_checkpoint (the
    healthy set and each pod's devices where podresources did not answer; compared with it
    otherwise), NUMA layout and cpu_manager_state (through the facts playbook), pods with their
    QoS, and the running Topology Manager policy (configz); with --change, the tenancy audit of
    its plan's tenancy: file. -o json prints the new collection and the checks over it.

    \b
    Examples:
      rollout evidence --label before -i inventory.ini --out evidence.json
      rollout evidence --label after --change 20261130T214802Z-a1b2c3 --out evidence.json
      rollout evidence --label after --change 20261130T214802Z-a1b2c3 -o json | jq .checks
    """
    import json

    from rollout.ansible.hosts import read_inventory
    from rollout.change.record.entries import ChangeBegin
    from rollout.change.record.opening import existing_journal
    from rollout.change.record.replay import replay
    from rollout.evidence.collecting import checks_of, collect, journal_evidence
    from rollout.evidence.gpu_paths import path_settings
    from rollout.evidence.report import EVIDENCE_FILE
    from rollout.kube.client import connect

    recorded = ChangeBegin()
    paths: dict[str, object] | None = None
    nodes: list[str] = []
    target = Path(out) if out else None
    journal = None
    api = connect(kubeconfig, context)
    if change:
        journal = existing_journal(change, api, lock_namespace)
        status = replay(journal.entries())
        recorded, nodes = status.info, list(status.nodes)
        # a migration: each node's allocation path too (rollout.evidence.gpu_paths)
        paths = path_settings({n: s.record for n, s in status.nodes.items()})
        target = target or journal.dir / EVIDENCE_FILE
    elif target is None:
        raise InputError("without --change, pass --out FILE", Location(field="--out"))
    inv_path = inventory or recorded.inventory
    if not inv_path:
        raise InputError("no inventory: pass -i or set ROLLOUT_INVENTORY", Location(field="-i"))
    inv = read_inventory(Path(str(inv_path)))
    nodes = nodes or [inv.node_of(h) for h in inv.hosts]
    collection = collect(
        label,
        api,
        inv,
        nodes,
        target,
        gpu_resource=gpu_resource,
        tenancy=_tenancy_of(recorded),
        gpu_paths=paths,
    )
    if journal is not None:  # promote reads the change's last 'after' evidence from its journal
        journal_evidence(journal, label, nodes, target, collection)
    if output == "json":
        doc = {"file": str(target), "collection": collection, "checks": checks_of(collection)}
        click.echo(json.dumps(doc, indent=2, sort_keys=True))


def _tenancy_of(recorded: ChangeBegin) -> str | None:
    """The tenancy file of the change's plan (``tenancy:``), when the plan is still there."""
    from rollout.change.plan.schema import load_plan

    plan = recorded.plan
    if not plan or not Path(plan).is_file():
        return None
    try:
        return load_plan(str(plan)).tenancy
    except InputError as e:
        click.echo(f"warning: no tenancy audit: {e}", err=True)
        return None


COMMANDS = [runbook_cmd, report_cmd, evidence_cmd]
