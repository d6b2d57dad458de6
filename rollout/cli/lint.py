"""``rollout lint``: would this kubelet start? Findings in the kubelet's own words.

Thin: load the files (each plain FILE on its own, or a node's whole set through
``loading.effective``), call ``validation.validate``, print. Exit 1 when any finding is an
error, 0 otherwise; bad input (missing or malformed file, unknown distribution) is exit 2 via
the error tree. Lint never writes anything.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import click

from rollout.cli.options import output_option
from rollout.errors import InputError
from rollout.kubelet.documents import load_file
from rollout.kubelet.facts import NodeFacts, load_node_facts
from rollout.kubelet.findings import Finding, Severity
from rollout.kubelet.loading import effective, effective_from_config, load_node
from rollout.kubelet.options import parse_version
from rollout.kubelet.validation import validate


def _named(findings: list[Finding], file: str) -> list[Finding]:
    """Every finding names its file: one about a field no file sets (``reservedMemory``
    missing under ``memoryManagerPolicy: Static``) is about ``file``, with no line."""
    return [f if f.file else replace(f, file=file, line=None) for f in findings]


def _lint_file(path: Path, version: str | None, facts: NodeFacts | None) -> list[Finding]:
    data, lines = load_file(path, str(path))
    eff = effective_from_config(data, file=str(path), lines=lines)
    found = validate(eff.config, origins=eff.origins, kubelet_version=version, node_facts=facts)
    return _named(found, str(path))


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
            findings.extend(_lint_file(path, kubelet_version, facts))
    else:
        assert distribution is not None and node_root is not None
        node = load_node(distribution, node_root)
        eff = effective(node)
        findings = validate(
            eff.config,
            origins=eff.origins,
            kubelet_version=kubelet_version,
            node_facts=facts,
            flags=eff.flag_origins,
            distribution=node.distribution.name,
        )
        d = node.distribution
        main = d.config_file or (d.flag_files[0].path if d.flag_files else None)
        findings = _named(findings, main or str(node_root))
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
