"""Evidence checks, table-driven over collected node data."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.evidence.checks import (
    Collection,
    Status,
    build_collection,
    check_allocatable,
    check_numa_alignment,
    check_unique_devices,
    evaluate,
    merge_collection,
    overall,
    overall_of,
    parse_collections,
    registered_devices,
)

NUMA = {"0": "0-3", "1": "4-7"}
DEV_NUMA = {"GPU-a": 0, "GPU-b": 0, "GPU-c": 1}


def pod(name: str, cpus: str = "", devices: tuple[str, ...] = (), **kw: Any) -> dict[str, Any]:
    p: dict[str, Any] = {"namespace": "ml", "name": name, "uid": f"uid-{name}", "qos": "Guaranteed"}
    if cpus:
        p["cpus"] = cpus
    if devices:
        p["devices"] = {"nvidia.com/gpu": list(devices)}
    return {**p, **kw}


def node(pods: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    return {
        "topologyManagerPolicy": "single-numa-node",
        "numa": NUMA,
        "deviceNuma": DEV_NUMA,
        "pods": pods,
        "podResources": True,
        **kw,
    }


ALLOC = [
    (
        "equal",
        {"n1": {"allocatable": {"nvidia.com/gpu": "3"}, "healthyDevices": {"nvidia.com/gpu": 3}}},
        Status.PASS,
        "",
    ),
    (
        "one unhealthy still advertised",
        {"n1": {"allocatable": {"nvidia.com/gpu": "3"}, "healthyDevices": {"nvidia.com/gpu": 2}}},
        Status.FAIL,
        "n1: allocatable nvidia.com/gpu is 3, 2 healthy",
    ),
    (
        "resource missing from allocatable",
        {"n1": {"allocatable": {}, "healthyDevices": {"nvidia.com/gpu": 1}}},
        Status.FAIL,
        "is absent",
    ),
    ("not collected", {"n1": {"allocatable": {"nvidia.com/gpu": "3"}}}, Status.NOT_COLLECTED, ""),
]


@pytest.mark.parametrize(("case", "nodes", "status", "problem"), ALLOC, ids=[a[0] for a in ALLOC])
def test_allocatable(case: str, nodes: dict[str, Any], status: Status, problem: str) -> None:
    c = check_allocatable(Collection("after", nodes=nodes))
    assert c.status is status
    assert problem in " ".join(c.problems)


UNIQUE = [
    (
        "distinct",
        {"n1": node([pod("a", devices=("GPU-a",)), pod("b", devices=("GPU-b",))])},
        Status.PASS,
        "",
    ),
    (
        "shared",
        {"n1": node([pod("a", devices=("GPU-a",)), pod("b", devices=("GPU-a", "GPU-b"))])},
        Status.FAIL,
        "n1: nvidia.com/gpu GPU-a assigned to ml/a, ml/b",
    ),
    (
        "shared with a finished pod is fine",
        {"n1": node([pod("a", devices=("GPU-a",), running=False), pod("b", devices=("GPU-a",))])},
        Status.PASS,
        "",
    ),
    (
        "same id on two nodes is two devices",
        {"n1": node([pod("a", devices=("GPU-a",))]), "n2": node([pod("b", devices=("GPU-a",))])},
        Status.PASS,
        "",
    ),
    ("no pod-resources data", {"n1": {"allocatable": {}}}, Status.NOT_COLLECTED, ""),
]


@pytest.mark.parametrize(("case", "nodes", "status", "problem"), UNIQUE, ids=[u[0] for u in UNIQUE])
def test_unique_devices(case: str, nodes: dict[str, Any], status: Status, problem: str) -> None:
    c = check_unique_devices(Collection("after", nodes=nodes))
    assert c.status is status
    assert problem in " ".join(c.problems)


STATE = {"policyName": "static", "entries": {"uid-s": {"main": "4-5", "side": "6"}}}
NUMA_CASES = [
    ("cpus and gpu on node 0", [pod("a", cpus="1-2", devices=("GPU-a",))], {}, Status.PASS, ""),
    (
        "gpu on the other node",
        [pod("a", cpus="1-2", devices=("GPU-c",))],
        {},
        Status.FAIL,
        "ml/a spans NUMA 0: cpu 1, cpu 2; NUMA 1: nvidia.com/gpu GPU-c",
    ),
    ("cpus across nodes", [pod("a", cpus="3-4")], {}, Status.FAIL, "NUMA 0: cpu 3; NUMA 1: cpu 4"),
    (
        "cpus from cpu_manager_state",
        [pod("s", devices=("GPU-c",))],
        {"cpuManagerState": STATE},
        Status.PASS,
        "",
    ),
    (
        "cpu_manager_state spread",
        [pod("s", devices=("GPU-a",))],
        {"cpuManagerState": STATE},
        Status.FAIL,
        "ml/s spans",
    ),
    (
        "unknown device NUMA",
        [pod("a", cpus="1", devices=("GPU-z",))],
        {},
        Status.FAIL,
        "NUMA ?: nvidia.com/gpu GPU-z",
    ),
    ("burstable pods are not judged", [pod("a", cpus="3-4", qos="Burstable")], {}, Status.PASS, ""),
    (
        "other policy not judged",
        [pod("a", cpus="3-4")],
        {"topologyManagerPolicy": "best-effort"},
        Status.NOT_JUDGED,
        "",
    ),
    (
        "no policy collected",
        [pod("a", cpus="1-2")],
        {"topologyManagerPolicy": None},
        Status.NOT_COLLECTED,
        "",
    ),
    (
        "restricted: two CPUs that fit one NUMA node spread over two",
        [pod("a", cpus="3-4")],
        {"topologyManagerPolicy": "restricted"},
        Status.FAIL,
        "ml/a spans NUMA 0: cpu 3; NUMA 1: cpu 4 (restricted: 1 NUMA node(s) hold it)",
    ),
    (
        "restricted: six CPUs need both NUMA nodes of four",
        [pod("a", cpus="1-6")],
        {"topologyManagerPolicy": "restricted"},
        Status.PASS,
        "",
    ),
    (
        "restricted: two GPUs that NUMA 0 holds, taken from both",
        [pod("a", cpus="1", devices=("GPU-a", "GPU-c"))],
        {
            "topologyManagerPolicy": "restricted",
            "registeredDevices": {"nvidia.com/gpu": list(DEV_NUMA)},
        },
        Status.FAIL,
        "(restricted: 1 NUMA node(s) hold it)",
    ),
    (
        "restricted: three GPUs need both NUMA nodes",
        [pod("a", cpus="1", devices=("GPU-a", "GPU-b", "GPU-c"))],
        {
            "topologyManagerPolicy": "restricted",
            "registeredDevices": {"nvidia.com/gpu": list(DEV_NUMA)},
        },
        Status.PASS,
        "",
    ),
]


@pytest.mark.parametrize(
    ("case", "pods", "extra", "status", "problem"), NUMA_CASES, ids=[n[0] for n in NUMA_CASES]
)
def test_numa_alignment(
    case: str, pods: list[dict[str, Any]], extra: dict[str, Any], status: Status, problem: str
) -> None:
    c = check_numa_alignment(Collection("after", nodes={"n1": node(pods, **extra)}))
    assert c.status is status
    assert problem in " ".join(c.problems)


def test_evaluate_names_missing_collections_and_overall_never_passes_on_missing() -> None:
    good = node(
        [pod("a", cpus="1", devices=("GPU-a",))],
        allocatable={"nvidia.com/gpu": "3"},
        healthyDevices={"nvidia.com/gpu": 3},
    )
    cols = parse_collections(
        {
            "collections": [
                {"label": "before", "nodes": {"n1": good}},
                {"label": "after", "nodes": {"n1": good}},
            ]
        }
    )
    # the node has no podresources account: that check alone is not collected (its own tests
    # are in test_podresources_evidence.py); no node of a migration: gpus-served-once is not
    # judged (its own tests are in test_gpu_paths_evidence.py)
    skip = ("podresources-matches-checkpoint", "gpus-served-once")
    checks = [c for c in evaluate(cols) if c.name not in skip]
    assert [(c.label, c.status) for c in checks[:6]] == [
        (lbl, Status.PASS) for lbl in ("before",) * 3 + ("after",) * 3
    ]
    assert {c.status for c in checks[6:]} == {Status.NOT_COLLECTED}
    assert all(c.summary == "no 'after-recreate' collection" for c in checks[6:])
    assert overall(checks) is Status.NOT_COLLECTED
    assert overall(checks[:6]) is Status.PASS
    bad = Collection("after-recreate", nodes={"n1": node([pod("a", cpus="3-4")])})
    assert overall(evaluate([*cols, bad])) is Status.FAIL


def test_build_collection_from_gathered_data_feeds_the_checks() -> None:
    facts = {
        "n1": {
            "numaNodes": [{"id": 0, "cpus": "0-3"}, {"id": 1, "cpus": "4-7"}],
            "gpus": [{"id": "0000:3b:00.0", "numaNode": 0}, {"id": "0000:af:00.0", "numaNode": 1}],
            "checkpoints": {"cpu_manager_state": STATE},
        }
    }
    col = build_collection(
        "after",
        "2026-12-01T00:00:00Z",
        facts,
        {"n1": {"nvidia.com/gpu": "2", "cpu": "8"}},
        {"n1": [pod("s")]},
        {"n1": {"topologyManagerPolicy": "single-numa-node"}},
    )
    d = col["nodes"]["n1"]
    # the PCI functions are shown, never taken for the healthy count
    assert d["pciGpus"] == {"nvidia.com/gpu": 2}
    assert "healthyDevices" not in d
    assert d["deviceNuma"] == {"0000:3b:00.0": 0, "0000:af:00.0": 1}
    assert d["podResources"] is False  # no device assignments gathered
    (c,) = parse_collections({"collections": [col]})
    alloc = check_allocatable(c)
    assert alloc.status is Status.NOT_COLLECTED
    assert alloc.problems == ("n1: no kubelet_internal_checkpoint on the node",)
    assert check_unique_devices(c).status is Status.NOT_COLLECTED
    numa = check_numa_alignment(c)  # CPUs 4-6 from cpu_manager_state, all on NUMA 1
    assert (numa.status, numa.checked) == (Status.PASS, 1)
    doc = merge_collection(
        {"collections": [{"label": "after", "nodes": {}}, {"label": "before"}]}, col
    )
    assert [x["label"] for x in doc["collections"]] == ["before", "after"]
    assert doc["collections"][1]["nodes"]


def test_a_promotions_collection_keeps_the_canarys_nodes_beside_its_own() -> None:
    canary = {"label": "after", "at": "t1", "nodes": {"c1": {"x": 1}, "p1": {"x": 0}}}
    doc = {"collections": [canary, {"label": "before", "nodes": {"c1": {}}}]}
    promoted = {"label": "after", "at": "t2", "nodes": {"p1": {"x": 2}, "p2": {"x": 3}}}
    kept = merge_collection(doc, promoted, keep_nodes=True)
    after = [c for c in kept["collections"] if c["label"] == "after"]
    assert after == [{"label": "after", "at": "t2",
                      "nodes": {"c1": {"x": 1}, "p1": {"x": 2}, "p2": {"x": 3}}}]  # fmt: skip
    replaced = merge_collection(doc, promoted)  # rollout evidence: the label's collection anew
    assert [c for c in replaced["collections"] if c["label"] == "after"] == [promoted]
    assert canary["nodes"] == {"c1": {"x": 1}, "p1": {"x": 0}}  # the document is not changed


# ------------------------------------------ device assignments from kubelet_internal_checkpoint
def _checkpoint(
    entries: list[tuple[str, dict[int, tuple[str, ...]]]],
    registered: dict[str, list[str]] | None = None,
    resource: str = "nvidia.com/gpu",
) -> dict[str, Any]:
    """A device manager checkpoint as the facts playbook returns it (parsed JSON)."""
    import json

    from rollout.kubelet.device_checkpoint import PodDevices, device_checkpoint, render_device

    cp = device_checkpoint(
        [PodDevices(uid, "main", resource, ids, b"") for uid, ids in entries],
        {"nvidia.com/gpu": ["GPU-0", "GPU-1", "GPU-4", "GPU-5"]}
        if registered is None
        else registered,
    )
    doc: dict[str, Any] = json.loads(render_device(cp))
    return doc


FACTS_NUMA = [{"id": 0, "cpus": "0-3"}, {"id": 1, "cpus": "4-7"}]
CKPT_CASES = [
    # case, checkpoint entries, pods (uid-<name>, cpus), unique status, numa status, problem
    (
        "each device once, GPUs beside the CPUs",
        [("uid-a", {0: ("GPU-0",)}), ("uid-b", {1: ("GPU-4", "GPU-5")})],
        [pod("a", cpus="1-2"), pod("b", cpus="5")],
        Status.PASS,
        Status.PASS,
        "",
    ),
    (
        "one GPU held by two running pods",
        [("uid-a", {0: ("GPU-0",)}), ("uid-b", {0: ("GPU-0",)})],
        [pod("a", cpus="1"), pod("b", cpus="2")],
        Status.FAIL,
        Status.PASS,
        "n1: nvidia.com/gpu GPU-0 assigned to ml/a, ml/b",
    ),
    (
        "a terminated pod's entry does not count",
        [("uid-a", {0: ("GPU-0",)}), ("uid-b", {0: ("GPU-0",)})],
        [pod("a", cpus="1"), pod("b", cpus="2", running=False)],
        Status.PASS,
        Status.PASS,
        "",
    ),
    (
        "GPU on the NUMA node the checkpoint names, not the CPUs'",
        [("uid-a", {1: ("GPU-4",)})],
        [pod("a", cpus="1-2")],
        Status.PASS,
        Status.FAIL,
        "ml/a spans NUMA 0: cpu 1, cpu 2; NUMA 1: nvidia.com/gpu GPU-4",
    ),
    (
        "GPUs of one pod split across NUMA nodes",
        [("uid-a", {0: ("GPU-0",), 1: ("GPU-4",)})],
        [pod("a", cpus="1")],
        Status.PASS,
        Status.FAIL,
        "NUMA 1: nvidia.com/gpu GPU-4",
    ),
    (
        "no assignments at all is a pass, not missing data",
        [],
        [pod("a", cpus="1")],
        Status.PASS,
        Status.PASS,
        "",
    ),
]


@pytest.mark.parametrize(
    ("case", "entries", "pods", "unique", "numa", "problem"),
    CKPT_CASES,
    ids=[c[0] for c in CKPT_CASES],
)
def test_checks_over_the_device_manager_checkpoint(
    case: str,
    entries: list[tuple[str, dict[int, tuple[str, ...]]]],
    pods: list[dict[str, Any]],
    unique: Status,
    numa: Status,
    problem: str,
) -> None:
    facts = {"n1": {"numaNodes": FACTS_NUMA, "checkpoints": {}}}
    facts["n1"]["checkpoints"]["kubelet_internal_checkpoint"] = _checkpoint(entries)
    col = build_collection(
        "after", "t", facts, {}, {"n1": pods}, {"n1": {"topologyManagerPolicy": "single-numa-node"}}
    )
    assert col["nodes"]["n1"]["deviceSource"] == "kubelet_internal_checkpoint"
    (c,) = parse_collections({"collections": [col]})
    u, n = check_unique_devices(c), check_numa_alignment(c)
    assert (u.status, n.status) == (unique, numa)
    if problem:
        assert problem in " ".join(u.problems + n.problems)


def test_a_corrupt_checkpoint_is_named_and_never_passes() -> None:
    doc = _checkpoint([("uid-a", {0: ("GPU-0",)})])
    doc["Checksum"] += 1
    facts = {"n1": {"numaNodes": FACTS_NUMA, "checkpoints": {"kubelet_internal_checkpoint": doc}}}
    col = build_collection("after", "t", facts, {}, {"n1": [pod("a", cpus="1")]}, {})
    (c,) = parse_collections({"collections": [col]})
    u = check_unique_devices(c)
    assert u.status is Status.NOT_COLLECTED
    assert u.problems == ("n1: kubelet_internal_checkpoint: checkpoint is corrupted",)


# ------------------------------------------ the healthy count is the kubelet's, not the PCI bus's
EIGHT_PCI = [{"id": f"0000:{0x10 + i:02x}:00.0", "numaNode": i // 4} for i in range(8)]
GPUS = [f"GPU-{i}" for i in range(8)]
HEALTHY_CASES = [
    # case, RegisteredDevices, capacity, allocatable, known before, status, problem/note
    (
        "one GPU unhealthy: allocatable 7 = 7 registered, the unhealthy one named",
        {"nvidia.com/gpu": GPUS[:3] + GPUS[4:]},
        {"nvidia.com/gpu": "8"},
        {"nvidia.com/gpu": "7"},
        {"nvidia.com/gpu": GPUS},
        Status.PASS,
        "n1: 1 nvidia.com/gpu device(s) unhealthy (capacity 8, allocatable 7): GPU-3",
    ),
    (
        "unhealthy, no earlier collection: counted from capacity - allocatable",
        {"nvidia.com/gpu": GPUS[:7]},
        {"nvidia.com/gpu": "8"},
        {"nvidia.com/gpu": "7"},
        {},
        Status.PASS,
        "n1: 1 nvidia.com/gpu device(s) unhealthy (capacity 8, allocatable 7)",
    ),
    (
        "MIG: seven 1g.10gb instances on one PCI GPU count as the plugin advertises",
        {"nvidia.com/mig-1g.10gb": [f"MIG-{i}" for i in range(7)]},
        {"nvidia.com/mig-1g.10gb": "7"},
        {"nvidia.com/mig-1g.10gb": "7"},
        {},
        Status.PASS,
        "",
    ),
    (
        "time-slicing: 4 replicas of each of 8 GPUs are 32 units",
        {"nvidia.com/gpu": [f"{g}::{r}" for g in GPUS for r in range(4)]},
        {"nvidia.com/gpu": "32"},
        {"nvidia.com/gpu": "32"},
        {},
        Status.PASS,
        "",
    ),
    (
        "allocatable still advertises a device the device manager no longer holds healthy",
        {"nvidia.com/gpu": GPUS[:7]},
        {"nvidia.com/gpu": "8"},
        {"nvidia.com/gpu": "8"},
        {},
        Status.FAIL,
        "n1: allocatable nvidia.com/gpu is 8, 7 healthy device(s) in the device manager's "
        "RegisteredDevices",
    ),
    (
        "after a kubelet restart, a plugin not registered again: the checkpoint is stale",
        {"nvidia.com/gpu": GPUS},
        {"nvidia.com/gpu": "8"},
        {"nvidia.com/gpu": "0"},
        {},
        Status.FAIL,
        "n1: allocatable nvidia.com/gpu is 0, 8 healthy device(s) in the device manager's "
        "RegisteredDevices; capacity 8: the kubelet holds 8 unhealthy since it wrote the "
        "checkpoint",
    ),
    (
        "a resource in capacity and allocatable but never registered",
        {},
        {"nvidia.com/gpu": "8"},
        {"nvidia.com/gpu": "8"},
        {},
        Status.FAIL,
        "n1: allocatable nvidia.com/gpu is 8, 0 healthy",
    ),
]


@pytest.mark.parametrize(
    ("case", "registered", "capacity", "alloc", "known", "status", "text"),
    HEALTHY_CASES,
    ids=[h[0] for h in HEALTHY_CASES],
)
def test_healthy_count_is_the_device_managers_registered_set(
    case: str,
    registered: dict[str, list[str]],
    capacity: dict[str, str],
    alloc: dict[str, str],
    known: dict[str, list[str]],
    status: Status,
    text: str,
) -> None:
    """The old code compared allocatable with the 8 NVIDIA PCI functions: it failed the unhealthy,
    MIG and time-slicing cases that are correct, and passed nothing it should fail."""
    facts = {
        "n1": {
            "numaNodes": FACTS_NUMA,
            "gpus": EIGHT_PCI,
            "checkpoints": {"kubelet_internal_checkpoint": _checkpoint([], registered)},
        }
    }
    col = build_collection(
        "after", "t", facts, {"n1": alloc}, {}, {}, capacity={"n1": capacity}, known={"n1": known}
    )
    assert col["nodes"]["n1"]["healthySource"] == "kubelet_internal_checkpoint"
    assert col["nodes"]["n1"]["pciGpus"] == {"nvidia.com/gpu": 8}
    (c,) = parse_collections({"collections": [col]})
    got = check_allocatable(c)
    assert got.status is status, got
    if text:
        assert text in " ".join(got.problems + got.notes), got


def test_a_device_a_pod_holds_that_is_no_longer_registered_is_named() -> None:
    cp = _checkpoint([("uid-a", {0: ("GPU-1",)})], {"nvidia.com/gpu": ["GPU-0"]})
    facts = {"n1": {"checkpoints": {"kubelet_internal_checkpoint": cp}}}
    col = build_collection(
        "after",
        "t",
        facts,
        {"n1": {"nvidia.com/gpu": "1"}},
        {"n1": [pod("a")]},
        {},
        capacity={"n1": {"nvidia.com/gpu": "2"}},
    )
    assert col["nodes"]["n1"]["unhealthyDevices"] == {"nvidia.com/gpu": ["GPU-1"]}
    (c,) = parse_collections({"collections": [col]})
    got = check_allocatable(c)
    assert got.status is Status.PASS
    assert got.notes == (
        "n1: 1 nvidia.com/gpu device(s) unhealthy (capacity 2, allocatable 1): GPU-1",
    )


def test_registered_devices_of_earlier_collections_name_the_ones_gone() -> None:
    before = {"nodes": {"n1": {"registeredDevices": {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}}}}
    doc = {"collections": [{"label": "before", **before}]}
    assert registered_devices(doc) == {"n1": {"nvidia.com/gpu": ["GPU-0", "GPU-1"]}}
    cp = _checkpoint([], {"nvidia.com/gpu": ["GPU-0"]})
    col = build_collection(
        "after",
        "t",
        {"n1": {"checkpoints": {"kubelet_internal_checkpoint": cp}}},
        {"n1": {"nvidia.com/gpu": "1"}},
        {},
        {},
        capacity={"n1": {"nvidia.com/gpu": "2"}},
        known=registered_devices(doc),
    )
    assert col["nodes"]["n1"]["unhealthyDevices"] == {"nvidia.com/gpu": ["GPU-1"]}


def test_a_corrupt_checkpoint_gives_no_healthy_count() -> None:
    doc = _checkpoint([])
    doc["Checksum"] += 1
    facts = {"n1": {"gpus": EIGHT_PCI, "checkpoints": {"kubelet_internal_checkpoint": doc}}}
    col = build_collection("after", "t", facts, {"n1": {"nvidia.com/gpu": "8"}}, {}, {})
    (c,) = parse_collections({"collections": [col]})
    got = check_allocatable(c)
    assert got.status is Status.NOT_COLLECTED
    assert got.problems == ("n1: kubelet_internal_checkpoint: checkpoint is corrupted",)


# ------------------------------------------ the plugin's NUMA nodes against the PCI devices'
def _topology(plugin: dict[str, int], pci: dict[str, int]) -> dict[str, Any]:
    return node(
        [],
        deviceNuma={**pci, **plugin},
        pciNuma={"nvidia.com/gpu": pci},
        pciGpus={"nvidia.com/gpu": len(pci)},
        allocatableDevices={"nvidia.com/gpu": sorted(plugin)},
    )


def test_a_plugin_that_places_gpus_on_other_numa_nodes_than_pci_fails_alignment() -> None:
    from rollout.evidence.checks import pci_numa_mismatch

    pci = {"0000:3b:00.0": 0, "0000:86:00.0": 1}
    wrong = _topology({"GPU-a": 0, "GPU-b": 0}, pci)
    check = check_numa_alignment(Collection("after", nodes={"n1": wrong}))
    assert check.status is Status.FAIL
    assert check.problems == (
        "n1: the device plugin places nvidia.com/gpu on NUMA 0: 2, the PCI devices' numa_node on "
        "NUMA 0: 1, NUMA 1: 1: placement judged on the plugin's NUMA nodes cannot be trusted",
    )
    assert "1 node(s) whose GPUs' NUMA nodes disagree with PCI" in check.summary
    assert pci_numa_mismatch(_topology({"GPU-a": 1, "GPU-b": 0}, pci)) is None  # same counts
    # not comparable: MIG or time-sliced units (more than the PCI functions), a device without
    # one NUMA node, or no podresources topology at all
    assert pci_numa_mismatch(_topology({"a": 0, "b": 0, "c": 0, "d": 0}, pci)) is None
    no_numa = _topology({"GPU-a": 0, "GPU-b": 0}, pci)
    no_numa["deviceNuma"] = {**pci, "GPU-a": 0}
    assert pci_numa_mismatch(no_numa) is None
    assert pci_numa_mismatch(node([])) is None


def test_a_policy_that_admits_any_placement_is_not_judged_and_says_where_pods_sit() -> None:
    """``none`` / ``best-effort`` (a ``before`` collection of the usual change): the placement is
    collected and listed, never judged, and not-judged is neither a pass nor a gap: a
    collection passes on its other checks' passes alone (``overall_of``)."""
    col = Collection(
        "before",
        nodes={
            "n1": node(
                [pod("a", cpus="3-4", devices=("GPU-c",)), pod("b", cpus="1", qos="Burstable")],
                topologyManagerPolicy="none",
            )
        },
    )
    got = check_numa_alignment(col)
    assert (got.status, got.problems) == (Status.NOT_JUDGED, ()), got
    assert got.summary.startswith("n1: topologyManagerPolicy none: any placement is admitted")
    assert got.notes == ("n1: ml/a on NUMA 0: cpu 3; NUMA 1: cpu 4, nvidia.com/gpu GPU-c",)
    assert overall_of(["pass", "not-judged"]) is Status.PASS
    assert overall_of(["not-judged"]) is Status.NOT_COLLECTED
    assert overall_of(["pass", "not-judged", "not-collected"]) is Status.NOT_COLLECTED
    assert overall_of(["pass", "not-judged", "fail"]) is Status.FAIL
    assert overall_of([]) is Status.NOT_COLLECTED


def test_a_passing_alignment_says_where_each_pod_sits() -> None:
    """The pass names each judged pod's NUMA node with its CPUs and devices (the device identity
    and the placement a reader approves), and a node of the collection that was not judged."""
    col = Collection(
        "after",
        nodes={
            "n1": node([pod("a", cpus="1-2", devices=("GPU-a",))]),
            "n2": node([], topologyManagerPolicy="none"),
        },
    )
    got = check_numa_alignment(col)
    assert (got.status, got.checked) == (Status.PASS, 1), got
    assert got.notes == (
        "n2: topologyManagerPolicy none: not judged",
        "n1: ml/a on NUMA 0: cpu 1, cpu 2, nvidia.com/gpu GPU-a",
    )
