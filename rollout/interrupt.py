"""Stopping a change's forward work at once: a rollback handed to the owner, or the Lease lost.

Why a shared flag rather than a second process acting: one change has one owner (the process
holding the ``rollout-lock`` Lease). When someone else asks for a rollback, or the owner learns it
no longer holds the Lease, the owner itself must stop starting anything new (no new node, no new
batch), interrupt its waits (a soak, a drain, a verify), put the nodes in flight back, and then
either roll back (a request) or exit (a lost Lease). The Lease's watch thread sets this flag; the
orchestrator checks it between steps and sleeps on it, so a request takes effect within
milliseconds, not at the next poll.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import datetime

from rollout.errors import RolloutError
from rollout.protocols import Clock


@dataclass(frozen=True)
class StopReason:
    """Why forward work stopped.

    Attributes:
        by: who asked (``user@host pid N`` / ``alert <fingerprint>``), or the loss in words.
        nodes: the nodes to roll back (None: every node of the change).
        lost: True when the Lease was lost (no rollback: finish or restore in flight, then exit).
        request_id: the hand-over request's id (None for a lost Lease).
        at: wall-clock time (epoch seconds) the owner saw it (set by :meth:`Interrupt.request`).
        force: the request asked ``--force`` (the restore overwrites files edited after our write);
            the first request decides, a later one joining it does not change it.
    """

    by: str
    nodes: tuple[str, ...] | None = None
    lost: bool = False
    request_id: str | None = None
    at: float = 0.0
    force: bool = False


class StopRequested(RolloutError):
    """Raised out of a wait or between steps once forward work must stop."""

    exit_code = 5

    def __init__(self, reason: StopReason) -> None:
        what = (
            f"lost the cluster lock: {reason.by}"
            if reason.lost
            else f"rollback requested by {reason.by}"
        )
        super().__init__(what)
        self.reason = reason


class Interrupt:
    """A thread-safe stop flag with a reason; waits on it return at once when it is set."""

    def __init__(self) -> None:
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._reason: StopReason | None = None
        self._wakers: list[Callable[[], None]] = []

    def request(self, reason: StopReason) -> None:
        """Set the flag. A later request widens the node set; a lost Lease is kept as lost."""
        with self._lock:
            old = self._reason
            if old is not None:
                nodes = _union(old.nodes, reason.nodes)
                reason = StopReason(
                    by=old.by,
                    nodes=nodes,
                    lost=old.lost or reason.lost,
                    request_id=old.request_id or reason.request_id,
                    at=old.at,
                    force=old.force if old.request_id else reason.force,
                )
            elif not reason.at:
                reason = replace(reason, at=time.time())
            self._reason = reason
            wakers = list(self._wakers)
        self._event.set()
        for wake in wakers:
            wake()

    def reason(self) -> StopReason | None:
        """The reason, or None while forward work may go on."""
        with self._lock:
            return self._reason

    def check(self) -> None:
        """Raise :class:`StopRequested` when the flag is set."""
        reason = self.reason()
        if reason is not None:
            raise StopRequested(reason)

    def sleep(self, seconds: float) -> None:
        """Sleep up to ``seconds``; raise :class:`StopRequested` as soon as the flag is set."""
        self.check()
        if self._event.wait(max(seconds, 0.0)):
            self.check()

    def add_waker(self, wake: Callable[[], None]) -> None:
        """Call ``wake`` when the flag is set (to cut short a wait that is not ours)."""
        with self._lock:
            self._wakers.append(wake)
            already = self._reason is not None
        if already:
            wake()


def _union(a: Sequence[str] | None, b: Sequence[str] | None) -> tuple[str, ...] | None:
    if a is None or b is None:
        return None
    return tuple(dict.fromkeys((*a, *b)))


class InterruptibleClock:
    """A :class:`~rollout.protocols.Clock` whose ``sleep`` ends within ``SLICE_S`` of an interrupt,
    raising :class:`StopRequested`: what the forward path's drain and verify wait with. The
    restore path keeps the plain clock, so a restore is never cut short."""

    SLICE_S = 0.05

    def __init__(self, clock: Clock, interrupt: Interrupt) -> None:
        self._clock = clock
        self._interrupt = interrupt

    def now(self) -> datetime:
        return self._clock.now()

    def monotonic(self) -> float:
        return self._clock.monotonic()

    def sleep(self, seconds: float) -> None:
        end = self._clock.monotonic() + seconds
        while True:
            self._interrupt.check()
            left = end - self._clock.monotonic()
            if left <= 0:
                return
            self._clock.sleep(min(left, self.SLICE_S))
