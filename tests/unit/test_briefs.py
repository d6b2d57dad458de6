"""Preflight's cluster-wide listings decode only the fields the checks read
(``rollout.kube.briefs``): the records must be what the whole objects give, the inventory's
objects must be the API server's bytes decoded whole, and no shape the API may send fails."""

from __future__ import annotations

import copy
import json
from typing import Any

from rollout.kube import briefs
from rollout.kube import nodes as kn
from rollout.models import PodRef, Requests

MANAGED = [
    {
        "manager": "kube-controller-manager",
        "operation": "Update",
        "fieldsType": "FieldsV1",
        "fieldsV1": {"f:spec": {"f:containers": {'k:{"name":"app"}': {".": {}}}}},
    }
]


def _pod(name: str, node: str, **spec: Any) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"uid-{name}",
            "labels": {"app": "web"},
            "annotations": {"note": "x"},
            "creationTimestamp": f"2026-12-05T10:00:0{len(name) % 10}Z",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "web-1", "controller": True}],
            "managedFields": MANAGED,
        },
        "spec": {
            "nodeName": node,
            "containers": [
                {"name": "app", "resources": {"requests": {"cpu": "250m", "memory": "1Gi"}}},
                {"name": "side", "resources": {"requests": {"nvidia.com/gpu": "2", "cpu": 1}}},
            ],
            **spec,
        },
        "status": {
            "phase": "Running",
            "conditions": [{"type": "Ready", "status": "True"}],
            "containerStatuses": [{"name": "app", "ready": True}],
        },
    }


class FakeCore:
    """The REST layer's pod and Node listings, answering bytes as ``_raw`` asks."""

    def __init__(self, pods: list[dict[str, Any]], nodes: list[dict[str, Any]]) -> None:
        self.pods, self.nodes = pods, nodes

    def list_pod_for_all_namespaces(self, _raw: bool = False, **kw: Any) -> Any:
        assert _raw
        return json.dumps({"metadata": {"continue": ""}, "items": self.pods}).encode()

    def list_node(self, _raw: bool = False, **kw: Any) -> Any:
        assert _raw
        return json.dumps({"items": self.nodes}).encode()


class FakeApi:
    def __init__(self, pods: list[dict[str, Any]], nodes: list[dict[str, Any]] = ()) -> None:  # type: ignore[assignment]
        self.core = FakeCore(pods, list(nodes))


def test_a_pod_record_from_the_listing_holds_what_the_checks_read() -> None:
    pod = _pod(
        "a",
        "n1",
        volumes=[{"name": "scratch", "emptyDir": {}}, {"name": "cfg", "configMap": {"name": "c"}}],
        nodeSelector={"pool": "gpu"},
        tolerations=[{"key": "gpu", "operator": "Exists"}],
    )
    listing = kn.pods_by_node(FakeApi([pod]), keep={"n1"})  # type: ignore[arg-type]
    assert listing.used == {"n1": Requests(1250, 1 << 30, {"nvidia.com/gpu": 2})}
    refs = listing.refs
    assert refs["n1"] == [
        PodRef(
            namespace="ml",
            name="a",
            node="n1",
            uid="uid-a",
            labels={"app": "web"},
            daemonset=False,
            mirror=False,
            cpu_millis=1250,
            memory_bytes=1 << 30,
            unmanaged=False,
            local_storage=True,
            extended={"nvidia.com/gpu": 2},
            placement={
                "nodeSelector": {"pool": "gpu"},
                "tolerations": [{"key": "gpu", "operator": "Exists"}],
            },
        )
    ]
    # the same record from the whole object (a watch event, a per-node listing)
    assert kn.to_pod_ref(pod) == refs["n1"][0]


def test_the_inventorys_pods_come_back_whole_and_the_finished_are_left_out() -> None:
    kept = [_pod("bb", "n1"), _pod("a", "n1")]
    done = _pod("c", "n1")
    done["status"]["phase"] = "Succeeded"
    other = _pod("d", "n2")
    listing = kn.pods_by_node(FakeApi([*kept, done, other]), keep={"n1"})  # type: ignore[arg-type]
    assert [p.name for p in listing.refs["n1"]] == ["bb", "a"]  # as listed
    assert listing.objects == {"n1": [kept[1], kept[0]]}  # whole, as sent, oldest first
    assert "n2" not in listing.refs and set(listing.used) == {"n1", "n2"}
    # two pods on n1 (the finished one not counted), one on n2
    assert listing.used["n1"] == Requests(2500, 2 << 30, {"nvidia.com/gpu": 4})
    assert listing.used["n2"] == Requests(1250, 1 << 30, {"nvidia.com/gpu": 2})


def test_mirror_daemonset_and_bare_pods_are_told_apart() -> None:
    mirror = _pod("m", "n1")
    mirror["metadata"]["annotations"] = {kn.MIRROR: "abc"}
    mirror["metadata"]["ownerReferences"] = [{"kind": "Node", "name": "n1", "controller": True}]
    ds = _pod("ds", "n1")
    ds["metadata"]["ownerReferences"] = [
        {"kind": "DaemonSet", "name": "plugin", "controller": True}
    ]
    bare = _pod("bare", "n1")
    del bare["metadata"]["ownerReferences"]
    not_controller = _pod("nc", "n1")
    not_controller["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "x"}]
    listing = kn.pods_by_node(FakeApi([mirror, ds, bare, not_controller]), keep=None)  # type: ignore[arg-type]
    by = {p.name: p for p in listing.refs["n1"]}
    assert by["m"].mirror and not by["m"].unmanaged
    assert by["ds"].daemonset
    assert by["bare"].unmanaged and by["nc"].unmanaged


def test_sparse_and_odd_shapes_decode_as_empty_not_as_errors() -> None:
    sparse = {"metadata": {"name": "s"}, "spec": {"nodeName": "n1", "containers": [{}]}}
    nulls = {
        "metadata": {"name": "z", "labels": None, "ownerReferences": None},
        "spec": {"nodeName": "n1", "containers": [{"resources": {"requests": None}}]},
        "status": {},
    }
    listing = kn.pods_by_node(FakeApi([sparse, nulls]), keep={"n1"})  # type: ignore[arg-type]
    assert [(p.name, p.cpu_millis, p.labels, p.unmanaged) for p in listing.refs["n1"]] == [
        ("s", 0, {}, True),
        ("z", 0, {}, True),
    ]
    assert listing.used.get("n1", Requests()) == Requests()


def _node(name: str, **status: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": name, "labels": {"pool": "gpu"}, "managedFields": MANAGED},
        "spec": {"taints": [{"key": "gpu", "effect": "NoSchedule"}]},
        "status": {
            "conditions": [
                {"type": "MemoryPressure", "status": "False"},
                {"type": "Ready", "status": "True"},
            ],
            "allocatable": {"cpu": "63500m", "memory": "250Gi", "nvidia.com/gpu": "8"},
            "capacity": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8"},
            "images": [{"names": ["registry.invalid/big:1"], "sizeBytes": 1 << 30}],
            **status,
        },
    }


def test_every_node_is_a_record_and_only_the_inventorys_are_objects() -> None:
    listed = [_node("n1"), _node("n2"), {"metadata": {"name": "bare"}}]
    infos, objects = kn.nodes_listed(FakeApi([], copy.deepcopy(listed)), keep={"n2"})  # type: ignore[arg-type]
    assert set(infos) == {"n1", "n2", "bare"}
    assert objects == {"n2": listed[1]}
    n1 = infos["n1"]
    assert n1.ready and not n1.unschedulable
    assert (n1.cpu_millis, n1.memory_bytes) == (63500, 250 << 30)
    assert n1.allocatable["nvidia.com/gpu"] == "8" and n1.capacity["cpu"] == "64"
    assert n1.taints == ({"key": "gpu", "effect": "NoSchedule"},)
    assert kn.to_node_info(listed[0]) == n1  # the whole object gives the same record
    assert not infos["bare"].ready and infos["bare"].cpu_millis == 0


def test_split_items_decodes_only_the_items_asked_for() -> None:
    body = json.dumps({"items": [{"a": 1}, {"b": [2, {"c": None}]}, {"d": "é"}]}).encode()
    assert briefs.split_items(body, {1, 2}) == {1: {"b": [2, {"c": None}]}, 2: {"d": "é"}}
    assert briefs.split_items(body, set()) == {}
