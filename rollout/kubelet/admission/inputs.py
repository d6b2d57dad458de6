"""The model's inputs from what rollout already reads: node facts, a kubelet config, Pod objects.

``machine_from_facts`` reads ``rollout.kubelet.facts.NodeFacts`` (the facts playbook's format):
SMT siblings give the cores (without them each CPU is its own core), ``sockets`` spreads the NUMA
nodes over sockets evenly (without it each NUMA node is its own socket), GPUs keep their NUMA node.
``config_from_kubelet`` reads the KubeletConfiguration fields admission depends on (camelCase, as
in the file). ``pod_from_api`` reads a Pod (or a pod template's ``spec``). ``explain`` turns a
rejection into numbers a person can check.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from rollout.kubelet import cpuset, quantity
from rollout.kubelet.admission.cpus import CPUInfo
from rollout.kubelet.admission.model import Config, Container, Machine, NUMANode, Pod, Verdict
from rollout.kubelet.facts import NodeFacts

GPU = "nvidia.com/gpu"


def machine_from_facts(facts: NodeFacts, device_resource: str = GPU) -> Machine:
    numa_of = {c: n.id for n in facts.numa_nodes for c in n.cpus}
    ids = [n.id for n in facts.numa_nodes] or [0]
    core_of: dict[int, int] = {}
    for group in facts.smt_siblings:
        for c in group:
            core_of[c] = min(group)
    per_socket = (
        len(ids) // facts.sockets
        if facts.sockets and facts.sockets <= len(ids) and len(ids) % facts.sockets == 0
        else 1
    )
    cpus = {}
    for c in sorted(facts.online_cpus):
        numa = numa_of.get(c, ids[0])
        cpus[c] = CPUInfo(numa, ids.index(numa) // per_socket, core_of.get(c, c))
    nodes = tuple(NUMANode(n.id, n.memory_bytes or 0) for n in facts.numa_nodes) or (NUMANode(0),)
    devices = {g.id: g.numa_node for g in facts.gpus}
    return Machine(cpus, nodes, {device_resource: devices} if devices else {})


def _qty(v: Any) -> float:
    return float(quantity.parse(str(v)).value)


def config_from_kubelet(cfg: Mapping[str, Any]) -> Config:
    """The admission fields of a KubeletConfiguration (absent fields: the kubelet's defaults)."""
    reserved = cpuset.parse(str(cfg.get("reservedSystemCPUs") or ""))
    millis = sum(
        _qty((cfg.get(k) or {}).get("cpu", 0)) * 1000 for k in ("kubeReserved", "systemReserved")
    )
    reserved_memory: dict[int, dict[str, int]] = {}
    for entry in cfg.get("reservedMemory") or ():
        node = int(entry.get("numaNode", 0))
        for r, v in (entry.get("limits") or {}).items():
            reserved_memory.setdefault(node, {})[str(r)] = int(_qty(v))
    return Config(
        cpu_policy=str(cfg.get("cpuManagerPolicy") or "none"),
        cpu_options={str(k): str(v) for k, v in (cfg.get("cpuManagerPolicyOptions") or {}).items()},
        reserved_cpus=reserved,
        num_reserved_cpus=len(reserved) or math.ceil(millis / 1000),
        memory_policy=str(cfg.get("memoryManagerPolicy") or "None"),
        reserved_memory=reserved_memory,
        topology_policy=str(cfg.get("topologyManagerPolicy") or "none"),
        scope=str(cfg.get("topologyManagerScope") or "container"),
        topology_options={
            str(k): str(v) for k, v in (cfg.get("topologyManagerPolicyOptions") or {}).items()
        },
    )


#: the kubelet's log line for a pod with pod-level resources while the gate is off (1.34+, #133279)
POD_LEVEL_SKIPPED = (
    "CPU Manager allocation skipped, pod is using pod-level resources but the "
    "PodLevelResourceManagers feature gate is not enabled"
)


def has_pod_level_resources(pod: Mapping[str, Any]) -> bool:
    """Whether the pod (or template) sets ``spec.resources`` requests or limits."""
    res = (pod.get("spec") or {}).get("resources") or {}
    return bool(res.get("requests") or res.get("limits"))


def pod_level_managers(cfg: Mapping[str, Any]) -> bool:
    """Whether ``PodLevelResourceManagers`` is on (off by default in every release)."""
    gates = cfg.get("featureGates") or {}
    return isinstance(gates, Mapping) and gates.get("PodLevelResourceManagers") is True


def pod_from_api(pod: Mapping[str, Any], uid: str = "", managers: bool = False) -> Pod:
    """A Pod object (or ``{"spec": template.spec}``); requests default to limits as in the API.

    A pod with pod-level resources is, while ``managers`` (``PodLevelResourceManagers``) is off,
    not Guaranteed for the CPU and Memory managers: since 1.34 (#133279) the kubelet gives it no
    exclusive CPUs, no pinned memory and no hints from those managers (:data:`POD_LEVEL_SKIPPED`).
    With the gate on, pod-level allocation is not modelled: the containers' requests are used.
    """
    spec = pod.get("spec") or {}
    meta = pod.get("metadata") or {}
    containers = []
    guaranteed = True
    for kind, init in (("initContainers", True), ("containers", False)):
        for c in spec.get(kind) or ():
            res = c.get("resources") or {}
            lim = dict(res.get("limits") or {})
            req = dict(res.get("requests") or {})
            for k, v in lim.items():
                req.setdefault(k, v)
            for r in ("cpu", "memory"):
                if r not in lim or _qty(req.get(r, 0)) != _qty(lim[r]):
                    guaranteed = False
            cpu = _qty(req.get("cpu", 0)) * 1000
            containers.append(
                Container(
                    str(c.get("name", "")),
                    math.ceil(cpu),
                    int(_qty(req.get("memory", 0))),
                    {
                        str(r): int(_qty(v))
                        for r, v in req.items()
                        if str(r).startswith("hugepages-")
                    },
                    {str(r): int(_qty(v)) for r, v in req.items() if "/" in str(r)},
                    init,
                )
            )
    pod_level = has_pod_level_resources(pod)
    return Pod(
        uid or str(meta.get("uid") or meta.get("name") or ""),
        tuple(containers),
        guaranteed and bool(containers) and (managers or not pod_level),
        str(meta.get("name") or ""),
        pod_level,
    )


def explain(verdict: Verdict, pod: Pod, machine: Machine, config: Config, node: str) -> str:
    """Numbers behind a verdict, e.g. "needs 6 nvidia.com/gpu on one NUMA node; the largest NUMA
    node of gpu-07 has 4"."""
    if verdict.admitted:
        numa = ",".join(str(n) for n in sorted(verdict.numa or ())) or "any"
        return f"admitted on NUMA node(s) {numa} of {node}"
    if verdict.reason != "TopologyAffinityError":
        return verdict.message
    scope_pod = config.scope == "pod"
    parts = []
    for r, devs in sorted(machine.devices.items()):
        want = [c.devices.get(r, 0) for c in pod.app]
        need = sum(want) if scope_pod else max(want, default=0)
        per = [sum(1 for n in devs.values() if n == x.id) for x in machine.numa]
        if need:
            parts.append((r, need, max(per, default=0)))
    if config.cpu_policy == "static" and pod.guaranteed:
        want = [c.cpu_millis // 1000 for c in pod.app if c.cpu_millis % 1000 == 0]
        need = sum(want) if scope_pod else max(want, default=0)
        per = [
            sum(
                1
                for c, i in machine.cpus.items()
                if i.numa == x.id and c not in config.reserved_cpus
            )
            for x in machine.numa
        ]
        if need:
            parts.append(("cpu", need, max(per, default=0)))
    where = (
        "one NUMA node" if config.topology_policy == "single-numa-node" else "the fewest NUMA nodes"
    )
    over = [p for p in parts if p[1] > p[2]] or parts
    if not over:
        return verdict.message
    return "; ".join(
        f"needs {need} {r} on {where}; the largest NUMA node of {node} has {have}"
        for r, need, have in over
    )
