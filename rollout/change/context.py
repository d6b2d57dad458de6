"""The engine's context: what every node step needs, the world behind Protocols, the journal and
the policies.

A module of its own because the forward path (``applying``), the restore path (``restoring``),
resume and the session all take it; it used to live in the restore module, so the forward path
imported its context from the restore path.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.change.journal import Journal
from rollout.change.planning import DrainPolicy
from rollout.fanout import DEFAULT_FORKS
from rollout.interrupt import Interrupt, InterruptibleClock
from rollout.models import Phase, Step, StepPath
from rollout.protocols import Clock, Cluster, NodeRunner


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
    #: restores overwrite files edited after this change wrote them (``rollout rollback --force``,
    #: also when handed over); otherwise the node step's compare-and-swap refuses them
    force_restore: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

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
    ) -> None:
        """Journal one node step (thread-safe; fsynced before returning)."""
        with self._lock:
            self.journal.append(
                step.value, phase, now=self.clock.now(), node=node, path=path, data=data
            )
