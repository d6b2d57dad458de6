"""Pod admission as the kubelet's Topology Manager decides it, over plain data.

The lab kubelet must reject exactly the pods a real kubelet with the same policy would reject on a
machine with the same NUMA layout, because ``rollout`` watches those rejections to decide whether
to roll back. This module is that decision: machine + policy + what is already held + the pod in,
``Decision`` (admit or the kubelet's reason and message, and what was allocated) out. No I/O.

What follows the kubelet (``pkg/kubelet/cm/topologymanager``, ``cpumanager/policy_static.go``,
``devicemanager/topology_hints.go``, ``memorymanager/policy_static.go``):

* hint providers: the CPU manager (``static`` policy, Guaranteed pods, integer CPU requests:
  exclusive CPUs from the shared pool minus reserved CPUs), the device manager (``nvidia.com/gpu``
  per NUMA node) and the memory manager (``Static``, Guaranteed pods). Each returns, per resource,
  every NUMA mask with enough *free* capacity; a hint is *preferred* when its mask is as narrow as
  the narrowest mask that could hold the request on an *empty* machine. A provider with nothing to
  say returns no hints ("don't care"); a request that fits nowhere yields an empty list, which
  merges as a non-preferred "any" hint;
* merging: the cross product of the providers' hints, affinities ANDed, preferred only if all are,
  best = preferred first, then narrowest (then lowest NUMA ids); ``single-numa-node`` first drops
  every hint that is not a preferred single-NUMA one;
* admission: ``none`` and ``best-effort`` admit; ``restricted`` and ``single-numa-node`` admit
  only a preferred best hint. Rejection: reason ``TopologyAffinityError``, message ``Resources
  cannot be allocated with Topology locality`` (``topologymanager/topology_manager.go``); the pod
  status message is the kubelet's ``"Pod was rejected: " + message``;
* scope: ``container`` decides and allocates container by container (init containers are checked
  against the state but hand their CPUs back, as the kubelet reuses them); ``pod`` decides once
  for the pod's effective request (max of the app containers' sum and the largest init container).

Simplifications (documented in docs/lab.md): CPUs within a NUMA node are taken lowest id first (no
core/socket packing), memory is a single ``memory`` resource (no hugepages), and the
``prefer-closest-numa-nodes`` / ``max-allowable-numa-nodes`` options are not modelled.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout.kubelet import quantity

TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"
UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
REJECTED_PREFIX = "Pod was rejected: "
GPU = "nvidia.com/gpu"


@dataclass(frozen=True)
class NUMANode:
    id: int
    cpus: frozenset[int]
    memory: int = 0
    gpus: tuple[str, ...] = ()


@dataclass(frozen=True)
class Machine:
    """The node's hardware and what the kubelet configuration reserves."""

    numa: tuple[NUMANode, ...]
    reserved_cpus: frozenset[int] = frozenset()
    reserved_memory: Mapping[int, int] = field(default_factory=dict)

    @property
    def all_cpus(self) -> frozenset[int]:
        return frozenset().union(*(n.cpus for n in self.numa))

    def numa_of_cpu(self, cpu: int) -> int:
        return next(n.id for n in self.numa if cpu in n.cpus)

    def numa_of_gpu(self, gpu: str) -> int:
        return next(n.id for n in self.numa if gpu in n.gpus)


@dataclass(frozen=True)
class Policy:
    """The kubelet settings admission depends on (values as in the KubeletConfiguration)."""

    cpu: str = "none"  # cpuManagerPolicy
    topology: str = "none"  # topologyManagerPolicy
    scope: str = "container"  # topologyManagerScope
    memory: str = "None"  # memoryManagerPolicy


@dataclass(frozen=True)
class Container:
    name: str
    cpu_millis: int = 0
    memory: int = 0
    gpus: int = 0
    init: bool = False


@dataclass(frozen=True)
class PodRequest:
    uid: str
    containers: tuple[Container, ...]
    guaranteed: bool = False


@dataclass(frozen=True)
class Allocation:
    """What one admitted pod holds: exclusive CPUs, GPUs, memory per NUMA node, per container."""

    cpus: Mapping[str, frozenset[int]] = field(default_factory=dict)
    gpus: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    memory: Mapping[str, Mapping[int, int]] = field(default_factory=dict)

    def all_cpus(self) -> frozenset[int]:
        return frozenset().union(*self.cpus.values()) if self.cpus else frozenset()

    def all_gpus(self) -> frozenset[str]:
        return frozenset(g for gs in self.gpus.values() for g in gs)


@dataclass(frozen=True)
class Decision:
    admit: bool
    reason: str = ""
    message: str = ""
    allocation: Allocation = field(default_factory=Allocation)
    numa_affinity: frozenset[int] | None = None

    @property
    def status_message(self) -> str:
        """The pod's ``status.message`` after a rejection (kubelet ``rejectPod``)."""
        return REJECTED_PREFIX + self.message


@dataclass(frozen=True)
class Hint:
    affinity: frozenset[int] | None  # None: any NUMA node
    preferred: bool


# ------------------------------------------------------------------------- reading a pod object
def _qty(v: Any) -> quantity.Quantity:
    return quantity.parse(str(v))


def pod_request(pod: Mapping[str, Any]) -> PodRequest:
    """The admission-relevant part of a Pod (API JSON)."""
    spec = pod.get("spec") or {}
    containers: list[Container] = []
    guaranteed = True
    for kind, init in (("initContainers", True), ("containers", False)):
        for c in spec.get(kind) or ():
            res = c.get("resources") or {}
            req = dict(res.get("requests") or {})
            lim = dict(res.get("limits") or {})
            for k, v in lim.items():
                req.setdefault(k, v)  # API defaulting: requests default to limits
            for r in ("cpu", "memory"):
                if r not in lim or _qty(req.get(r, 0)).value != _qty(lim[r]).value:
                    guaranteed = False
            cpu = _qty(req.get("cpu", 0)).value * 1000
            containers.append(
                Container(
                    str(c.get("name", "")),
                    int(cpu) if cpu == int(cpu) else int(cpu) + 1,
                    int(_qty(req.get("memory", 0)).value),
                    int(_qty(req.get(GPU, 0)).value),
                    init,
                )
            )
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    return PodRequest(uid, tuple(containers), guaranteed and bool(containers))


# ----------------------------------------------------------------------------------- the model
@dataclass
class _Free:
    cpus: set[int]
    gpus: set[str]
    memory: dict[int, int]


def _free(machine: Machine, held: Iterable[Allocation]) -> _Free:
    cpus = set(machine.all_cpus - machine.reserved_cpus)
    gpus = {g for n in machine.numa for g in n.gpus}
    mem = {n.id: n.memory - machine.reserved_memory.get(n.id, 0) for n in machine.numa}
    for a in held:
        cpus -= a.all_cpus()
        gpus -= a.all_gpus()
        for per in a.memory.values():
            for n, b in per.items():
                mem[n] = mem.get(n, 0) - b
    return _Free(cpus, gpus, mem)


def _masks(machine: Machine) -> list[frozenset[int]]:
    ids = [n.id for n in machine.numa]
    return [frozenset(c) for k in range(1, len(ids) + 1) for c in itertools.combinations(ids, k)]


def _hints_for(
    machine: Machine,
    request: int,
    total_in: Mapping[int, int],
    free_in: Mapping[int, int],
) -> list[Hint]:
    """Every mask with enough free capacity; preferred when as narrow as the narrowest mask that
    holds the request on an empty machine (kubelet ``minAffinitySize``)."""
    masks = _masks(machine)
    sizes = [len(m) for m in masks if sum(total_in.get(n, 0) for n in m) >= request]
    min_size = min(sizes) if sizes else len(machine.numa)
    return [
        Hint(m, len(m) == min_size) for m in masks if sum(free_in.get(n, 0) for n in m) >= request
    ]


def _exclusive_cpus(policy: Policy, pod: PodRequest, c: Container) -> int:
    if policy.cpu != "static" or not pod.guaranteed or c.cpu_millis % 1000:
        return 0
    return c.cpu_millis // 1000


def _provider_hints(
    machine: Machine,
    policy: Policy,
    pod: PodRequest,
    cpus: int,
    gpus: int,
    memory: int,
    free: _Free,
) -> list[list[Hint]]:
    """One hint list per (provider, resource) that has an opinion."""
    out: list[list[Hint]] = []
    if cpus:
        total = {n.id: len(n.cpus) for n in machine.numa}
        avail = {n.id: len(n.cpus & free.cpus) for n in machine.numa}
        out.append(_hints_for(machine, cpus, total, avail))
    if gpus:
        total = {n.id: len(n.gpus) for n in machine.numa}
        avail = {n.id: len(set(n.gpus) & free.gpus) for n in machine.numa}
        out.append(_hints_for(machine, gpus, total, avail))
    if memory and policy.memory == "Static" and pod.guaranteed:
        total = {n.id: n.memory - machine.reserved_memory.get(n.id, 0) for n in machine.numa}
        out.append(_hints_for(machine, memory, total, free.memory))
    return out


def _narrower(a: frozenset[int], b: frozenset[int]) -> bool:
    if len(a) != len(b):
        return len(a) < len(b)
    return sorted(a) < sorted(b)


def merge(machine: Machine, policy: str, hint_lists: Sequence[list[Hint]]) -> Hint:
    """The Topology Manager's best hint for one admission unit (container or pod)."""
    default = frozenset(n.id for n in machine.numa)
    lists: list[list[Hint]] = []
    for hl in hint_lists:
        if policy == "single-numa-node":
            hl = [h for h in hl if h.preferred and (h.affinity is None or len(h.affinity) == 1)]
        lists.append(hl or [Hint(None, False)])
    best = Hint(default, False)
    for combo in itertools.product(*lists):
        affinity = default
        preferred = True
        for h in combo:
            if h.affinity is not None:
                affinity = affinity & h.affinity
            preferred = preferred and h.preferred
        if not affinity:
            continue
        cand = Hint(affinity, preferred)
        if cand.preferred != best.preferred:
            if cand.preferred:
                best = cand
            continue
        assert best.affinity is not None
        if _narrower(affinity, best.affinity):
            best = cand
    if policy == "single-numa-node" and best.affinity == default and len(default) > 1:
        best = Hint(None, best.preferred)
    return best


def _admits(policy: str, best: Hint) -> bool:
    if policy in ("restricted", "single-numa-node"):
        return best.preferred
    return True


def _take(ordered: Iterable[Any], n: int) -> list[Any]:
    out = list(itertools.islice(ordered, n))
    return out


def _allocate(
    machine: Machine,
    affinity: frozenset[int] | None,
    free: _Free,
    cpus: int,
    gpus: int,
    memory: int,
    memory_managed: bool,
) -> tuple[frozenset[int], tuple[str, ...], dict[int, int]] | str:
    """Take resources, hinted NUMA nodes first (CPU manager ``allocateCPUs``); an error string when
    the node does not have them at all (the kubelet's ``UnexpectedAdmissionError``)."""
    aligned = affinity if affinity is not None else frozenset()

    def order_cpu(c: int) -> tuple[int, int]:
        return (0 if machine.numa_of_cpu(c) in aligned else 1, c)

    def order_gpu(g: str) -> tuple[int, str]:
        return (0 if machine.numa_of_gpu(g) in aligned else 1, g)

    if cpus > len(free.cpus):
        return (
            "not enough cpus available to satisfy request: "
            f"requested={cpus}, available={len(free.cpus)}"
        )
    if gpus > len(free.gpus):
        return (
            f"requested number of devices unavailable for {GPU}. "
            f"Requested: {gpus}, Available: {len(free.gpus)}"
        )
    got_cpus = frozenset(_take(sorted(free.cpus, key=order_cpu), cpus))
    got_gpus = tuple(sorted(_take(sorted(free.gpus, key=order_gpu), gpus)))
    got_mem: dict[int, int] = {}
    if memory and memory_managed:
        left = memory
        for n in sorted(free.memory, key=lambda i: (0 if i in aligned else 1, i)):
            take = min(left, max(free.memory[n], 0))
            if take:
                got_mem[n] = take
                left -= take
            if not left:
                break
        if left:
            return "[memorymanager] failed to find NUMA nodes to extend the current node affinity"
    free.cpus -= got_cpus
    free.gpus -= set(got_gpus)
    for n, b in got_mem.items():
        free.memory[n] -= b
    return got_cpus, got_gpus, got_mem


def admit(
    machine: Machine, policy: Policy, held: Iterable[Allocation], pod: PodRequest
) -> Decision:
    """Decide like the kubelet's Topology Manager admit handler, and allocate on success."""
    free = _free(machine, held)
    mem_managed = policy.memory == "Static" and pod.guaranteed
    units: list[tuple[list[Container], int, int, int]] = []
    if policy.scope == "pod":
        app = [c for c in pod.containers if not c.init]
        inits = [c for c in pod.containers if c.init]

        def eff(f: Any) -> int:
            return max([sum(f(c) for c in app), *(f(c) for c in inits)], default=0)

        units.append(
            (
                list(pod.containers),
                eff(lambda c: _exclusive_cpus(policy, pod, c)),
                eff(lambda c: c.gpus),
                eff(lambda c: c.memory),
            )
        )
    else:
        units = [([c], _exclusive_cpus(policy, pod, c), c.gpus, c.memory) for c in pod.containers]
    cpus_out: dict[str, frozenset[int]] = {}
    gpus_out: dict[str, tuple[str, ...]] = {}
    mem_out: dict[str, dict[int, int]] = {}
    last: frozenset[int] | None = None
    for containers, cpus, gpus, memory in units:
        hints = _provider_hints(machine, policy, pod, cpus, gpus, memory, free)
        best = (
            Hint(None, True)
            if policy.topology == "none"
            else merge(machine, policy.topology, hints)
        )
        if not _admits(policy.topology, best):
            return Decision(False, TOPOLOGY_AFFINITY_ERROR, TOPOLOGY_AFFINITY_MESSAGE)
        last = best.affinity
        for c in containers:
            c_cpus = _exclusive_cpus(policy, pod, c)
            before = _Free(set(free.cpus), set(free.gpus), dict(free.memory))
            got = _allocate(machine, best.affinity, free, c_cpus, c.gpus, c.memory, mem_managed)
            if isinstance(got, str):
                return Decision(
                    False,
                    UNEXPECTED_ADMISSION_ERROR,
                    f"Allocate failed due to {got}, which is unexpected",
                )
            if c.init:
                # init containers run to completion first; their resources are reused
                free.cpus, free.gpus, free.memory = before.cpus, before.gpus, before.memory
                continue
            if got[0]:
                cpus_out[c.name] = got[0]
            if got[1]:
                gpus_out[c.name] = got[1]
            if got[2]:
                mem_out[c.name] = got[2]
    return Decision(True, allocation=Allocation(cpus_out, gpus_out, mem_out), numa_affinity=last)


def machine_from_topology(
    topology: Mapping[str, Any],
    reserved_cpus: Iterable[int] = (),
    reserved_memory: Mapping[int, int] | None = None,
) -> Machine:
    """A Machine from node.json's ``topology`` block."""
    from rollout.kubelet import cpuset

    nodes = tuple(
        NUMANode(
            int(n["id"]),
            cpuset.parse(str(n.get("cpus", ""))),
            int(n.get("memoryBytes", 0)),
            tuple(str(g) for g in n.get("gpus") or ()),
        )
        for n in topology.get("numaNodes") or ()
    )
    return Machine(nodes, frozenset(reserved_cpus), dict(reserved_memory or {}))
