"""Read-only reads for the admission preview: controllers as plain dicts (the Nodes and pods
come from the listings in ``rollout.kube.nodes``: ``nodes_listed``, ``pods_by_node``).

Why dicts: ``rollout.kubelet.admission.node_preview`` is pure and reads objects as the API serves
them (camelCase),
so the client's models are serialized here and nothing else sees them.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rollout.kube import briefs
from rollout.kube.client import Api, call
from rollout.kube.nodes import pod_objects_on
from rollout.kube.watching import owner_of
from rollout.samples import is_admission_reason

Placement = Callable[[dict[str, Any]], bool]
"""Whether a pod template's placement (``nodeName``, ``nodeSelector``, ``affinity``,
``tolerations``) lets its pods onto a Node the caller cares about."""


def _controllers(body: bytes, kind: str, wanted: Placement | None) -> list[dict[str, Any]]:
    """A listing's controllers: whole (``kind`` set) where ``wanted`` takes the template's
    placement (every one when None); the others as their metadata alone (kind, name,
    namespace, owners), decoded without the rest (:mod:`rollout.kube.briefs`)."""
    items = briefs.controller_list.decode(body).items or []
    whole = {i for i, c in enumerate(items) if wanted is None or wanted(briefs.placement(c))}
    full = briefs.split_items(body, whole)
    out = [
        full.get(i) or {"metadata": briefs.metadata_dict(c.metadata)} for i, c in enumerate(items)
    ]
    for d in out:
        d["kind"] = kind
    return out


def controller_objects(api: Api, wanted: Placement | None = None) -> list[dict[str, Any]]:
    """Deployments, StatefulSets, DaemonSets and ReplicaSets of every namespace.

    ``wanted``: the pod placements the caller reads whole (the admission preview: those that
    land on a Node of the change); a controller whose template it refuses comes back as its
    metadata alone, which still resolves owners (a pod's ReplicaSet to its Deployment). Why: a
    cluster of thousands of Nodes has thousands of controllers, and preflight decoded every
    template whole (``docs/scale.md``).

    The ReplicaSets come as metadata only: a Deployment's ReplicaSet serves to name the
    Deployment (its ``ownerReferences``), and the Deployment carries the pod template. Only when
    some ReplicaSet has no Deployment over it (its own template is then a workload of its own)
    are they listed again in full.
    """
    metadata = briefs.controller_list.decode(
        call(
            "list ReplicaSets (metadata)",
            api.apps.list_replica_set_for_all_namespaces,
            metadata_only=True,
            _raw=True,
        )
    )
    replica_sets: list[dict[str, Any]] = [
        {"kind": "ReplicaSet", "metadata": briefs.metadata_dict(r.metadata)}
        for r in metadata.items or ()
    ]
    if any(not (owner_of(r["metadata"]) or "").startswith("Deployment/") for r in replica_sets):
        replica_sets = _controllers(
            call("list ReplicaSets", api.apps.list_replica_set_for_all_namespaces, _raw=True),
            "ReplicaSet",
            wanted,
        )
    return (
        _controllers(
            call("list Deployments", api.apps.list_deployment_for_all_namespaces, _raw=True),
            "Deployment",
            wanted,
        )
        + _controllers(
            call("list StatefulSets", api.apps.list_stateful_set_for_all_namespaces, _raw=True),
            "StatefulSet",
            wanted,
        )
        + _controllers(
            call("list DaemonSets", api.apps.list_daemon_set_for_all_namespaces, _raw=True),
            "DaemonSet",
            wanted,
        )
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


def pending_pods(api: Api, namespace: str) -> list[dict[str, Any]]:
    """The Pending pods of ``namespace`` (JSON), those being deleted left out."""
    listing = call(
        f"list Pending pods of {namespace}",
        api.core.list_pod_for_all_namespaces,
        field_selector=f"metadata.namespace={namespace},status.phase=Pending",
    )
    return [
        p
        for p in listing.get("items") or []
        if not (p.get("metadata") or {}).get("deletionTimestamp")
    ]


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
