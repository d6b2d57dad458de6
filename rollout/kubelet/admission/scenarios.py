"""Seeded random admission scenarios, as model objects and as the Go harness's JSON.

Used by the differential test against the kubelet's own code (``tools/admissiondiff``,
``tests/unit/test_admission_diff.py``) and by ``benchmarks/admission_agreement.py``. A scenario
is a machine (1 to 8 NUMA nodes, 1 or 2 sockets or one per NUMA node, SMT on or off, memory and
2Mi hugepages per node, a NUMA distance matrix), a kubelet config (CPU manager policy, options and
reservation, Memory Manager policy and ``reservedMemory``, Topology Manager policy, scope and
options) and a sequence of pods admitted in order.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.kubelet.admission.cpus import CPUInfo
from rollout.kubelet.admission.model import Config, Container, Machine, NUMANode, Pod

MI = 1 << 20
GI = 1 << 30
HUGE = "hugepages-2Mi"


@dataclass(frozen=True)
class Scenario:
    seed: int
    machine: Machine
    config: Config
    pods: tuple[Pod, ...]

    def to_json(self) -> dict[str, Any]:
        """The Go harness's input (``tools/admissiondiff/main.go``)."""
        return {
            "seed": self.seed,
            "cpus": [
                {"id": c, "core": i.core, "socket": i.socket, "numa": i.numa}
                for c, i in sorted(self.machine.cpus.items())
            ],
            "numa": [
                {
                    "id": n.id,
                    "memory": n.memory,
                    "hugepages2Mi": n.hugepages.get(HUGE, 0) // (2 * MI),
                    "distances": list(n.distances),
                }
                for n in self.machine.numa
            ],
            "cpuPolicy": self.config.cpu_policy,
            "cpuOptions": dict(self.config.cpu_options),
            "reservedCPUs": sorted(self.config.reserved_cpus),
            "numReservedCPUs": len(self.config.reserved_cpus) or self.config.num_reserved_cpus,
            "memoryPolicy": self.config.memory_policy,
            "reservedMemory": {
                str(n): dict(v) for n, v in sorted(self.config.reserved_memory.items())
            },
            "topologyPolicy": self.config.topology_policy,
            "scope": self.config.scope,
            "topologyOptions": dict(self.config.topology_options),
            "pods": [
                {
                    "uid": p.uid,
                    "guaranteed": p.guaranteed,
                    "containers": [
                        {
                            "name": c.name,
                            "cpuMilli": c.cpu_millis,
                            "memory": c.memory,
                            "hugepages2Mi": c.hugepages.get(HUGE, 0),
                            "init": c.init,
                        }
                        for c in p.containers
                    ],
                }
                for p in self.pods
            ],
        }


def scenario_from_json(data: Mapping[str, Any]) -> Scenario:
    """The inverse of ``Scenario.to_json`` (for reproducers printed by the test)."""
    cpus = {
        int(c["id"]): CPUInfo(int(c["numa"]), int(c["socket"]), int(c["core"]))
        for c in data["cpus"]
    }
    numa = tuple(
        NUMANode(
            int(n["id"]),
            int(n["memory"]),
            {HUGE: int(n["hugepages2Mi"]) * 2 * MI},
            tuple(int(d) for d in n["distances"]),
        )
        for n in data["numa"]
    )
    explicit = frozenset(int(c) for c in data["reservedCPUs"])
    config = Config(
        cpu_policy=data["cpuPolicy"],
        cpu_options=dict(data["cpuOptions"]),
        reserved_cpus=explicit,
        num_reserved_cpus=int(data["numReservedCPUs"]),
        memory_policy=data["memoryPolicy"],
        reserved_memory={
            int(k): {r: int(b) for r, b in v.items()} for k, v in data["reservedMemory"].items()
        },
        topology_policy=data["topologyPolicy"],
        scope=data["scope"],
        topology_options=dict(data["topologyOptions"]),
    )
    pods = tuple(
        Pod(
            p["uid"],
            tuple(
                Container(
                    c["name"],
                    int(c["cpuMilli"]),
                    int(c["memory"]),
                    {HUGE: int(c["hugepages2Mi"])} if c["hugepages2Mi"] else {},
                    {},
                    bool(c["init"]),
                )
                for c in p["containers"]
            ),
            bool(p["guaranteed"]),
        )
        for p in data["pods"]
    )
    return Scenario(int(data.get("seed", 0)), Machine(cpus, numa), config, pods)


def _machine(rng: random.Random) -> Machine:
    n_numa = rng.randint(1, 8)
    socket_choices = [s for s in (1, 2, n_numa) if n_numa % s == 0] + ([2] if n_numa == 1 else [])
    sockets = rng.choice(socket_choices)
    smt = rng.choice((1, 2))
    cores_per_numa = rng.randint(1, 6) if sockets <= n_numa else 2 * rng.randint(1, 3)
    total_cores = cores_per_numa * n_numa
    cpus: dict[int, CPUInfo] = {}
    for core in range(total_cores):
        numa = core // cores_per_numa
        # one NUMA node may hold two sockets
        socket = numa // (n_numa // sockets) if sockets <= n_numa else core * sockets // total_cores
        for t in range(smt):
            cpus[t * total_cores + core] = CPUInfo(numa, socket, core)
    dist = [[10] * n_numa for _ in range(n_numa)]
    for i in range(n_numa):
        for j in range(i + 1, n_numa):
            dist[i][j] = dist[j][i] = rng.choice((11, 12, 16, 20, 21, 32))
    nodes = tuple(
        NUMANode(
            i,
            rng.choice((2, 4, 8, 16)) * GI,
            {HUGE: rng.choice((0, 0, 128, 256)) * 2 * MI},
            tuple(dist[i]),
        )
        for i in range(n_numa)
    )
    return Machine(cpus, nodes)


def _config(rng: random.Random, m: Machine) -> Config:
    topo = m.topology
    policy = rng.choice(("none", "best-effort", "restricted", "single-numa-node"))
    opts: dict[str, str] = {}
    cpu_policy = "static" if rng.random() < 0.9 else "none"
    if cpu_policy == "static":
        if rng.random() < 0.35:
            opts["full-pcpus-only"] = "true"
        if rng.random() < 0.3:
            opts["distribute-cpus-across-numa"] = "true"
        if (
            policy != "single-numa-node"
            and topo.num_sockets <= topo.num_numa
            and rng.random() < 0.2
        ):
            opts["align-by-socket"] = "true"
        if rng.random() < 0.2:
            opts["strict-cpu-reservation"] = "true"
        if (
            not opts.get("full-pcpus-only")
            and not opts.get("distribute-cpus-across-numa")
            and rng.random() < 0.1
        ):
            opts["distribute-cpus-across-cores"] = "true"
    reserved: frozenset[int] = frozenset()
    n_reserved = rng.randint(1, 3)
    if rng.random() < 0.5:
        cores = sorted({i.core for i in m.cpus.values()})
        picked = rng.sample(cores, min(len(cores), rng.randint(1, 2)))
        reserved = frozenset(c for c, i in m.cpus.items() if i.core in picked)
        if not opts.get("full-pcpus-only") and len(reserved) > 1 and rng.random() < 0.5:
            reserved = frozenset(sorted(reserved)[:-1])
    elif opts.get("full-pcpus-only"):
        n_reserved = topo.cpus_per_core * rng.randint(1, 2)
    if len(reserved) >= len(m.cpus) or n_reserved >= len(m.cpus):
        reserved, n_reserved = frozenset(), 1
    memory_policy = "Static" if rng.random() < 0.5 else "None"
    reserved_memory: dict[int, dict[str, int]] = {}
    if memory_policy == "Static":
        for n in m.numa:
            if n.id == 0 or rng.random() < 0.5:
                r = {"memory": rng.choice((256, 512, 1024)) * MI}
                if n.hugepages.get(HUGE) and rng.random() < 0.3:
                    r[HUGE] = 64 * MI
                reserved_memory[n.id] = r
    topo_opts: dict[str, str] = {}
    if rng.random() < 0.3:
        topo_opts["prefer-closest-numa-nodes"] = "true"
    if rng.random() < 0.1:
        topo_opts["max-allowable-numa-nodes"] = rng.choice(("8", "10"))
    return Config(
        cpu_policy=cpu_policy,
        cpu_options=opts,
        reserved_cpus=reserved,
        num_reserved_cpus=len(reserved) or n_reserved,
        memory_policy=memory_policy,
        reserved_memory=reserved_memory,
        topology_policy=policy,
        scope=rng.choice(("container", "pod")),
        topology_options=topo_opts,
    )


def _pods(rng: random.Random, m: Machine, cfg: Config) -> tuple[Pod, ...]:
    pods = []
    ncpu = len(m.cpus)
    per_numa = max(1, ncpu // len(m.numa))
    for i in range(rng.randint(1, 8)):
        guaranteed = rng.random() < 0.85
        containers = []
        for j in range(rng.randint(1, 3)):
            init = j == 0 and cfg.memory_policy == "None" and rng.random() < 0.2
            if rng.random() < 0.1:
                cpu = rng.choice((100, 500, 1500))
            else:
                cpu = 1000 * rng.randint(
                    1, max(1, min(ncpu, int(per_numa * rng.choice((0.5, 1, 1.5, 2)))))
                )
            mem = rng.choice((64, 256, 1024, 3072, 6144, 12288)) * MI
            huge = {}
            # memory + hugepages hints on 8 NUMA nodes make the kubelet's merge walk 255^3
            # permutations per container; hugepages are asked for on up to 4 NUMA nodes
            if cfg.memory_policy == "Static" and len(m.numa) <= 4 and rng.random() < 0.3:
                huge = {HUGE: rng.choice((2, 64, 256, 512)) * MI}
            containers.append(Container(f"c{j}", cpu, mem, huge, {}, init))
        if not any(not c.init for c in containers):
            containers.append(Container("app", 1000, 64 * MI))
        pods.append(Pod(f"pod-{i}", tuple(containers), guaranteed))
    return tuple(pods)


def generate(seed: int) -> Scenario:
    rng = random.Random(seed)
    m = _machine(rng)
    cfg = _config(rng, m)
    return Scenario(seed, m, cfg, _pods(rng, m, cfg))
