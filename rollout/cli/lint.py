"""``rollout lint``: would this kubelet start? Findings in the kubelet's own words.

Thin: parse, call ``rollout.kubelet.linting`` (each plain FILE on its own, or a node's whole
set), print. Exit 1 when any finding is an
error, 0 otherwise; bad input (missing or malformed file, unknown distribution) is exit 2 via
the error tree. Lint never writes anything.
"""

from __future__ import annotations

import json
from pathlib import Path

import click

from rollout.cli.options import output_option
from rollout.errors import InputError
from rollout.kubelet.facts import load_node_facts
from rollout.kubelet.findings import Finding, Severity
from rollout.kubelet.linting import lint_file, lint_node
from rollout.kubelet.options import parse_version


@click.command("lint")
@click.argument("files", nargs=-1, type=click.Path(path_type=Path))
@click.option("--distribution", "-d", help="The node's distribution (with --node-root).")
@click.option(
    "--node-root",
    type=click.Path(path_type=Path),
    help="Directory holding copies of the node's files at their node paths.",
)
@click.option(
    "--kubelet-version",
    help="Kubelet version the rules follow (option maturity, feature gates); default 1.35.",
)
@click.option(
    "--node-facts",
    type=click.Path(path_type=Path),
    help="Node facts file (online CPUs, NUMA nodes); enables the machine-dependent rules.",
)
@output_option
def lint(
    files: tuple[Path, ...],
    distribution: str | None,
    node_root: Path | None,
    kubelet_version: str | None,
    node_facts: Path | None,
    output: str,
) -> None:
    """Check kubelet configuration the way the kubelet does at parse time and at start-up.

    \b
    Examples:
      rollout lint /var/lib/kubelet/config.yaml
      rollout lint --distribution k3s --node-root ./node1 --kubelet-version 1.33 -o json
      rollout lint config.yaml --node-facts node1-facts.json
    """
    if files and (distribution or node_root):
        raise InputError("give either FILE... or --distribution with --node-root, not both")
    if not files and not (distribution and node_root):
        raise InputError("give FILE... or both --distribution and --node-root")
    if kubelet_version:
        parse_version(kubelet_version)
    facts = load_node_facts(node_facts) if node_facts else None
    findings: list[Finding] = []
    if files:
        for path in files:
            findings.extend(lint_file(path, kubelet_version, facts))
    else:
        assert distribution is not None and node_root is not None
        findings = lint_node(distribution, node_root, kubelet_version, facts)
    errors = sum(1 for f in findings if f.severity is Severity.ERROR)
    if output == "json":
        click.echo(json.dumps([f.as_dict() for f in findings], indent=2))
    else:
        for f in findings:
            click.echo(f.describe())
        warnings = len(findings) - errors
        click.echo(f"{errors} error(s), {warnings} warning(s)")
    if errors:
        click.get_current_context().exit(1)


COMMANDS = [lint]
