"""The CPU manager's CPU picker: ``takeByTopology`` (packed and NUMA-distributed).

Follows ``pkg/kubelet/cm/cpumanager/cpu_assignment.go``; the facts carried over:

* the accumulator takes, from the free CPUs, whole NUMA nodes and whole sockets first (NUMA nodes
  first when a socket holds one or more NUMA nodes, sockets first when NUMA nodes outnumber
  sockets), then whole physical cores, then single threads; it claims a unit only while it still
  needs at least that unit's size;
* every candidate list is ordered by how many free CPUs the unit has (fewest first: pack into the
  fullest), then by id; cores are listed socket by socket (or NUMA node by NUMA node), threads
  in id order within their core;
* ``distribute-cpus-across-numa`` spreads a request over the fewest NUMA nodes that can hold it,
  evenly in groups of ``cpuGroupSize`` (2 with SMT under ``full-pcpus-only``), choosing the
  combination that leaves the free CPUs most balanced (standard deviation rounded to 1/1000);
* ``distribute-cpus-across-cores`` (alpha) picks threads socket by socket instead of filling cores.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field


class CPUAllocationError(Exception):
    """``takeByTopology`` failed; the message is the kubelet's."""


@dataclass(frozen=True)
class CPUInfo:
    numa: int
    socket: int
    core: int


@dataclass(frozen=True)
class CPUTopology:
    """``topology.CPUTopology``: per CPU its NUMA node, socket and core (core id unique)."""

    cpus: Mapping[int, CPUInfo]
    _by: dict[str, dict[int, frozenset[int]]] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        for kind in ("numa", "socket", "core"):
            groups: dict[int, set[int]] = {}
            for cpu, info in self.cpus.items():
                groups.setdefault(getattr(info, kind), set()).add(cpu)
            self._by[kind] = {k: frozenset(v) for k, v in groups.items()}

    @property
    def all(self) -> frozenset[int]:
        return frozenset(self.cpus)

    def ids(self, kind: str) -> list[int]:
        return sorted(self._by[kind])

    def members(self, kind: str, ident: int) -> frozenset[int]:
        return self._by[kind].get(ident, frozenset())

    @property
    def num_sockets(self) -> int:
        return len(self._by["socket"])

    @property
    def num_numa(self) -> int:
        return len(self._by["numa"])

    @property
    def cpus_per_core(self) -> int:
        n = len(self._by["core"])
        return len(self.cpus) // n if n else 0

    @property
    def cpus_per_socket(self) -> int:
        n = self.num_sockets
        return len(self.cpus) // n if n else 0

    def numa_of(self, cpu: int) -> int:
        return self.cpus[cpu].numa

    def sockets_of_numa(self, nodes: Iterable[int]) -> frozenset[int]:
        want = set(nodes)
        return frozenset(i.socket for i in self.cpus.values() if i.numa in want)


class _Acc:
    """``cpuAccumulator``."""

    def __init__(self, topo: CPUTopology, available: frozenset[int], n: int, spread: bool):
        self.topo = topo
        self.free = set(available)
        self.need = n
        self.result: set[int] = set()
        self.numa_first = topo.num_sockets >= topo.num_numa
        self.spread = spread

    # ------------------------------------------------------------------ ordering
    def _free_in(self, kind: str, ident: int) -> int:
        return len(self.topo.members(kind, ident) & self.free)

    def _present(self, kind: str, within: Iterable[int] | None = None) -> list[int]:
        cpus = self.free if within is None else self.free & set(within)
        return sorted({getattr(self.topo.cpus[c], kind) for c in cpus})

    def _sort(self, kind: str, ids: list[int]) -> list[int]:
        return sorted(ids, key=lambda i: (self._free_in(kind, i), i))

    def numas(self) -> list[int]:
        if self.numa_first:
            return self._sort("numa", self._present("numa"))
        out: list[int] = []
        for s in self.sockets():
            out += self._sort("numa", self._present("numa", self.topo.members("socket", s)))
        return out

    def sockets(self) -> list[int]:
        if not self.numa_first:
            return self._sort("socket", self._present("socket"))
        out: list[int] = []
        for n in self.numas():
            out += self._sort("socket", self._present("socket", self.topo.members("numa", n)))
        return out

    def cores(self) -> list[int]:
        out: list[int] = []
        if self.numa_first:
            for s in self.sockets():
                out += self._sort("core", self._present("core", self.topo.members("socket", s)))
        else:
            for n in self.numas():
                out += self._sort("core", self._present("core", self.topo.members("numa", n)))
        return out

    def sorted_cpus(self) -> list[int]:
        out: list[int] = []
        if self.spread:
            for s in self.sockets():
                out += sorted(self.topo.members("socket", s) & self.free)
        else:
            for c in self.cores():
                out += sorted(self.topo.members("core", c) & self.free)
        return out

    # ------------------------------------------------------------------ taking
    def take(self, cpus: Iterable[int]) -> None:
        got = set(cpus)
        self.result |= got
        self.free -= got
        self.need -= len(got)

    def satisfied(self) -> bool:
        return self.need < 1

    def failed(self) -> bool:
        return self.need > len(self.free)

    def _take_full(self, kind: str, order: list[int], full_size: Callable[[int], int]) -> None:
        free_units = [u for u in order if self._free_in(kind, u) == full_size(u)]
        for u in free_units:
            members = self.topo.members(kind, u)
            if self.need >= len(members):
                self.take(members)

    def take_full_numa(self) -> None:
        self._take_full("numa", self.numas(), lambda u: len(self.topo.members("numa", u)))

    def take_full_sockets(self) -> None:
        self._take_full("socket", self.sockets(), lambda u: self.topo.cpus_per_socket)

    def take_full_cores(self) -> None:
        self._take_full("core", self.cores(), lambda u: self.topo.cpus_per_core)

    def take_remaining(self) -> None:
        for cpu in self.sorted_cpus():
            self.take([cpu])
            if self.satisfied():
                return


def take_packed(
    topo: CPUTopology, available: frozenset[int], n: int, spread: bool = False
) -> frozenset[int]:
    """``takeByTopologyNUMAPacked``."""
    acc = _Acc(topo, available, n, spread)
    if acc.satisfied():
        return frozenset(acc.result)
    if acc.failed():
        raise CPUAllocationError(
            "not enough cpus available to satisfy request: "
            f"requested={n}, available={len(available)}"
        )
    steps = (
        (acc.take_full_numa, acc.take_full_sockets)
        if acc.numa_first
        else (acc.take_full_sockets, acc.take_full_numa)
    )
    for step in steps:
        step()
        if acc.satisfied():
            return frozenset(acc.result)
    if not spread:
        acc.take_full_cores()
        if acc.satisfied():
            return frozenset(acc.result)
    acc.take_remaining()
    if acc.satisfied():
        return frozenset(acc.result)
    raise CPUAllocationError("failed to allocate cpus")


def _round3(x: float) -> float:
    return math.floor(x * 1000 + 0.5) / 1000  # Go math.Round for x >= 0


def _stddev(xs: list[int]) -> float:
    m = _round3(sum(float(x) for x in xs) / len(xs))
    s = math.sqrt(sum((float(x) - m) * (float(x) - m) for x in xs) / len(xs))
    return _round3(s)


class _GoSlice:
    """A Go ``[]int`` view (backing array + length), for ``iterateCombinations``.

    The kubelet builds each combination with ``append(accum, n[i])`` on a shared prefix; when the
    prefix has spare capacity every sibling combination is written into the same backing array,
    so a combination kept as "best" shows the contents of the last sibling visited after it.
    The kubelet's choice depends on that, so the model keeps Go's slice semantics (capacity
    1, 2, 4, 8, ... as ``append`` grows an int slice).
    """

    __slots__ = ("arr", "n")

    def __init__(self, arr: list[int], n: int) -> None:
        self.arr = arr
        self.n = n

    def append(self, x: int) -> _GoSlice:
        if self.n < len(self.arr):
            self.arr[self.n] = x
            return _GoSlice(self.arr, self.n + 1)
        cap = 1 if not self.arr else 2 * len(self.arr)
        arr = self.arr[: self.n] + [x] + [0] * (cap - self.n - 1)
        return _GoSlice(arr, self.n + 1)

    def items(self) -> list[int]:
        return self.arr[: self.n]


def _go_combinations(items: list[int], k: int) -> Iterator[_GoSlice]:
    """``iterateCombinations`` in the kubelet's order, yielding aliased slices as Go does."""
    if k < 1:
        return

    def helper(k: int, start: int, accum: _GoSlice) -> Iterator[_GoSlice]:
        if k == 0:
            yield accum
            return
        for i in range(start, len(items) - k + 1):
            yield from helper(k - 1, i + 1, accum.append(items[i]))

    yield from helper(k, 0, _GoSlice([], 0))


def take_distributed(
    topo: CPUTopology, available: frozenset[int], n: int, group: int, spread: bool = False
) -> frozenset[int]:
    """``takeByTopologyNUMADistributed``."""
    if n % group:
        return take_packed(topo, available, n, spread)
    acc = _Acc(topo, available, n, spread)
    if acc.satisfied():
        return frozenset(acc.result)
    if acc.failed():
        raise CPUAllocationError(
            "not enough cpus available to satisfy request: "
            f"requested={n}, available={len(available)}"
        )
    numas = acc.numas()
    free_in = {u: acc._free_in("numa", u) for u in numas}
    num_numa_all = topo.num_numa
    groups_total = (len(topo.cpus) - 1) // group + 1
    groups_per_numa = (groups_total - 1) // num_numa_all + 1
    groups_needed = (n - 1) // group + 1
    lo = (groups_needed - 1) // groups_per_numa + 1
    hi = min(groups_needed, len(acc._present("numa")))
    for k in range(lo, hi + 1):
        best_balance = math.inf
        best_rem: _GoSlice | None = None
        best_combo: _GoSlice | None = None
        for combo_view in _go_combinations(numas, k):
            if best_balance == 0:
                break
            combo = combo_view.items()
            if sum(free_in[u] for u in combo) < n:
                continue
            if sum(free_in[u] // group for u in combo) * group < n:
                continue
            dist = (n // len(combo) // group) * group
            if any(free_in[u] < dist for u in combo):
                continue
            after = {u: free_in[u] for u in numas}
            for u in combo:
                after[u] -= dist
            remainder = n - dist * len(combo)
            rem_combo = [u for u in combo if after[u] >= group]
            local_best = math.inf
            local_rem: _GoSlice | None = None
            if remainder == 0:
                local_best = _stddev(list(after.values()))
            kk = len(rem_combo)
            while remainder > 0 and kk >= 1:
                for subset_view in _go_combinations(rem_combo, kk):
                    subset = subset_view.items()
                    left = remainder
                    av = dict(after)
                    if sum(av[u] for u in subset) < left:
                        continue
                    while left > 0:
                        progressed = False
                        for u in subset:
                            if left == 0:
                                break
                            if av[u] < group:
                                continue
                            av[u] -= group
                            left -= group
                            progressed = True
                        if not progressed:  # the kubelet would loop forever here
                            raise CPUAllocationError("no progress distributing the remainder")
                    bal = _stddev(list(av.values()))
                    if bal < local_best:
                        local_best = bal
                        local_rem = subset_view
                kk -= 1
            if local_best < best_balance:
                best_balance = local_best
                best_rem = local_rem
                best_combo = combo_view
        if best_combo is None:
            continue
        chosen = best_combo.items()  # read after the walk, as the kubelet reads its slice
        rem_nodes = best_rem.items() if best_rem is not None else []
        dist = (n // len(chosen) // group) * group
        for u in chosen:
            acc.take(take_packed(topo, frozenset(topo.members("numa", u) & acc.free), dist, spread))
        remainder = n - dist * len(chosen)
        while remainder > 0:
            progressed = False
            for u in rem_nodes:
                if remainder == 0:
                    break
                pool = frozenset(topo.members("numa", u) & acc.free)
                if len(pool) < group:
                    continue
                acc.take(take_packed(topo, pool, group, spread))
                remainder -= group
                progressed = True
            if not progressed:
                raise CPUAllocationError("no progress distributing the remainder")
        if acc.need > 0:
            raise CPUAllocationError(
                f"accounting error, not enough CPUs allocated, remaining: {acc.need}"
            )
        if acc.need < 0:
            raise CPUAllocationError(
                f"accounting error, too many CPUs allocated, remaining: {acc.need}"
            )
        return frozenset(acc.result)
    return take_packed(topo, available, n, spread)
