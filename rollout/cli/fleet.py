"""``rollout nodes``: the fleet as it is, and where it drifted from what its changes left.

Thin: read the Nodes' marks, the changes' journals (from the cluster record), each node's files
(the read-only facts playbook) and ``/configz``; ``rollout.change.drift`` says what differs.
"""

from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import click

from .options import inventory_option, kube_options, output_option

DRIFT_EXIT = 9
"""``rollout nodes``: at least one node drifted from what its last change left."""


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
    Nodes outside the inventory are checked on /configz only. Exit 9 when any node drifted
    (for cron or CI), 0 otherwise.

    \b
    Examples:
      rollout nodes -i inventory.ini
      rollout nodes -i inventory.ini -o json | jq '.nodes[] | select(.drifted)'
      rollout nodes --context prod-east || echo "drift: see above"
    """
    from rollout.change.inventory import read_inventory
    from rollout.kube.client import connect

    api = connect(kubeconfig, context)
    inv = read_inventory(Path(inventory)) if inventory else None
    reports = survey(api, lock_namespace, inv)
    drifted = [r for r in reports if r.drift]
    if output == "json":
        doc = {"nodes": [r.to_dict() for r in reports], "drifted": [r.node for r in drifted]}
        click.echo(json.dumps(doc, indent=2))
    else:
        for r in reports:
            policy = " ".join(f"{k}={v}" for k, v in r.policy.items()) or "-"
            change = f"{r.change} ({r.state})" if r.change else "no change"
            digest = r.configz_sha256[:12] or "configz unread"
            verdict = "DRIFT" if r.drift else "ok"
            click.echo(f"{r.node}: {verdict}  {change}  configz {digest}  {policy}")
            for d in r.drift:
                click.echo(f"  drift: {d}")
            if r.error:
                click.echo(f"  {r.error}")
    if drifted:
        click.echo(
            f"{len(drifted)} node(s) drifted: {', '.join(r.node for r in drifted)}", err=True
        )
        sys.exit(DRIFT_EXIT)


def survey(api: Any, lock_namespace: str, inv: Any = None) -> list[Any]:
    """Every node of ``inv`` and every Node a change marked, as :class:`NodeReport` rows (files
    read only for the inventory's nodes; without ``inv``, /configz only: ``rollout serve``'s
    drift metric)."""
    from concurrent.futures import ThreadPoolExecutor

    from rollout.change.drift import report_node
    from rollout.change.record import existing_journal
    from rollout.change.replaying import status_of
    from rollout.errors import RolloutError
    from rollout.fanout import DEFAULT_FORKS, workers
    from rollout.kube import mirror as km
    from rollout.kube import proxy

    marks = km.marked_nodes(api, retry_s=30.0)
    in_inv = [inv.node_of(h) for h in inv.hosts] if inv else []
    names = list(dict.fromkeys([*in_inv, *marks]))
    statuses: dict[str, Any] = {}
    for change in sorted({m["change"] for m in marks.values() if m["change"]}):
        try:
            statuses[change] = status_of(existing_journal(change, api, lock_namespace))
        except RolloutError as e:
            click.echo(f"warning: change {change}: {e}", err=True)
    files = _node_files(inv) if inv else {}

    def live(n: str) -> tuple[dict[str, Any] | None, str]:
        try:
            return proxy.configz(api, n), ""
        except RolloutError as e:
            return None, str(e)

    # one /configz read per node, at most DEFAULT_FORKS at once (not one after the other)
    with ThreadPoolExecutor(max_workers=workers(len(names), DEFAULT_FORKS)) as pool:
        read = dict(zip(names, pool.map(live, names), strict=True))
    reports = []
    for n in names:
        mark = marks.get(n)
        status = statuses.get(mark["change"]) if mark else None
        configz, error = read[n]
        reports.append(
            report_node(
                n,
                n in in_inv,
                mark,
                status.nodes.get(n) if status else None,
                files.get(n) if n in in_inv else None,
                configz,
                error,
            )
        )
    return reports


def _node_files(inv: Any) -> dict[str, dict[str, bytes | None]]:
    """Each inventory node's kubelet files (the facts playbook, read-only)."""
    from rollout.ansible.runner import AnsibleRunner
    from rollout.change.rendering import node_files_of

    with tempfile.TemporaryDirectory(prefix="rollout-nodes-") as tmp:
        facts_dir = Path(tmp) / "facts"
        raw = AnsibleRunner(Path(tmp) / "runner").gather_facts(
            inv.path, list(inv.hosts), facts_dir, inv.hostvars
        )
        return {inv.node_of(h): node_files_of(r, facts_dir / h)[0] for h, r in raw.items()}


COMMANDS = [nodes_cmd]
