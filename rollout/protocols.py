"""The small interfaces the orchestrator talks to the world through.

Why: the apply / rollback loop makes the decisions operators care about (what to restore, when to
uncordon, when to stop). Behind these Protocols the loop runs against the real API server and
Ansible in production and in the lab, and against tiny in-memory fakes in unit tests. Each method is
one round trip; retries of transient failures belong to the adapters, decisions to the loop.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Any, Protocol

from rollout.models import NodeChange, NodeInfo, PodListing, PodRef, ServingReads
from rollout.verdicts import Verdict, VerdictStatus


class Eviction(StrEnum):
    """The outcome of one eviction request."""

    EVICTED = "evicted"  # 200/201: the pod is being deleted
    BLOCKED = "blocked"  # 429: a PodDisruptionBudget (or rate limit) refuses it now
    GONE = "gone"  # 404: already gone


@dataclass(frozen=True)
class EvictionResult:
    """One eviction attempt: outcome and the API server's message (for 429: why)."""

    outcome: Eviction
    message: str = ""


class Cluster(Protocol):
    """Node-level operations on the cluster; never a write to a workload."""

    def node(self, name: str) -> NodeInfo:
        """The Node's cordon state, readiness and allocatable."""
        ...

    def cordon(self, name: str) -> None:
        """Set ``spec.unschedulable``."""
        ...

    def uncordon(self, name: str) -> None:
        """Clear ``spec.unschedulable``."""
        ...

    def pods_on_node(self, name: str) -> list[PodRef]:
        """Every pod bound to the node."""
        ...

    def evict(self, pod: PodRef, grace_period_s: int | None) -> EvictionResult:
        """One Eviction API request (honours PDBs)."""
        ...

    def delete_pod(self, pod: PodRef, grace_period_s: int | None) -> None:
        """Delete the pod (``--disable-eviction`` only: bypasses PDBs)."""
        ...

    def pod_gone(self, pod: PodRef) -> bool:
        """Whether the pod (this uid) no longer exists."""
        ...

    def pdbs_for(self, pod: PodRef) -> list[str]:
        """``namespace/name`` of the PodDisruptionBudgets selecting the pod."""
        ...

    def healthz(self, node: str) -> bool:
        """The kubelet's ``/healthz`` through the node proxy says ok."""
        ...

    def configz(self, node: str) -> Mapping[str, Any]:
        """The running kubelet's configuration (``/configz`` through the node proxy)."""
        ...

    def dra_slices(self, node: str) -> Mapping[str, Mapping[str, int]]:
        """The node's ResourceSlices: driver -> slice uid -> its device count (empty when
        ``resource.k8s.io`` is not served or no driver publishes for the node)."""
        ...


class Lock(Protocol):
    """The cluster-wide lock (a Lease), renewed while held (``rollout.kube.leases.LeaseLock``)."""

    def acquire(self, change_id: str) -> None:
        """Take the lock for this change (a lock already held by the same change is ours).

        Raises:
            LockHeldError: another change holds it; the message names the holder.
        """
        ...

    def release(self) -> None:
        """Give the lock back (only if we hold it)."""
        ...

    def report(self, outcome: str, message: str) -> None:
        """Tell a requester waiting on the lock how the rollback it handed over ended."""
        ...


@dataclass(frozen=True)
class RestoreFile:
    """One file to put back: bytes (None: remove it, the change created it) and metadata.

    ``node_copy``: the sha256 of original bytes this machine has no copy of (neither its state
    directory nor the cluster record): the node step puts back its own copy, kept under
    ``/var/lib/rollout/backups/<change>/`` before the first write, after checking that sha256.
    """

    path: str
    content: bytes | None
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"
    node_copy: str | None = None


@dataclass(frozen=True)
class RunResult:
    """What a playbook run did on one node.

    ``refused``: the node step's compare-and-swap check found a file that is not what the
    controller expected; nothing was written on the node (``message`` names node, file, expected
    and found sha256).
    """

    ok: bool
    message: str = ""
    changed: bool = False
    refused: bool = False
    timings: Mapping[str, float] = field(default_factory=dict)


class NodeRunner(Protocol):
    """Changes files on nodes (the apply and restore playbooks).

    Both methods serve a whole batch with one run (Ansible's start-up is paid once per batch,
    not once per node); their results are per node, so one node failing or being unreachable
    fails only that node.
    """

    def per_node(self, hosts: Sequence[str]) -> bool:
        """Whether a run per node costs no more than a shared one for ``hosts`` (the node step
        over plain ssh): the orchestrator then takes each node of a batch through its forward
        path on its own. Asked once at the start of each batch; a runner may warm each node's
        session for its node step then."""
        ...

    def apply_many(self, changes: Sequence[NodeChange], change_id: str) -> Mapping[str, RunResult]:
        """On every node of ``changes``: back up, write the files, reset checkpoints, restart the
        kubelet, wait for healthz; the result of each, by node name."""
        ...

    def restore_many(
        self,
        items: Sequence[tuple[NodeChange, Sequence[RestoreFile]]],
        change_id: str,
        force: bool = False,
    ) -> Mapping[str, RunResult]:
        """On every node of ``items``: put the files back byte for byte, reset checkpoints,
        restart, wait for healthz; the result of each, by node name. ``force``: also over files
        edited after this change wrote them (``rollout rollback --force``), which are otherwise
        refused by the compare-and-swap check."""
        ...


class PreflightReads(Protocol):
    """What preflight reads from the API server (``rollout.change.preflight.checking.prepare``). The
    real one is ``rollout.change.preflight.checking.ClusterReader`` (one listing each, prefetched
    while the facts are gathered); unit tests pass one from memory."""

    def version(self) -> str:
        """The server's ``gitVersion``."""
        ...

    def resource_versions(self) -> list[str]:
        """The ``resource.k8s.io`` versions the server serves (empty: DRA not served)."""
        ...

    def nodes(self) -> dict[str, NodeInfo]:
        """Every Node, as preflight's records."""
        ...

    def pod_listing(self) -> PodListing:
        """Every pod not finished: the inventory's nodes' as records and objects (oldest
        first), and every node's summed requests."""
        ...

    def pdbs(self) -> list[Any]:
        """Every PodDisruptionBudget."""
        ...

    def dra(self, versions: list[str]) -> dict[str, list[str]]:
        """Node -> the DRA drivers publishing ResourceSlices for it."""
        ...

    def device_classes(self, versions: list[str]) -> list[dict[str, Any]]:
        """Every DeviceClass."""
        ...

    def serving(self) -> ServingReads:
        """Model-serving canaries in progress and Deployments rolling out
        (``rollout.kube.canaries``)."""
        ...

    def node_objects(self) -> dict[str, dict[str, Any]]:
        """The Nodes of the change's inventory (every Node for a reader without one), as the
        API objects; the other Nodes only as :meth:`nodes` records."""
        ...

    def controllers(self, nodes: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
        """Deployments, StatefulSets, DaemonSets and ReplicaSets of every namespace: whole
        where the pod template lands on one of ``nodes`` (Node objects), else the metadata."""
        ...


class Clock(Protocol):
    """Time, as a parameter (tests pass a fake that advances on sleep)."""

    def now(self) -> datetime:
        """Wall-clock time (journal timestamps)."""
        ...

    def monotonic(self) -> float:
        """Seconds on a monotonic clock (deadlines)."""
        ...

    def sleep(self, seconds: float) -> None:
        """Wait."""
        ...


class Gate(Protocol):
    """Decides after a batch whether the rollout may go on, and what happens after the rollback
    a Failed verdict starts (:class:`OneSoak` is the gate that does nothing after it)."""

    @property
    def verdict(self) -> Verdict | None:
        """The verdict that decided (a Failed one stays, later soaks over the rest do not
        replace it); None before the first soak, or when the gate keeps none."""
        ...

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        """Soak over ``nodes`` and decide; a Failed verdict names the nodes to restore
        (``failed_nodes``; none: all of ``nodes``)."""
        ...

    def soaks_on(self) -> bool:
        """After a Failed verdict's rollback: whether the soak goes on over the nodes not rolled
        back (``onFailure: rollback-affected``, until the first soak's end)."""
        ...

    def keep_watching(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        """Soak on over ``nodes`` (asked only while :meth:`soaks_on`); a Failed verdict names
        the nodes to roll back next."""
        ...

    def after_rollback(self, change_id: str, nodes: Sequence[str]) -> str:
        """Once ``nodes`` are rolled back: a sentence for the change's outcome on the workloads
        the gate saw rejected ("" when there is nothing to say)."""
        ...


class OneSoak:
    """What a gate that only decides answers after its rollback: it soaks on over nothing and
    has nothing to say. Gates without a rollback policy inherit it."""

    verdict: Verdict | None = None

    def soaks_on(self) -> bool:
        return False

    def keep_watching(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        return Verdict(VerdictStatus.SUCCESSFUL, "this gate does not soak on after a rollback")

    def after_rollback(self, change_id: str, nodes: Sequence[str]) -> str:
        return ""
