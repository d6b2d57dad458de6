"""Evidence from the kubelet's podresources API, against its checkpoints (pure, no node).

:func:`build_collection` takes each pod's devices and exclusive CPUs from the facts'
``podResources`` (``deviceSource``/``cpuSource`` ``podresources``) and the healthy set from
``GetAllocatableResources``; ``podresources-matches-checkpoint`` fails naming node, pod,
container, the device or CPUs and both sources when they disagree, and is not collected (never
a pass) when the socket was absent or the call failed: then the checkpoint is the source, and the
check says so. A container's cgroup cpuset, where the facts found it, must be its exclusive CPUs.
Runtime: about 1 s.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollout.evidence.checks import (
    CGROUP_NOTE,
    Status,
    build_collection,
    check_allocatable,
    check_numa_alignment,
    check_sources_agree,
    check_unique_devices,
    parse_collections,
)
from rollout.kubelet.device_checkpoint import PodDevices, device_checkpoint, render_device

GPU = "nvidia.com/gpu"
NUMA = [{"id": 0, "cpus": "0-3"}, {"id": 1, "cpus": "4-7"}]


def _checkpoint(entries: dict[str, tuple[int, str]], registered: list[str]) -> dict[str, Any]:
    cp = device_checkpoint(
        [PodDevices(uid, "app", GPU, {n: (dev,)}, b"") for uid, (n, dev) in entries.items()],
        {GPU: registered},
    )
    doc: dict[str, Any] = json.loads(render_device(cp))
    return doc


def _container(name: str, dev: str | None, numa: int, cpus: list[int]) -> dict[str, Any]:
    devices = [{"resourceName": GPU, "deviceIds": [dev], "numaNodes": [numa]}] if dev else []
    return {"name": name, "devices": devices, "cpuIds": cpus, "memory": []}


def _podres(listed: dict[str, tuple[str | None, int, list[int]]], healthy: list[str]) -> Any:
    return {
        "socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
        "pods": [
            {"name": n, "namespace": "ml", "containers": [_container("app", *c)]}
            for n, c in listed.items()
        ],
        "allocatable": {
            "devices": [
                {"resourceName": GPU, "deviceIds": [d], "numaNodes": [0 if d < "GPU-4" else 1]}
                for d in healthy
            ],
            "cpuIds": list(range(1, 8)),
            "memory": [],
        },
    }


def _collect(
    podres: Any,
    cpu_entries: dict[str, dict[str, str]] | None = None,
    device_cp: bool = True,
    cgroups: dict[str, str] | None = None,
) -> Any:
    facts: dict[str, Any] = {
        "n1": {
            "numaNodes": NUMA,
            "checkpoints": {
                "kubelet_internal_checkpoint": _checkpoint(
                    {"uid-a": (0, "GPU-0"), "uid-b": (1, "GPU-4")}, ["GPU-0", "GPU-1", "GPU-4"]
                ),
                "cpu_manager_state": {
                    "policyName": "static",
                    "entries": cpu_entries
                    if cpu_entries is not None
                    else {"uid-a": {"app": "1-2"}, "uid-b": {"app": "5"}},
                },
            },
            "podResources": podres,
        }
    }
    if not device_cp:
        del facts["n1"]["checkpoints"]["kubelet_internal_checkpoint"]
    if cgroups is not None:
        facts["n1"]["containerCpusets"] = cgroups
    pods = {
        "n1": [
            {
                "namespace": "ml",
                "name": n,
                "uid": f"uid-{n}",
                "qos": "Guaranteed",
                "running": True,
                "containerIds": {"app": f"id-{n}"},
            }
            for n in ("a", "b")
        ]
    }
    col = build_collection(
        "after",
        "2026-12-04T00:00:00Z",
        facts,
        {"n1": {GPU: "3"}},
        pods,
        {"n1": {"topologyManagerPolicy": "single-numa-node"}},
        capacity={"n1": {GPU: "3"}},
    )
    (parsed,) = parse_collections({"collections": [col]})
    return col["nodes"]["n1"], parsed


AGREE = {"a": ("GPU-0", 0, [1, 2]), "b": ("GPU-4", 1, [5])}


def test_podresources_is_the_source_and_agrees_with_the_checkpoints() -> None:
    d, c = _collect(_podres(AGREE, ["GPU-0", "GPU-1", "GPU-4"]))
    assert (d["deviceSource"], d["cpuSource"], d["healthySource"]) == ("podresources",) * 3
    a = next(p for p in d["pods"] if p["name"] == "a")
    assert a["devices"] == {GPU: ["GPU-0"]} and a["cpus"] == "1-2"
    assert a["podResourcesContainers"] == {"app": {"devices": {GPU: ["GPU-0"]}, "cpus": "1-2"}}
    assert a["checkpointDevices"] == {"app": {GPU: ["GPU-0"]}}
    assert a["checkpointCpus"] == {"app": "1-2"}
    assert d["allocatableDevices"] == {GPU: ["GPU-0", "GPU-1", "GPU-4"]}
    agree = check_sources_agree(c)
    assert (agree.status, agree.checked) == (Status.PASS, 2), agree
    assert agree.notes == (CGROUP_NOTE,)
    for check in (check_allocatable, check_unique_devices, check_numa_alignment):
        assert check(c).status is Status.PASS, check(c)


@pytest.mark.parametrize(
    ("case", "listed", "cpu_entries", "problem"),
    [
        (
            "another GPU",
            {**AGREE, "b": ("GPU-1", 0, [5])},
            None,
            "n1: ml/b container app: nvidia.com/gpu podresources [GPU-1], "
            "kubelet_internal_checkpoint [GPU-4]",
        ),
        (
            "other CPUs",
            {**AGREE, "a": ("GPU-0", 0, [1, 3])},
            None,
            "n1: ml/a container app: exclusive CPUs podresources '1,3', cpu_manager_state '1-2'",
        ),
        (
            "CPUs the state file does not hold",
            AGREE,
            {"uid-a": {"app": "1-2"}},
            "n1: ml/b container app: exclusive CPUs podresources '5', cpu_manager_state ''",
        ),
        (
            "a pod podresources does not list",
            {"a": AGREE["a"]},
            None,
            "n1: ml/b: the checkpoint assigns resources, podresources does not list it",
        ),
    ],
)
def test_a_disagreement_fails_naming_pod_container_resource_and_both_sources(
    case: str,
    listed: dict[str, Any],
    cpu_entries: dict[str, dict[str, str]] | None,
    problem: str,
) -> None:
    _, c = _collect(_podres(listed, ["GPU-0", "GPU-1", "GPU-4"]), cpu_entries)
    got = check_sources_agree(c)
    assert got.status is Status.FAIL, case
    assert got.problems == (problem,), case


def test_no_socket_or_a_failed_call_falls_back_to_the_checkpoint_and_says_so() -> None:
    d, c = _collect({"error": "no podresources socket (pod-resources/kubelet.sock) under /x"})
    assert d["deviceSource"] == "kubelet_internal_checkpoint"
    assert d["healthySource"] == "kubelet_internal_checkpoint"
    assert "cpuSource" not in d
    got = check_sources_agree(c)
    assert got.status is Status.NOT_COLLECTED
    assert got.problems == (
        "n1: no podresources socket (pod-resources/kubelet.sock) under /x; devices and CPUs "
        "from the checkpoints",
    )
    assert check_unique_devices(c).status is Status.PASS  # the checkpoint still proves it

    failed = {
        "socket": "/var/lib/kubelet/pod-resources/kubelet.sock",
        "listError": "/v1.PodResourcesLister/List: grpc-status 8 RESOURCE_EXHAUSTED: rate",
        "allocatable": _podres({}, ["GPU-0", "GPU-1"])["allocatable"],
    }
    d, c = _collect(failed)
    assert d["deviceSource"] == "kubelet_internal_checkpoint"
    assert d["healthySource"] == "podresources" and d["healthyDevices"] == {GPU: 2}
    assert check_sources_agree(c).status is Status.NOT_COLLECTED
    assert "RESOURCE_EXHAUSTED" in check_sources_agree(c).problems[0]
    # allocatable 3, podresources' healthy set 2: the kubelet's own account fails the check
    assert check_allocatable(c).status is Status.FAIL

    d, c = _collect(None)  # facts of a module that did not ask
    assert d["podResourcesProblem"] == "podresources not collected (facts without podResources)"
    assert check_sources_agree(c).status is Status.NOT_COLLECTED


def test_without_a_device_checkpoint_only_the_cpus_are_compared() -> None:
    d, c = _collect(_podres(AGREE, ["GPU-0", "GPU-1", "GPU-4"]), device_cp=False)
    assert d["deviceSource"] == "podresources" and d["healthySource"] == "podresources"
    got = check_sources_agree(c)
    assert got.status is Status.PASS, got
    assert got.notes == ("n1: devices not compared (no kubelet_internal_checkpoint)", CGROUP_NOTE)
    _, c = _collect(_podres({**AGREE, "b": ("GPU-1", 0, [6])}, ["GPU-0"]), device_cp=False)
    assert check_sources_agree(c).problems == (
        "n1: ml/b container app: exclusive CPUs podresources '6', cpu_manager_state '5'",
    )


def test_under_the_none_cpu_policy_only_the_devices_are_compared() -> None:
    podres = _podres({"a": ("GPU-0", 0, []), "b": ("GPU-4", 1, [])}, ["GPU-0", "GPU-1", "GPU-4"])
    _, c = _collect(podres)
    (parsed_node,) = c.nodes.values()
    state = dict(parsed_node["cpuManagerState"], policyName="none")
    c.nodes["n1"]["cpuManagerState"] = state
    got = check_sources_agree(c)
    assert got.status is Status.PASS, got
    assert got.notes == (
        "n1: CPUs not compared (cpu_manager_state: policy none)",
        CGROUP_NOTE,
    )


def test_the_containers_cgroup_cpusets_are_their_exclusive_cpus() -> None:
    podres = _podres(AGREE, ["GPU-0", "GPU-1", "GPU-4"])
    d, c = _collect(podres, cgroups={"id-a": "1-2", "id-b": "5", "id-pause": "0-7"})
    assert next(p for p in d["pods"] if p["name"] == "a")["cgroupCpus"] == {"app": "1-2"}
    got = check_sources_agree(c)
    assert got.status is Status.PASS, got
    assert got.notes == ("2 container(s) with exclusive CPUs compared with their cgroup cpuset",)

    _, c = _collect(podres, cgroups={"id-a": "1-2", "id-b": "0-7"})
    assert check_sources_agree(c).problems == (
        "n1: ml/b container app: exclusive CPUs podresources '5', cgroup cpuset '0-7'",
    )
    _, c = _collect(podres, cgroups={})  # a runtime without container cgroups
    assert check_sources_agree(c).notes == (CGROUP_NOTE,)


def test_evidence_pods_name_each_containers_runtime_id(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout.kube import collecting

    pod = {
        "metadata": {"namespace": "ml", "name": "a", "uid": "u"},
        "status": {
            "phase": "Running",
            "qosClass": "Guaranteed",
            "containerStatuses": [
                {"name": "app", "containerID": "containerd://" + "a" * 64},
                {"name": "waiting"},
            ],
        },
    }
    monkeypatch.setattr(collecting, "pod_objects_on", lambda api, node: [pod])
    (got,) = collecting.evidence_pods(None, "n1")  # type: ignore[arg-type]
    assert got["containerIds"] == {"app": "a" * 64}


def test_a_node_with_no_running_pod_is_not_judged_never_passed() -> None:
    """Both sources collected and no pod running on the node (a canary just drained): nothing
    to compare is ``not-judged``, not ``not-collected`` (the data is there) and not a pass; a
    node whose podresources is missing beside it keeps the check ``not-collected``."""
    _, c = _collect(_podres({}, ["GPU-0", "GPU-1", "GPU-4"]), cpu_entries={})
    c.nodes["n1"]["pods"] = []
    got = check_sources_agree(c)
    assert (got.status, got.checked) == (Status.NOT_JUDGED, 0), got
    assert got.summary.startswith("no running pod on n1: podresources and the checkpoints"), got
    _, other = _collect({"error": "no podresources socket"})
    both = parse_collections(
        {
            "collections": [
                {"label": "after", "nodes": {"n1": c.nodes["n1"], "n2": other.nodes["n1"]}}
            ]
        }
    )[0]
    assert check_sources_agree(both).status is Status.NOT_COLLECTED
