"""The device manager's NUMA hints and device choice for one extended resource (e.g. GPUs).

Follows ``pkg/kubelet/cm/devicemanager/topology_hints.go`` and ``manager.go``:

* a resource none of whose devices reports a NUMA node has no preference (``nil`` hints);
* otherwise masks range over the NUMA nodes that have such devices only; a mask is offered when
  the free devices on it (plus devices an init container of the same pod hands back) cover the
  request; preferred when as small as the smallest mask whose devices could hold the request;
  fewer free devices than requested anywhere: an empty list (no possible affinity);
* allocation takes devices on the hinted NUMA nodes first. Which of several equally placed
  devices the kubelet takes is a Go map iteration (random); the model takes them in id order.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rollout.kubelet.admission.static import unexpected
from rollout.kubelet.admission.topology import Hint, Mask, iterate_masks


@dataclass
class DevicePool:
    resource: str
    numa_of: Mapping[str, int | None]  # device id -> NUMA node (None: no topology)
    known_numa: tuple[int, ...]
    allocated: dict[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    reuse: dict[str, frozenset[str]] = field(default_factory=dict)

    def in_use(self) -> set[str]:
        return {d for ds in self.allocated.values() for d in ds}

    def available(self) -> set[str]:
        return set(self.numa_of) - self.in_use()

    def aligned(self) -> bool:
        return any(n is not None for n in self.numa_of.values())

    def hints(self, request: int, pod_uid: str, pod_scope: bool) -> list[Hint] | None:
        if request == 0:
            return None  # not requested: the resource is absent from the provider's map
        if not self.aligned():
            return None
        available = self.available()
        reusable = set() if pod_scope else set(self.reuse.get(pod_uid, frozenset()))
        if len(available | reusable) < request:
            return []
        nodes = sorted({n for n in self.numa_of.values() if n is not None} & set(self.known_numa))
        if not nodes:
            nodes = sorted(self.known_numa)
        min_size = len(nodes)
        found: list[Mask] = []
        for mask in iterate_masks(nodes):
            in_mask = sum(1 for n in self.numa_of.values() if n is not None and n in mask)
            if in_mask >= request and len(mask) < min_size:
                min_size = len(mask)
            matching = 0
            skip = False
            for d in reusable:
                n = self.numa_of[d]
                if n is None:
                    continue
                if n not in mask:
                    skip = True
                    break
                matching += 1
            if skip:
                continue
            matching += sum(
                1 for d in available if self.numa_of[d] is not None and self.numa_of[d] in mask
            )
            if matching >= request:
                found.append(mask)
        return [Hint(m, len(m) == min_size) for m in found]

    def allocate(
        self, pod_uid: str, container: str, request: int, affinity: Mask | None, init: bool
    ) -> tuple[str, ...]:
        if request == 0:
            return ()
        got: list[str] = []
        for d in sorted(self.reuse.get(pod_uid, frozenset())):
            if len(got) < request:
                got.append(d)
        available = self.available() - set(got)
        needed = request - len(got)
        if needed and len(available) < needed:
            raise unexpected(
                f"requested number of devices unavailable for {self.resource}. "
                f"Requested: {needed}, Available: {len(available)}"
            )
        if needed:

            def order(d: str) -> tuple[int, str]:
                n = self.numa_of[d]
                if affinity is not None and n is not None and n in affinity:
                    return (0, d)
                return (1 if n is not None else 2, d)

            got += sorted(available, key=order)[:needed]
        out = tuple(sorted(got))
        self.allocated[(pod_uid, container)] = out
        for uid in [u for u in self.reuse if u != pod_uid]:
            del self.reuse[uid]
        cur = self.reuse.get(pod_uid, frozenset())
        self.reuse[pod_uid] = cur | set(out) if init else cur - set(out)
        return out

    def release_pod(self, pod_uid: str) -> None:
        for key in [k for k in self.allocated if k[0] == pod_uid]:
            del self.allocated[key]
