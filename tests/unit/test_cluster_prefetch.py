"""Preflight's API reads that do not depend on the nodes' facts run while the facts are gathered
(``ClusterReader.prefetch``); each prefetched answer is used once, later reads go to the API
server again, and a failed prefetch leaves every read to the real call (which raises it)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.change.preflight.checking import ClusterReader
from rollout.models import NodeInfo, PodListing, PodRef, Requests, ServingReads


class FakeKn:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[str] = []
        self.fail = fail

    def server_version(self, api: Any) -> str:
        self.calls.append("version")
        return "v1.36.3"

    def resource_api_versions(self, api: Any) -> list[str]:
        self.calls.append("resource_versions")
        return ["v1"]

    def nodes_listed(
        self, api: Any, keep: Any = None
    ) -> tuple[dict[str, NodeInfo], dict[str, dict[str, Any]]]:
        self.calls.append("nodes")
        if self.fail:
            raise RuntimeError("API server away")
        return (
            {"n1": NodeInfo("n1"), "n2": NodeInfo("n2")},
            {n: {"metadata": {"name": n}} for n in ("n1", "n2") if not keep or n in keep},
        )

    def pods_by_node(self, api: Any, keep: Any = None) -> PodListing:
        self.calls.append("pods")
        kept = [n for n in ("n1", "n2") if not keep or n in keep]
        return PodListing(
            refs={n: [PodRef("ns", f"p-{n}", n)] for n in kept},
            objects={n: [{"metadata": {"name": f"p-{n}"}}] for n in kept},
            used={n: Requests(cpu_millis=100) for n in ("n1", "n2")},
        )

    def list_pdbs(self, api: Any) -> list[Any]:
        self.calls.append("pdbs")
        return []

    def dra_drivers_by_node(self, api: Any, versions: list[str]) -> dict[str, list[str]]:
        self.calls.append("dra")
        return {}

    def device_class_objects(self, api: Any, versions: list[str]) -> list[dict[str, Any]]:
        self.calls.append("deviceclasses")
        return []


class FakeWorkloads:
    """The preview's reads (``rollout.kube.workloads``), recording into the same call list."""

    def __init__(self, kn: FakeKn) -> None:
        self.kn = kn

    def controller_objects(self, api: Any, wanted: Any = None) -> list[dict[str, Any]]:
        self.kn.calls.append("controllers")
        return []


class FakeCanaries:
    """The model-serving canaries' reads (``rollout.kube.canaries``), into the same call list."""

    def __init__(self, kn: FakeKn) -> None:
        self.kn = kn

    def serving_reads(self, api: Any) -> ServingReads:
        self.kn.calls.append("serving")
        return ServingReads()


def _reader(fake: FakeKn, nodes: Any = None) -> ClusterReader:
    reader = ClusterReader(api=None, nodes=nodes)
    reader._kn = fake  # type: ignore[assignment]
    reader._wl = FakeWorkloads(fake)  # type: ignore[assignment]
    reader._sv = FakeCanaries(fake)  # type: ignore[assignment]
    return reader


def test_prefetched_answers_are_used_once() -> None:
    fake = FakeKn()
    reader = _reader(fake)
    reader.prefetch()
    assert set(fake.calls) >= {
        "version",
        "nodes",
        "pdbs",
        "dra",
        "deviceclasses",
        "pods",
        "serving",
    }
    # one listing of the Nodes and one of the cluster's pods serve the checks and the preview
    assert fake.calls.count("nodes") == 1 and fake.calls.count("pods") == 1
    fake.calls.clear()
    assert reader.version() == "v1.36.3" and set(reader.nodes()) == {"n1", "n2"}
    listing = reader.pod_listing()
    assert listing.refs["n1"] == [PodRef("ns", "p-n1", "n1")]
    assert listing.objects["n1"] == [{"metadata": {"name": "p-n1"}}]
    assert reader.pdbs() == [] and reader.dra(["v1"]) == {}
    assert reader.device_classes(["v1"]) == []
    objects_of_nodes = reader.node_objects()
    assert set(objects_of_nodes) == {"n1", "n2"}
    assert reader.controllers(objects_of_nodes) == []
    assert reader.serving() == ServingReads()
    assert fake.calls == []  # all served from the prefetch
    reader.nodes()
    reader.pod_listing()
    assert fake.calls == ["nodes", "pods"]  # a second read goes to the API server


def test_only_the_inventorys_nodes_keep_their_pod_objects() -> None:
    fake = FakeKn()
    reader = _reader(fake, nodes=["n2"])
    listing = reader.pod_listing()
    assert set(listing.used) == {"n1", "n2"}  # every node's requests: the capacity check
    assert set(listing.refs) == set(listing.objects) == {"n2"}


def test_a_failed_prefetch_leaves_the_reads_to_the_real_calls() -> None:
    fake = FakeKn(fail=True)
    reader = _reader(fake)
    reader.prefetch()  # does not raise
    fake.calls.clear()
    assert reader.version() == "v1.36.3"
    with pytest.raises(RuntimeError, match="API server away"):
        reader.nodes()
    assert fake.calls == ["version", "nodes"]
