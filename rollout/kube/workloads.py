"""Read-only reads for the admission preview: Nodes, pods and controllers as plain dicts.

Why dicts: ``rollout.change.previewing`` is pure and reads objects as the API serves them
(camelCase),
so the client's models are serialized here and nothing else sees them.
"""

from __future__ import annotations

from typing import Any

from kubernetes import client

from rollout.kube.client import Api, call


def _dicts(api: Api, items: Any, kind: str = "") -> list[dict[str, Any]]:
    out = []
    for o in items:
        d: dict[str, Any] = api.api_client.sanitize_for_serialization(o)  # type: ignore[no-untyped-call]
        if kind:
            d["kind"] = kind
        out.append(d)
    return out


def node_objects(api: Api) -> dict[str, dict[str, Any]]:
    """Every Node by name (labels and taints are what the preview reads)."""
    return {
        d["metadata"]["name"]: d for d in _dicts(api, call("list nodes", api.core.list_node).items)
    }


def pod_objects(api: Api, node: str) -> list[dict[str, Any]]:
    """The pods bound to the node that have not finished, oldest first."""
    items = call(
        f"list pods on {node}",
        api.core.list_pod_for_all_namespaces,
        field_selector=f"spec.nodeName={node}",
    ).items
    pods = [
        d
        for d in _dicts(api, items)
        if (d.get("status") or {}).get("phase") not in ("Succeeded", "Failed")
    ]
    return sorted(pods, key=lambda d: str(d["metadata"].get("creationTimestamp") or ""))


def controller_objects(api: Api) -> list[dict[str, Any]]:
    """Deployments, StatefulSets, DaemonSets and ReplicaSets of every namespace."""
    apps = client.AppsV1Api(api.api_client)
    return (
        _dicts(
            api,
            call("list Deployments", apps.list_deployment_for_all_namespaces).items,
            "Deployment",
        )
        + _dicts(
            api,
            call("list StatefulSets", apps.list_stateful_set_for_all_namespaces).items,
            "StatefulSet",
        )
        + _dicts(
            api, call("list DaemonSets", apps.list_daemon_set_for_all_namespaces).items, "DaemonSet"
        )
        + _dicts(
            api,
            call("list ReplicaSets", apps.list_replica_set_for_all_namespaces).items,
            "ReplicaSet",
        )
    )
