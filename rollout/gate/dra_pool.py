"""The gate on a DRA pool: the design document's failure signals for devices allocated through
DRA, on top of the admission gate.

Failed when, over the nodes the gate judges: a ResourceClaim of the pool's DeviceClass has stayed
unallocated longer than the limit (the scheduler cannot place it); a pod that asks for the class
(its own claim, or the extended resource the class maps) has stayed Pending, unscheduled, longer
than the limit; a device allocated to a pod is reported unhealthy where the driver reports health
(``allocatedResourcesStatus``, KEP-4680). A claim or pod that names no node fails the whole set of
nodes; an unhealthy device fails its node.

:func:`pool_problems` is pure (the API server's objects in); :class:`DraPoolGate` wraps another
gate and asks it first: a verdict other than Successful stands as it is.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from rollout.kube.client import Api
from rollout.protocols import Gate
from rollout.verdicts import Verdict, VerdictStatus


@dataclass(frozen=True)
class PoolObjects:
    """What the signals read: every ResourceClaim and every pod (the API server's JSON)."""

    claims: Sequence[Mapping[str, Any]] = ()
    pods: Sequence[Mapping[str, Any]] = ()


@dataclass(frozen=True)
class PoolProblem:
    """One failure signal: what it says, and the node it concerns (None: the pool)."""

    reason: str
    node: str | None = None


@dataclass(frozen=True)
class PoolSignals:
    """The pool's settings: the DeviceClass, the extended resource it maps, the limit."""

    device_class: str
    resource: str
    limit_s: float = 300.0


def _age(obj: Mapping[str, Any], now: datetime) -> float:
    ts = obj.get("metadata", {}).get("creationTimestamp")
    if not ts:
        return 0.0
    try:
        born = datetime.fromisoformat(str(ts).replace("Z", "+00:00"))
    except ValueError:
        return 0.0
    return (now - born).total_seconds()


def _classes(claim: Mapping[str, Any]) -> set[str]:
    """The DeviceClasses a claim's requests name (``resource.k8s.io/v1``: ``exactly`` or
    ``firstAvailable``; ``v1beta1``: on the request)."""
    out: set[str] = set()
    for r in claim.get("spec", {}).get("devices", {}).get("requests") or []:
        for sub in (r, r.get("exactly") or {}, *(r.get("firstAvailable") or [])):
            if sub.get("deviceClassName"):
                out.add(str(sub["deviceClassName"]))
    return out


def _key(obj: Mapping[str, Any]) -> str:
    md = obj.get("metadata", {})
    return f"{md.get('namespace')}/{md.get('name')}"


def _wants(pod: Mapping[str, Any], resource: str, claims: set[str]) -> bool:
    spec = pod.get("spec", {})
    for c in spec.get("containers") or []:
        res = c.get("resources") or {}
        if resource in (res.get("limits") or {}) or resource in (res.get("requests") or {}):
            return True
    ns = pod.get("metadata", {}).get("namespace")
    for rc in spec.get("resourceClaims") or []:
        if f"{ns}/{rc.get('resourceClaimName')}" in claims:
            return True
    return False


def _unscheduled(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status", {})
    if status.get("phase") != "Pending" or pod.get("spec", {}).get("nodeName"):
        return False
    return any(
        c.get("type") == "PodScheduled" and c.get("status") == "False"
        for c in status.get("conditions") or []
    )


def pool_problems(objs: PoolObjects, sig: PoolSignals, now: datetime) -> list[PoolProblem]:
    """The pool's failure signals now (pure; empty: none)."""
    out: list[PoolProblem] = []
    of_class = [c for c in objs.claims if sig.device_class in _classes(c)]
    for c in of_class:
        if not c.get("status", {}).get("allocation") and (age := _age(c, now)) > sig.limit_s:
            out.append(
                PoolProblem(
                    f"ResourceClaim {_key(c)} of DeviceClass {sig.device_class} unallocated for "
                    f"{age:.0f}s (limit {sig.limit_s:g}s)"
                )
            )
    names = {_key(c) for c in of_class}
    for p in objs.pods:
        if (
            _unscheduled(p)
            and _wants(p, sig.resource, names)
            and (age := _age(p, now)) > (sig.limit_s)
        ):
            out.append(
                PoolProblem(
                    f"pod {_key(p)} Pending, unscheduled, for {age:.0f}s asking for "
                    f"{sig.device_class} / {sig.resource} (limit {sig.limit_s:g}s)"
                )
            )
        for cs in p.get("status", {}).get("containerStatuses") or []:
            for ar in cs.get("allocatedResourcesStatus") or []:
                for r in ar.get("resources") or []:
                    if r.get("health") == "Unhealthy":
                        out.append(
                            PoolProblem(
                                f"pod {_key(p)} container {cs.get('name')}: device "
                                f"{r.get('resourceID')} of {ar.get('name')} reported Unhealthy",
                                p.get("spec", {}).get("nodeName"),
                            )
                        )
    return out


class DraPoolGate:
    """A gate that adds the DRA pool's failure signals to another gate's verdict."""

    def __init__(
        self,
        inner: Gate,
        read: Callable[[], PoolObjects],
        signals: PoolSignals,
        now: Callable[[], datetime],
    ) -> None:
        self.inner = inner
        self.read = read
        self.signals = signals
        self.now = now
        self._verdict: Verdict | None = None

    @property
    def verdict(self) -> Verdict | None:
        return self._verdict or self.inner.verdict

    def _judge(self, verdict: Verdict, nodes: Sequence[str]) -> Verdict:
        if verdict.status is not VerdictStatus.SUCCESSFUL:
            return verdict
        problems = pool_problems(self.read(), self.signals, self.now())
        if not problems:
            return verdict
        named = [p.node for p in problems if p.node in nodes]
        pool_wide = any(p.node is None for p in problems)
        failed = () if pool_wide or not named else tuple(dict.fromkeys(n for n in named if n))
        reason = "DRA pool: " + "; ".join(p.reason for p in problems)
        self._verdict = Verdict(VerdictStatus.FAILED, reason, failed_nodes=failed)
        return self._verdict

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        return self._judge(self.inner.evaluate(change_id, nodes), nodes)

    def soaks_on(self) -> bool:
        return self.inner.soaks_on()

    def keep_watching(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        return self._judge(self.inner.keep_watching(change_id, nodes), nodes)

    def after_rollback(self, change_id: str, nodes: Sequence[str]) -> str:
        return self.inner.after_rollback(change_id, nodes)


def read_pool(api: Api) -> PoolObjects:
    """The pool's objects from the API server."""
    from rollout.kube.devices import claims_and_pods

    claims, pods = claims_and_pods(api)
    return PoolObjects(claims=claims, pods=pods)
