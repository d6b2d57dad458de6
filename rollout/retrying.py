"""Trying again, one way: how long to wait between tries (:class:`Backoff`), how often to look
while waiting for something (:class:`Poll`), a call retried on the failures it names (:func:`retry`)
and a condition waited for (:func:`wait_until`).

Why one module: the tool retries an API call on connection trouble and 5xx
(``rollout.kube.client.call``), a watch after an error (``rollout.kube.watching``), an eviction a
PodDisruptionBudget refused (``rollout.change.engine.drain``), a Node label write the kubelet's own
status write raced (``rollout.kube.devices``), and waits for the DRA driver's republish
(``rollout.change.kinds.allocation_path``), the claim freeze's probe
(``rollout.change.kinds.claim_freeze``), the Lease owner's watch and renewal after a failure
(``rollout.kube.leases``), the recreated workloads and device probes
(``rollout.change.commands.recreate_workloads``, ``rollout.evidence.recreating``), the bench pod
(``rollout.bench.in_pod``) and ``rollout serve``'s drift rounds (``rollout.gate.trigger``). Each
keeps its own policy (what it retries, for how long, how often); the arithmetic and the loop are
written once here, with the clock a parameter, and tested once (``tests/unit/test_retrying.py``
pins each caller's schedule). No jitter: one process retries each resource, so there is no herd to
spread.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff: the wait before retry ``attempt`` (0-based) is
    ``initial_s * factor ** attempt``, at most ``cap_s``."""

    initial_s: float
    cap_s: float
    factor: float = 2.0

    def delay(self, attempt: int) -> float:
        """The wait before retry ``attempt`` (0-based; below 0 counts as 0)."""
        return float(min(self.cap_s, self.initial_s * (self.factor ** max(0, attempt))))


@dataclass(frozen=True)
class Poll:
    """How often to look: every ``fast_s`` during the first ``fast_for_s`` of a wait, then every
    ``slow_s`` (what is waited for mostly lands early; later looks cost less)."""

    fast_s: float
    fast_for_s: float
    slow_s: float

    @classmethod
    def every(cls, seconds: float) -> Poll:
        """One pace for the whole wait."""
        return cls(seconds, 0.0, seconds)

    def interval(self, elapsed_s: float) -> float:
        """The wait before the next look, ``elapsed_s`` into the wait."""
        return self.fast_s if elapsed_s < self.fast_for_s else self.slow_s


def retry(
    fn: Callable[[], T],
    retry_if: Callable[[Exception], bool],
    *,
    backoff: Backoff | None = None,
    within_s: float | None = None,
    attempts: int | None = None,
    give_up: Callable[[Exception], Exception] | None = None,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] | None = None,
) -> T:
    """``fn()``, called again while it fails with an exception ``retry_if`` accepts.

    Args:
        retry_if: which failures are worth another try; any other is raised at once.
        backoff: the wait before each retry (None: retry at once).
        within_s: give up on a failure that comes ``within_s`` or more after the first call
            began (the deadline is taken before it).
        attempts: give up after this many calls.
        give_up: the exception raised (from the last failure) on giving up; None: the last
            failure itself.
        sleep, monotonic: the clock (``monotonic`` None: :func:`time.monotonic`).

    Raises:
        Exception: a failure ``retry_if`` declines; on giving up, ``give_up``'s or the last one.
    """
    clock = time.monotonic if monotonic is None else monotonic
    deadline = None if within_s is None else clock() + within_s
    tries = 0
    while True:
        try:
            return fn()
        except Exception as e:
            if not retry_if(e):
                raise
            tries += 1
            spent = attempts is not None and tries >= attempts
            late = deadline is not None and clock() >= deadline
            if spent or late:
                if give_up is None:
                    raise
                raise give_up(e) from e
            if backoff is not None:
                sleep(backoff.delay(tries - 1))


def wait_until(
    done: Callable[[], bool],
    timeout_s: float,
    poll: Poll,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
    start: float | None = None,
) -> bool:
    """Ask ``done()`` until it says True (True), or until it said False at ``timeout_s`` or later
    after the wait began (False); between two asks, ``poll``'s interval. ``done`` is asked at
    least once, and once more after the last sleep. ``start``: when the wait began on
    ``monotonic``'s clock (None: now)."""
    start = monotonic() if start is None else start
    deadline = start + timeout_s
    while not done():
        now = monotonic()
        if now >= deadline:
            return False
        sleep(poll.interval(now - start))
    return True
