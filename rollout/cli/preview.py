"""``rollout preview``: which pods each node in scope will admit or reject under the new config.

The same preflight as ``rollout apply`` (facts gathered, files rendered), then the admission
preview of ``rollout.kubelet.admission.node_preview``; nothing is changed.
"""

from __future__ import annotations

import json

import click

from rollout.change.plan.schema import load_plan
from rollout.errors import InputError, Location
from rollout.kubelet.admission.node_preview import fleet_misfits, render_text

from .options import inventory_option, kube_options, output_option, plan_option


@click.command("preview")
@plan_option
@inventory_option
@click.option("--canary", is_flag=True, help="Only the canary group (as `apply --canary`).")
@output_option
@kube_options
def preview_cmd(
    plan_path: str | None,
    inventory: str | None,
    canary: bool,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Predict, for every node in scope, which pods the kubelet will admit or reject under the
    config being rendered: the pods on it now (evicted and recreated, admitted in order) and
    every Deployment, StatefulSet, DaemonSet or ReplicaSet whose pod template can land on it
    (nodeSelector, required node affinity, tolerations), each with the kubelet's reason and
    message and the numbers behind it. Ends with the workloads that fit no node in scope.
    Read-only. Other preflight refusals (a node missing, capacity) still refuse (exit 3).

    \b
    Examples:
      rollout preview --canary
      rollout preview --plan plan.yaml -i inventory.ini -o json
      rollout preview -o json | jq '.nodes[].pods[] | select(.verdict == "rejected")'
    """
    from rollout.ansible.hosts import read_inventory
    from rollout.change.commands.session import run_preflight
    from rollout.cli.wiring import inventory_path
    from rollout.kube.client import connect

    if not plan_path:
        raise InputError("no plan: pass --plan or set ROLLOUT_PLAN", Location(field="--plan"))
    plan = load_plan(plan_path)  # every section parsed: bad input fails before any I/O
    inv = read_inventory(inventory_path(inventory))
    api = connect(kubeconfig, context)
    prepared = run_preflight(plan, inv, api, canary, True)
    if output == "json":
        doc = {
            "nodes": [p.to_dict() for p in prepared.previews],
            "fitsNoNode": fleet_misfits(prepared.previews),
        }
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(render_text(prepared.previews), nl=False)


COMMANDS = [preview_cmd]
