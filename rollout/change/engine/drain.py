"""Draining one node: evict every pod through the Eviction API, retry refusals, give up on time.

Why our own loop (and not ``kubectl drain`` or ``k8s_drain``): a drain stuck on a
PodDisruptionBudget must end, at a timeout we choose, with the blocking pods *and* their budgets
named (kubectl #172); a 429 is an expected outcome retried with capped exponential backoff, since
the API server sends no Retry-After (kubernetes #36409); one request per pod per attempt, the outer
loop owning the timers (kubernetes #117492). ``--disable-eviction`` deletes instead, and only when
asked. DaemonSet pods and static pods' mirrors are left alone, like ``--ignore-daemonsets``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from rollout.change.plan.drain_rules import DrainPolicy, evictable
from rollout.errors import EvictionBlockedError
from rollout.models import PodRef
from rollout.protocols import Clock, Cluster, Eviction
from rollout.retrying import Backoff

_LOOKS = Backoff(0.05, 0.25)
"""The wait between two looks at the evicted pods: 0.05 s, doubling, at most 0.25 s, since a pod
with a short grace period is gone in well under a quarter of a second and every batch waits for
its slowest drain."""


@dataclass(frozen=True)
class DrainReport:
    """What a drain did: the pods evicted (or deleted) and how many 429s it absorbed."""

    evicted: tuple[str, ...]
    refusals: int


def drain(
    cluster: Cluster,
    node: str,
    policy: DrainPolicy,
    clock: Clock,
    on_event: Callable[[str], None] = lambda _m: None,
) -> DrainReport:
    """Evict every evictable pod from ``node`` and wait until they are gone.

    Raises:
        EvictionBlockedError: the timeout passed; the message names each blocking pod, the API
            server's reason and the PodDisruptionBudgets selecting it.
    """
    return evict_pods(cluster, node, evictable(cluster.pods_on_node(node)), policy, clock, on_event)


def evict_pods(
    cluster: Cluster,
    node: str,
    pods: Sequence[PodRef],
    policy: DrainPolicy,
    clock: Clock,
    on_event: Callable[[str], None] = lambda _m: None,
    what: str = "drain",
) -> DrainReport:
    """Evict ``pods`` (of ``node``) and wait until they are gone: the drain's loop, also what
    ``apply --recreate-workloads`` evicts one controller's pods with
    (:mod:`rollout.change.commands.recreate_workloads`). ``what`` names the operation in the
    timeout's message.

    Raises:
        EvictionBlockedError: as :func:`drain`.
    """
    start = clock.monotonic()
    deadline = start + policy.timeout_s
    pending: dict[str, PodRef] = {p.key: p for p in pods}
    next_try: dict[str, float] = {k: start for k in pending}
    attempts: dict[str, int] = {k: 0 for k in pending}
    refused: dict[str, str] = {}
    waiting: dict[str, PodRef] = {}
    evicted: list[str] = []
    refusals = 0
    refusal_backoff = Backoff(policy.backoff_initial_s, policy.backoff_cap_s)
    looks = 0
    while pending or waiting:
        now = clock.monotonic()
        for key, pod in list(pending.items()):
            if next_try[key] > now:
                continue
            if policy.disable_eviction:
                cluster.delete_pod(pod, policy.grace_period_s)
                outcome, message = Eviction.EVICTED, ""
            else:
                r = cluster.evict(pod, policy.grace_period_s)
                outcome, message = r.outcome, r.message
            if outcome is Eviction.BLOCKED:
                refusals += 1
                refused[key] = message
                # the API server sends no Retry-After on a PDB refusal (kubernetes #36409)
                next_try[key] = now + refusal_backoff.delay(attempts[key])
                attempts[key] += 1
                if attempts[key] == 1:
                    on_event(f"{node}: eviction of {key} refused ({message}); retrying")
                continue
            del pending[key]
            refused.pop(key, None)
            evicted.append(key)
            waiting[key] = pod
        for key, pod in list(waiting.items()):
            if cluster.pod_gone(pod):
                del waiting[key]
        if not pending and not waiting:
            break
        now = clock.monotonic()
        if now >= deadline:
            raise EvictionBlockedError(
                _blocked_message(cluster, node, policy, pending, waiting, refused, what)
            )
        wake = min([next_try[k] for k in pending] + [now + _LOOKS.delay(looks)])
        looks += 1
        clock.sleep(max(0.0, min(wake, deadline) - now))
    return DrainReport(tuple(evicted), refusals)


def _blocked_message(
    cluster: Cluster,
    node: str,
    policy: DrainPolicy,
    pending: dict[str, PodRef],
    waiting: dict[str, PodRef],
    refused: dict[str, str],
    what: str = "drain",
) -> str:
    parts = []
    for key, pod in sorted(pending.items()):
        pdbs = cluster.pdbs_for(pod)
        by = f"PodDisruptionBudget {', '.join(pdbs)}" if pdbs else "no PodDisruptionBudget"
        why = refused.get(key) or "not attempted"
        parts.append(f"pod {key} (blocked by {by}: {why})")
    for key in sorted(waiting):
        parts.append(f"pod {key} (evicted but still terminating)")
    return f"{what} of node {node} timed out after {policy.timeout_s:g}s; " + "; ".join(parts)
