"""One eviction: the Eviction API request and its outcome, named.

Why one request per call: the retry loop (capped backoff, timeout, naming the blocking pods)
belongs to ``rollout.change.engine.drain``, which owns the timers (kubernetes #117492). Here a 429
is an expected answer (a PodDisruptionBudget says not now), not a crash; a 500 (e.g. more than one
PDB selects the pod) is a misconfiguration and is raised with the API server's words. A 403 whose
cause is ``NamespaceTerminating`` (the pod's namespace is being deleted: the API server creates no
Eviction there) is retried like a 429, as ``kubectl drain`` does: the namespace controller deletes
the pod, and the next request answers 404.
"""

from __future__ import annotations

import json
from typing import Any

from rollout.errors import ExternalError
from rollout.kube.client import Api, call, describe
from rollout.kube.rest import AnswerError
from rollout.models import PodRef
from rollout.protocols import Eviction, EvictionResult


def evict(api: Api, pod: PodRef, grace_period_s: int | None) -> EvictionResult:
    """POST an Eviction for the pod (honours PodDisruptionBudgets).

    Raises:
        ExternalError: any answer other than 200/201, 404, 429 and a 403 for a terminating
            namespace (500: several PDBs).
    """
    body: dict[str, Any] = {
        "apiVersion": "policy/v1",
        "kind": "Eviction",
        "metadata": {"name": pod.name, "namespace": pod.namespace},
    }
    if grace_period_s is not None:
        body["deleteOptions"] = {"gracePeriodSeconds": grace_period_s}
    try:
        call(
            f"evict pod {pod.key}",
            api.core.create_namespaced_pod_eviction,
            pod.name,
            pod.namespace,
            body,
            retry_s=20.0,
        )
    except AnswerError as e:
        if e.status == 429:
            return EvictionResult(Eviction.BLOCKED, describe(e).split(" ", 1)[-1])
        if e.status == 404:
            return EvictionResult(Eviction.GONE)
        if e.status == 403 and _namespace_terminating(e):
            return EvictionResult(Eviction.BLOCKED, describe(e).split(" ", 1)[-1])
        raise ExternalError(f"eviction of pod {pod.key} refused: {describe(e)}") from e
    return EvictionResult(Eviction.EVICTED)


def _namespace_terminating(e: AnswerError) -> bool:
    """The Status carries the cause ``NamespaceTerminating`` (k8s.io/api core/v1)."""
    try:
        causes = (json.loads(e.body or "{}").get("details") or {}).get("causes") or []
    except (ValueError, AttributeError):
        return False
    return any(isinstance(c, dict) and c.get("type") == "NamespaceTerminating" for c in causes)


def delete(api: Api, pod: PodRef, grace_period_s: int | None) -> None:
    """DELETE the pod (``--disable-eviction`` only: bypasses PodDisruptionBudgets)."""
    try:
        call(
            f"delete pod {pod.key}",
            api.core.delete_namespaced_pod,
            pod.name,
            pod.namespace,
            grace_period_seconds=grace_period_s,
        )
    except AnswerError as e:
        if e.status != 404:
            raise ExternalError(f"delete pod {pod.key}: {describe(e)}") from e
