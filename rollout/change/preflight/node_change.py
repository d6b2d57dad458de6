"""One node's change, computed from its gathered facts: render, lint, and the diff to show.

Why apart from :mod:`rollout.change.preflight.checking`: preflight is about the whole fleet (every
node gathered, every check run, every refusal listed at once); this is about one node, pure but for
reading fetched files of older facts: the node's kubelet files as the facts module recorded them,
the render of the plan's intent onto them, the validation of the result, and the
:class:`~rollout.models.NodeChange` the engine ships (with the digests the compare-and-swap write
checks). The shipping tests and the preflight benchmark call it per node.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

from rollout.ansible.hosts import Inventory
from rollout.ansible.payloads import ABSENT
from rollout.change.kinds.kubelet_verify import WATCHED
from rollout.change.plan.schema import Plan
from rollout.errors import InputError, Location, PreflightError
from rollout.kubelet.checkpoints import gate_flip_findings
from rollout.kubelet.facts import node_facts_from_dict
from rollout.kubelet.findings import Severity
from rollout.kubelet.loading import effective, node_from_files
from rollout.kubelet.render import render
from rollout.kubelet.validation import validate
from rollout.models import NodeChange, NodeFacts


def _gpu_model(raw: Mapping[str, Any]) -> str:
    return ",".join(
        sorted({f"{g.get('vendor', '')}:{g.get('device', '')}" for g in raw.get("gpus") or []})
    )


def node_change(
    plan: Plan, inv: Inventory, host: str, raw: Mapping[str, Any], facts_dir: Path
) -> tuple[NodeChange, NodeFacts, list[str], list[str]]:
    """Render and lint one node from its gathered facts.

    Returns:
        The change, the node's facts, lint errors (refusals) and warnings.
    """
    node = inv.node_of(host)
    dist = (
        plan.distribution_for(host)
        or inv.hostvars.get(host, {}).get("rollout_distribution")
        or raw.get("distribution")
    )
    if not dist:
        raise PreflightError(f"node {node}: distribution unknown (set it in the plan)")
    files, meta = node_files_of(raw, facts_dir / host)
    node_files = node_from_files(str(dist), {k: v for k, v in files.items() if v is not None})
    before = effective(node_files)
    existing = any(
        str((before.config.get(s) or {}).get("cpu", "")).strip() not in ("", "0", "0m")
        for s in ("kubeReserved", "systemReserved")
    )
    intent = plan.intent_for(host, existing_reservation=existing)
    r = render(node_files, intent, plan.method_for(host), plan.name)
    hw = node_facts_from_dict(raw, file=str(facts_dir / f"{host}.json"))
    findings = validate(
        r.effective_after.config,
        origins=r.effective_after.origins,
        kubelet_version=raw.get("kubeletVersion"),
        node_facts=hw,
        flags=r.effective_after.flag_origins,
        distribution=str(dist),
    )
    # a finding about a field no file sets (failCgroupV1 left at its default) is about the
    # distribution's main file, as in `rollout lint`
    d = node_files.distribution
    main = d.config_file or (d.flag_files[0].path if d.flag_files else None)
    # a checkpoint-format gate flipped together with a policy (the kubelet layer's own rule)
    findings += gate_flip_findings(
        before.config, r.effective_after.config, r.effective_after.origins
    )
    findings = [f if f.file else replace(f, file=main, line=None) for f in findings]
    errors = [f"node {node}: {f.describe()}" for f in findings if f.severity is Severity.ERROR]
    warnings = [f"node {node}: {w}" for w in r.warnings]
    touched = [f.path for f in r.files] + list(r.removed)
    digests = {p: hashlib.sha256(b).hexdigest() for p, b in files.items() if b is not None}
    change = NodeChange(
        node=node,
        host=host,
        files={f.path: f.content for f in r.files},
        removed=tuple(p for p in r.removed if p not in {f.path for f in r.files}),
        checkpoint_reset=tuple(r.checkpoint_reset),
        expected={
            k: r.effective_after.config.get(k)
            for k in WATCHED
            if k in intent.fields and k in r.effective_after.config
        },
        service=r.services[0] if r.services else "kubelet",
        # an existing file keeps the node's mode and owner; a new one gets render's
        mode={
            f.path: meta.get(f.path)
            or (f.mode, f.owner.partition(":")[0], f.owner.partition(":")[2] or f.owner)
            for f in r.files
        },
        before={p: files.get(p) for p in touched},
        before_meta={p: meta[p] for p in touched if p in meta},
        expect={p: digests.get(p, ABSENT) for p in touched},
    )
    facts = NodeFacts(
        host=host,
        node=node,
        distribution=str(dist),
        cpu_model=str(raw.get("cpuModel") or ""),
        numa=tuple(str(n.get("cpus", "")) for n in raw.get("numaNodes") or []),
        gpu_model=_gpu_model(raw),
        files=files,
        kubelet_after=r.effective_after.config,
    )
    return change, facts, errors, warnings


def node_files_of(
    raw: Mapping[str, Any], fetched: Path
) -> tuple[dict[str, bytes | None], dict[str, tuple[str, str, str]]]:
    """The node's kubelet files as the facts module read them: path -> bytes, and path ->
    (mode, owner, group). Facts from older playbooks carry no bytes; those were fetched to
    ``fetched/<node path>`` (mode and owner then unknown).

    Raises:
        InputError: a file's bytes do not match the sha256 the node reported.
    """
    files: dict[str, bytes | None] = {}
    meta: dict[str, tuple[str, str, str]] = {}
    recorded = raw.get("kubeletFileMeta") or {}
    for p in raw.get("kubeletFiles") or []:
        m = recorded.get(p)
        if not isinstance(m, Mapping):
            files[p] = (fetched / p.lstrip("/")).read_bytes()
            continue
        data = base64.b64decode(str(m.get("content_b64", "")))
        if hashlib.sha256(data).hexdigest() != m.get("sha256"):
            raise InputError(
                f"facts of {p}: bytes do not match their sha256",
                Location(field=f"kubeletFileMeta[{p}]"),
            )
        files[p] = data
        meta[p] = (str(m.get("mode")), str(m.get("owner")), str(m.get("group")))
    return files, meta


def unified_diff(change: NodeChange) -> str:
    """A unified diff of every file the change writes or removes."""
    out: list[str] = []
    for path in change.touched:
        old = (change.before.get(path) or b"").decode("utf-8", "replace").splitlines(keepends=True)
        new = change.files.get(path)
        new_lines = new.decode("utf-8", "replace").splitlines(keepends=True) if new else []
        out += difflib.unified_diff(
            old,
            new_lines,
            f"a{path}" if change.before.get(path) is not None else "/dev/null",
            f"b{path}" if new is not None else "/dev/null",
        )
    return "".join(line if line.endswith("\n") else line + "\n" for line in out)
