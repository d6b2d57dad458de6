"""The engine's context: what every node step needs, the world behind Protocols, the journal and
the policies; and :class:`KindSteps`, the seam a kind of change plugs into.

A module of its own because the forward path (``applying``), the restore path (``restoring``),
resume and the session all take it; it used to live in the restore module, so the forward path
imported its context from the restore path.

The seam: the engine runs every node of every kind of change through one skeleton, forward
preflight -> cordon -> drain -> the kind's steps -> verify -> uncordon, and restore cordon ->
drain -> the kind's restore steps -> verify -> uncordon; batches, canary, gate, promote, windows,
journal, failpoints, resume, the one owner and compare-and-swap stay the engine's. A kind writes
only :class:`KindSteps` (and its plan section). The kubelet-config change is the first kind
(``rollout.change.kinds.kubelet_config``); the change-level ``begin`` names any other kind in its
``kind`` (``rollout.change.record.entries.ChangeBegin``; absent: the kubelet-config change, so every
journal written before the seam still reads), and ``resume`` and ``rollback`` pick the kind
from it (``rollout.change.kinds.registry``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.record.journal import Journal
from rollout.change.record.replay import NodeStatus, owed_rollback
from rollout.errors import RolloutError
from rollout.fanout import DEFAULT_FORKS
from rollout.interrupt import Interrupt, InterruptibleClock
from rollout.models import NodeInfo, Phase, Step, StepPath
from rollout.protocols import Clock, Cluster, NodeRunner


class KindSteps(Protocol):
    """What a kind of change does on one node, between the engine's steps (see the module).

    ``work`` is the kind's per-node change (it has ``node`` and ``host``); the engine never looks
    inside it. A kind journals its own steps (``ctx.record``, begin before and done after, one
    of :class:`~rollout.models.Step`); a step in :data:`~rollout.models.WRITES` is the one whose
    ``begin`` means the node may differ from before (a restore then runs the kind's restore
    steps; before it, a restore only undoes the cordon, and resume runs that step again). The
    engine journals ``preflight``, ``cordon``, ``drain``, ``verify``, ``restore-verify`` and
    ``uncordon`` itself, and restores a node on any exception a kind step raises.
    """

    @property
    def name(self) -> str:
        """The kind's name, as the journal records it (``entries.ChangeBegin.kind``)."""
        ...

    def per_node(self, ctx: Context, works: Sequence[Any]) -> bool:
        """Whether each node of a batch runs its whole path on its own (else the batch's nodes
        share one :meth:`write`)."""
        ...

    def baseline(self, ctx: Context, work: Any, info: NodeInfo) -> dict[str, Any]:
        """What the node is before the change (``info``: its Node as read before the cordon):
        journaled with ``preflight`` done (read-only)."""
        ...

    def prepare(self, ctx: Context, work: Any) -> None:
        """The kind's steps after the drain that change nothing on the node (journaled)."""
        ...

    def write(self, ctx: Context, works: Sequence[Any]) -> dict[str, RolloutError]:
        """The steps that change the nodes (journaled, a :data:`~rollout.models.WRITES` step's
        ``begin`` first); the nodes that failed, each with its error (a ``failed`` entry
        journaled by the kind only where it must say more, e.g. that nothing was written)."""
        ...

    def expected(self, work: Any) -> dict[str, Any]:
        """What verify checks, journaled with its ``begin``."""
        ...

    def verify(self, ctx: Context, work: Any, before: NodeStatus) -> None:
        """Wait until the node is healthy on the new state, or raise naming what is off."""
        ...

    def rebuild(self, ctx: Context, status: NodeStatus, for_restore: bool) -> Any:
        """The node's ``work`` rebuilt from its journal record (resume, rollback)."""
        ...

    def restore_before_drain(self, ctx: Context, status: NodeStatus, work: Any) -> None:
        """The kind's restore steps between the engine's cordon and its drain (journaled)."""
        ...

    def restore_prepare(self, ctx: Context, status: NodeStatus, work: Any) -> Any:
        """The kind's restore steps after the drain, before the restore's write (journaled);
        what :meth:`restore_write` gets for the node."""
        ...

    def restore_write(
        self, ctx: Context, items: Sequence[tuple[NodeStatus, Any]]
    ) -> dict[str, RolloutError]:
        """Put the nodes back, each given what its :meth:`restore_prepare` returned (the nodes
        that failed, each with its error)."""
        ...

    def restore_done(self, ctx: Context, status: NodeStatus) -> None:
        """Journal the end of the restore's write for one node that succeeded."""
        ...

    def restore_expected(self, status: NodeStatus) -> dict[str, Any]:
        """What the restore's verify checks, journaled with its ``begin``."""
        ...

    def restore_verify(self, ctx: Context, status: NodeStatus) -> None:
        """Wait until the node is healthy as it was before the change, or raise."""
        ...


@runtime_checkable
class RestoreBracket(Protocol):
    """What a kind may do around its restores, beyond one node (the allocation-path change's
    cluster-wide claim freeze, ``rollout.change.kinds.claim_freeze``): the engine calls
    :meth:`restore_begin` before the restore of some nodes touches any of them,
    :meth:`restore_end` after it, and :meth:`change_end` before it journals any end of the
    change. A kind without them has nothing to do there."""

    def restore_begin(self, ctx: Context, statuses: Sequence[NodeStatus]) -> None:
        """Before the restore of ``statuses``; raising stops it with no node touched."""
        ...

    def restore_end(self, ctx: Context) -> None:
        """After the restore begun by :meth:`restore_begin` (never raises)."""
        ...

    def change_end(self, ctx: Context) -> None:
        """Before the change's end is journaled, whoever ends it (never raises)."""
        ...


@dataclass
class Context:
    """What every node step needs: the world behind Protocols, the journal and the policies."""

    cluster: Cluster
    runner: NodeRunner
    clock: Clock
    journal: Journal
    drain: DrainPolicy = field(default_factory=DrainPolicy)
    verify_timeout_s: float = 120.0
    on_event: Callable[[str], None] = lambda _m: None
    interrupt: Interrupt = field(default_factory=Interrupt)
    #: at most this many nodes are worked on at once (``--forks``; see ``rollout.fanout``)
    forks: int = DEFAULT_FORKS
    #: the kind of change (None: the kubelet-config change;
    # ``rollout.change.kinds.registry.kind_of``)
    kind: KindSteps | None = None
    #: told as each batch begins which nodes the next batch holds (empty: this is the last);
    #: the caller readies what it needs after them (``apply``'s ``after`` evidence opens its
    #: facts sessions as the last batch begins). Reads and opens only: it changes no node.
    next_batch: Callable[[Sequence[str]], None] = lambda _nodes: None
    #: restores running under this context between ``RestoreBracket.restore_begin`` and
    #: ``restore_end`` (resume settles nodes side by side; the last one out ends the bracket)
    restores: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def force_restore(self) -> bool:
        """Whether a restore overwrites node files edited after this change wrote them
        (``rollout rollback --force``, also handed over to the owner); otherwise the node step's
        compare-and-swap refuses them. Decided by the journal alone, as the restore's write
        starts: the ``force`` the rollback the change is in journaled
        (:func:`~rollout.change.record.replay.owed_rollback`); no code sets it."""
        owed = owed_rollback(self.journal.entries())
        return owed is not None and owed.force

    @property
    def forward_clock(self) -> InterruptibleClock:
        """The clock the forward path waits with: an interrupt cuts its waits short."""
        return InterruptibleClock(self.clock, self.interrupt)

    def record(
        self,
        node: str,
        step: Step,
        phase: Phase,
        path: StepPath,
        data: Mapping[str, Any] | None = None,
        mirror_later: bool = False,
    ) -> None:
        """Journal one node step (thread-safe; fsynced before returning). ``mirror_later``: a
        ``done`` the node's next ``begin`` follows at once goes to the cluster record with it
        (``Journal.append``)."""
        with self._lock:
            self.journal.append(
                step.value,
                phase,
                now=self.clock.now(),
                node=node,
                path=path,
                data=data,
                mirror_later=mirror_later,
            )
