"""Preparing a change: every preflight fact gathered and checked before anything is touched.

Why one place: the operator must see *all* reasons a change is refused at once, and nothing may be
written (not even a journal) until every check passed. This module gathers the facts (API server
version and discovery, Nodes, pods, PDBs, ResourceSlices, through :class:`ClusterReader`), has each
node's files rendered and linted (:mod:`rollout.change.preflight.node_change`), and hands the plain
data to the pure checks in ``rollout.change.plan`` (``batches``, ``drain_rules``, ``capacity``). The
result, :class:`Prepared`, is what ``--dry-run`` prints and what the orchestrator runs. The
inventory it runs on is read by :mod:`rollout.ansible.hosts`.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.ansible.hosts import Inventory
from rollout.change.plan.batches import (
    Batch,
    check_homogeneous,
    make_batches,
    one_control_plane_at_a_time,
)
from rollout.change.plan.capacity import PlacementIndex, check_capacity, check_placement
from rollout.change.plan.drain_rules import DrainOverrides, blocking_pdbs, evictable, undrainable
from rollout.change.plan.schema import Plan
from rollout.change.plan.strategy import Strategy
from rollout.change.preflight import device_checks
from rollout.change.preflight.node_change import node_change, unified_diff
from rollout.change.tenancy.audit import ALIGNING, Audit, change_refusals
from rollout.errors import PreflightError, RolloutError
from rollout.kube import canaries, workloads
from rollout.kube import nodes as kn
from rollout.kubelet.admission.node_preview import (
    NodePreview,
    decide,
    fleet_misfits,
    lands_on,
    preview_node,
)
from rollout.kubelet.facts import node_facts_from_dict
from rollout.models import NodeChange, NodeFacts, NodeInfo, PodListing, ServingReads
from rollout.protocols import PreflightReads

if TYPE_CHECKING:
    from rollout.kube.client import Api

# what callers of rollout.change.preflight.checking import from here, though it now lives beside it
__all__ = [
    "ClusterReader",
    "Prepared",
    "PreviewedRefusal",
    "prepare",
]


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
        forced: device refusals (:mod:`rollout.change.preflight.device_checks`) overridden with
            ``--force REASON`` (apply journals them with the reason).
        raw_facts: the facts preflight judged, by host (apply's ``before`` evidence is built
            from them).
        losses: pods to evict that no controller recreates or that have ``emptyDir`` data,
            allowed by ``--force-delete-unmanaged`` / ``--delete-emptydir-data`` (journaled).
        serving_forced: model-serving canaries in progress (:mod:`rollout.kube.canaries`)
            overridden with ``--force-serving REASON`` (journaled with the reason).
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
    forced: tuple[str, ...] = ()
    raw_facts: Mapping[str, Mapping[str, Any]] = field(default_factory=dict, repr=False)
    losses: tuple[str, ...] = ()
    serving_forced: tuple[str, ...] = ()

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
            "forcedRefusals": list(self.forced),
            "forcedServingCanaries": list(self.serving_forced),
            "allowedLosses": list(self.losses),
        }


class PreviewedRefusal(PreflightError):
    """A refusal raised after the admission preview ran: it carries the preview, so the runbook
    can show what the new config would reject even when preflight refuses (exit 3 as any
    refusal)."""

    def __init__(self, message: str, previews: tuple[NodePreview, ...]) -> None:
        super().__init__(message)
        self.previews = previews


class ClusterReader:
    """What preflight reads from the API server (:class:`~rollout.protocols.PreflightReads`),
    through ``rollout.kube``.

    :meth:`prefetch` reads what does not depend on the nodes' facts (run it while the facts are
    gathered); each answer it got is then served once from memory instead of read again. It lists
    the Nodes once and the cluster's pods once, paginated (:func:`rollout.kube.nodes.pods_by_node`:
    no request per Node, so the requests do not grow with the Nodes outside the inventory): the
    checks' records (:class:`NodeInfo`, :class:`PodRef`, each Node's :class:`Requests`) and the
    admission preview's objects come from the same listings, of which only what the checks read
    is decoded for the Nodes outside the inventory (:mod:`rollout.kube.briefs`).

    Args:
        api: the API connection.
        nodes: the Node names of the inventory: only they and their pods are kept as records
            and whole objects (the admission preview reads them); None keeps every node's.
    """

    def __init__(self, api: Api, nodes: Collection[str] | None = None) -> None:
        self._kn = kn
        self._wl = workloads
        self._sv = canaries
        self.api = api
        self.wanted = None if nodes is None else frozenset(nodes)
        self._got: dict[tuple[str, str], Any] = {}

    def _read(self, key: tuple[str, str], read: Callable[[], Any]) -> Any:
        if key in self._got:
            return self._got.pop(key)
        return read()

    def prefetch(self) -> None:
        """Read the server version, ``resource.k8s.io`` versions, Nodes, PDBs, DRA drivers,
        DeviceClasses, controllers and the cluster's pods now; any error is left for the real
        read to raise."""
        try:
            versions = self.resource_versions()
            infos, objects = self._node_listing()
            got: dict[tuple[str, str], Any] = {
                ("version", ""): self.version(),
                ("resource_versions", ""): versions,
                ("nodes", ""): infos,
                ("node_objects", ""): objects,
                ("pdbs", ""): self.pdbs(),
                ("dra", ",".join(versions)): self.dra(versions),
                ("device_classes", ",".join(versions)): self.device_classes(versions),
                _controllers_key(objects): self.controllers(objects),
                ("pod_listing", ""): self.pod_listing(),
                ("serving", ""): self.serving(),
            }
        except Exception:  # prepare's own reads raise it, properly
            return
        self._got.update(got)

    def version(self) -> str:
        return str(self._read(("version", ""), lambda: self._kn.server_version(self.api)))

    def resource_versions(self) -> list[str]:
        return list(
            self._read(("resource_versions", ""), lambda: self._kn.resource_api_versions(self.api))
        )

    def _node_listing(self) -> tuple[dict[str, NodeInfo], dict[str, dict[str, Any]]]:
        """One listing of the Nodes: every Node's record, and the inventory's as objects."""
        return self._kn.nodes_listed(self.api, self.wanted)

    def nodes(self) -> dict[str, NodeInfo]:
        return dict(self._read(("nodes", ""), lambda: self._node_listing()[0]))

    def pod_listing(self) -> PodListing:
        """Every pod not finished: the inventory's nodes' as records and objects (oldest
        first), every node's summed requests; one paginated listing."""
        listing: PodListing = self._read(
            ("pod_listing", ""), lambda: self._kn.pods_by_node(self.api, self.wanted)
        )
        return listing

    def pdbs(self) -> list[Any]:
        return list(self._read(("pdbs", ""), lambda: self._kn.list_pdbs(self.api)))

    def dra(self, versions: list[str]) -> dict[str, list[str]]:
        return dict(
            self._read(
                ("dra", ",".join(versions)),
                lambda: self._kn.dra_drivers_by_node(self.api, versions),
            )
        )

    def device_classes(self, versions: list[str]) -> list[dict[str, Any]]:
        return list(
            self._read(
                ("device_classes", ",".join(versions)),
                lambda: self._kn.device_class_objects(self.api, versions),
            )
        )

    def serving(self) -> ServingReads:
        """Model-serving canaries in progress, Deployments rolling out (every namespace)."""
        reads: ServingReads = self._read(("serving", ""), lambda: self._sv.serving_reads(self.api))
        return reads

    def node_objects(self) -> dict[str, dict[str, Any]]:
        """The inventory's Nodes (every Node when the reader has no inventory) as objects."""
        return dict(self._read(("node_objects", ""), lambda: self._node_listing()[1]))

    def controllers(self, nodes: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Every controller, whole where its pod template lands on one of ``nodes`` (Node
        objects: the preview judges only those), else as its metadata alone."""

        def wanted(spec: dict[str, Any]) -> bool:
            return any(lands_on(spec, n) for n in nodes.values())

        return list(
            self._read(
                _controllers_key(nodes),
                lambda: self._wl.controller_objects(self.api, wanted),
            )
        )


def _controllers_key(nodes: Collection[str]) -> tuple[str, str]:
    """What a controllers read is remembered by: the Nodes whose landing templates it kept."""
    return "controllers", ",".join(sorted(nodes))


def prepare(
    plan: Plan,
    inv: Inventory,
    cluster: PreflightReads,
    raw_facts: Mapping[str, Mapping[str, Any]],
    facts_dir: Path,
    canary_only: bool,
    accept_predicted_rejections: bool = False,
    force: bool = False,
    overrides: DrainOverrides | None = None,
    settled: Collection[str] = (),
    force_serving: bool = False,
    tenancy: Audit | None = None,
) -> Prepared:
    """Run every preflight check; refuse with every problem named, or return the change.

    A pod running on a node that moves and predicted rejected there under the new config is a
    refusal unless ``accept_predicted_rejections``; other predicted rejections are warnings. The
    device refusals of a node that moves (:mod:`rollout.change.preflight.device_checks`: GPUs not
    all advertised, one resource served by a device plugin and DRA, by name or by vendor domain; the
    vendor-domain one only on the nodes not ``settled``) are warnings with ``force``
    (``Prepared.forced``); every other refusal stands.
    A node that moves and holds pods no controller recreates, or pods with ``emptyDir`` data, is
    a refusal unless ``overrides`` allows it (kubectl drain's rules); the allowances are put in
    the returned strategy's drain policy, which the node step checks again before each cordon.
    ``settled``: nodes the change already moved (``promote``, ``resume``): not drained again, so
    left out of the drain and capacity checks.
    A model-serving canary in progress (:mod:`rollout.kube.canaries`: an Argo Rollout, a Flagger
    Canary, a KServe InferenceService rolling out, a Deployment rolling out with a pod on a node
    this command changes) is a refusal unless ``force_serving`` (``Prepared.serving_forced``).
    ``tenancy``: the audit of the plan's tenancy file (``rollout tenancy audit``); one that does
    not pass refuses a change that moves a node with DRA devices or leaves it under an aligning
    Topology Manager policy (a pool shared by tenants), forceable like the device refusals;
    otherwise it is a warning.

    Raises:
        PreflightError: one or more checks failed (all of them listed).
    """
    overrides = overrides or DrainOverrides()
    strategy = plan.strategy.for_nodes(len(inv.hosts))
    strategy = replace(
        strategy,
        drain=replace(
            strategy.drain,
            delete_unmanaged=overrides.delete_unmanaged,
            delete_emptydir_data=overrides.delete_emptydir_data,
        ),
    )
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
    batches, restarts = one_control_plane_at_a_time(
        batches, {n: c.service for n, c in changes.items()}
    )
    warnings += restarts
    moving = [n for b in batches for n in b.nodes]
    dra = cluster.dra(versions)
    listing = cluster.pod_listing()
    pods, pod_objects, used = listing.refs, listing.objects, listing.used
    pdbs = cluster.pdbs()
    changed = [n for n in moving if n not in settled]
    serving = cluster.serving()
    warnings += serving.unread
    in_progress = [
        *serving.canaries,
        *canaries.rolling_on(serving.deployments, changed, pod_objects),
    ]
    if force_serving:
        warnings += [f"forced (--force-serving): {s}" for s in in_progress]
    elif in_progress:
        problems += in_progress
        problems.append(
            "(the model-serving canaries above: `--force-serving REASON` overrides; the reason "
            "is journaled)"
        )
    for n in (n for n in moving if n not in settled):
        warnings += [b.describe() for b in blocking_pdbs(n, pods.get(n, []), pdbs)]
        problems += undrainable(
            n, pods.get(n, []), overrides.delete_unmanaged, overrides.delete_emptydir_data
        )
    placements = PlacementIndex(all_nodes)
    for b in batches:
        drained = [n for n in b.nodes if n not in settled]
        if not drained:
            continue
        short = check_capacity(drained, all_nodes, pods, used)
        misplaced, pinned = check_placement(drained, all_nodes, pods, placements, used)
        warnings += pinned
        if overrides.capacity_warn_only:
            warnings += [f"{w} (--capacity-warn-only: not refused)" for w in short + misplaced]
        else:
            problems += short + misplaced
    objects = cluster.node_objects()
    device_refusals, device_warnings = _device_checks(
        cluster, objects, versions, moving, changed, facts, raw_facts, dra
    )
    warnings += device_warnings
    tenancy_refusals = _tenancy_checks(tenancy, report, warnings, moving, facts, dra)
    if force:
        warnings += [f"forced (--force): {p}" for p in device_refusals + tenancy_refusals]
    elif device_refusals:
        problems += device_refusals
        problems.append("(the device refusals above: `rollout apply --force REASON` overrides)")
    if tenancy_refusals and not force:
        problems += tenancy_refusals
        problems.append("(the tenancy refusals above: `rollout apply --force REASON` overrides)")
    previews: list[NodePreview] = []
    try:
        previews = _previews(cluster, objects, moving, facts, raw_facts, facts_dir, pod_objects)
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
        forced=tuple(device_refusals + tenancy_refusals) if force else (),
        serving_forced=tuple(in_progress) if force_serving else (),
        raw_facts=raw_facts,
        losses=tuple(
            sorted(
                p.key
                for n in moving
                if n not in settled
                for p in evictable(pods.get(n, []))
                if (p.unmanaged and overrides.delete_unmanaged)
                or (p.local_storage and overrides.delete_emptydir_data)
            )
        ),
    )


def _tenancy_checks(
    audit: Audit | None,
    report: list[str],
    warnings: list[str],
    moving: Sequence[str],
    facts: Mapping[str, NodeFacts],
    dra: Mapping[str, list[str]],
) -> list[str]:
    """The tenancy audit's line in the report, and its refusals (or warnings, where no node
    that moves has DRA devices or is left under an aligning Topology Manager policy)."""
    if audit is None:
        return []
    report.append(f"tenancy audit of {audit.policy}: {audit.result} ({len(audit.rows)} checks)")
    if audit.result == "pass":
        return []
    guarded = [
        n
        for n in moving
        if dra.get(n)
        or str((facts[n].kubelet_after if n in facts else {}).get("topologyManagerPolicy"))
        in ALIGNING
    ]
    lines = change_refusals(audit)
    if guarded:
        return lines
    warnings += lines
    return []


def _device_checks(
    cluster: PreflightReads,
    objects: Mapping[str, Mapping[str, Any]],
    versions: list[str],
    moving: Sequence[str],
    changed: Collection[str],
    facts: Mapping[str, NodeFacts],
    raw_facts: Mapping[str, Mapping[str, Any]],
    dra: Mapping[str, list[str]],
) -> tuple[list[str], list[str]]:
    """The device refusals and warnings of the nodes that move (``device_checks``); the
    vendor-domain check only on ``changed`` (the nodes this command changes: the canary for
    ``apply --canary``, the nodes left for ``promote``)."""
    classes = device_checks.device_classes(cluster.device_classes(versions))
    refusals: list[str] = []
    warnings: list[str] = []
    for n in moving:
        status = (objects.get(n) or {}).get("status") or {}
        capacity = status.get("capacity") or {}
        allocatable = status.get("allocatable") or {}
        f = facts.get(n)
        pci = len(raw_facts.get(f.host, {}).get("gpus") or ()) if f else 0
        drivers = dra.get(n, [])
        refusals += device_checks.check_advertised(
            n, capacity, allocatable, pci, dra_drivers=drivers
        )
        refusals += device_checks.check_dra_extended(n, capacity, drivers, classes)
        if n in changed:
            refusals += device_checks.check_vendor_domain(n, allocatable, drivers)
        policy = str((f.kubelet_after if f else {}).get("topologyManagerPolicy") or "none")
        warnings += device_checks.dra_topology_warnings(n, drivers, policy)
    return refusals, warnings


def _previews(
    cluster: PreflightReads,
    objects: Mapping[str, Mapping[str, Any]],
    moving: Sequence[str],
    facts: Mapping[str, NodeFacts],
    raw_facts: Mapping[str, Mapping[str, Any]],
    facts_dir: Path,
    pod_objects: Mapping[str, Sequence[dict[str, Any]]],
) -> list[NodePreview]:
    """The admission preview of every node that moves (``rollout.kubelet.admission.node_preview``),
    over each node's pods (``pod_objects``: oldest first)."""
    controllers = cluster.controllers(objects)
    out = []
    for n in moving:
        f = facts.get(n)
        if f is None:  # no facts or no render: preflight names why; nothing to preview
            continue
        hw = node_facts_from_dict(raw_facts[f.host], file=str(facts_dir / f"{f.host}.json"))
        out.append(
            preview_node(objects[n], hw, f.kubelet_after, list(pod_objects.get(n, ())), controllers)
        )
    return out
