"""A migration's evidence across the move: each pod's DRA devices from the kubelet's podresources
(``dynamic_resources``, decoded by the role's client: ``tests/unit/test_podresources_client.py``)
beside the device plugin's IDs, a DRA device the
kubelet prepared for two claims failing ``unique-device-ids``, and ``gpus-served-once`` judging
each node's ``gpuPath`` (every GPU healthy before served after, once, through one path). The
lab test ``tests/lab/test_migration_evidence_lab.py`` proves it through the CLI."""

from __future__ import annotations

from typing import Any

from rollout.evidence.checks import (
    Collection,
    Status,
    build_collection,
    check_gpus_served_once,
    check_unique_devices,
    parse_collections,
)
from rollout.evidence.gpu_paths import expected_from, gpu_path, path_settings
from tests.unit.test_podresources_evidence import AGREE, NUMA, _podres

GPU = "nvidia.com/gpu"
S = {
    "driver": "gpu.example.com",
    "device_plugin_label": "dp",
    "dra_label": "dra",
    "resource": GPU,
}


def _dra_collection(devices: dict[str, list[str]]) -> tuple[dict[str, Any], Collection]:
    """A node whose pods ``a`` and ``b`` each hold the DRA devices named (claim ``ml/<pod>``),
    as the kubelet's podresources reports them."""
    podres = _podres({}, [])
    podres["pods"] = [
        {
            "name": n,
            "namespace": "ml",
            "containers": [
                {
                    "name": "app",
                    "devices": [],
                    "cpuIds": [],
                    "memory": [],
                    "dynamicResources": [
                        {
                            "claimName": n,
                            "claimNamespace": "ml",
                            "claimResources": [
                                {"driverName": "gpu.example.com", "poolName": "n1", "deviceName": d}
                                for d in devs
                            ],
                        }
                    ],
                }
            ],
        }
        for n, devs in devices.items()
    ]
    facts = {"n1": {"numaNodes": NUMA, "checkpoints": {}, "podResources": podres}}
    pods = {
        "n1": [
            {"namespace": "ml", "name": n, "uid": f"uid-{n}", "qos": "BestEffort", "running": True}
            for n in devices
        ]
    }
    col = build_collection(
        "after", "t", facts, {"n1": {GPU: "0"}}, pods, {"n1": {}}, capacity={"n1": {}}
    )
    (parsed,) = parse_collections({"collections": [col]})
    return col["nodes"]["n1"], parsed


def test_each_pods_dra_devices_come_from_podresources_and_one_held_twice_fails() -> None:
    node, parsed = _dra_collection({"a": ["gpu-0"], "b": ["gpu-1"]})
    pods = {p["name"]: p for p in node["pods"]}
    assert pods["a"]["podResourcesDra"] == {"ml/a": ["gpu.example.com/n1/gpu-0"]}
    check = check_unique_devices(parsed)
    assert check.status is Status.PASS and check.checked == 2, check
    _, parsed = _dra_collection({"a": ["gpu-0"], "b": ["gpu-0"]})
    check = check_unique_devices(parsed)
    assert check.status is Status.FAIL
    assert check.problems == (
        "n1: DRA device gpu.example.com/n1/gpu-0 prepared by the kubelet for 2 claims "
        "(podresources): ml/a, ml/b",
    )


def test_device_plugin_ids_before_and_dra_devices_after_are_both_kept() -> None:
    from tests.unit.test_podresources_evidence import _collect

    before, _ = _collect(_podres(AGREE, ["GPU-0", "GPU-1", "GPU-4"]))
    assert {p["name"]: p["devices"] for p in before["pods"]} == {
        "a": {GPU: ["GPU-0"]},
        "b": {GPU: ["GPU-4"]},
    }
    assert not any(p.get("podResourcesDra") for p in before["pods"])


def _served(label: str, **g: Any) -> Collection:
    base = {"resource": GPU, "driver": "gpu.example.com", "path": "dra", "allocatable": 0}
    return Collection(label, nodes={"n1": {"gpuPath": {**base, **g}}})


def test_every_healthy_gpu_is_served_after_once_through_one_path() -> None:
    ok = check_gpus_served_once(_served("after", sliceDevices=["gpu-0", "gpu-1"], expected=2))
    assert ok.status is Status.PASS, ok
    assert ok.notes == ("n1: 2 nvidia.com/gpu through the dra path (expected 2): gpu-0, gpu-1",)
    cases = {
        "n1: nvidia.com/gpu served through both paths: allocatable 2 and 2 device(s) in "
        "gpu.example.com's ResourceSlices": {"allocatable": 2, "sliceDevices": ["gpu-0", "gpu-1"]},
        "n1: 1 nvidia.com/gpu served through the dra path, 2 healthy before": {
            "sliceDevices": ["gpu-0"],
            "expected": 2,
        },
        "n1: device(s) gpu-0 listed twice in the slices": {
            "sliceDevices": ["gpu-0", "gpu-0", "gpu-1"],
        },
        "n1: served by the device-plugin path, its labels select dra": {"allocatable": 2},
    }
    for problem, g in cases.items():
        c = check_gpus_served_once(_served("after", **g))
        assert c.status is Status.FAIL and problem in c.problems, (problem, c)
    plain = check_gpus_served_once(Collection("after", nodes={"n1": {}}))
    assert plain.status is Status.NOT_JUDGED  # a kubelet-config change's collection
    missing = Collection("after", nodes={"n1": {"gpuPathProblem": "cannot read: 403"}})
    assert check_gpus_served_once(missing).status is Status.NOT_COLLECTED


def test_the_gpu_path_of_a_node_and_the_count_it_served_before() -> None:
    g = gpu_path({"dp": "false", "dra": "true"}, {GPU: "0"}, ["gpu-1", "gpu-0"], S)
    assert g == {
        "resource": GPU,
        "driver": "gpu.example.com",
        "path": "dra",
        "allocatable": 0,
        "sliceDevices": ["gpu-0", "gpu-1"],
        "served": 2,
    }
    before = gpu_path({"dp": "true"}, {GPU: "8"}, [], S)
    assert before["path"] == "device-plugin" and before["served"] == 8
    doc = {"collections": [{"label": "before", "nodes": {"n1": {"gpuPath": before}}}]}
    assert expected_from(doc, "n1") == 8 and expected_from(doc, "n2") is None
    records = {"n1": {"target": "dra", "settings": S}, "n2": {}}
    assert path_settings(records) == S
    assert path_settings({"n1": {"files": []}}) is None  # a kubelet-config change
