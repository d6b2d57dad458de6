"""Strategy parsing, batches and the preflight checks (pure, table-driven)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.change.plan.batches import check_homogeneous, make_batches
from rollout.change.plan.capacity import check_capacity, check_placement
from rollout.change.plan.drain_rules import blocking_pdbs, undrainable
from rollout.change.plan.strategy import Strategy, parse_strategy
from rollout.errors import InputError, Location
from rollout.kube.nodes import to_pdb_ref
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


def _pdb(spec: dict[str, object]) -> PdbRef:
    return to_pdb_ref({"metadata": {"namespace": "ns", "name": "b"}, "spec": spec, "status": {}})


def test_an_empty_pdb_selector_selects_every_pod_of_its_namespace_and_a_null_one_none() -> None:
    """policy/v1: ``selector: {}`` selects every pod in the namespace; no selector, none."""
    here = [PodRef("ns", "a", labels={"app": "web"}), PodRef("ns", "b")]
    elsewhere = PodRef("other", "c", labels={"app": "web"})
    empty = _pdb({"selector": {}, "maxUnavailable": 0})
    assert [p.name for p in here if empty.matches(p)] == ["a", "b"]
    assert not empty.matches(elsewhere)
    null = _pdb({"maxUnavailable": 0})
    assert not any(null.matches(p) for p in [*here, elsewhere])
    got = {b.pdb: b.pods for b in blocking_pdbs("n1", here, [empty, null])}
    assert got == {"ns/b": ("ns/a", "ns/b")}


@pytest.mark.parametrize(
    ("op", "values", "selected"),
    [
        ("In", ["web", "api"], ["web", "api"]),
        ("NotIn", ["web"], ["api", "none"]),
        ("Exists", [], ["web", "api"]),
        ("DoesNotExist", [], ["none"]),
    ],
)
def test_pdb_match_expressions_select_as_label_selectors_do(
    op: str, values: list[str], selected: list[str]
) -> None:
    pods = [
        PodRef("ns", "web", labels={"app": "web", "tier": "fe"}),
        PodRef("ns", "api", labels={"app": "api", "tier": "fe"}),
        PodRef("ns", "none", labels={"tier": "fe"}),
    ]
    expr = {"key": "app", "operator": op, "values": values}
    pdb = _pdb({"selector": {"matchLabels": {"tier": "fe"}, "matchExpressions": [expr]}})
    assert [p.name for p in pods if pdb.matches(p)] == selected


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


def test_control_plane_restarting_nodes_go_one_at_a_time() -> None:
    from rollout.change.plan.batches import Batch, one_control_plane_at_a_time

    batches = [Batch(("a", "b", "c"), True), Batch(("d", "e"), False)]
    units = {"a": "k3s", "b": "kubelet", "c": "rke2-server", "d": "kubelet", "e": "kubelet"}
    out, warnings = one_control_plane_at_a_time(batches, units)
    assert out == [
        Batch(("b",), True),
        Batch(("a",), True),
        Batch(("c",), True),
        Batch(("d", "e"), False),
    ]
    assert len(warnings) == 2
    assert warnings[0].startswith(
        "node a: restarting the kubelet restarts k3s, that is the k3s server (API server, "
    )
    assert warnings[0].endswith("such nodes are changed one at a time")
    micro, [w] = one_control_plane_at_a_time(
        [Batch(("m",), False)], {"m": "snap.microk8s.daemon-kubelite"}
    )
    assert micro == [Batch(("m",), False)] and "kubelite, which runs every MicroK8s" in w
    assert one_control_plane_at_a_time(batches[1:], units) == (batches[1:], [])


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


GPU = "nvidia.com/gpu"


def _gpu_node(name: str, gpus: int = 8, **kw: object) -> NodeInfo:
    return NodeInfo(
        name,
        cpu_millis=64000,
        memory_bytes=64 << 30,
        allocatable={"cpu": "64", GPU: str(gpus)},
        **kw,  # type: ignore[arg-type]
    )


def _gpu_pod(name: str, gpus: int, node: str = "a", **placement: object) -> PodRef:
    return PodRef("ml", name, node=node, cpu_millis=2000, extended={GPU: gpus}, placement=placement)


def test_capacity_sums_extended_resources_too() -> None:
    nodes = {"a": _gpu_node("a"), "b": _gpu_node("b")}
    pods = {"a": [_gpu_pod("train", 4)], "b": [_gpu_pod("big", 6, node="b")]}
    (msg,) = check_capacity(["a"], nodes, pods)
    assert msg == (
        f"not enough {GPU} left for the pods evicted from a: they request 4, "
        "the other schedulable nodes have 2 free"
    )
    pods["b"] = [_gpu_pod("small", 4, node="b")]
    assert check_capacity(["a"], nodes, pods) == []


def test_placement_refuses_a_gpu_pod_that_its_placement_sends_to_full_nodes() -> None:
    """Free GPUs exist (on c), but the pod's nodeSelector allows only b, which is full."""
    nodes = {
        "a": _gpu_node("a", labels={"pool": "a100"}),
        "b": _gpu_node("b", labels={"pool": "a100"}),
        "c": _gpu_node("c", labels={"pool": "h100"}),
    }
    pods = {
        "a": [_gpu_pod("train", 4, nodeSelector={"pool": "a100"})],
        "b": [_gpu_pod("big", 8, node="b")],
        "c": [],
    }
    assert check_capacity(["a"], nodes, pods) == []  # the sum alone would let it go
    refusals, warnings = check_placement(["a"], nodes, pods)
    assert refusals == [
        f"pod ml/train evicted from a fits no other node: it requests cpu 2000m, {GPU} 4; "
        f"the nodes its placement allows: b: {GPU} 0 free"
    ]
    assert warnings == []
    pods["b"] = []
    assert check_placement(["a"], nodes, pods) == ([], [])


def test_placement_honours_taints_tolerations_and_node_affinity() -> None:
    taint = {"key": "gpu", "value": "true", "effect": "NoSchedule"}
    nodes = {
        "a": _gpu_node("a"),
        "b": _gpu_node("b", taints=(taint,)),
        "c": _gpu_node("c", unschedulable=True),
    }
    pods: dict[str, list[PodRef]] = {"a": [_gpu_pod("train", 4)], "b": [], "c": []}
    refusals, _ = check_placement(["a"], nodes, pods)
    assert refusals == [
        f"pod ml/train evicted from a fits no other node: it requests cpu 2000m, {GPU} 4; "
        "the nodes its placement allows: c: cordoned or not Ready"
    ]  # b's taint is not tolerated
    tolerates = [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}]
    pods["a"] = [_gpu_pod("train", 4, tolerations=tolerates)]
    assert check_placement(["a"], nodes, pods) == ([], [])
    only_c = {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [
                    {
                        "matchExpressions": [
                            {"key": "kubernetes.io/hostname", "operator": "In", "values": ["c"]}
                        ]
                    }
                ]
            }
        }
    }
    nodes["c"] = _gpu_node("c", unschedulable=True, labels={"kubernetes.io/hostname": "c"})
    pods["a"] = [_gpu_pod("train", 4, affinity=only_c, tolerations=tolerates)]
    refusals, _ = check_placement(["a"], nodes, pods)
    assert len(refusals) == 1 and "c: cordoned or not Ready" in refusals[0]


def test_placement_warns_for_a_pod_pinned_to_the_node_it_runs_on() -> None:
    nodes = {"a": _gpu_node("a", labels={"kubernetes.io/hostname": "a"}), "b": _gpu_node("b")}
    pods = {"a": [_gpu_pod("pinned", 4, nodeSelector={"kubernetes.io/hostname": "a"})], "b": []}
    assert check_placement(["a"], nodes, pods) == (
        [],
        [
            "pod ml/pinned can run on no node outside a (its nodeSelector, node affinity or "
            "tolerations allow none): it stays Pending until a is back"
        ],
    )


def test_pod_and_node_records_carry_what_placement_reads() -> None:
    from rollout.kube.nodes import to_node_info, to_pod_ref

    spec = {
        "nodeSelector": {"pool": "a100"},
        "tolerations": [{"key": "gpu", "operator": "Exists"}],
        "containers": [
            {"resources": {"requests": {"cpu": "2", GPU: "4", "hugepages-2Mi": "1Gi"}}},
            {"resources": {"requests": {GPU: "1"}}},
        ],
    }
    p = to_pod_ref({"metadata": {"namespace": "ml", "name": "t"}, "spec": spec})
    assert p.extended == {GPU: 5} and p.cpu_millis == 2000
    assert p.placement == {"nodeSelector": spec["nodeSelector"], "tolerations": spec["tolerations"]}
    taint = {"key": "gpu", "effect": "NoSchedule"}
    n = to_node_info(
        {
            "metadata": {"name": "b", "labels": {"pool": "a100"}},
            "spec": {"taints": [taint]},
            "status": {"allocatable": {"cpu": "64", GPU: "8"}},
        }
    )
    assert n.labels == {"pool": "a100"} and n.taints == (taint,)


def test_drain_overrides_round_trip_through_their_journaled_flags() -> None:
    from rollout.change.plan.drain_rules import DrainOverrides

    for o in (DrainOverrides(), DrainOverrides(True, False, True), DrainOverrides(False, True)):
        assert DrainOverrides.from_flags(o.used()) == o
    assert DrainOverrides(True, True, True).used() == [
        "--force-delete-unmanaged",
        "--delete-emptydir-data",
        "--capacity-warn-only",
    ]


def test_one_placement_index_judges_each_placement_once_across_batches(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Shared by a preflight's batches, the index matches each distinct placement against every
    Node once, and answers as check_placement did without it."""
    from rollout.change.plan import capacity

    nodes = {n: _gpu_node(n, labels={"pool": "a100" if n < "e" else "h100"}) for n in "abcdefgh"}
    pods = {
        n: [_gpu_pod(f"p{n}{i}", 1, node=n, nodeSelector={"pool": "a100"}) for i in range(3)]
        for n in "abcd"
    }
    pods.update({n: [_gpu_pod(f"q{n}", 1, node=n)] for n in "efgh"})
    batches = [["a", "b"], ["c", "d"], ["e", "f"], ["g", "h"]]
    alone = [check_placement(b, nodes, pods) for b in batches]
    calls: list[str] = []
    real = capacity.lands_on

    def counting(placement: Any, node: Any) -> bool:
        calls.append(node["metadata"]["name"])
        return real(placement, node)

    monkeypatch.setattr(capacity, "lands_on", counting)
    index = capacity.PlacementIndex(nodes)
    shared = [check_placement(b, nodes, pods, index) for b in batches]
    assert shared == alone
    assert len(calls) == 2 * len(nodes)  # two distinct placements, each against the 8 Nodes
