"""``rollout nodes``: the fleet as it is, and where it drifted from what its changes left.

Thin: ``rollout.fleet.survey.survey`` reads the Nodes' marks, the changes' journals, each node's
files and ``/configz``, and ``rollout.fleet.drift`` says what differs; this prints it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from .options import inventory_option, kube_options, output_option

DRIFT_EXIT = 9
"""``rollout nodes``: at least one node drifted from what its last change left."""
TWO_PATHS_EXIT = 10
"""``rollout nodes``: at least one node serves an extended resource through the device plugin and
DRA at once (KEP-5004's one path per node); wins over :data:`DRIFT_EXIT`."""


@click.command("nodes")
@inventory_option
@click.option(
    "--lock-namespace",
    default="kube-system",
    show_default=True,
    help="Namespace of the changes' cluster record.",
)
@output_option
@kube_options
def nodes_cmd(
    inventory: str | None,
    lock_namespace: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Every node of the inventory and every Node a change marked: the live kubelet config
    (/configz: a digest and the policy fields), the change and intent that last wrote it, its
    state in that change, and drift: the files and settings that differ from what that change
    left (a file `kubeadm upgrade node` rewrote, a hand edit, a re-imaged node). Read-only.

    A node the change left applied must have the files it wrote and the settings its verify
    step expected; a node it left restored, the backed-up files and the settings it had before.
    Nodes outside the inventory are checked on /configz only.

    Each node's allocation path per extended resource (nvidia.com/gpu...): device-plugin (its
    allocatable > 0), dra (a DeviceClass's extendedResourceName maps it to a driver with
    ResourceSlices on the node, allocatable 0: the scheduler's rule), none, or BOTH (KEP-5004:
    "One node in a cluster cannot have both"). Exit 10 when any node serves a resource through
    both paths, else 9 when any node drifted (for cron or CI), 0 otherwise.

    \b
    Examples:
      rollout nodes -i inventory.ini
      rollout nodes -i inventory.ini -o json | jq '.nodes[] | select(.drifted)'
      rollout nodes --context prod-east || echo "drift: see above"
    """
    from rollout.ansible.hosts import read_inventory
    from rollout.fleet.survey import survey
    from rollout.kube.client import connect

    api = connect(kubeconfig, context)
    inv = read_inventory(Path(inventory)) if inventory else None
    reports = survey(api, lock_namespace, inv, lambda m: click.echo(m, err=True))
    drifted = [r for r in reports if r.drift]
    both = [r for r in reports if r.two_paths]
    if output == "json":
        doc = {
            "nodes": [r.to_dict() for r in reports],
            "drifted": [r.node for r in drifted],
            "twoPaths": [r.node for r in both],
        }
        click.echo(json.dumps(doc, indent=2))
    else:
        for r in reports:
            policy = " ".join(f"{k}={v}" for k, v in r.policy.items()) or "-"
            change = f"{r.change} ({r.state})" if r.change else "no change"
            digest = r.configz_sha256[:12] or "configz unread"
            verdict = "DRIFT" if r.drift else "ok"
            # BOTH in capitals: the state KEP-5004 forbids
            paths = " ".join(
                f"{p.resource}={'BOTH' if p.resource in r.two_paths else p.path}" for p in r.paths
            )
            dra = f"  DRA drivers {','.join(r.dra_drivers)}" if r.dra_drivers else ""
            click.echo(
                f"{r.node}: {verdict}  {change}  configz {digest}  {policy}  "
                f"paths {paths or 'none'}{dra}"
            )
            for d in r.drift:
                click.echo(f"  drift: {d}")
            for p in r.paths:
                if p.note:
                    click.echo(f"  {p.resource}: {p.path}: {p.note}")
            if r.error:
                click.echo(f"  {r.error}")
    if drifted:
        click.echo(
            f"{len(drifted)} node(s) drifted: {', '.join(r.node for r in drifted)}", err=True
        )
    if both:
        for r in both:
            click.echo(
                f"node {r.node}: {', '.join(r.two_paths)} served by the device plugin and by "
                "DRA at once",
                err=True,
            )
        sys.exit(TWO_PATHS_EXIT)
    if drifted:
        sys.exit(DRIFT_EXIT)


COMMANDS = [nodes_cmd]
