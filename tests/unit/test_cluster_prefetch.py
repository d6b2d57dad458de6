"""Preflight's API reads that do not depend on the nodes' facts run while the facts are gathered
(``ClusterReader.prefetch``); each prefetched answer is used once, later reads go to the API
server again, and a failed prefetch leaves every read to the real call (which raises it)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.change.preparing import ClusterReader
from rollout.models import NodeInfo


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

    def list_nodes(self, api: Any) -> dict[str, NodeInfo]:
        self.calls.append("nodes")
        if self.fail:
            raise RuntimeError("API server away")
        return {"n1": NodeInfo("n1"), "n2": NodeInfo("n2")}

    def pods_on_node(self, api: Any, node: str) -> list[Any]:
        self.calls.append(f"pods {node}")
        return []

    def list_pdbs(self, api: Any) -> list[Any]:
        self.calls.append("pdbs")
        return []

    def dra_drivers_by_node(self, api: Any, versions: list[str]) -> dict[str, list[str]]:
        self.calls.append("dra")
        return {}


@pytest.fixture(autouse=True)
def _workloads(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout.kube import workloads

    monkeypatch.setattr(workloads, "node_objects", lambda api: {"n1": {}})
    monkeypatch.setattr(workloads, "controller_objects", lambda api: [])


def test_prefetched_answers_are_used_once() -> None:
    reader = ClusterReader(api=None)
    fake = FakeKn()
    reader._kn = fake  # type: ignore[assignment]
    reader.prefetch()
    assert set(fake.calls) >= {"version", "nodes", "pdbs", "dra", "pods n1", "pods n2"}
    fake.calls.clear()
    assert reader.version() == "v1.36.3" and set(reader.nodes()) == {"n1", "n2"}
    assert reader.pods("n1") == [] and reader.pdbs() == [] and reader.dra(["v1"]) == {}
    assert fake.calls == []  # all served from the prefetch
    reader.nodes()
    reader.pods("n1")
    assert fake.calls == ["nodes", "pods n1"]  # a second read goes to the API server


def test_a_failed_prefetch_leaves_the_reads_to_the_real_calls() -> None:
    reader = ClusterReader(api=None)
    fake = FakeKn(fail=True)
    reader._kn = fake  # type: ignore[assignment]
    reader.prefetch()  # does not raise
    fake.calls.clear()
    assert reader.version() == "v1.36.3"
    with pytest.raises(RuntimeError, match="API server away"):
        reader.nodes()
    assert fake.calls == ["version", "nodes"]
