"""The ``after-recreate`` evidence ``apply --recreate-probes`` collects: identity and placement
still hold once a pod holding a device has been deleted and created again on the node.

Why probes: recreating a user's pods needs the operator's consent; the tool's own probe pods
(:mod:`rollout.kube.probing`: its namespace, its labels, bound with ``nodeName``) need none. On
each node that advertises the device resource, one Guaranteed probe asking for one device runs,
is deleted, and runs again under a new name: the kubelet's device manager and CPU manager
assign it afresh, from the state our restart left. The collection is taken while the second
probe runs, so ``unique-device-ids`` and ``numa-aligned`` judge its assignment with the pods
already there; the probes are deleted afterwards, whatever happened: on SIGTERM before the
tool dies, and those a SIGKILL left by the next run, before it creates its own
(:mod:`rollout.kube.owned_pods`).

A probe the kubelet rejects (``TopologyAffinityError``, ``UnexpectedAdmissionError``) or that
does not run within the timeout makes the collection fail with the pod's reason; it never stops
or undoes the change (as any evidence collection).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from rollout.errors import ExternalError
from rollout.kube.probing import PROBE_IMAGE, PROBE_NAMESPACE, ProbePods, probe_manifest
from rollout.retrying import Poll, wait_until

if TYPE_CHECKING:
    from rollout.kube.client import Api

RUN_TIMEOUT_S = 90.0
POLL = Poll.every(0.5)
"""How often the probes are looked at while they start or go."""


def device_probe(
    node: str,
    change_id: str,
    index: int,
    resource: str,
    namespace: str = PROBE_NAMESPACE,
    image: str = PROBE_IMAGE,
) -> dict[str, Any]:
    """A probe pod (``probe_manifest``) that also asks for one ``resource`` device, requests
    equal to limits as extended resources require (pure)."""
    m = probe_manifest(node, change_id, index, namespace=namespace, image=image)
    m["metadata"]["name"] = m["metadata"]["name"].replace("rollout-probe-", "rollout-device-", 1)
    m["metadata"]["labels"]["rollout.io/evidence"] = "after-recreate"
    res = m["spec"]["containers"][0]["resources"]
    res["requests"][resource] = res["limits"][resource] = "1"
    return m


class RecreatedProbes:
    """One device probe per node, run, deleted and run again (see the module docstring)."""

    def __init__(
        self,
        api: Api,
        namespace: str = PROBE_NAMESPACE,
        timeout: float = RUN_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        say: Callable[[str], None] = lambda _m: None,
    ) -> None:
        """``say``: where the device probes a killed tool left, deleted first, are named."""
        self.api, self.namespace, self.timeout = api, namespace, timeout
        self.clock, self.sleep = clock, sleep
        self.pods = ProbePods(api, namespace, say=say)

    @contextmanager
    def running(self, change_id: str, nodes: Sequence[str], resource: str) -> Iterator[list[str]]:
        """The second probes' names while they run; every probe is deleted on the way out.

        Raises:
            ExternalError: a probe was rejected or did not run in time (named, with its reason).
        """
        self.pods.ensure_namespace()
        self.pods.sweep()
        try:
            first = [self._create(n, change_id, 0, resource) for n in nodes]
            self._wait(first, "running")
            for name in first:
                self.pods.delete(name)
            self._wait(first, "gone")
            second = [self._create(n, change_id, 1, resource) for n in nodes]
            self._wait(second, "running")
            yield second
        finally:
            self.pods.cleanup()

    def _create(self, node: str, change_id: str, index: int, resource: str) -> str:
        return self.pods.create(device_probe(node, change_id, index, resource, self.namespace))

    def _wait(self, names: Sequence[str], until: str) -> None:
        """Until every probe of ``names`` runs (``running``) or is gone (``gone``).

        Raises:
            ExternalError: a probe failed (the kubelet rejected it) or the timeout passed.
        """
        waiting = list(names)

        def there() -> bool:
            for name in list(waiting):
                st = self.pods.state(name)
                if until == "gone":
                    if st is None:
                        waiting.remove(name)
                    continue
                if st is None:
                    raise ExternalError(f"probe {name} is gone before it ran")
                if st["phase"] == "Running":
                    waiting.remove(name)
                elif st["phase"] == "Failed":
                    raise ExternalError(
                        f"probe {name} on {st['node']} was rejected: {st['reason']}: "
                        f"{st['message']}"
                    )
            return not waiting

        if not wait_until(there, self.timeout, POLL, self.sleep, self.clock):
            raise ExternalError(
                f"probe(s) {', '.join(waiting)} not {until} after {self.timeout:.0f}s"
            )
