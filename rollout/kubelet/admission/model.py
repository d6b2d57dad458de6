"""Pod admission as the kubelet decides it: one node, its config, a sequence of pods.

``Node(machine, config)`` holds the state of the CPU manager (static policy), the Memory Manager
(Static policy), the device manager (one pool per extended resource) and the Topology Manager
(policy, scope, options). ``Node.admit(pod)`` runs the kubelet's admission for one pod, in the
kubelet's order, and returns a ``Verdict``: admitted with the NUMA nodes, CPU ids, devices and
memory NUMA nodes each container got, or rejected with the kubelet's reason and message. A
rejected pod holds nothing afterwards (the kubelet drops its state as stale on the next admission).

The order (``topologymanager/scope_*.go``, ``cm/container_manager_linux.go``): hint providers are
the device manager, the CPU manager and the Memory Manager, in that order. ``container`` scope
merges hints and allocates container by container (init containers first); ``pod`` scope merges
once for the whole pod and every container allocates against that hint; with topology policy
``none`` every container allocates with no hint. The generic resource fit (``OutOf<resource>``)
runs before all of them when the node's allocatable amounts are given.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from rollout.kubelet.admission import topology as tm
from rollout.kubelet.admission.cpus import CPUInfo, CPUTopology
from rollout.kubelet.admission.devices import DevicePool
from rollout.kubelet.admission.memory import MEMORY, MemoryPolicy
from rollout.kubelet.admission.static import AdmissionFailure, StaticPolicy
from rollout.kubelet.admission.static import parse_options as parse_cpu_options

REJECTED_PREFIX = "Pod was rejected: "


@dataclass(frozen=True)
class NUMANode:
    id: int
    memory: int = 0
    hugepages: Mapping[str, int] = field(default_factory=dict)  # resource name -> bytes
    distances: tuple[int, ...] = ()


@dataclass(frozen=True)
class Machine:
    """Hardware: CPUs (NUMA node, socket, core), NUMA nodes, devices per resource."""

    cpus: Mapping[int, CPUInfo]
    numa: tuple[NUMANode, ...]
    devices: Mapping[str, Mapping[str, int | None]] = field(default_factory=dict)

    @property
    def topology(self) -> CPUTopology:
        return CPUTopology(self.cpus)

    def numa_info(self) -> tm.NUMAInfo:
        n = len(self.numa)
        dist = {
            node.id: node.distances or tuple(10 if i == j else 20 for j in range(n))
            for i, node in enumerate(self.numa)
        }
        return tm.NUMAInfo(tuple(node.id for node in self.numa), dist)


@dataclass(frozen=True)
class Config:
    """The KubeletConfiguration fields admission depends on (values as written there)."""

    cpu_policy: str = "none"
    cpu_options: Mapping[str, str] = field(default_factory=dict)
    reserved_cpus: frozenset[int] = frozenset()  # reservedSystemCPUs
    num_reserved_cpus: int = 0  # ceil(kube+system reserved cpu) when reservedSystemCPUs is unset
    memory_policy: str = "None"
    reserved_memory: Mapping[int, Mapping[str, int]] = field(default_factory=dict)
    topology_policy: str = "none"
    scope: str = "container"
    topology_options: Mapping[str, str] = field(default_factory=dict)
    allocatable: Mapping[str, int] | None = None  # cpu in millicores, the rest in units/bytes


@dataclass(frozen=True)
class Container:
    name: str
    cpu_millis: int = 0
    memory: int = 0
    hugepages: Mapping[str, int] = field(default_factory=dict)
    devices: Mapping[str, int] = field(default_factory=dict)
    init: bool = False


@dataclass(frozen=True)
class Pod:
    uid: str
    containers: tuple[Container, ...]
    guaranteed: bool = False
    name: str = ""
    #: the pod sets pod-level resources (``spec.resources``, KEP-2837)
    pod_level: bool = False

    @property
    def init(self) -> list[Container]:
        return [c for c in self.containers if c.init]

    @property
    def app(self) -> list[Container]:
        return [c for c in self.containers if not c.init]

    def ordered(self) -> list[Container]:
        return self.init + self.app


@dataclass(frozen=True)
class Verdict:
    uid: str
    admitted: bool
    reason: str = ""
    message: str = ""
    numa: tm.Mask | None = None  # the Topology Manager's affinity (last container's)
    cpus: Mapping[str, frozenset[int]] = field(default_factory=dict)
    devices: Mapping[str, Mapping[str, tuple[str, ...]]] = field(default_factory=dict)
    memory: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)

    @property
    def status_message(self) -> str:
        """The pod's ``status.message`` after a rejection (kubelet ``rejectPod``)."""
        return REJECTED_PREFIX + self.message


def _eff(pod: Pod, f: Callable[[Container], int]) -> int:
    """Pod-level amount: the larger of the app containers' sum and the largest init container."""
    return max([sum(f(c) for c in pod.app), *(f(c) for c in pod.init)], default=0)


@dataclass
class _Got:
    cpus: dict[str, frozenset[int]] = field(default_factory=dict)
    devices: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    memory: dict[str, dict[str, tuple[int, ...]]] = field(default_factory=dict)


class Node:
    """The admission state of one node."""

    def __init__(self, machine: Machine, config: Config) -> None:
        self.machine = machine
        self.config = config
        if config.topology_policy not in tm.POLICIES:
            raise ValueError(f'unknown policy: "{config.topology_policy}"')
        self.topo_opts = tm.TopologyOptions()
        if config.topology_policy != "none":
            if config.scope not in tm.SCOPES:
                raise ValueError(f'unknown scope: "{config.scope}"')
            self.topo_opts = tm.parse_options(config.topology_options)
            if len(machine.numa) > self.topo_opts.max_allowable_numa_nodes:
                raise ValueError(
                    "unsupported on machines with more than "
                    f"{self.topo_opts.max_allowable_numa_nodes} NUMA Nodes"
                )
        self.info = machine.numa_info()
        self.cpu: StaticPolicy | None = None
        if config.cpu_policy == "static":
            self.cpu = StaticPolicy.create(
                machine.topology,
                parse_cpu_options(config.cpu_options),
                config.reserved_cpus,
                len(config.reserved_cpus) or config.num_reserved_cpus,
                config.topology_policy,
            )
        self.mem: MemoryPolicy | None = None
        if config.memory_policy == "Static":
            self.mem = MemoryPolicy.create(
                {n.id: n.memory for n in machine.numa},
                {n.id: n.hugepages for n in machine.numa},
                config.reserved_memory,
            )
        known = tuple(n.id for n in machine.numa)
        self.devices = {
            r: DevicePool(r, devs, known) for r, devs in sorted(machine.devices.items())
        }
        self.used: dict[str, dict[str, int]] = {}  # pod uid -> requests (generic fit)

    # ------------------------------------------------------------------ requests
    def guaranteed_cpus(self, pod: Pod, c: Container) -> int:
        if self.cpu is None or not pod.guaranteed or c.cpu_millis % 1000:
            return 0
        return c.cpu_millis // 1000

    def _mem_request(self, pod: Pod, c: Container) -> dict[str, int]:
        if self.mem is None or not pod.guaranteed:
            return {}
        req = {r: v for r, v in c.hugepages.items() if v}
        if c.memory:
            req[MEMORY] = c.memory
        return req

    def _pod_mem_request(self, pod: Pod) -> dict[str, int]:
        out: dict[str, int] = {}
        app: dict[str, int] = {}
        for c in pod.app:
            for r, v in self._mem_request(pod, c).items():
                app[r] = app.get(r, 0) + v
        for r, v in app.items():
            out[r] = max([v, *(self._mem_request(pod, c).get(r, 0) for c in pod.init)])
        return out

    # ------------------------------------------------------------------ hints
    def _hints(self, pod: Pod, c: Container | None) -> list[tm.ProviderHints]:
        dev: dict[str, list[tm.Hint] | None] = {}
        for r, pool in self.devices.items():
            n = (
                _eff(pod, lambda x, r=r: x.devices.get(r, 0))  # type: ignore[misc]
                if c is None
                else c.devices.get(r, 0)
            )
            if n:
                dev[r] = pool.hints(n, pod.uid, c is None)
        out: list[tm.ProviderHints] = [dev]
        if self.cpu is not None:
            n = (
                _eff(pod, lambda x: self.guaranteed_cpus(pod, x))
                if c is None
                else self.guaranteed_cpus(pod, c)
            )
            h = self.cpu.hints(n, pod.uid)
            out.append(None if h is None else {"cpu": h})
        if self.mem is not None:
            req = self._pod_mem_request(pod) if c is None else self._mem_request(pod, c)
            out.append(self.mem.hints(req) if req else None)
        return out

    # ------------------------------------------------------------------ allocation
    def _allocate(self, pod: Pod, c: Container, hint: tm.Hint, acc: _Got) -> None:
        devs: dict[str, tuple[str, ...]] = {}
        for r, pool in self.devices.items():
            got = pool.allocate(pod.uid, c.name, c.devices.get(r, 0), hint.affinity, c.init)
            if got:
                devs[r] = got
        if devs:
            acc.devices[c.name] = devs
        if self.cpu is not None:
            n = self.guaranteed_cpus(pod, c)
            cpus = self.cpu.allocate(pod.uid, c.name, n, hint.affinity, c.init)
            if cpus:
                acc.cpus[c.name] = cpus
        if self.mem is not None and pod.guaranteed:
            req = self._mem_request(pod, c)
            if req:
                nodes = self.mem.allocate(pod.uid, c.name, req, hint)
                acc.memory[c.name] = {r: tuple(sorted(nodes)) for r in req}

    def hold(
        self,
        uid: str,
        container: str,
        cpus: frozenset[int] = frozenset(),
        devices: Mapping[str, Sequence[str]] | None = None,
        memory: Mapping[int, int] | None = None,
    ) -> None:
        """Record what a running container already holds (from the kubelet's checkpoints)."""
        if cpus and self.cpu is not None:
            self.cpu.default -= cpus
            self.cpu.assignments[(uid, container)] = frozenset(cpus)
        for r, ids in (devices or {}).items():
            if r in self.devices and ids:
                self.devices[r].allocated[(uid, container)] = tuple(ids)
        if memory and self.mem is not None:
            bits = tuple(sorted(memory))
            for n, b in memory.items():
                st = self.mem.nodes[n]
                st.assignments += 1
                st.cells = bits
                t = st.tables[MEMORY]
                t.free -= b
                t.reserved += b
            self.mem.blocks[(uid, container)] = [(MEMORY, sum(memory.values()), bits)]

    def release(self, uid: str) -> None:
        if self.cpu is not None:
            self.cpu.release_pod(uid)
        if self.mem is not None:
            self.mem.release_pod(uid)
        for pool in self.devices.values():
            pool.release_pod(uid)
        self.used.pop(uid, None)

    def _fits(self, pod: Pod) -> Verdict | None:
        alloc = self.config.allocatable
        if alloc is None:
            return None
        want = {
            "cpu": _eff(pod, lambda c: c.cpu_millis),
            "memory": _eff(pod, lambda c: c.memory),
        }
        for r in self.devices:
            want[r] = _eff(pod, lambda c, r=r: c.devices.get(r, 0))  # type: ignore[misc]
        for r, v in want.items():
            if not v or r not in alloc:
                continue
            used = sum(u.get(r, 0) for u in self.used.values())
            if used + v > alloc[r]:
                return Verdict(
                    pod.uid,
                    False,
                    f"OutOf{r}",
                    f"Node didn't have enough resource: {r}, requested: {v}, used: {used}, "
                    f"capacity: {alloc[r]}",
                )
        self.used[pod.uid] = want
        return None

    def admit(self, pod: Pod) -> Verdict:
        """Admit (and allocate) or reject one pod, exactly once."""
        unfit = self._fits(pod)
        if unfit is not None:
            return unfit
        acc = _Got()
        policy = self.config.topology_policy
        last: tm.Mask | None = None
        try:
            if policy == "none":
                for c in pod.ordered():
                    self._allocate(pod, c, tm.Hint(None, False), acc)
            elif self.config.scope == "pod":
                best, ok = tm.merge(self.info, policy, self.topo_opts, self._hints(pod, None))
                if not ok:
                    raise AdmissionFailure(tm.TOPOLOGY_AFFINITY_ERROR, tm.TOPOLOGY_AFFINITY_MESSAGE)
                last = best.affinity
                for c in pod.ordered():
                    self._allocate(pod, c, best, acc)
            else:
                for c in pod.ordered():
                    best, ok = tm.merge(self.info, policy, self.topo_opts, self._hints(pod, c))
                    if not ok:
                        raise AdmissionFailure(
                            tm.TOPOLOGY_AFFINITY_ERROR, tm.TOPOLOGY_AFFINITY_MESSAGE
                        )
                    last = best.affinity
                    self._allocate(pod, c, best, acc)
        except AdmissionFailure as f:
            self.release(pod.uid)
            return Verdict(pod.uid, False, f.reason, f.message)
        return Verdict(pod.uid, True, "", "", last, acc.cpus, acc.devices, acc.memory)
