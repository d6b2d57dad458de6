"""Batches: the canary first, then the rest, ``maxUnavailable`` at a time (pure).

Why pure: which nodes change together decides how much of the fleet is down at once; cutting
batches from plain data (node names, the strategy, each node's kubelet unit) keeps every rule a
table-driven unit test. The canary's own check, :func:`check_homogeneous`, lives here too: the
canary's verdict stands for the rest only if its nodes are alike.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from rollout.change.plan.strategy import Strategy
from rollout.kubelet.distributions import CONTROL_PLANE_UNITS
from rollout.models import NodeFacts


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
