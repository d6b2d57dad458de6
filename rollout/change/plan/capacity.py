"""Capacity and placement: whether the nodes left schedulable can take a batch's evicted pods
(pure).

Why pure: preflight must say exactly why it refuses (the missing CPU, memory or GPUs, the pod its
placement pins to a drained node); the orchestrator gathers the facts (Nodes, pods) and hands them
in, so every rule is a table-driven unit test. Where a pod may go is read as the scheduler reads
it, through :func:`rollout.kubelet.admission.node_preview.lands_on`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any

from rollout.change.plan.drain_rules import evictable
from rollout.kubelet.admission.node_preview import lands_on
from rollout.models import NodeInfo, PodRef, Requests, requests_of


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
    """The Node as ``node_preview.lands_on`` reads it (labels, taints)."""
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
