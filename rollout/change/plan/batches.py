"""Pure planning: the plan's ``strategy`` section, batches, and preflight checks over plain data.

Why pure: preflight is what stands between an operator's plan and production nodes, and it must
say exactly why it refuses (naming the odd node, the blocking PodDisruptionBudget, the missing
capacity).
Keeping it free of I/O means every rule is a table-driven unit test; the orchestrator only gathers
the facts (nodes, pods, PDBs, ResourceSlices) and hands them in.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from rollout.durations import parse_go_duration
from rollout.errors import InputError, Location
from rollout.kubelet.admission.node_preview import lands_on
from rollout.kubelet.distributions import CONTROL_PLANE_UNITS
from rollout.models import NodeFacts, NodeInfo, PdbRef, PodRef, Requests, requests_of

STRATEGY_KEYS = ("canaryGroup", "maxUnavailable", "drain", "batches")
DRAIN_KEYS = ("timeout", "backoffCap", "disableEviction", "gracePeriod")


@dataclass(frozen=True)
class DrainPolicy:
    """How a node is drained.

    Attributes:
        timeout_s: give up on a node's drain after this long (the node is then restored).
        backoff_initial_s: first wait after a 429.
        backoff_cap_s: the longest wait between eviction attempts of one pod.
        disable_eviction: delete pods instead of evicting them (bypasses PDBs; only when asked).
        grace_period_s: termination grace period for evicted pods (None: the pod's own).
        delete_unmanaged: evict pods no controller recreates (``--force-delete-unmanaged``);
            otherwise the forward path refuses a node holding one, before cordoning it.
        delete_emptydir_data: evict pods with ``emptyDir`` volumes (``--delete-emptydir-data``);
            otherwise the same refusal.
    """

    timeout_s: float = 120.0
    backoff_initial_s: float = 0.5
    backoff_cap_s: float = 10.0
    disable_eviction: bool = False
    grace_period_s: int | None = None
    delete_unmanaged: bool = False
    delete_emptydir_data: bool = False


@dataclass(frozen=True)
class DrainOverrides:
    """What the operator allowed the drains on the command line (``rollout apply``).

    Attributes:
        delete_unmanaged: ``--force-delete-unmanaged``: pods no controller recreates are evicted.
        delete_emptydir_data: ``--delete-emptydir-data``: pods with ``emptyDir`` are evicted.
        capacity_warn_only: ``--capacity-warn-only``: the capacity and placement checks warn,
            never refuse.
    """

    delete_unmanaged: bool = False
    delete_emptydir_data: bool = False
    capacity_warn_only: bool = False

    @classmethod
    def from_flags(cls, flags: Collection[str]) -> DrainOverrides:
        """The overrides the flags (as :meth:`used` lists them) name."""
        return cls(
            delete_unmanaged="--force-delete-unmanaged" in flags,
            delete_emptydir_data="--delete-emptydir-data" in flags,
            capacity_warn_only="--capacity-warn-only" in flags,
        )

    def used(self) -> list[str]:
        """The flags given, as typed (journaled when a change starts)."""
        names = {
            "delete_unmanaged": "--force-delete-unmanaged",
            "delete_emptydir_data": "--delete-emptydir-data",
            "capacity_warn_only": "--capacity-warn-only",
        }
        return [flag for attr, flag in names.items() if getattr(self, attr)]


@dataclass(frozen=True)
class Strategy:
    """The plan's ``strategy`` section.

    Attributes:
        canary_group: the inventory group holding the canary nodes.
        max_unavailable: how many nodes are changed at once.
        drain: drain policy.
        batches: optional sizes of the batches after the canary (default: ``max_unavailable``).
        max_unavailable_percent: ``maxUnavailable`` as the plan wrote a percentage (None: a
            count); :meth:`for_nodes` resolves it against the change's node count (until then
            ``max_unavailable`` is the percentage of one node, at least 1).
    """

    canary_group: str = "canary"
    max_unavailable: int = 1
    drain: DrainPolicy = field(default_factory=DrainPolicy)
    batches: tuple[int, ...] = ()
    max_unavailable_percent: float | None = field(default=None, compare=False)

    def for_nodes(self, node_count: int) -> Strategy:
        """The strategy for a change of ``node_count`` nodes: a percentage ``maxUnavailable``
        resolved (rounded down, at least 1); a count as written."""
        if self.max_unavailable_percent is None:
            return self
        return replace(self, max_unavailable=_percent_of(self.max_unavailable_percent, node_count))


def parse_duration(value: Any, where: Location) -> float:
    """Seconds from a number or a Go duration (``"30s"``, ``"1m30s"``, ``"500ms"``, ``"2h"``).

    Raises:
        InputError: not a duration (location named).
    """
    if isinstance(value, bool):
        raise InputError(f"not a duration: {value!r}", where)
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        try:
            seconds = parse_go_duration(str(value).strip())
        except ValueError:
            raise InputError(
                f"not a duration: {value!r} (Go's grammar: e.g. 30s, 1m30s, 500ms, 2h)", where
            ) from None
    if seconds <= 0:
        raise InputError(f"must be positive, got {value!r}", where)
    return seconds


def parse_strategy(
    raw: Mapping[str, Any],
    location: Callable[[str], Location],
    node_count: int | None = None,
) -> Strategy:
    """Parse the plan's ``strategy`` section.

    Args:
        raw: the raw section (may be empty: defaults apply).
        location: maps a dotted field (``strategy.drain.timeout``) to a file/line location.
        node_count: total number of nodes, to resolve a percentage ``maxUnavailable``.

    Raises:
        InputError: unknown field or bad value, with file, field and line.
    """
    for k in raw:
        if k not in STRATEGY_KEYS:
            raise InputError(
                f"unknown field; valid: {', '.join(STRATEGY_KEYS)}", location(f"strategy.{k}")
            )
    group = raw.get("canaryGroup", "canary")
    if not isinstance(group, str) or not group:
        raise InputError("must be a non-empty string", location("strategy.canaryGroup"))
    mu, percent = _max_unavailable(raw.get("maxUnavailable", 1), location, node_count)
    drain_raw = raw.get("drain") or {}
    if not isinstance(drain_raw, Mapping):
        raise InputError("must be a mapping", location("strategy.drain"))
    for k in drain_raw:
        if k not in DRAIN_KEYS:
            raise InputError(
                f"unknown field; valid: {', '.join(DRAIN_KEYS)}", location(f"strategy.drain.{k}")
            )
    d = DrainPolicy()
    timeout = d.timeout_s
    if "timeout" in drain_raw:
        timeout = parse_duration(drain_raw["timeout"], location("strategy.drain.timeout"))
    cap = d.backoff_cap_s
    if "backoffCap" in drain_raw:
        cap = parse_duration(drain_raw["backoffCap"], location("strategy.drain.backoffCap"))
    disable = drain_raw.get("disableEviction", False)
    if not isinstance(disable, bool):
        raise InputError("must be true or false", location("strategy.drain.disableEviction"))
    grace = drain_raw.get("gracePeriod")
    if grace is not None:
        grace = int(parse_duration(grace, location("strategy.drain.gracePeriod")))
    batches_raw = raw.get("batches") or []
    if not isinstance(batches_raw, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in batches_raw
    ):
        raise InputError("must be a list of positive batch sizes", location("strategy.batches"))
    return Strategy(
        canary_group=group,
        max_unavailable=mu,
        drain=DrainPolicy(
            timeout_s=timeout,
            backoff_initial_s=min(d.backoff_initial_s, cap),
            backoff_cap_s=cap,
            disable_eviction=disable,
            grace_period_s=grace,
        ),
        batches=tuple(batches_raw),
        max_unavailable_percent=percent,
    )


def _percent_of(pct: float, node_count: int | None) -> int:
    return max(1, int((node_count or 1) * pct / 100))


def _max_unavailable(
    value: Any, location: Callable[[str], Location], node_count: int | None
) -> tuple[int, float | None]:
    """``maxUnavailable`` as a count, and the percentage it was written as (None: a count)."""
    where = location("strategy.maxUnavailable")
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise InputError(f"must be at least 1, got {value}", where)
        return value, None
    if isinstance(value, str) and value.endswith("%"):
        try:
            pct = float(value[:-1])
        except ValueError as e:
            raise InputError(f"not a percentage: {value!r}", where) from e
        if not 0 < pct <= 100:
            raise InputError(f"must be between 0% and 100%, got {value}", where)
        return _percent_of(pct, node_count), pct
    raise InputError(f"must be a positive integer or a percentage, got {value!r}", where)


@dataclass(frozen=True)
class Batch:
    """Nodes changed together.

    Attributes:
        nodes: Node names.
        canary: part of the canary group (the gate runs after the last canary batch).
    """

    nodes: tuple[str, ...]
    canary: bool


def make_batches(
    nodes: Sequence[str], canary: Sequence[str], strategy: Strategy, canary_only: bool
) -> list[Batch]:
    """Split nodes into batches: canary nodes first (``maxUnavailable`` at a time), then the rest.

    Args:
        nodes: every node of the change, in inventory order.
        canary: the canary group's nodes.
        strategy: batch sizes.
        canary_only: stop after the canary (``--canary``).
    """
    size = strategy.max_unavailable
    canary_set = set(canary)
    first = [n for n in nodes if n in canary_set]
    out = [Batch(tuple(first[i : i + size]), True) for i in range(0, len(first), size)]
    if canary_only:
        return out
    rest = [n for n in nodes if n not in canary_set]
    sizes = list(strategy.batches)
    i = 0
    while i < len(rest):
        n = sizes.pop(0) if sizes else size
        out.append(Batch(tuple(rest[i : i + n]), False))
        i += n
    return out


def one_control_plane_at_a_time(
    batches: Sequence[Batch], units: Mapping[str, str]
) -> tuple[list[Batch], list[str]]:
    """Nodes whose kubelet restart restarts the control plane too (the k3s server, the RKE2
    server, MicroK8s' kubelite) each get a batch of their own, in order; the other nodes of a
    batch stay together. Returns the batches and one warning per such node saying so.

    Args:
        batches: from :func:`make_batches`.
        units: node -> the systemd unit its change restarts.
    """
    out: list[Batch] = []
    warnings: list[str] = []
    for b in batches:
        special = [n for n in b.nodes if units.get(n) in CONTROL_PLANE_UNITS]
        rest = tuple(n for n in b.nodes if n not in special)
        if rest:
            out.append(Batch(rest, b.canary))
        out += [Batch((n,), b.canary) for n in special]
        for n in special:
            unit = units[n]
            warnings.append(
                f"node {n}: restarting the kubelet restarts {unit}, that is "
                f"{CONTROL_PLANE_UNITS[unit]}: the control plane on this node restarts with it; "
                "such nodes are changed one at a time"
            )
    return out, warnings


# ---------------------------------------------------------------------------------------------
# Preflight checks: each returns human-readable problems; empty means fine.


def _signature(f: NodeFacts) -> dict[str, str]:
    return {
        "CPU model": f.cpu_model or "?",
        "NUMA layout": ";".join(f.numa) or "?",
        "GPU model": f.gpu_model or "none",
    }


def check_homogeneous(facts: Sequence[NodeFacts]) -> list[str]:
    """The canary group must be alike (CPU model, NUMA layout, GPU model), or its verdict means
    nothing for the rest. Names each odd node and what differs from the majority."""
    if len(facts) < 2:
        return []
    sigs = {f.node: _signature(f) for f in facts}
    problems = []
    for attr in ("CPU model", "NUMA layout", "GPU model"):
        counts = Counter(s[attr] for s in sigs.values())
        if len(counts) == 1:
            continue
        common, _ = counts.most_common(1)[0]
        for node, s in sigs.items():
            if s[attr] != common:
                problems.append(
                    f"canary group is not homogeneous: node {node} has {attr} {s[attr]!r}, "
                    f"the others {common!r}"
                )
    return problems


@dataclass(frozen=True)
class PdbBlock:
    """A PodDisruptionBudget that would block the drain of one node.

    Attributes:
        node: the node being drained.
        pdb: ``namespace/name`` of the budget.
        pods: the pods it protects on that node.
        reason: why it would block.
    """

    node: str
    pdb: str
    pods: tuple[str, ...]
    reason: str

    def describe(self) -> str:
        """One line for the operator."""
        return (
            f"node {self.node}: PodDisruptionBudget {self.pdb} would block eviction of "
            f"{', '.join(self.pods)}: {self.reason}"
        )


def evictable(pods: Sequence[PodRef]) -> list[PodRef]:
    """The pods a drain evicts: not DaemonSet-owned, not static mirrors."""
    return [p for p in pods if not p.daemonset and not p.mirror]


UNMANAGED_FLAG = "--force-delete-unmanaged"
"""The flag that lets a drain evict pods no controller recreates. kubectl drain calls it
``--force``; here ``--force`` already means "override a refusal, give a REASON" (``promote``,
``rollback``), so the name says what is forced."""
EMPTYDIR_FLAG = "--delete-emptydir-data"
"""kubectl drain's own name for evicting pods whose ``emptyDir`` data is lost with them."""


def undrainable(
    node: str,
    pods: Sequence[PodRef],
    delete_unmanaged: bool = False,
    delete_emptydir_data: bool = False,
) -> list[str]:
    """Why draining ``node`` would lose something for good, in kubectl drain's words, with every
    such pod named: pods that declare no controller (nothing recreates them), pods with local
    storage (their ``emptyDir`` data goes with them). DaemonSet pods and static mirrors are not
    evicted, so never named; a flag that allows a kind leaves it out."""
    moving = evictable(pods)
    problems = []
    bare = sorted(p.key for p in moving if p.unmanaged)
    if bare and not delete_unmanaged:
        problems.append(
            f"node {node}: cannot delete Pods that declare no controller "
            f"(use {UNMANAGED_FLAG} to override): {', '.join(bare)}"
        )
    local = sorted(p.key for p in moving if p.local_storage)
    if local and not delete_emptydir_data:
        problems.append(
            f"node {node}: cannot delete Pods with local storage "
            f"(use {EMPTYDIR_FLAG} to override): {', '.join(local)}"
        )
    return problems


def blocking_pdbs(node: str, pods: Sequence[PodRef], pdbs: Sequence[PdbRef]) -> list[PdbBlock]:
    """PDBs that would refuse an eviction from ``node`` now (``disruptionsAllowed`` 0, or
    ``minAvailable`` at or above the expected pods, which can never be satisfied)."""
    out = []
    for pdb in pdbs:
        hit = tuple(p.key for p in evictable(pods) if pdb.matches(p))
        if not hit:
            continue
        if pdb.min_available is not None and pdb.min_available >= max(pdb.expected_pods, 1):
            reason = (
                f"minAvailable {pdb.min_available} >= {pdb.expected_pods} expected pods "
                "(can never allow a disruption)"
            )
        elif pdb.disruptions_allowed <= 0:
            reason = "ALLOWED DISRUPTIONS is 0"
        elif pdb.disruptions_allowed < len(hit):
            reason = f"allows {pdb.disruptions_allowed} disruption(s) for {len(hit)} pods here"
        else:
            continue
        out.append(PdbBlock(node, f"{pdb.namespace}/{pdb.name}", hit, reason))
    return out


def _free(info: NodeInfo, used: Requests | None) -> dict[str, int]:
    """What a node has left: allocatable minus the requests of the pods on it (``used``), per
    resource (``cpu`` in millicores, ``memory`` in bytes, each extended resource in units)."""
    used = used or _NOTHING
    free = {
        "cpu": info.cpu_millis - used.cpu_millis,
        "memory": info.memory_bytes - used.memory_bytes,
    }
    for r, v in device_resources(info.allocatable).items():
        try:
            have = int(v)
        except ValueError:
            continue
        free[r] = have - used.extended.get(r, 0)
    return {k: max(0, v) for k, v in free.items()}


_NOTHING = Requests()


def usage(pods_by_node: Mapping[str, Sequence[PodRef]]) -> dict[str, Requests]:
    """Each node's summed requests, from its pods' records."""
    return {n: requests_of(pods) for n, pods in pods_by_node.items()}


def _needs(p: PodRef) -> dict[str, int]:
    return {"cpu": p.cpu_millis, "memory": p.memory_bytes, **p.extended}


def _node_object(info: NodeInfo) -> dict[str, Any]:
    """The Node as ``previewing.lands_on`` reads it (labels, taints)."""
    return {
        "metadata": {"name": info.name, "labels": dict(info.labels)},
        "spec": {"taints": list(info.taints)},
    }


class PlacementIndex:
    """Which Nodes a placement (nodeSelector, affinity, tolerations) allows, each distinct
    placement judged against every Node once.

    Why: :func:`check_placement` asks for every evicted pod of every batch; in a cluster of
    thousands of Nodes building each Node's object per batch and matching each pod against all
    of them was a tenth of preflight's CPU (``docs/scale.md``), while most pods of a fleet share
    a handful of placements (none, or a pool's nodeSelector).
    """

    def __init__(self, nodes: Mapping[str, NodeInfo]) -> None:
        self._nodes = nodes
        self._objects: dict[str, dict[str, Any]] | None = None
        self._allowed: dict[str, tuple[str, ...]] = {}

    def allowed(self, placement: Mapping[str, Any]) -> tuple[str, ...]:
        """The Nodes (in ``nodes``' order) whose labels and taints ``placement`` allows."""
        key = json.dumps(placement, sort_keys=True, default=str)
        hit = self._allowed.get(key)
        if hit is None:
            if self._objects is None:
                self._objects = {n: _node_object(i) for n, i in self._nodes.items()}
            hit = tuple(n for n, o in self._objects.items() if lands_on(placement, o))
            self._allowed[key] = hit
        return hit


def _amount(resource: str, n: int) -> str:
    if resource == "cpu":
        return f"{n}m"
    return f"{n} bytes" if resource == "memory" else str(n)


def check_capacity(
    batch: Sequence[str],
    nodes: Mapping[str, NodeInfo],
    pods_by_node: Mapping[str, Sequence[PodRef]],
    used: Mapping[str, Requests] | None = None,
) -> list[str]:
    """Whether the nodes left schedulable while ``batch`` is drained can take its evicted pods.

    A sum per resource (CPU, memory and every extended resource, ``nvidia.com/gpu``) over the
    requests of the evicted pods against what the other schedulable nodes have free: the clear
    cases (a cluster with no room left) without pretending to be the scheduler. Where each pod
    may go (its nodeSelector, affinity, tolerations) is :func:`check_placement`.

    ``pods_by_node``: the pods of the batch's nodes (at least); ``used``: every node's summed
    requests (default: summed from ``pods_by_node``).
    """
    used = usage(pods_by_node) if used is None else used
    moving = [p for n in batch for p in evictable(pods_by_node.get(n, ()))]
    need: dict[str, int] = {}
    for p in moving:
        for r, v in _needs(p).items():
            need[r] = need.get(r, 0) + v
    if not moving or not any(need.values()):
        return []
    free: dict[str, int] = dict.fromkeys(need, 0)
    for name, info in nodes.items():
        if name in batch or info.unschedulable or not info.ready:
            continue
        for r, v in _free(info, used.get(name)).items():
            if r in free:
                free[r] += v
    problems = []
    where = ", ".join(batch)
    if need.get("cpu", 0) > free["cpu"]:
        problems.append(
            f"not enough CPU left for the pods evicted from {where}: "
            f"they request {need['cpu']}m, the other schedulable nodes have {free['cpu']}m free"
        )
    if need.get("memory", 0) > free["memory"]:
        problems.append(
            f"not enough memory left for the pods evicted from {where}: "
            f"they request {need['memory']} bytes, the other schedulable nodes have "
            f"{free['memory']} free"
        )
    for r in sorted(k for k in need if k not in ("cpu", "memory")):
        if need[r] > free[r]:
            problems.append(
                f"not enough {r} left for the pods evicted from {where}: "
                f"they request {need[r]}, the other schedulable nodes have {free[r]} free"
            )
    return problems


def check_placement(
    batch: Sequence[str],
    nodes: Mapping[str, NodeInfo],
    pods_by_node: Mapping[str, Sequence[PodRef]],
    index: PlacementIndex | None = None,
    used: Mapping[str, Requests] | None = None,
) -> tuple[list[str], list[str]]:
    """Where each pod evicted from ``batch`` can go: a node outside the batch, schedulable and
    Ready, that its nodeSelector, required node affinity and tolerations allow (as the
    scheduler reads them; pod (anti-)affinity is not read) and that has its requests free (each
    pod alone: a necessary condition, not a bin-packing).

    Returns:
        (refusals, warnings): a pod that other nodes would take by its placement but none has
        room for is a refusal, its requests and each candidate's free amounts named; a pod whose
        placement allows no node but the batch's own (pinned to its node) comes back only with
        it, and is a warning.

    ``index``: one :class:`PlacementIndex` over ``nodes`` shared by every batch of a preflight;
    ``used``: every node's summed requests (default: summed from ``pods_by_node``).
    """
    used = usage(pods_by_node) if used is None else used
    refusals: list[str] = []
    warnings: list[str] = []
    index = index or PlacementIndex(nodes)
    drained = set(batch)
    for node in batch:
        for p in evictable(pods_by_node.get(node, ())):
            allowed = [n for n in index.allowed(p.placement) if n not in drained]
            if not allowed:
                others = any(n not in batch for n in nodes)
                why = (
                    "its nodeSelector, node affinity or tolerations allow none"
                    if others
                    else ("there is none")
                )
                warnings.append(
                    f"pod {p.key} can run on no node outside {', '.join(batch)} ({why}): "
                    f"it stays Pending until {node} is back"
                )
                continue
            need = {r: v for r, v in _needs(p).items() if v}
            ready = [n for n in allowed if not nodes[n].unschedulable and nodes[n].ready]
            short: list[str] = []
            fits = False
            for n in ready:
                free = _free(nodes[n], used.get(n))
                lacking = [r for r, v in need.items() if free.get(r, 0) < v]
                if not lacking:
                    fits = True
                    break
                short.append(
                    f"{n}: " + ", ".join(f"{r} {_amount(r, free.get(r, 0))} free" for r in lacking)
                )
            if fits:
                continue
            asks = ", ".join(f"{r} {_amount(r, v)}" for r, v in sorted(need.items()))
            left = [n for n in allowed if n not in ready]
            why = "; ".join(short + [f"{n}: cordoned or not Ready" for n in left])
            refusals.append(
                f"pod {p.key} evicted from {node} fits no other node: it requests {asks}; "
                f"the nodes its placement allows: {why}"
            )
    return refusals, warnings


def device_resources(allocatable: Mapping[str, str]) -> dict[str, str]:
    """Extended resources a device plugin advertises (``vendor.com/name``), with their value."""
    return {
        k: v
        for k, v in allocatable.items()
        if "/" in k and not k.startswith(("hugepages-", "kubernetes.io/", "k8s.io/"))
    }
