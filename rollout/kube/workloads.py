"""Read-only reads for the admission preview: Nodes and controllers as plain dicts (the pods
come from the one paginated listing, ``rollout.kube.nodes.pods_by_node``).

Why dicts: ``rollout.change.previewing`` is pure and reads objects as the API serves them
(camelCase),
so the client's models are serialized here and nothing else sees them.
"""

from __future__ import annotations

from typing import Any

from rollout.kube.client import Api, call


def _dicts(listing: dict[str, Any], kind: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = listing.get("items") or []
    if kind:
        for d in out:
            d["kind"] = kind
    return out


def node_objects(api: Api) -> dict[str, dict[str, Any]]:
    """Every Node by name (labels and taints are what the preview reads)."""
    return {d["metadata"]["name"]: d for d in _dicts(call("list nodes", api.core.list_node))}


def controller_objects(api: Api) -> list[dict[str, Any]]:
    """Deployments, StatefulSets, DaemonSets and ReplicaSets of every namespace."""
    return (
        _dicts(call("list Deployments", api.apps.list_deployment_for_all_namespaces), "Deployment")
        + _dicts(
            call("list StatefulSets", api.apps.list_stateful_set_for_all_namespaces), "StatefulSet"
        )
        + _dicts(call("list DaemonSets", api.apps.list_daemon_set_for_all_namespaces), "DaemonSet")
        + _dicts(
            call("list ReplicaSets", api.apps.list_replica_set_for_all_namespaces), "ReplicaSet"
        )
    )
