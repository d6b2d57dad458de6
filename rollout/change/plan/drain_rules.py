"""Drain rules: how a node is drained and which pods a drain may not lose (pure).

Why apart from the engine's drain (:mod:`rollout.change.engine.drain`, which evicts): preflight
refuses a node whose drain would lose a pod for good, or that a PodDisruptionBudget would block,
before anything is cordoned; these rules are plain data in, reasons out, so each is a table-driven
unit test and both preflight and the engine read the same ones.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass

from rollout.models import PdbRef, PodRef


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
