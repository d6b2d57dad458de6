"""One eviction's answers (rollout/kube/evicting.py): a 403 because the pod's namespace is being
deleted is retried as kubectl drain retries it, any other 403 is refused with the API server's
words."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollout.errors import ExternalError
from rollout.kube.evicting import evict
from rollout.kube.rest import AnswerError
from rollout.models import PodRef
from rollout.protocols import Eviction

TERMINATING = {
    "kind": "Status",
    "status": "Failure",
    "message": 'pods "web-1" is forbidden: unable to create new content in namespace shop '
    "because it is being terminated",
    "reason": "Forbidden",
    "details": {
        "name": "web-1",
        "kind": "pods",
        "causes": [
            {
                "reason": "NamespaceTerminating",
                "message": "namespace shop is being terminated",
                "field": "metadata.namespace",
                "type": "NamespaceTerminating",
            }
        ],
    },
    "code": 403,
}


class Core:
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        self.status, self.body = status, body

    def create_namespaced_pod_eviction(self, *args: Any, **kwargs: Any) -> Any:
        raise AnswerError(self.status, "Forbidden", json.dumps(self.body))


class Api:
    def __init__(self, core: Core) -> None:
        self.core = core


POD = PodRef(namespace="shop", name="web-1")


def test_a_terminating_namespace_is_retried_not_refused() -> None:
    r = evict(Api(Core(403, TERMINATING)), POD, None)  # type: ignore[arg-type]
    assert r.outcome is Eviction.BLOCKED
    assert "being terminated" in r.message


def test_another_403_is_refused_with_the_api_servers_words() -> None:
    body = {**TERMINATING, "message": 'pods "web-1" is forbidden: User "x" cannot create'}
    body["details"] = {"name": "web-1", "kind": "pods"}
    with pytest.raises(ExternalError, match='eviction of pod shop/web-1 refused: 403 pods "web-1"'):
        evict(Api(Core(403, body)), POD, None)  # type: ignore[arg-type]
