"""Preparing a change: every preflight fact gathered and checked before anything is touched.

Why one place: the operator must see *all* reasons a change is refused at once, and nothing may be
written (not even a journal) until every check passed. This module gathers the facts (inventory,
API server version and discovery, Nodes, pods, PDBs, ResourceSlices, node facts through the facts
playbook), renders and lints each node's files, and hands the plain data to the pure checks in
``rollout.change.planning``. The result, :class:`Prepared`, is what ``--dry-run`` prints and what
the
orchestrator runs.
"""

from __future__ import annotations

import base64
import difflib
import hashlib
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.ansible.inventory import read_plain
from rollout.ansible.payloads import ABSENT
from rollout.change.plan import Plan
from rollout.change.planning import (
    Batch,
    Strategy,
    blocking_pdbs,
    check_capacity,
    check_double_ownership,
    check_homogeneous,
    evictable,
    make_batches,
    parse_strategy,
)
from rollout.change.previewing import NodePreview, decide, fleet_misfits, preview_node
from rollout.change.verifying import WATCHED
from rollout.errors import InputError, Location, PreflightError, RolloutError
from rollout.kube import nodes as kn
from rollout.kubelet.facts import node_facts_from_dict
from rollout.kubelet.findings import Severity
from rollout.kubelet.intent import build_intent
from rollout.kubelet.loading import effective, node_from_files
from rollout.kubelet.render import render
from rollout.kubelet.validation import validate
from rollout.models import NodeChange, NodeFacts, NodeInfo, PodRef


@dataclass(frozen=True)
class Inventory:
    """An Ansible inventory, as ``ansible-inventory --list`` sees it.

    Attributes:
        path: the file.
        hosts: every host, in inventory order.
        groups: group -> hosts.
        hostvars: host -> variables.
    """

    path: Path
    hosts: tuple[str, ...]
    groups: Mapping[str, tuple[str, ...]]
    hostvars: Mapping[str, Mapping[str, Any]]

    def node_of(self, host: str) -> str:
        """The Kubernetes Node name of a host (``rollout_node_name``, else the host name)."""
        return str(self.hostvars.get(host, {}).get("rollout_node_name") or host)


def read_inventory(path: Path) -> Inventory:
    """Parse an inventory with ``ansible-inventory --list`` (every inventory format works).

    Raises:
        InputError: the file is not a valid inventory, or holds no hosts.
    """
    return start_inventory(path)()


def start_inventory(path: Path) -> Callable[[], Inventory]:
    """Start ``ansible-inventory --list`` (about a second of CPU) and return what waits for it
    and parses its answer (:func:`read_inventory`), so a caller can do other work meanwhile.

    Raises:
        InputError: ``ansible-inventory`` is not installed (the returned function raises the
            other errors of :func:`read_inventory`).
    """
    if (plain := read_plain(path)) is not None:  # a plain INI file: no ansible-inventory
        return lambda: _parse_inventory(path, plain)
    exe = shutil.which("ansible-inventory", path=str(Path(sys.executable).parent)) or shutil.which(
        "ansible-inventory"
    )
    if exe is None:
        raise InputError("ansible-inventory not found", Location(file=str(path)))
    proc = subprocess.Popen(
        [exe, "-i", str(path), "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true"},
    )

    def finish() -> Inventory:
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise InputError(
                f"not a valid inventory: {stderr.strip()[-300:]}", Location(file=str(path))
            )
        return _parse_inventory(path, json.loads(stdout))

    return finish


def _parse_inventory(path: Path, data: Mapping[str, Any]) -> Inventory:
    groups: dict[str, tuple[str, ...]] = {}
    order: list[str] = []
    for name, g in data.items():
        if name == "_meta" or not isinstance(g, dict):
            continue
        hosts = tuple(g.get("hosts", ()))
        groups[name] = hosts
        order += [h for h in hosts if h not in order]
    if not order:
        raise InputError("inventory has no hosts", Location(file=str(path)))
    return Inventory(path, tuple(order), groups, data.get("_meta", {}).get("hostvars", {}))


@dataclass(frozen=True)
class Prepared:
    """A change ready to run (or to print with ``--dry-run``).

    Attributes:
        strategy: the parsed strategy.
        batches: the batches to run.
        changes: node -> what it receives.
        canary: canary nodes.
        evictions: node -> pods its drain will evict.
        diffs: node -> unified diff of every file.
        report: facts worth printing (API server version, ``resource.k8s.io``).
        warnings: PDBs that may block, render warnings (not refusals).
        previews: the admission preview of every node that moves.
        accepted: predicted rejections of running pods, accepted with
            ``--accept-predicted-rejections`` (apply journals them).
    """

    strategy: Strategy
    batches: tuple[Batch, ...]
    changes: Mapping[str, NodeChange]
    canary: tuple[str, ...]
    evictions: Mapping[str, tuple[str, ...]]
    diffs: Mapping[str, str]
    report: tuple[str, ...] = ()
    warnings: tuple[str, ...] = field(default=())
    previews: tuple[NodePreview, ...] = ()
    accepted: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready plan (``--dry-run -o json``)."""
        return {
            "batches": [{"nodes": list(b.nodes), "canary": b.canary} for b in self.batches],
            "nodes": {
                n: {
                    "files": sorted(c.files),
                    "removed": list(c.removed),
                    "checkpointReset": list(c.checkpoint_reset),
                    "expected": dict(c.expected),
                    "evict": list(self.evictions.get(n, ())),
                    "diff": self.diffs.get(n, ""),
                }
                for n, c in self.changes.items()
            },
            "report": list(self.report),
            "warnings": list(self.warnings),
            "preview": {
                "nodes": [p.to_dict() for p in self.previews],
                "fitsNoNode": fleet_misfits(self.previews),
            },
            "acceptedPredictedRejections": list(self.accepted),
        }


class PreviewedRefusal(PreflightError):
    """A refusal raised after the admission preview ran: it carries the preview, so the runbook
    can show what the new config would reject even when preflight refuses (exit 3 as any
    refusal)."""

    def __init__(self, message: str, previews: tuple[NodePreview, ...]) -> None:
        super().__init__(message)
        self.previews = previews


class ClusterReader:
    """What preflight reads from the API server (the real one lives in ``rollout.kube``).

    :meth:`prefetch` reads what does not depend on the nodes' facts (run it while the facts are
    gathered); each answer it got is then served once from memory instead of read again.
    """

    def __init__(self, api: Any) -> None:
        self._kn = kn
        self.api = api
        self._got: dict[tuple[str, str], Any] = {}

    def _read(self, key: tuple[str, str], read: Callable[[], Any]) -> Any:
        if key in self._got:
            return self._got.pop(key)
        return read()

    def prefetch(self) -> None:
        """Read the server version, ``resource.k8s.io`` versions, Nodes, PDBs, DRA drivers, node
        objects, controllers and every node's pods now; any error is left for the real read to
        raise."""
        try:
            versions = self.resource_versions()
            got: dict[tuple[str, str], Any] = {
                ("version", ""): self.version(),
                ("resource_versions", ""): versions,
                ("nodes", ""): self.nodes(),
                ("pdbs", ""): self.pdbs(),
                ("dra", ",".join(versions)): self.dra(versions),
                ("node_objects", ""): self.node_objects(),
                ("controllers", ""): self.controllers(),
            }
            for n in got[("nodes", "")]:
                got[("pods", n)] = self.pods(n)
        except Exception:  # prepare's own reads raise it, properly
            return
        self._got.update(got)

    def version(self) -> str:
        return str(self._read(("version", ""), lambda: self._kn.server_version(self.api)))

    def resource_versions(self) -> list[str]:
        return list(
            self._read(("resource_versions", ""), lambda: self._kn.resource_api_versions(self.api))
        )

    def nodes(self) -> dict[str, NodeInfo]:
        return dict(self._read(("nodes", ""), lambda: self._kn.list_nodes(self.api)))

    def pods(self, node: str) -> list[PodRef]:
        return list(self._read(("pods", node), lambda: self._kn.pods_on_node(self.api, node)))

    def pdbs(self) -> list[Any]:
        return list(self._read(("pdbs", ""), lambda: self._kn.list_pdbs(self.api)))

    def dra(self, versions: list[str]) -> dict[str, list[str]]:
        return dict(
            self._read(
                ("dra", ",".join(versions)),
                lambda: self._kn.dra_drivers_by_node(self.api, versions),
            )
        )

    def node_objects(self) -> dict[str, dict[str, Any]]:
        from rollout.kube import workloads

        return dict(self._read(("node_objects", ""), lambda: workloads.node_objects(self.api)))

    def pod_objects(self, node: str) -> list[dict[str, Any]]:
        from rollout.kube import workloads

        return workloads.pod_objects(self.api, node)

    def controllers(self) -> list[dict[str, Any]]:
        from rollout.kube import workloads

        return list(self._read(("controllers", ""), lambda: workloads.controller_objects(self.api)))


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
    intent = build_intent(
        plan.kubelet_for(host),
        plan_file=plan.path,
        plan_lines=plan.lines,
        existing_reservation=existing,
    )
    r = render(node_files, intent, plan.method_for(host), plan.name)
    hw = node_facts_from_dict(raw, file=str(facts_dir / f"{host}.json"))
    findings = validate(
        r.effective_after.config,
        origins=r.effective_after.origins,
        kubelet_version=raw.get("kubeletVersion"),
        node_facts=hw,
    )
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


def prepare(
    plan: Plan,
    inv: Inventory,
    cluster: ClusterReader,
    raw_facts: Mapping[str, Mapping[str, Any]],
    facts_dir: Path,
    canary_only: bool,
    accept_predicted_rejections: bool = False,
) -> Prepared:
    """Run every preflight check; refuse with every problem named, or return the change.

    A pod running on a node that moves and predicted rejected there under the new config is a
    refusal unless ``accept_predicted_rejections``; other predicted rejections are warnings.

    Raises:
        PreflightError: one or more checks failed (all of them listed).
        InputError: the plan's strategy is malformed.
    """
    strategy = parse_strategy(plan.strategy, plan.location, len(inv.hosts))
    problems: list[str] = []
    warnings: list[str] = []
    report = [f"API server {cluster.version()}"]
    versions = cluster.resource_versions()
    report.append(
        f"resource.k8s.io served: {', '.join(versions)}"
        if versions
        else "resource.k8s.io not served"
    )
    all_nodes = cluster.nodes()
    hosts = list(inv.hosts)
    for h in hosts:
        if inv.node_of(h) not in all_nodes:
            problems.append(f"inventory host {h} has no Node {inv.node_of(h)!r} in the cluster")
    canary_hosts = list(inv.groups.get(strategy.canary_group, ()))
    if not canary_hosts:
        problems.append(
            f"inventory group {strategy.canary_group!r} (strategy.canaryGroup) has no hosts"
        )
    if problems:
        raise PreflightError("preflight refused the change:\n  " + "\n  ".join(problems))
    changes: dict[str, NodeChange] = {}
    facts: dict[str, NodeFacts] = {}
    for h in hosts:
        if h not in raw_facts:
            problems.append(f"no facts gathered for host {h}")
            continue
        try:
            change, f, errs, warns = node_change(plan, inv, h, raw_facts[h], facts_dir)
        except RolloutError as e:
            problems.append(f"node {inv.node_of(h)}: {e}")
            continue
        changes[change.node], facts[change.node] = change, f
        problems += errs
        warnings += warns
    canary = [inv.node_of(h) for h in canary_hosts]
    problems += check_homogeneous([facts[n] for n in canary if n in facts])
    order = [inv.node_of(h) for h in hosts]
    batches = make_batches(order, canary, strategy, canary_only)
    moving = [n for b in batches for n in b.nodes]
    dra = cluster.dra(versions)
    pods = {n: cluster.pods(n) for n in all_nodes}
    pdbs = cluster.pdbs()
    for n in order:
        problems += check_double_ownership(n, all_nodes[n].allocatable, dra.get(n, []))
    for n in moving:
        warnings += [b.describe() for b in blocking_pdbs(n, pods.get(n, []), pdbs)]
    for b in batches:
        problems += check_capacity(b.nodes, all_nodes, pods)
    previews: list[NodePreview] = []
    try:
        previews = _previews(cluster, moving, facts, raw_facts, facts_dir)
    except ValueError as e:  # the kubelet would not start with this config (its own words)
        problems.append(f"admission preview: the kubelet would not start: {e}")
    refused, warned, accepted = decide(previews, accept_predicted_rejections)
    problems += refused
    warnings += warned
    if problems:
        raise PreviewedRefusal(
            "preflight refused the change:\n  " + "\n  ".join(problems), tuple(previews)
        )
    return Prepared(
        strategy=strategy,
        batches=tuple(batches),
        changes={n: changes[n] for n in order},
        canary=tuple(canary),
        evictions={n: tuple(p.key for p in evictable(pods.get(n, []))) for n in moving},
        diffs={n: unified_diff(changes[n]) for n in moving},
        report=tuple(report),
        warnings=tuple(warnings),
        previews=tuple(previews),
        accepted=tuple(accepted),
    )


def _previews(
    cluster: ClusterReader,
    moving: Sequence[str],
    facts: Mapping[str, NodeFacts],
    raw_facts: Mapping[str, Mapping[str, Any]],
    facts_dir: Path,
) -> list[NodePreview]:
    """The admission preview of every node that moves (``rollout.change.previewing``)."""
    objects = cluster.node_objects()
    controllers = cluster.controllers()
    out = []
    for n in moving:
        f = facts[n]
        hw = node_facts_from_dict(raw_facts[f.host], file=str(facts_dir / f"{f.host}.json"))
        out.append(
            preview_node(objects[n], hw, f.kubelet_after, cluster.pod_objects(n), controllers)
        )
    return out


def hosts_for(inv: Inventory, nodes: Sequence[str]) -> list[str]:
    """Inventory hosts of the given Node names."""
    by_node = {inv.node_of(h): h for h in inv.hosts}
    return [by_node[n] for n in nodes if n in by_node]
