"""The lab kubelet's Topology Manager admission, table-driven over a 2 x 32 CPU x 4 GPU machine."""

from __future__ import annotations

import pytest

from rollout.lab.kubelet import admission as adm

GIB = 1 << 30
MACHINE = adm.Machine(
    (
        adm.NUMANode(
            0,
            frozenset(range(0, 16)) | frozenset(range(32, 48)),
            256 * GIB,
            ("GPU-0", "GPU-1", "GPU-2", "GPU-3"),
        ),
        adm.NUMANode(
            1,
            frozenset(range(16, 32)) | frozenset(range(48, 64)),
            256 * GIB,
            ("GPU-4", "GPU-5", "GPU-6", "GPU-7"),
        ),
    ),
    reserved_cpus=frozenset({0, 1}),
)
STATIC = dict(cpu="static", memory="None", scope="container")


def guaranteed(cpu: int, gpus: int = 0, mem: int = GIB, uid: str = "p") -> adm.PodRequest:
    return adm.PodRequest(uid, (adm.Container("app", cpu * 1000, mem, gpus),), guaranteed=True)


def held_cpus(cpus: set[int]) -> adm.Allocation:
    return adm.Allocation(cpus={"app": frozenset(cpus)})


@pytest.mark.parametrize(
    ("topology", "pod", "held", "admitted"),
    [
        # fits the node but not one NUMA node
        ("single-numa-node", guaranteed(40), [], False),
        ("restricted", guaranteed(40), [], True),  # 2 NUMA nodes is the narrowest possible
        ("best-effort", guaranteed(40), [], True),
        ("none", guaranteed(40), [], True),
        ("single-numa-node", guaranteed(4, gpus=6), [], False),
        ("none", guaranteed(4, gpus=6), [], True),
        # fits one NUMA node
        ("single-numa-node", guaranteed(8, gpus=2), [], True),
        ("restricted", guaranteed(8, gpus=2), [], True),
        # NUMA 0 has 30 free CPUs (2 reserved), NUMA 1 has 32
        ("single-numa-node", guaranteed(31), [], True),
        ("single-numa-node", guaranteed(32), [], True),
        # already-held CPUs change the decision: 20 held on each NUMA node
        (
            "single-numa-node",
            guaranteed(16),
            [
                held_cpus(
                    set(range(2, 16)) | set(range(32, 38)) | set(range(16, 32)) | set(range(48, 52))
                )
            ],
            False,
        ),
        ("single-numa-node", guaranteed(16), [held_cpus(set(range(16, 36)))], True),
        # CPUs on one node, GPUs only free on the other: no common NUMA node
        (
            "single-numa-node",
            guaranteed(20, gpus=2),
            [
                adm.Allocation(
                    cpus={"a": frozenset(range(16, 32)) | frozenset(range(48, 60))},
                    gpus={"a": ("GPU-0", "GPU-1", "GPU-2")},
                )
            ],
            False,
        ),
        (
            "restricted",
            guaranteed(20, gpus=2),
            [
                adm.Allocation(
                    cpus={"a": frozenset(range(16, 32)) | frozenset(range(48, 60))},
                    gpus={"a": ("GPU-0", "GPU-1", "GPU-2")},
                )
            ],
            False,
        ),
        (
            "best-effort",
            guaranteed(20, gpus=2),
            [
                adm.Allocation(
                    cpus={"a": frozenset(range(16, 32)) | frozenset(range(48, 60))},
                    gpus={"a": ("GPU-0", "GPU-1", "GPU-2")},
                )
            ],
            True,
        ),
    ],
)
def test_topology_decisions(
    topology: str, pod: adm.PodRequest, held: list[adm.Allocation], admitted: bool
) -> None:
    d = adm.admit(MACHINE, adm.Policy(topology=topology, **STATIC), held, pod)
    assert d.admit is admitted
    if not admitted:
        assert d.reason == "TopologyAffinityError"
        assert d.status_message == (
            "Pod was rejected: Resources cannot be allocated with Topology locality"
        )


def test_burstable_pod_gets_no_exclusive_cpus_and_is_admitted() -> None:
    pod = adm.PodRequest("b", (adm.Container("app", 40_000, GIB),), guaranteed=False)
    d = adm.admit(MACHINE, adm.Policy(topology="single-numa-node", **STATIC), [], pod)
    assert d.admit and not d.allocation.cpus


def test_allocation_is_aligned_and_excludes_reserved_and_held() -> None:
    held = [held_cpus({2, 3})]
    d = adm.admit(
        MACHINE, adm.Policy(topology="single-numa-node", **STATIC), held, guaranteed(8, gpus=2)
    )
    cpus = d.allocation.cpus["app"]
    assert len(cpus) == 8 and not cpus & {0, 1, 2, 3}
    assert d.numa_affinity is not None and len(d.numa_affinity) == 1
    (numa,) = d.numa_affinity
    assert all(MACHINE.numa_of_cpu(c) == numa for c in cpus)
    assert all(MACHINE.numa_of_gpu(g) == numa for g in d.allocation.gpus["app"])


def test_pod_scope_aligns_the_sum_container_scope_each_container() -> None:
    two = adm.PodRequest(
        "s",
        (adm.Container("a", 20_000, GIB), adm.Container("b", 20_000, GIB)),
        guaranteed=True,
    )
    per_container = adm.Policy(topology="single-numa-node", cpu="static", scope="container")
    per_pod = adm.Policy(topology="single-numa-node", cpu="static", scope="pod")
    assert adm.admit(MACHINE, per_container, [], two).admit
    assert not adm.admit(MACHINE, per_pod, [], two).admit


def test_memory_manager_static_hints() -> None:
    pod = guaranteed(2, mem=300 * GIB)
    mm = adm.Policy(topology="single-numa-node", cpu="static", memory="Static")
    assert not adm.admit(MACHINE, mm, [], pod).admit
    assert adm.admit(MACHINE, adm.Policy(topology="single-numa-node", cpu="static"), [], pod).admit
    ok = adm.admit(MACHINE, mm, [], guaranteed(2, mem=100 * GIB))
    assert ok.admit and sum(ok.allocation.memory["app"].values()) == 100 * GIB


def test_not_enough_cpus_at_all_is_unexpected_admission_error() -> None:
    d = adm.admit(MACHINE, adm.Policy(topology="best-effort", **STATIC), [], guaranteed(63))
    assert not d.admit and d.reason == "UnexpectedAdmissionError"
    # the kubelet first takes every free CPU of the hinted NUMA nodes (here all 62), then asks
    # takeByTopology for the rest from what is left: its error names that remainder
    # (allocateCPUs in policy_static.go; the differential test sees the same message)
    assert d.message == (
        "Allocate failed due to not enough cpus available to satisfy request: "
        "requested=1, available=0, which is unexpected"
    )


def test_pod_request_from_api_object() -> None:
    pod = {
        "metadata": {"uid": "u1"},
        "spec": {
            "initContainers": [
                {"name": "i", "resources": {"limits": {"cpu": "1", "memory": "1Gi"}}}
            ],
            "containers": [
                {
                    "name": "app",
                    "resources": {
                        "requests": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "2"},
                        "limits": {"cpu": "8", "memory": "16Gi", "nvidia.com/gpu": "2"},
                    },
                },
            ],
        },
    }
    req = adm.pod_request(pod)
    assert req.guaranteed and req.uid == "u1"
    assert req.containers[1] == adm.Container("app", 8000, 16 * GIB, 2, False)
    assert req.containers[0].init
    pod["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "9"  # type: ignore[index]
    assert not adm.pod_request(pod).guaranteed
