"""The admission preview's controllers: ReplicaSets as metadata only, in full only when one has
no Deployment over it (``rollout.kube.workloads.controller_objects``). The real API server's
answer to the metadata-only listing is checked in ``tests/lab/test_kwok_lab.py``."""

from __future__ import annotations

import json
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
        self.deployments: list[dict[str, Any]] = [{"metadata": {"name": "web", "namespace": "ml"}}]
        self.calls: list[str] = []

    def _answer(self, what: str, items: list[dict[str, Any]], raw: bool) -> Any:
        """The listing as the REST layer answers it: bytes with ``_raw``, else parsed."""
        self.calls.append(what)
        listing = {"items": [dict(i) for i in items]}
        return json.dumps(listing).encode() if raw else listing

    def list_deployment_for_all_namespaces(self, _raw: bool = False, **kw: Any) -> Any:
        return self._answer("deployments", self.deployments, _raw)

    def list_stateful_set_for_all_namespaces(self, _raw: bool = False, **kw: Any) -> Any:
        return self._answer("statefulsets", [], _raw)

    def list_daemon_set_for_all_namespaces(self, _raw: bool = False, **kw: Any) -> Any:
        return self._answer("daemonsets", [], _raw)

    def list_replica_set_for_all_namespaces(
        self, metadata_only: bool = False, _raw: bool = False, **kw: Any
    ) -> Any:
        items = self.replica_sets
        if not metadata_only:
            items = [{**r, "spec": {"template": {"spec": {}}}} for r in items]
        what = "replicasets (metadata)" if metadata_only else "replicasets"
        return self._answer(what, items, _raw)


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


def _deployment(name: str, selector: dict[str, str]) -> dict[str, Any]:
    template = {
        "metadata": {"labels": {"app": name}},
        "spec": {
            "nodeSelector": selector,
            "containers": [{"name": "c", "resources": {"requests": {"cpu": "2"}}}],
        },
    }
    return {
        "metadata": {"name": name, "namespace": "ml", "managedFields": [{"manager": "x"}]},
        "spec": {"replicas": 1, "template": template},
        "status": {"replicas": 1},
    }


def test_only_the_controllers_whose_pods_land_where_wanted_come_back_whole() -> None:
    """The preview judges the templates that land on the change's Nodes; every other
    controller comes back as its name and owners, which still resolve a pod's workload."""
    owned = [
        {
            "metadata": {
                "name": f"{d}-1",
                "namespace": "ml",
                "ownerReferences": [{"kind": "Deployment", "name": d, "controller": True}],
            }
        }
        for d in ("gpu", "other")
    ]
    api = FakeApi(owned)
    api.apps.deployments = [
        _deployment("gpu", {"pool": "gpu"}),
        _deployment("other", {"pool": "cpu"}),
    ]
    seen: list[dict[str, Any]] = []

    def wanted(placement: dict[str, Any]) -> bool:
        seen.append(placement)
        return bool(placement.get("nodeSelector") == {"pool": "gpu"})

    objects = controller_objects(api, wanted)  # type: ignore[arg-type]
    assert {"nodeSelector": {"pool": "cpu"}} in seen
    by_name = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Deployment"}
    assert by_name["gpu"] == {**_deployment("gpu", {"pool": "gpu"}), "kind": "Deployment"}
    assert by_name["other"] == {
        "kind": "Deployment",
        "metadata": {"name": "other", "namespace": "ml"},
    }
    from rollout.kubelet.admission.node_preview import workload_of

    pod = {
        "metadata": {
            "namespace": "ml",
            "ownerReferences": [{"kind": "ReplicaSet", "name": "other-1", "controller": True}],
        }
    }
    assert workload_of(pod, objects) == "Deployment/ml/other"
