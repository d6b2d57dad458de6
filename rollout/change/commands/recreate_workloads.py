"""``apply --recreate-workloads``: the operator's own GPU and Guaranteed pods on each applied
node are evicted, one controller at a time, and their controllers' replacements must run before
the ``after-recreate`` evidence is collected over them.

Why with consent only: recreating a user's pods interrupts them; without the flag nothing of the
user's is touched (the probes of ``--recreate-probes`` are the tool's own). Which pods
(:func:`select`, pure): Running, not being deleted, owned by a controller (``ownerReferences``
with ``controller: true``) and either Guaranteed (``status.qosClass``) or asking for an extended
resource (``nvidia.com/gpu``): the pods the CPU, memory and device managers assign to, so the
ones the evidence judges. Left alone, and named: bare pods (nothing recreates them), DaemonSet
pods (node agents, the device plugin among them: recreating the plugin makes every device
unhealthy until it registers again, a fault of our own making; the drain leaves them too),
static pods' mirrors (owned by the Node; the kubelet runs them from a file) and the tool's own
probes.

How: first the pods the change's own drain evicted from the node are waited for (no pod
Pending in their namespaces, at most the replacement timeout): they come back only once the node
is uncordoned, and reading the node before they run would find nothing to recreate
(:meth:`RecreatedWorkloads._settle`). Then the controller's pods are evicted through the
Eviction API with the drain's own loop (:func:`rollout.change.engine.drain.evict_pods`:
PodDisruptionBudgets respected, 429 retried with backoff, the drain timeout, the blocking
budgets named), then its replacements (pods of the
same controller whose uid did not exist before) must be Running (admitted by a kubelet) within
the timeout; a replacement the kubelet rejects (phase Failed: ``TopologyAffinityError``,
``UnexpectedAdmissionError``) fails it with the kubelet's reason and message. The scheduler
places the replacements: one on a node the change did not apply is named and not judged. Each
controller is journaled (``recreate``) before its eviction and after its replacements run or it
failed; a failure stops the recreation there, is journaled as the ``after-recreate``
collection's error and warned about, and never stops or undoes the change.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from rollout.change.engine.drain import evict_pods
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.record.entries import NodeStep, Recreation
from rollout.change.record.journal import Journal, Kind
from rollout.errors import ExternalError
from rollout.kube.nodes import finished, to_pod_ref
from rollout.kube.probing import PROBE_NAMESPACE
from rollout.kube.watching import owner_of
from rollout.models import Phase
from rollout.protocols import Clock, Cluster
from rollout.retrying import Poll, wait_until

REPLACE_TIMEOUT_S = 120.0
"""How long a controller's replacements have to run once its pods are gone."""
_SAY_EVERY_S = 10.0
POLL = Poll.every(0.5)
"""How often the recreation looks at the drained pods' return and at the replacements."""


def _key(p: Mapping[str, Any]) -> str:
    meta = p.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


@dataclass(frozen=True)
class Selection:
    """What :func:`select` found on one node.

    Attributes:
        owners: ``Kind/namespace/name`` of each controller -> its pods there (JSON) to recreate.
        left: pods that qualify by resources but are left alone -> why.
    """

    owners: Mapping[str, list[Mapping[str, Any]]] = field(default_factory=dict)
    left: Mapping[str, str] = field(default_factory=dict)


def select(pods: Iterable[Mapping[str, Any]]) -> Selection:
    """The pods of one node (JSON) ``--recreate-workloads`` recreates, by controller, and the
    GPU / Guaranteed ones it leaves alone with why (pure; see the module docstring)."""
    owners: dict[str, list[Mapping[str, Any]]] = {}
    left: dict[str, str] = {}
    for p in pods:
        meta = p.get("metadata") or {}
        status = p.get("status") or {}
        if finished(dict(p)) or meta.get("deletionTimestamp") or status.get("phase") != "Running":
            continue
        ref = to_pod_ref(dict(p))
        if not (ref.extended or status.get("qosClass") == "Guaranteed"):
            continue
        owner = owner_of(meta)
        if ref.namespace == PROBE_NAMESPACE:
            continue  # the tool's own probes (--recreate-probes recreates those)
        if ref.mirror or (owner or "").startswith("Node/"):
            left[ref.key] = "a static pod's mirror: the kubelet runs it from a file"
        elif owner is None:
            left[ref.key] = "no controller: nothing would recreate it"
        elif ref.daemonset:
            left[ref.key] = "a DaemonSet's pod: node agents (the device plugin) are not recreated"
        else:
            owners.setdefault(owner, []).append(p)
    return Selection(dict(sorted(owners.items())), left)


def describe_selection(node: str, sel: Selection) -> list[str]:
    """What ``--dry-run`` prints for one node: the pods it would recreate and those it would
    leave, as they are now (pure)."""
    out = []
    for owner, pods in sel.owners.items():
        out.append(f"  recreate {owner}: {', '.join(_key(p) for p in pods)}")
    for key, why in sorted(sel.left.items()):
        out.append(f"  leave {key}: {why}")
    return out or [f"  no GPU or Guaranteed pod of a controller on {node} now"]


class WorkloadPods(Protocol):
    """The pod reads the recreation needs (``rollout.kube``; unit tests pass a fake)."""

    def on_node(self, node: str) -> list[dict[str, Any]]:
        """Every pod bound to ``node`` (JSON, any phase)."""
        ...

    def of_owner(self, owner: str) -> list[dict[str, Any]]:
        """Every pod of the controller ``owner`` (JSON, any phase, any node)."""
        ...

    def pending(self, namespace: str) -> list[dict[str, Any]]:
        """Every pod of ``namespace`` in phase Pending (JSON, bound to a node or not)."""
        ...


@dataclass(frozen=True)
class Recreated:
    """One controller's pods recreated: the pods evicted and their replacements' node by key."""

    node: str
    owner: str
    pods: tuple[str, ...]
    replacements: Mapping[str, str]


class RecreatedWorkloads:
    """Recreate the workload pods of each node, one controller at a time, journaled (see the
    module docstring)."""

    def __init__(
        self,
        cluster: Cluster,
        pods: WorkloadPods,
        policy: DrainPolicy,
        clock: Clock,
        say: Callable[[str], None] = print,
        timeout: float = REPLACE_TIMEOUT_S,
    ) -> None:
        self.cluster, self.pods, self.clock, self.say = cluster, pods, clock, say
        # always the Eviction API: the operator's consent is to recreate, not to bypass budgets
        self.policy = DrainPolicy(
            timeout_s=policy.timeout_s,
            backoff_initial_s=policy.backoff_initial_s,
            backoff_cap_s=policy.backoff_cap_s,
            grace_period_s=policy.grace_period_s,
        )
        self.timeout = timeout

    def run(self, journal: Journal, nodes: Sequence[str]) -> list[Recreated]:
        """Recreate every selected pod of ``nodes`` (the nodes the change applied); what was
        recreated, in order.

        Raises:
            EvictionBlockedError: a PodDisruptionBudget kept refusing past the drain timeout.
            ExternalError: a replacement was rejected or did not run in time.
        """
        done: list[Recreated] = []
        for node in nodes:
            self._settle(journal, node)
            sel = select(self.pods.on_node(node))
            for key, why in sorted(sel.left.items()):
                self.say(f"{node}: not recreating {key}: {why}")
            if not sel.owners:
                self.say(f"{node}: no GPU or Guaranteed pod of a controller to recreate")
            for owner, pods in sel.owners.items():
                done.append(self._one(journal, node, owner, pods, set(nodes)))
        return done

    def _settle(self, journal: Journal, node: str) -> None:
        """Wait, at most the replacement timeout, until no pod is Pending in the namespaces of
        the pods the change's drain evicted from ``node``: those pods' replacements wait for a
        node while it is cordoned and are placed once it is uncordoned; selecting before they run
        would find none of them. A Pending pod left when the time is up is named, and the
        recreation goes on with what runs."""
        evicted: set[str] = set()
        for e in journal.entries():
            if e.step == "drain" and e.node == node and e.phase is Phase.DONE:
                evicted.update(NodeStep(e.data).evicted)
        namespaces = sorted({k.split("/", 1)[0] for k in evicted if "/" in k})
        if not namespaces:
            return
        start = self.clock.monotonic()
        deadline, said = start + self.timeout, start
        pending: list[str] = []

        def settled() -> bool:
            nonlocal pending, said
            pending = sorted(_key(p) for ns in namespaces for p in self.pods.pending(ns))
            now = self.clock.monotonic()
            if pending and now - said >= _SAY_EVERY_S and now < deadline:
                said = now
                self.say(
                    f"{node}: waiting for the drained pods to come back before recreating: "
                    f"{len(pending)} Pending ({deadline - now:.0f}s left)"
                )
            return not pending

        if not wait_until(
            settled, self.timeout, POLL, self.clock.sleep, self.clock.monotonic, start
        ):
            self.say(
                f"warning: {node}: still Pending after {self.timeout:.0f}s: "
                f"{', '.join(pending)}; recreating what runs"
            )

    def _one(
        self,
        journal: Journal,
        node: str,
        owner: str,
        pods: list[Mapping[str, Any]],
        changed: set[str],
    ) -> Recreated:
        keys = tuple(_key(p) for p in pods)
        rec = Recreation(node, owner, keys)
        journal.append(Kind.RECREATE, Phase.BEGIN, now=self.clock.now(), data=rec.begun())
        try:
            before = {str((p.get("metadata") or {}).get("uid")) for p in self.pods.of_owner(owner)}
            self.say(f"{node}: recreating {owner}: evicting {', '.join(keys)}")
            refs = [to_pod_ref(dict(p)) for p in pods]
            evict_pods(self.cluster, node, refs, self.policy, self.clock, self.say, "recreate")
            placed = self._replacements(node, owner, before, len(pods))
        except Exception as e:
            journal.append(
                Kind.RECREATE, Phase.FAILED, now=self.clock.now(), data=rec.failed(str(e))
            )
            raise
        off = sorted(k for k, n in placed.items() if n not in changed)
        for k, n in placed.items():
            self.say(f"{node}: {owner}: replacement {k} Running on {n}")
        if off:
            self.say(
                f"warning: {owner}: replacement(s) {', '.join(off)} run on nodes the change did "
                "not apply; the after-recreate evidence does not judge them"
            )
        journal.append(
            Kind.RECREATE,
            Phase.DONE,
            now=self.clock.now(),
            data=rec.done(placed, off),
        )
        return Recreated(node, owner, keys, placed)

    def _replacements(self, node: str, owner: str, before: set[str], count: int) -> dict[str, str]:
        """Until ``count`` pods of ``owner`` that were not there before run: their node by key.

        Raises:
            ExternalError: one was rejected (phase Failed), or the timeout passed.
        """
        start = self.clock.monotonic()
        deadline, said = start + self.timeout, start
        fresh: list[Mapping[str, Any]] = []
        running: dict[str, str] = {}

        def placed() -> bool:
            nonlocal fresh, running, said
            fresh = [
                p
                for p in self.pods.of_owner(owner)
                if str((p.get("metadata") or {}).get("uid")) not in before
                and not (p.get("metadata") or {}).get("deletionTimestamp")
            ]
            for p in fresh:
                st = p.get("status") or {}
                if st.get("phase") == "Failed":
                    where = (p.get("spec") or {}).get("nodeName") or "no node"
                    raise ExternalError(
                        f"replacement {_key(p)} of {owner} on {where} was rejected: "
                        f"{st.get('reason')}: {st.get('message')}"
                    )
            running = {
                _key(p): str((p.get("spec") or {}).get("nodeName"))
                for p in fresh
                if (p.get("status") or {}).get("phase") == "Running"
            }
            if len(running) >= count:
                return True
            now = self.clock.monotonic()
            if now - said >= _SAY_EVERY_S and now < deadline:
                said = now
                self.say(
                    f"{node}: waiting for {count - len(running)} replacement(s) of {owner} to "
                    f"run ({deadline - now:.0f}s left)"
                )
            return False

        if not wait_until(
            placed, self.timeout, POLL, self.clock.sleep, self.clock.monotonic, start
        ):
            raise ExternalError(
                f"{node}: {len(running)} of {count} replacement(s) of {owner} Running after "
                f"{self.timeout:.0f}s (pending: "
                f"{', '.join(_key(p) for p in fresh if _key(p) not in running) or 'none'})"
            )
        return dict(sorted(running.items())[:count])


class KubeWorkloadPods:
    """:class:`WorkloadPods` over the API server."""

    def __init__(self, api: Any) -> None:
        self.api = api

    def on_node(self, node: str) -> list[dict[str, Any]]:
        """See :meth:`WorkloadPods.on_node`."""
        from rollout.kube.nodes import pod_objects_on

        return pod_objects_on(self.api, node)

    def of_owner(self, owner: str) -> list[dict[str, Any]]:
        """See :meth:`WorkloadPods.of_owner`."""
        from rollout.kube.workloads import owner_pods

        return owner_pods(self.api, owner)

    def pending(self, namespace: str) -> list[dict[str, Any]]:
        """See :meth:`WorkloadPods.pending`."""
        from rollout.kube.workloads import pending_pods

        return pending_pods(self.api, namespace)
