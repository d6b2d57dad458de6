"""The kubelet's own endpoints through the API server's node proxy.

Why the node proxy: it is how an operator (and this tool) sees what the *running* kubelet uses,
with the cluster's own authentication, without reaching node ports directly: ``/configz`` for the
effective configuration, ``/healthz``, and ``/metrics`` (for the rejection-rate gate).
"""

from __future__ import annotations

import json
from typing import Any

from rollout.errors import ExternalError
from rollout.kube.client import Api, call
from rollout.kube.rest import AnswerError


def get(api: Api, node: str, path: str, retry_s: float = 10.0) -> tuple[int, bytes]:
    """GET ``/api/v1/nodes/<node>/proxy/<path>``; return status and raw body."""
    try:
        return call(
            f"GET node {node} proxy /{path}",
            api.core.connect_get_node_proxy_with_path,
            node,
            path,
            retry_s=retry_s,
        )
    except AnswerError as e:
        return e.status, (e.body or "").encode() if isinstance(e.body, str) else (e.body or b"")


def healthz(api: Api, node: str) -> bool:
    """Whether the kubelet answers ``ok`` on ``/healthz`` (any failure: False)."""
    try:
        status, body = get(api, node, "healthz", retry_s=2.0)
    except ExternalError:
        return False
    return status == 200 and body.strip() == b"ok"


def configz(api: Api, node: str) -> dict[str, Any]:
    """The running kubelet's ``/configz`` body.

    Raises:
        ExternalError: not reachable or not JSON.
    """
    status, body = get(api, node, "configz")
    if status != 200:
        raise ExternalError(f"node {node} /configz answered {status}: {body[:200]!r}")
    try:
        data = json.loads(body)
    except ValueError as e:
        raise ExternalError(f"node {node} /configz is not JSON: {e}") from e
    if not isinstance(data, dict):
        raise ExternalError(f"node {node} /configz is not an object")
    return data


def metrics(api: Api, node: str) -> str:
    """The kubelet's ``/metrics`` text.

    Raises:
        ExternalError: not reachable.
    """
    status, body = get(api, node, "metrics")
    if status != 200:
        raise ExternalError(f"node {node} /metrics answered {status}")
    return body.decode("utf-8", "replace")
