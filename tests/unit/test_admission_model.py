"""The admission model on hand-made machines: CPU choice, SMT, memory groups, devices, inputs."""

from __future__ import annotations

from rollout.kubelet.admission import inputs, model
from rollout.kubelet.admission.cpus import CPUInfo, CPUTopology, take_packed
from rollout.kubelet.facts import node_facts_from_dict

GIB = 1 << 30

# 2 sockets = 2 NUMA nodes, 4 cores each, SMT 2: CPU c and c+8 are siblings (Linux numbering)
SMT = {c: CPUInfo(numa=(c % 8) // 4, socket=(c % 8) // 4, core=c % 8) for c in range(16)}


def test_take_by_topology_packs_whole_cores_on_the_fullest_numa_node() -> None:
    topo = CPUTopology(SMT)
    # NUMA 0 has 3 free CPUs left (0, 8, 1), NUMA 1 all 8: a 2-CPU request takes the whole core 0
    # of the fuller NUMA node, not the lowest ids of an empty one
    free = frozenset({0, 8, 1}) | frozenset(c for c in range(16) if (c % 8) >= 4)
    assert take_packed(topo, free, 2) == frozenset({0, 8})
    # 8 CPUs: the whole free NUMA node 1
    assert take_packed(topo, free, 8) == frozenset({4, 5, 6, 7, 12, 13, 14, 15})


def _pod(uid: str, cpus: int, gpus: int = 0, mem: int = GIB) -> model.Pod:
    devs = {"nvidia.com/gpu": gpus} if gpus else {}
    return model.Pod(uid, (model.Container("app", cpus * 1000, mem, {}, devs),), True)


def test_full_pcpus_only_rejects_odd_requests_with_the_kubelets_message() -> None:
    cfg = model.Config(
        cpu_policy="static",
        cpu_options={"full-pcpus-only": "true"},
        reserved_cpus=frozenset({0, 8}),
        topology_policy="single-numa-node",
    )
    node = model.Node(
        model.Machine(SMT, (model.NUMANode(0, 8 * GIB), model.NUMANode(1, 8 * GIB))), cfg
    )
    v = node.admit(_pod("a", 3))
    assert (v.reason, v.message) == (
        "SMTAlignmentError",
        "SMT Alignment Error: requested 3 cpus not multiple cpus per core = 2",
    )
    # NUMA 0 still has 3 whole free cores (1, 2, 3): the narrowest hint is NUMA 0, and the
    # accumulator takes whole cores 1 and 2 with their siblings 9 and 10
    ok = node.admit(_pod("b", 4))
    assert ok.admitted and ok.cpus["app"] == frozenset({1, 2, 9, 10})


def test_gpus_on_one_numa_node_and_the_numbers_of_a_rejection() -> None:
    facts = node_facts_from_dict(
        {
            "onlineCPUs": "0-15",
            "sockets": 2,
            "numaNodes": [
                {"id": 0, "cpus": "0-3,8-11", "memoryBytes": 8 * GIB},
                {"id": 1, "cpus": "4-7,12-15", "memoryBytes": 8 * GIB},
            ],
            "smtSiblings": [f"{c},{c + 8}" for c in range(8)],
            "gpus": [{"id": f"g{i}", "numaNode": i // 4} for i in range(8)],
        }
    )
    machine = inputs.machine_from_facts(facts)
    cfg = inputs.config_from_kubelet(
        {
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0,8",
            "topologyManagerPolicy": "single-numa-node",
            "topologyManagerScope": "pod",
        }
    )
    node = model.Node(machine, cfg)
    six = inputs.pod_from_api(
        {
            "metadata": {"name": "train-0"},
            "spec": {
                "containers": [
                    {
                        "name": "t",
                        "resources": {
                            "limits": {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "6"}
                        },
                    }
                ]
            },
        }
    )
    v = node.admit(six)
    assert (v.admitted, v.reason) == (False, "TopologyAffinityError")
    assert inputs.explain(v, six, machine, cfg, "gpu-07") == (
        "needs 6 nvidia.com/gpu on one NUMA node; the largest NUMA node of gpu-07 has 4"
    )
    four = _pod("ok", 2, gpus=4)
    got = node.admit(four)
    assert got.admitted and got.numa is not None and len(got.numa) == 1
    (numa,) = got.numa
    assert all(
        machine.devices["nvidia.com/gpu"][g] == numa for g in got.devices["app"]["nvidia.com/gpu"]
    )
    assert all(machine.cpus[c].numa == numa for c in got.cpus["app"])


def test_memory_manager_groups_keep_a_multi_node_allocation_apart() -> None:
    cfg = model.Config(
        cpu_policy="none",
        memory_policy="Static",
        reserved_memory={0: {"memory": GIB}},
        topology_policy="best-effort",
    )
    machine = model.Machine(SMT, (model.NUMANode(0, 4 * GIB), model.NUMANode(1, 4 * GIB)))
    node = model.Node(machine, cfg)
    big = node.admit(_pod("big", 1, mem=5 * GIB))  # spans both nodes: group {0,1}
    assert big.admitted and big.memory["app"]["memory"] == (0, 1)
    small = node.admit(_pod("small", 1, mem=GIB // 2))
    # a single-node hint may not use a node of the group: the group is used whole
    assert small.admitted and small.memory["app"]["memory"] == (0, 1)
