"""What ``rollout lint`` checks: one kubelet configuration file on its own, or a node's whole set
of files and flags as its distribution merges them, through the kubelet's own rules
(``validation.validate``). Every finding names its file."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from rollout.kubelet.documents import load_file
from rollout.kubelet.facts import NodeFacts
from rollout.kubelet.findings import Finding
from rollout.kubelet.loading import effective, effective_from_config, load_node
from rollout.kubelet.validation import validate


def _named(findings: list[Finding], file: str) -> list[Finding]:
    """Every finding names its file: one about a field no file sets (``reservedMemory``
    missing under ``memoryManagerPolicy: Static``) is about ``file``, with no line."""
    return [f if f.file else replace(f, file=file, line=None) for f in findings]


def lint_file(path: Path, version: str | None, facts: NodeFacts | None) -> list[Finding]:
    """The findings of one KubeletConfiguration file, as the kubelet would judge it alone."""
    data, lines = load_file(path, str(path))
    eff = effective_from_config(data, file=str(path), lines=lines)
    found = validate(eff.config, origins=eff.origins, kubelet_version=version, node_facts=facts)
    return _named(found, str(path))


def lint_node(
    distribution: str, node_root: Path, version: str | None, facts: NodeFacts | None
) -> list[Finding]:
    """The findings of a node's whole configuration (files, drop-ins and flags of its
    distribution, read under ``node_root``); a finding no file carries is about the main file."""
    node = load_node(distribution, node_root)
    eff = effective(node)
    findings = validate(
        eff.config,
        origins=eff.origins,
        kubelet_version=version,
        node_facts=facts,
        flags=eff.flag_origins,
        distribution=node.distribution.name,
    )
    d = node.distribution
    main = d.config_file or (d.flag_files[0].path if d.flag_files else None)
    return _named(findings, main or str(node_root))
