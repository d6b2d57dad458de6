"""What the evidence report needs from the API server: each node's pods with their QoS class
and their containers' runtime IDs.

Read-only (pods list with a field selector on the node: the same RBAC as the drain).
"""

from __future__ import annotations

from typing import Any

from rollout.kube.client import Api
from rollout.kube.nodes import pod_objects_on


def evidence_pods(api: Api, node: str) -> list[dict[str, Any]]:
    """The pods bound to ``node``: namespace, name, uid, qos, running, and ``containerIds``
    (container name -> the runtime's ID, without its ``containerd://`` scheme) where the status
    names them (the evidence finds each container's cgroup by it)."""
    out = []
    for p in pod_objects_on(api, node):
        meta, status = p.get("metadata") or {}, p.get("status") or {}
        pod: dict[str, Any] = {
            "namespace": meta.get("namespace") or "",
            "name": meta.get("name") or "",
            "uid": meta.get("uid") or "",
            "qos": status.get("qosClass") or "",
            "running": status.get("phase") == "Running",
        }
        ids = {
            str(c.get("name")): str(c["containerID"]).partition("://")[2] or str(c["containerID"])
            for key in ("initContainerStatuses", "containerStatuses")
            for c in status.get(key) or ()
            if isinstance(c, dict) and c.get("containerID")
        }
        if ids:
            pod["containerIds"] = ids
        out.append(pod)
    return out
