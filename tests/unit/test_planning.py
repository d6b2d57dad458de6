"""Strategy parsing, batches, backoff and the preflight checks (pure, table-driven)."""

from __future__ import annotations

import pytest

from rollout.change.planning import (
    Strategy,
    backoff_delay,
    blocking_pdbs,
    check_capacity,
    check_double_ownership,
    check_homogeneous,
    make_batches,
    parse_strategy,
    undrainable,
)
from rollout.errors import InputError, Location
from rollout.models import NodeFacts, NodeInfo, PdbRef, PodRef


def loc(field: str) -> Location:
    return Location(file="plan.yaml", field=field, line=7)


def test_strategy_defaults_and_values() -> None:
    assert parse_strategy({}, loc) == Strategy()
    s = parse_strategy(
        {
            "canaryGroup": "gpu-canary",
            "maxUnavailable": "50%",
            "drain": {"timeout": "2m", "backoffCap": "5s", "disableEviction": True},
            "batches": [1, 3],
        },
        loc,
        node_count=4,
    )
    assert (s.canary_group, s.max_unavailable, s.batches) == ("gpu-canary", 2, (1, 3))
    assert (s.drain.timeout_s, s.drain.backoff_cap_s, s.drain.disable_eviction) == (120, 5, True)


@pytest.mark.parametrize(
    ("raw", "field"),
    [
        ({"maxUnavailabel": 1}, "strategy.maxUnavailabel"),
        ({"maxUnavailable": 0}, "strategy.maxUnavailable"),
        ({"maxUnavailable": "x%"}, "strategy.maxUnavailable"),
        ({"drain": {"timeout": "soon"}}, "strategy.drain.timeout"),
        ({"drain": {"timeout": -1}}, "strategy.drain.timeout"),
        ({"drain": {"disableEviction": "yes"}}, "strategy.drain.disableEviction"),
        ({"drain": {"tmeout": 1}}, "strategy.drain.tmeout"),
        ({"batches": [0]}, "strategy.batches"),
        ({"canaryGroup": ""}, "strategy.canaryGroup"),
    ],
)
def test_strategy_errors_name_file_field_and_line(raw: dict[str, object], field: str) -> None:
    with pytest.raises(InputError) as e:
        parse_strategy(raw, loc)
    assert str(e.value).startswith(f"plan.yaml:7, field {field!r}")


def test_batches_canary_first_then_rest() -> None:
    nodes = ["a", "b", "c", "d", "e"]
    s = Strategy(max_unavailable=2, batches=(1,))
    got = [(b.nodes, b.canary) for b in make_batches(nodes, ["d", "b"], s, canary_only=False)]
    assert got == [(("b", "d"), True), (("a",), False), (("c", "e"), False)]
    assert [b.nodes for b in make_batches(nodes, ["d", "b"], s, canary_only=True)] == [("b", "d")]


def test_backoff_is_exponential_and_capped() -> None:
    assert [backoff_delay(i, 0.5, 3) for i in range(5)] == [0.5, 1, 2, 3, 3]


def test_homogeneity_names_the_odd_node() -> None:
    a = NodeFacts("a", "a", "kubeadm", "Xeon 8480", ("0-3", "4-7"), "10de:2330")
    b = NodeFacts("b", "b", "kubeadm", "Xeon 8480", ("0-3", "4-7"), "10de:2330")
    c = NodeFacts("c", "c", "kubeadm", "Xeon 8480", ("0-7",), "10de:2330")
    assert check_homogeneous([a, b]) == []
    (msg,) = check_homogeneous([a, b, c])
    assert "node c has NUMA layout '0-7'" in msg


def test_blocking_pdbs() -> None:
    pods = [
        PodRef("ns", "web-1", labels={"app": "web"}),
        PodRef("ns", "db-1", labels={"app": "db"}),
        PodRef("ns", "ds-1", labels={"app": "web"}, daemonset=True),
    ]
    pdbs = [
        PdbRef("ns", "web", {"app": "web"}, disruptions_allowed=0, expected_pods=3),
        PdbRef("ns", "db", {"app": "db"}, disruptions_allowed=1, expected_pods=2, min_available=2),
        PdbRef("other", "x", {"app": "web"}, disruptions_allowed=0),
    ]
    got = {b.pdb: (b.pods, b.reason) for b in blocking_pdbs("n1", pods, pdbs)}
    assert got == {
        "ns/web": (("ns/web-1",), "ALLOWED DISRUPTIONS is 0"),
        "ns/db": (("ns/db-1",), "minAvailable 2 >= 2 expected pods (can never allow a disruption)"),
    }


def test_capacity() -> None:
    nodes = {
        "a": NodeInfo("a", cpu_millis=4000, memory_bytes=8 << 30),
        "b": NodeInfo("b", cpu_millis=4000, memory_bytes=8 << 30),
        "c": NodeInfo("c", unschedulable=True, cpu_millis=64000, memory_bytes=64 << 30),
    }
    pods = {"a": [PodRef("ns", "p", cpu_millis=3000, memory_bytes=1 << 30)], "b": []}
    assert check_capacity(["a"], nodes, pods) == []
    pods["b"] = [PodRef("ns", "q", cpu_millis=2000)]
    (msg,) = check_capacity(["a"], nodes, pods)
    assert "request 3000m, the other schedulable nodes have 2000m free" in msg


def test_double_ownership() -> None:
    alloc = {"cpu": "8", "nvidia.com/gpu": "8", "hugepages-1Gi": "0"}
    assert check_double_ownership("n1", alloc, []) == []
    assert check_double_ownership("n1", alloc, ["dra.example.com"]) == []
    (msg,) = check_double_ownership("n1", alloc, ["gpu.nvidia.com"])
    assert "nvidia.com/gpu=8" in msg and "gpu.nvidia.com" in msg
    assert check_double_ownership("n1", {"nvidia.com/gpu": "0"}, ["gpu.nvidia.com"]) == []


def _lossy_pods() -> list[PodRef]:
    return [
        PodRef("ns", "web-1"),  # a ReplicaSet's: recreated elsewhere
        PodRef("ns", "debug", unmanaged=True),  # hand-made: gone for good once evicted
        PodRef("ops", "scratch", unmanaged=True, local_storage=True),
        PodRef("ns", "cache-0", local_storage=True),  # a StatefulSet's, with emptyDir data
        PodRef("kube-system", "agent", daemonset=True, unmanaged=True, local_storage=True),
        PodRef("kube-system", "etcd-n1", mirror=True, unmanaged=True),
    ]


def test_undrainable_names_every_pod_a_drain_would_lose_in_kubectls_words() -> None:
    assert undrainable("n1", _lossy_pods()) == [
        "node n1: cannot delete Pods that declare no controller "
        "(use --force-delete-unmanaged to override): ns/debug, ops/scratch",
        "node n1: cannot delete Pods with local storage "
        "(use --delete-emptydir-data to override): ns/cache-0, ops/scratch",
    ]
    # DaemonSet pods and static mirrors are never evicted, so never a reason to refuse
    only_kept = [p for p in _lossy_pods() if p.daemonset or p.mirror]
    assert undrainable("n1", [PodRef("ns", "web-1"), *only_kept]) == []


@pytest.mark.parametrize(
    ("unmanaged", "emptydir", "left"),
    [
        (True, False, ["local storage"]),
        (False, True, ["declare no controller"]),
        (True, True, []),
    ],
)
def test_undrainable_each_flag_allows_only_its_own_kind(
    unmanaged: bool, emptydir: bool, left: list[str]
) -> None:
    got = undrainable("n1", _lossy_pods(), unmanaged, emptydir)
    assert len(got) == len(left) and all(w in g for w, g in zip(left, got, strict=True))


def test_pod_ref_classifies_controller_and_emptydir_as_kubectl_does() -> None:
    from rollout.kube.nodes import to_pod_ref

    def pod(owners: list[dict[str, object]], volumes: list[dict[str, object]]) -> PodRef:
        meta = {"namespace": "ns", "name": "p", "ownerReferences": owners}
        return to_pod_ref({"metadata": meta, "spec": {"volumes": volumes}})

    rs = {"kind": "ReplicaSet", "name": "web-7f", "controller": True}
    assert not pod([rs], []).unmanaged
    # an owner that is not the controller (controller absent or false) recreates nothing
    assert pod([{"kind": "ConfigMap", "name": "x"}], []).unmanaged
    assert pod([{**rs, "controller": False}], []).unmanaged
    assert pod([], []).unmanaged
    assert pod([rs], [{"name": "tmp", "emptyDir": {}}]).local_storage
    assert not pod([rs], [{"name": "cfg", "configMap": {"name": "c"}}]).local_storage
