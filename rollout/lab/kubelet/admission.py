"""The lab kubelet's pod admission: ``rollout.kubelet.admission`` (the one model), over its state.

The lab kubelet must reject exactly the pods a real kubelet with the same policy would reject on a
machine with the same NUMA layout, because ``rollout`` watches those rejections to decide whether
to roll back. The decision itself is ``rollout.kubelet.admission.model.Node.admit``, the model the
preview uses too and that ``tests/unit/test_admission_diff.py`` checks against the kubelet's own
code. This module only translates: the lab's node.json machine, its policy, what its pods already
hold (from the checkpoints) and a Pod object in; a ``Decision`` out. No I/O.

The lab's node.json has no SMT siblings or sockets: each CPU is its own core, each NUMA node its own
socket.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.kubelet import quantity
from rollout.kubelet.admission import model
from rollout.kubelet.admission.cpus import CPUInfo

__all__ = [
    "GPU",
    "REJECTED_PREFIX",
    "UNEXPECTED_ADMISSION_ERROR",
    "Allocation",
    "Container",
    "Decision",
    "Machine",
    "NUMANode",
    "PodRequest",
    "Policy",
    "admit",
    "machine_from_topology",
    "pod_request",
]

UNEXPECTED_ADMISSION_ERROR = "UnexpectedAdmissionError"
REJECTED_PREFIX = model.REJECTED_PREFIX
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

    def model(self) -> model.Machine:
        cpus = {c: CPUInfo(n.id, n.id, c) for n in self.numa for c in n.cpus}
        nodes = tuple(model.NUMANode(n.id, n.memory) for n in self.numa)
        gpus = {g: n.id for n in self.numa for g in n.gpus}
        return model.Machine(cpus, nodes, {GPU: gpus} if gpus else {})


@dataclass(frozen=True)
class Policy:
    """The kubelet settings admission depends on (values as in the KubeletConfiguration)."""

    cpu: str = "none"  # cpuManagerPolicy
    topology: str = "none"  # topologyManagerPolicy
    scope: str = "container"  # topologyManagerScope
    memory: str = "None"  # memoryManagerPolicy
    cpu_options: Mapping[str, str] = field(default_factory=dict)
    topology_options: Mapping[str, str] = field(default_factory=dict)


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
def _config(machine: Machine, policy: Policy) -> model.Config:
    reserved_memory = {n: {"memory": b} for n, b in machine.reserved_memory.items() if b}
    if policy.memory == "Static" and not reserved_memory and machine.numa:
        # the lab kubelet's start-up already refuses this; admission sees the kubelet's minimum
        reserved_memory = {machine.numa[0].id: {"memory": 1}}
    return model.Config(
        cpu_policy=policy.cpu,
        cpu_options=dict(policy.cpu_options),
        reserved_cpus=machine.reserved_cpus if policy.cpu == "static" else frozenset(),
        memory_policy=policy.memory,
        reserved_memory=reserved_memory,
        topology_policy=policy.topology,
        scope=policy.scope,
        topology_options=dict(policy.topology_options),
    )


def _pod(pod: PodRequest) -> model.Pod:
    return model.Pod(
        pod.uid,
        tuple(
            model.Container(
                c.name, c.cpu_millis, c.memory, {}, {GPU: c.gpus} if c.gpus else {}, c.init
            )
            for c in pod.containers
        ),
        pod.guaranteed,
    )


def admit(
    machine: Machine, policy: Policy, held: Iterable[Allocation], pod: PodRequest
) -> Decision:
    """Decide like the kubelet (``rollout.kubelet.admission``), and allocate on success."""
    node = model.Node(machine.model(), _config(machine, policy))
    for i, a in enumerate(held):
        uid = f"held-{i}"
        for name in set(a.cpus) | set(a.gpus) | set(a.memory):
            node.hold(
                uid,
                name,
                a.cpus.get(name, frozenset()),
                {GPU: a.gpus[name]} if name in a.gpus else None,
                a.memory.get(name),
            )
    v = node.admit(_pod(pod))
    if not v.admitted:
        return Decision(False, v.reason, v.message)
    init = {c.name for c in pod.containers if c.init}
    cpus = {c: s for c, s in v.cpus.items() if c not in init}
    gpus = {c: d[GPU] for c, d in v.devices.items() if GPU in d and c not in init}
    memory: dict[str, dict[int, int]] = {}
    for c in pod.containers:
        if c.init or c.name not in v.memory or not c.memory:
            continue
        nodes = v.memory[c.name].get("memory", ())
        memory[c.name] = _spread(node, nodes, c.memory)
    return Decision(True, allocation=Allocation(cpus, gpus, memory), numa_affinity=v.numa)


def _spread(node: model.Node, nodes: Iterable[int], size: int) -> dict[int, int]:
    """Bytes per NUMA node of a block, filled node by node as the Memory Manager does."""
    out: dict[int, int] = {}
    left = size
    for n in nodes:
        if not left:
            break
        assert node.mem is not None
        t = node.mem.nodes[n].tables["memory"]
        # the block was already taken: what this node gave is at most what it had before
        take = min(left, t.reserved)
        if take:
            out[n] = take
            left -= take
    return out


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
