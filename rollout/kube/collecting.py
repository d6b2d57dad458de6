"""What the evidence report needs from the API server: each node's pods with their QoS class.

Read-only (pods list with a field selector on the node: the same RBAC as the drain).
"""

from __future__ import annotations

from typing import Any

from rollout.kube.client import Api, call


def evidence_pods(api: Api, node: str) -> list[dict[str, Any]]:
    """The pods bound to ``node``: namespace, name, uid, qos, running."""
    items: list[Any] = call(
        f"list pods on {node}",
        api.core.list_pod_for_all_namespaces,
        field_selector=f"spec.nodeName={node}",
    ).items
    out = []
    for p in items:
        status = p.status
        out.append(
            {
                "namespace": p.metadata.namespace,
                "name": p.metadata.name,
                "uid": p.metadata.uid or "",
                "qos": (status.qos_class if status else None) or "",
                "running": bool(status and status.phase == "Running"),
            }
        )
    return out
