"""The admission preview's controllers: ReplicaSets as metadata only, in full only when one has
no Deployment over it (``rollout.kube.workloads.controller_objects``). The real API server's
answer to the metadata-only listing is checked in ``tests/lab/test_kwok_lab.py``."""

from __future__ import annotations

from typing import Any

from rollout.kube.workloads import controller_objects


def _rs(name: str, owner: str | None) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "namespace": "ml"}
    if owner:
        meta["ownerReferences"] = [{"kind": owner, "name": "web", "controller": True}]
    return {"metadata": meta}


class FakeApps:
    def __init__(self, replica_sets: list[dict[str, Any]]) -> None:
        self.replica_sets = replica_sets
        self.calls: list[str] = []

    def _answer(self, what: str, items: list[dict[str, Any]]) -> dict[str, Any]:
        self.calls.append(what)
        return {"items": [dict(i) for i in items]}

    def list_deployment_for_all_namespaces(self, **kw: Any) -> dict[str, Any]:
        return self._answer("deployments", [{"metadata": {"name": "web", "namespace": "ml"}}])

    def list_stateful_set_for_all_namespaces(self, **kw: Any) -> dict[str, Any]:
        return self._answer("statefulsets", [])

    def list_daemon_set_for_all_namespaces(self, **kw: Any) -> dict[str, Any]:
        return self._answer("daemonsets", [])

    def list_replica_set_for_all_namespaces(
        self, metadata_only: bool = False, **kw: Any
    ) -> dict[str, Any]:
        items = self.replica_sets
        if not metadata_only:
            items = [{**r, "spec": {"template": {"spec": {}}}} for r in items]
        return self._answer("replicasets (metadata)" if metadata_only else "replicasets", items)


class FakeApi:
    def __init__(self, replica_sets: list[dict[str, Any]]) -> None:
        self.apps = FakeApps(replica_sets)


def test_replica_sets_of_deployments_are_listed_as_metadata_only() -> None:
    api = FakeApi([_rs("web-1", "Deployment"), _rs("web-2", "Deployment")])
    objects = controller_objects(api)  # type: ignore[arg-type]
    assert "replicasets" not in api.apps.calls
    assert api.apps.calls.count("replicasets (metadata)") == 1
    rs = [o for o in objects if o["kind"] == "ReplicaSet"]
    assert [o["metadata"]["name"] for o in rs] == ["web-1", "web-2"]
    assert all("spec" not in o for o in rs)


def test_a_replica_set_of_its_own_brings_the_full_listing() -> None:
    """A ReplicaSet no Deployment owns is a workload: its pod template is needed."""
    api = FakeApi([_rs("web-1", "Deployment"), _rs("bare", None)])
    objects = controller_objects(api)  # type: ignore[arg-type]
    assert api.apps.calls.count("replicasets") == 1
    rs = {o["metadata"]["name"]: o for o in objects if o["kind"] == "ReplicaSet"}
    assert set(rs) == {"web-1", "bare"} and all("spec" in o for o in rs.values())
