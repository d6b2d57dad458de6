"""``rollout render``: the files a node must receive, printed, written to a directory, or as JSON.

Thin: parse options, call ``rollout.kubelet.render``, print. Nothing is written unless every step
succeeded, so a bad plan or a conflict never leaves half a directory behind.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import click
import yaml

from rollout.change.plan.schema import load_plan
from rollout.cli.options import output_option
from rollout.errors import InputError, Location
from rollout.kubelet.distributions import DISTRIBUTIONS
from rollout.kubelet.intent import build_intent
from rollout.kubelet.loading import effective, load_node
from rollout.kubelet.render import render as render_node


def _parse_set(values: tuple[str, ...]) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for item in values:
        name, sep, raw = item.partition("=")
        if not sep or not name:
            raise InputError(f"--set expects FIELD=VALUE, got {item!r}", Location(field="--set"))
        try:
            value = yaml.safe_load(raw) if raw else ""
        except yaml.YAMLError as e:
            raise InputError(f"value is not valid YAML: {e}", Location(field=name)) from e
        out.append((name, value))
    return out


@click.command("render")
@click.option(
    "--distribution",
    "-d",
    type=click.Choice(sorted(DISTRIBUTIONS)),
    help="The node's distribution (default: the plan's).",
)
@click.option(
    "--node-root",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Directory holding copies of the node's files at their node paths.",
)
@click.option(
    "--plan", "plan_file", envvar="ROLLOUT_PLAN", type=click.Path(dir_okay=False), help="Plan file."
)
@click.option("--node", "host", help="Inventory hostname, for the plan's per-node overrides.")
@click.option("--cpu-manager-policy", help="cpuManagerPolicy (default static).")
@click.option("--reserved-cpus", help="reservedSystemCPUs, e.g. 0,32.")
@click.option("--topology-manager-policy", help="topologyManagerPolicy (default single-numa-node).")
@click.option("--topology-manager-scope", help="topologyManagerScope (default pod).")
@click.option("--memory-manager-policy", help="memoryManagerPolicy (None or Static).")
@click.option(
    "--set", "sets", multiple=True, metavar="FIELD=VALUE", help="Any field; VALUE is YAML."
)
@click.option("--method", help="How to add our settings (default: per distribution).")
@click.option(
    "--out-dir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Write each file to OUT/<node path> instead of printing.",
)
@click.option("--effective", "show_effective", is_flag=True, help="Print the effective config.")
@output_option
def render(
    distribution: str | None,
    node_root: Path,
    plan_file: str | None,
    host: str | None,
    cpu_manager_policy: str | None,
    reserved_cpus: str | None,
    topology_manager_policy: str | None,
    topology_manager_scope: str | None,
    memory_manager_policy: str | None,
    sets: tuple[str, ...],
    method: str | None,
    out_dir: Path | None,
    show_effective: bool,
    output: str,
) -> None:
    """Render the kubelet files a node must receive.

    \b
    Examples:
      rollout render -d kubeadm --node-root ./node --reserved-cpus 0,32
      rollout render -d k3s --node-root ./node --plan plan.yaml --out-dir ./out
      rollout render -d eks-al2023 --node-root ./node --reserved-cpus 0,1 --effective
    """
    plan = load_plan(plan_file) if plan_file else None
    dist = distribution or (plan.distribution_for(host) if plan else None)
    if dist is None:
        raise InputError(
            "no distribution: pass --distribution or set it in the plan",
            Location(field="distribution"),
        )
    node = load_node(dist, node_root)
    flags = {
        "cpuManagerPolicy": cpu_manager_policy,
        "reservedSystemCPUs": reserved_cpus,
        "topologyManagerPolicy": topology_manager_policy,
        "topologyManagerScope": topology_manager_scope,
        "memoryManagerPolicy": memory_manager_policy,
    }
    before = effective(node)
    existing = any(
        str((before.config.get(s) or {}).get("cpu", "")).strip() not in ("", "0", "0m")
        for s in ("kubeReserved", "systemReserved")
    )
    sets_given = _parse_set(sets)
    intent = (
        plan.intent_for(host, flags=flags, sets=sets_given, existing_reservation=existing)
        if plan
        else build_intent(None, flags=flags, sets=sets_given, existing_reservation=existing)
    )
    result = render_node(
        node,
        intent,
        method or (plan.method_for(host) if plan else None),
        plan.name if plan else "rollout",
    )
    for w in result.warnings:
        click.echo(f"warning: {w}", err=True)
    if show_effective:
        click.echo(result.effective_after.as_json(), nl=False)
        return
    if output == "json":
        click.echo(json.dumps(result.as_dict(), indent=2))
    elif out_dir is None:
        for f in result.files:
            click.echo(f"# {f.path} ({f.action}, mode {f.mode})")
            text = f.content.decode()
            click.echo(text if text.endswith("\n") else text + "\n", nl=False)
        if result.checkpoint_reset:
            click.echo(
                "# checkpoint files to remove before restart: " + " ".join(result.checkpoint_reset)
            )
    if out_dir is not None:
        for f in result.files:
            target = out_dir / f.path.lstrip("/")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(f.content)
        if output != "json":
            click.echo(f"wrote {len(result.files)} file(s) under {out_dir}")


COMMANDS = [render]
