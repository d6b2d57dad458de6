"""The Memory Manager's ``Static`` policy: memory and hugepages per NUMA node, NUMA groups.

Follows ``pkg/kubelet/cm/memorymanager/policy_static.go``:

* per NUMA node and resource (``memory``, ``hugepages-2Mi`` ...): allocatable = total minus
  ``reservedMemory`` (for ``memory`` also minus the node's hugepages), free, reserved;
* Guaranteed containers only; hints: every NUMA mask whose *allocatable* sum covers each
  requested resource counts towards the smallest size; a mask is offered when its *free* sum
  covers the request and it does not break a NUMA group (a node already used by a multi-node
  allocation may only be used again with exactly that group; a node used alone may not join a
  group); preferred = smallest size. No fitting mask at all: the provider says nothing;
* allocation uses the Topology Manager's hint; with no hint (or one that does not hold the
  request) the narrowest fitting hint, preferred first, that contains the given mask; the
  request is then taken node by node in mask order and the mask becomes the nodes' group.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rollout.kubelet.admission.static import unexpected
from rollout.kubelet.admission.topology import Hint, Mask, iterate_masks, narrower

MEMORY = "memory"


@dataclass
class Table:
    allocatable: int
    free: int
    reserved: int = 0


@dataclass
class NodeState:
    tables: dict[str, Table]
    assignments: int = 0
    cells: tuple[int, ...] = ()


@dataclass
class MemoryPolicy:
    nodes: dict[int, NodeState]
    blocks: dict[tuple[str, str], list[tuple[str, int, tuple[int, ...]]]] = field(
        default_factory=dict
    )

    @classmethod
    def create(
        cls,
        memory: Mapping[int, int],
        hugepages: Mapping[int, Mapping[str, int]],
        reserved: Mapping[int, Mapping[str, int]],
    ) -> MemoryPolicy:
        """``memory``/``hugepages``: bytes per NUMA node; ``reserved``: ``reservedMemory``."""
        if sum(r.get(MEMORY, 0) for r in reserved.values()) <= 0:
            raise ValueError("[memorymanager] you should specify the system reserved memory")
        nodes: dict[int, NodeState] = {}
        for nid in sorted(memory):
            tables: dict[str, Table] = {}
            huge_total = 0
            for res, size in sorted((hugepages.get(nid) or {}).items()):
                alloc = size - (reserved.get(nid) or {}).get(res, 0)
                tables[res] = Table(alloc, alloc)
                huge_total += size
            alloc = memory[nid] - (reserved.get(nid) or {}).get(MEMORY, 0) - huge_total
            tables[MEMORY] = Table(alloc, alloc)
            nodes[nid] = NodeState(tables, 0, (nid,))
        return cls(nodes)

    def _table(self, nid: int, res: str) -> Table:
        t = self.nodes[nid].tables.get(res)
        if t is None:
            # the kubelet dereferences a missing table (a resource the node does not report)
            raise unexpected(f"[memorymanager] NUMA node {nid} has no {res}")
        return t

    def hints(self, requested: Mapping[str, int]) -> dict[str, list[Hint]]:
        """``calculateHints``; an empty dict when no mask fits (the provider says nothing)."""
        ids = sorted(self.nodes)
        min_size = len(ids)
        found: list[Mask] = []
        for mask in iterate_masks(ids):
            bits = sorted(mask)
            if any(
                sum(self._table(n, r).allocatable for n in bits) < v for r, v in requested.items()
            ):
                continue
            min_size = min(min_size, len(mask))
            single = len(bits) == 1
            if single and len(self.nodes[bits[0]].cells) > 1:
                continue
            if not single and any(
                self.nodes[n].assignments > 0
                and (len(self.nodes[n].cells) == 1 or sorted(self.nodes[n].cells) != bits)
                for n in bits
            ):
                continue
            if any(sum(self._table(n, r).free for n in bits) < v for r, v in requested.items()):
                continue
            found.append(mask)
        return {r: [Hint(m, len(m) == min_size) for m in found] for r in requested} if found else {}

    def _best(self, hints: list[Hint]) -> Hint:
        best: Hint | None = None
        for h in hints:
            assert h.affinity is not None
            if best is None:
                best = h
                continue
            assert best.affinity is not None
            better = h.preferred and not best.preferred
            if better or (h.preferred == best.preferred and narrower(h.affinity, best.affinity)):
                best = h
        return best if best is not None else Hint(None, False)

    def allocate(
        self, pod_uid: str, container: str, requested: Mapping[str, int], hint: Hint
    ) -> Mask:
        """``staticPolicy.Allocate`` for one container; AdmissionFailure."""
        best = hint
        if hint.affinity is None:
            hs = self.hints(requested)
            if not hs:
                raise unexpected(
                    "[memorymanager] failed to get the default NUMA affinity, "
                    "no NUMA nodes with enough memory is available"
                )
            default = self._best(hs.get(MEMORY, []))
            if not default.preferred and best.preferred:
                raise unexpected("[memorymanager] failed to find the default preferred hint")
            best = default
        assert best.affinity is not None
        bits = sorted(best.affinity)
        if any(sum(self._table(n, r).free for n in bits) < v for r, v in requested.items()):
            inside = [
                h
                for h in self.hints(requested).get(MEMORY, [])
                if h.affinity is not None and best.affinity <= h.affinity
            ]
            if not inside:
                raise unexpected(
                    "[memorymanager] failed to find NUMA nodes to extend the current topology hint"
                )
            ext = self._best(inside)
            if not ext.preferred and best.preferred:
                raise unexpected("[memorymanager] failed to find the extended preferred hint")
            best = ext
            assert best.affinity is not None
            bits = sorted(best.affinity)
        if len(bits) > 1 and any(
            self.nodes[n].assignments > 0
            and (len(self.nodes[n].cells) == 1 or sorted(self.nodes[n].cells) != bits)
            for n in bits
        ):
            raise unexpected("[memorymanager] preferred hint violates NUMA node allocation")
        blocks = []
        for res in sorted(requested):
            size = requested[res]
            blocks.append((res, size, tuple(bits)))
            left = size
            for n in bits:
                st = self.nodes[n]
                st.assignments += 1
                st.cells = tuple(bits)
                if left == 0:
                    continue
                t = self._table(n, res)
                if t.free <= 0:
                    continue
                got = min(t.free, left)
                t.free -= got
                t.reserved += got
                left -= got
        self.blocks[(pod_uid, container)] = blocks
        return frozenset(bits)

    def release_pod(self, pod_uid: str) -> None:
        for key in [k for k in self.blocks if k[0] == pod_uid]:
            for res, size, bits in self.blocks.pop(key):
                left = size
                for n in bits:
                    st = self.nodes[n]
                    st.assignments -= 1
                    if st.assignments == 0:
                        st.cells = (n,)
                    if left == 0:
                        continue
                    t = self._table(n, res)
                    if t.reserved == 0:
                        continue
                    give = min(t.reserved, left)
                    t.free += give
                    t.reserved -= give
                    left -= give
