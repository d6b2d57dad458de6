"""Read-only reads for the admission preview: Nodes and controllers as plain dicts (the pods
come from the one paginated listing, ``rollout.kube.nodes.pods_by_node``).

Why dicts: ``rollout.change.previewing`` is pure and reads objects as the API serves them
(camelCase),
so the client's models are serialized here and nothing else sees them.
"""

from __future__ import annotations

from typing import Any

from rollout.kube.client import Api, call
from rollout.kube.nodes import pod_objects_on
from rollout.kube.watching import owner_of
from rollout.samples import is_admission_reason


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
    """Deployments, StatefulSets, DaemonSets and ReplicaSets of every namespace.

    The ReplicaSets come as metadata only: a Deployment's ReplicaSet serves to name the
    Deployment (its ``ownerReferences``), and the Deployment carries the pod template. Only when
    some ReplicaSet has no Deployment over it (its own template is then a workload of its own)
    are they listed again in full.
    """
    replica_sets = _dicts(
        call(
            "list ReplicaSets (metadata)",
            api.apps.list_replica_set_for_all_namespaces,
            metadata_only=True,
        ),
        "ReplicaSet",
    )
    if any(
        not (owner_of(r.get("metadata") or {}) or "").startswith("Deployment/")
        for r in replica_sets
    ):
        replica_sets = _dicts(
            call("list ReplicaSets", api.apps.list_replica_set_for_all_namespaces), "ReplicaSet"
        )
    return (
        _dicts(call("list Deployments", api.apps.list_deployment_for_all_namespaces), "Deployment")
        + _dicts(
            call("list StatefulSets", api.apps.list_stateful_set_for_all_namespaces), "StatefulSet"
        )
        + _dicts(call("list DaemonSets", api.apps.list_daemon_set_for_all_namespaces), "DaemonSet")
        + replica_sets
    )


def owner_runs(owner: str, pods: list[dict[str, Any]]) -> bool:
    """Whether one of ``pods`` (JSON) belongs to ``owner`` (``Kind/namespace/name`` of its
    controller, as the gate names it) and is Running, not being deleted (pure)."""
    return any(
        owner_of(p.get("metadata") or {}) == owner
        and (p.get("status") or {}).get("phase") == "Running"
        and not (p.get("metadata") or {}).get("deletionTimestamp")
        for p in pods
    )


def owner_running(api: Api, owner: str) -> bool:
    """Whether the controller ``owner`` (``Kind/namespace/name``) has a pod Running now."""
    return owner_runs(owner, owner_pods(api, owner))


def owner_pods(api: Api, owner: str) -> list[dict[str, Any]]:
    """Every pod (JSON, any phase, on any node) whose controller is ``owner``
    (``Kind/namespace/name``); none for a malformed name."""
    namespace = owner.split("/")[1] if owner.count("/") == 2 else ""
    if not namespace:
        return []
    listing = call(
        f"list pods of {owner}",
        api.core.list_pod_for_all_namespaces,
        field_selector=f"metadata.namespace={namespace}",
    )
    return [p for p in listing.get("items") or [] if owner_of(p.get("metadata") or {}) == owner]


def rejected_owners_in(pods: list[dict[str, Any]], since: float) -> list[str]:
    """The controllers of the pods (JSON) the kubelet rejected at admission (phase Failed, an
    admission reason) that were created at or after ``since`` (pure)."""
    from datetime import datetime

    out = set()
    for p in pods:
        status = p.get("status") or {}
        if status.get("phase") != "Failed" or not is_admission_reason(status.get("reason")):
            continue
        meta = p.get("metadata") or {}
        created = str(meta.get("creationTimestamp") or "")
        try:
            when = datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp()
        except ValueError:
            continue
        if when >= since and (owner := owner_of(meta)) is not None:
            out.add(owner)
    return sorted(out)


def rejected_owners_on(api: Api, nodes: list[str], since: float) -> list[str]:
    """The controllers whose pods the kubelets of ``nodes`` rejected since ``since``."""
    return sorted({o for n in nodes for o in rejected_owners_in(pod_objects_on(api, n), since)})
