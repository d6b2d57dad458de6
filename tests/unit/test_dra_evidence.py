"""DRA devices in ``unique-device-ids``: claims from their status, matched to the nodes' pods by
uid (``rollout/evidence/dra.py``)."""

from __future__ import annotations

from typing import Any

from rollout.evidence.checks import Collection, Status, check_unique_devices
from rollout.evidence.dra import claims_by_node, dra_owners

DRIVER = "gpu.example.com"


def claim(name: str, devices: list[str], users: list[str], share: str | None = None) -> Any:
    results = [
        {"request": "gpu", "driver": DRIVER, "pool": "pool-a", "device": d}
        | ({"shareID": share} if share else {})
        for d in devices
    ]
    return {
        "metadata": {"namespace": "ml", "name": name},
        "status": {
            "allocation": {"devices": {"results": results}},
            "reservedFor": [{"resource": "pods", "name": u, "uid": f"uid-{u}"} for u in users],
        },
    }


def pods(**by_node: list[str]) -> dict[str, list[dict[str, Any]]]:
    return {
        n: [{"namespace": "ml", "name": p, "uid": f"uid-{p}", "running": True} for p in ps]
        for n, ps in by_node.items()
    }


def collection(claims: list[Any], on: dict[str, list[dict[str, Any]]]) -> Collection:
    return Collection(
        "after", nodes={n: {"draClaims": cs} for n, cs in claims_by_node(claims, on).items()}
    )


def test_claims_are_placed_on_the_nodes_of_the_pods_that_reserve_them() -> None:
    got = claims_by_node(
        [claim("a", ["gpu-0"], ["p1"]), claim("b", ["gpu-1"], ["p9"]), {"metadata": {}}],
        pods(n1=["p1"], n2=["p2"]),
    )
    assert got["n2"] == []  # p9 is on no collected node; an unallocated claim is skipped
    assert got["n1"] == [
        {
            "claim": "ml/a",
            "pods": ["ml/p1"],
            "devices": [
                {"request": "gpu", "driver": DRIVER, "pool": "pool-a", "device": "gpu-0",
                 "shareID": None}
            ],
        }
    ]  # fmt: skip


def test_one_device_in_two_claims_fails_naming_device_claims_and_pods() -> None:
    c = collection(
        [claim("a", ["gpu-0"], ["p1"]), claim("b", ["gpu-0"], ["p2"])], pods(n1=["p1"], n2=["p2"])
    )
    check = check_unique_devices(c)
    assert check.status is Status.FAIL, check
    assert check.problems == (
        f"DRA device {DRIVER}/pool-a/gpu-0 allocated to 2 claims: "
        "n1: ml/a (ml/p1); n2: ml/b (ml/p2)",
    )


def test_one_claim_shared_by_pods_and_devices_shared_by_share_id_pass() -> None:
    c = collection(
        [
            claim("shared", ["gpu-0"], ["p1", "p2"]),
            claim("s1", ["gpu-1"], ["p3"], share="aaaa"),
            claim("s2", ["gpu-1"], ["p4"], share="bbbb"),
        ],
        pods(n1=["p1", "p3"], n2=["p2", "p4"]),
    )
    check = check_unique_devices(c)
    assert check.status is Status.PASS, check
    assert check.checked == 3
    assert set(dra_owners(c.nodes)) == {
        f"{DRIVER}/pool-a/gpu-0",
        f"{DRIVER}/pool-a/gpu-1#aaaa",
        f"{DRIVER}/pool-a/gpu-1#bbbb",
    }


def test_no_claims_and_no_checkpoint_is_not_collected_never_a_pass() -> None:
    c = collection([], pods(n1=["p1"]))
    assert check_unique_devices(c).status is Status.NOT_COLLECTED


def test_plugin_and_dra_duplicates_are_both_reported() -> None:
    c = collection([claim("a", ["gpu-0"], ["p1"]), claim("b", ["gpu-0"], ["p1"])], pods(n1=["p1"]))
    node = dict(c.nodes["n1"])
    node["podResources"] = True
    node["pods"] = [
        {"namespace": "ml", "name": "x", "running": True, "devices": {"nvidia.com/gpu": ["G1"]}},
        {"namespace": "ml", "name": "y", "running": True, "devices": {"nvidia.com/gpu": ["G1"]}},
    ]
    check = check_unique_devices(Collection("after", nodes={"n1": node}))
    assert check.status is Status.FAIL
    assert len(check.problems) == 2, check.problems
    assert check.problems[0] == "n1: nvidia.com/gpu G1 assigned to ml/x, ml/y"
