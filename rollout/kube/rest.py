"""The API groups the tool calls, as JSON over the kubeconfig's connection.

Why not the client's typed API classes: importing ``CoreV1Api`` builds about 250 pydantic model
modules (the measurement is in ``benchmarks/README.md``), and every list of pods is then
validated into models that the tool reads a handful of fields from. Here each operation is one
HTTP request on the client's own ``ApiClient`` (its kubeconfig, TLS, token refresh and
connection pool), and answers are the API server's JSON as dicts (camelCase, as ``kubectl get -o
json`` shows them). Method names and arguments are those of the typed classes, so a reader (and
``tests/unit/test_rbac_manifest.py``) maps each call to its RBAC rule the same way.

Errors are :class:`AnswerError`: the project's :class:`rollout.errors.ApiError` (``status``,
``reason``, a short message; what code outside ``rollout.kube`` catches, and the CLI maps to exit
7) that is also the client's own :class:`ApiException` (``body``, ``headers``), so this package
decides over 4xx answers as before and :func:`rollout.kube.client.call` retries connection errors
and 5xx. No other exception type of the client leaves :meth:`Rest.send`
(``tests/unit/test_kube_boundary.py``).

``ApiClient.param_serialize`` and ``ApiException.from_response`` exist only in clients generated
by OpenAPI Generator v7: kubernetes 37.0.0 is the first such release (36.0.3 still has the legacy
generator's ``call_api(resource_path, method, ...)``), hence ``kubernetes>=37`` in pyproject.toml.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Generator
from typing import Any

from kubernetes.client.api_client import ApiClient
from kubernetes.client.exceptions import ApiException

from rollout.errors import ApiError, truncate

JSON = "application/json"
MERGE_PATCH = "application/merge-patch+json"
# kube-apiserver's metadata-only list (meta.k8s.io/v1 PartialObjectMetadataList), JSON the fallback
PARTIAL_METADATA_LIST = (
    "application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1,application/json"
)
DEFAULT_TIMEOUT_S = 30.0
#: zlib's window bits for a gzip stream (header and trailer checked)
GZIP_WBITS = 16 + zlib.MAX_WBITS


class AnswerError(ApiException, ApiError):
    """An error answer of the API server (or none: ``status`` 0): a
    :class:`rollout.errors.ApiError` outside this package, the client's ``ApiException`` inside
    it (see the module docstring)."""

    def __init__(
        self, status: int, reason: str = "", body: str | None = None, headers: Any = None
    ) -> None:
        ApiException.__init__(self, status=status, reason=reason, body=body)
        self.headers = headers
        ApiError.__init__(self, answer_message(status, reason, body), status, reason)

    def __str__(self) -> str:
        return self.message

    @classmethod
    def of(cls, e: ApiException) -> AnswerError:
        """The same answer as the client's exception ``e`` (kept as the cause by the caller)."""
        if isinstance(e, AnswerError):
            return e
        return cls(int(e.status or 0), str(e.reason or ""), e.body, e.headers)


def answer_message(status: int, reason: str, body: str | None) -> str:
    """``404 nodes "x" not found``: the status and the API server's own ``message`` (its
    reason phrase when the body is not a Status), truncated."""
    msg: Any = None
    try:
        msg = json.loads(body or "{}").get("message")
    except (ValueError, AttributeError):
        msg = body
    return f"{status} {truncate(str(msg or reason or 'no answer'))}"


class Rest:
    """One HTTP request per call on an ``ApiClient``; JSON in, JSON out."""

    def __init__(self, api_client: ApiClient, gzip: bool = True) -> None:
        """``gzip``: whether :meth:`json` asks for compressed answers (off where the
        kubeconfig's cluster says ``disable-compression: true``, as kubectl reads it)."""
        self.api_client = api_client
        self.gzip = gzip

    def send(
        self,
        method: str,
        path: str,
        query: dict[str, Any] | None = None,
        body: Any = None,
        content_type: str = JSON,
        accept: str = JSON,
        timeout: Any = DEFAULT_TIMEOUT_S,
        gzip: bool = False,
    ) -> Any:
        """Send one request; return the unread response (``.status``, ``.read()``,
        ``.response`` the urllib3 response for streaming). ``gzip``: ask for a compressed
        answer (``Accept-Encoding: gzip``, as client-go does); the API server compresses one
        over 128 KiB (:meth:`json` inflates it).

        Raises:
            AnswerError: any answer outside 2xx (404, 409 and 5xx included), or none (the
                client's ``ApiException`` of status 0, e.g. a TLS failure).
        """
        headers = {"Accept": accept}
        if gzip:
            headers["Accept-Encoding"] = "gzip"
        if body is not None:
            headers["Content-Type"] = content_type
        q = {k: v for k, v in (query or {}).items() if v is not None}
        req = self.api_client.param_serialize(
            method=method,
            resource_path=path,
            query_params=list(q.items()) or None,
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        try:
            resp = self.api_client.call_api(*req, _request_timeout=timeout)
        except ApiException as e:
            raise AnswerError.of(e) from e
        if not 200 <= resp.status <= 299:
            resp.read()  # type: ignore[no-untyped-call]
            raise AnswerError.of(ApiException(http_resp=resp))
        return resp

    def json(self, method: str, path: str, raw: bool = False, **kw: Any) -> Any:
        """:meth:`send`, the answer parsed as JSON (None for an empty body); ``raw``: the
        answer's bytes, unparsed (the caller decodes only what it reads,
        :mod:`rollout.kube.briefs`).

        Compressed on the wire (``gzip``): a cluster's listings are tens of MB, served in
        chunks of about 2 KB, and reading 8.5 MB of Nodes cost 59 ms of CPU plain against 38 ms
        compressed (``docs/scale.md``). A compressed answer is read whole, then inflated in one
        call into one buffer: urllib3 inflates into a growing buffer and copies it once more,
        which held two copies of the largest listing at the peak."""
        resp = self.send(method, path, gzip=self.gzip, **kw)
        stream = resp.response
        if str(stream.headers.get("Content-Encoding", "")).lower() == "gzip":
            data = zlib.decompress(stream.read(decode_content=False), GZIP_WBITS)
        else:
            data = stream.read()
        if raw:
            return bytes(data)
        return json.loads(data) if data else None

    def watch(
        self, path: str, query: dict[str, Any], timeout_s: int, request_timeout: float
    ) -> Generator[dict[str, Any], None, None]:
        """The watch events (``{"type", "object"}``) of a list ``path``, as they arrive, until the
        server ends the watch after ``timeout_s``. Closing the generator closes the stream.

        Raises:
            AnswerError: the watch was refused (a 410 answer: the version is compacted).
        """
        resp = self.send(
            "GET",
            path,
            query={**query, "watch": "true", "timeoutSeconds": timeout_s},
            timeout=request_timeout,
        )
        raw = resp.response
        buf = b""
        try:
            for chunk in raw.stream(amt=None, decode_content=True):
                buf += chunk
                while b"\n" in buf:
                    line, buf = buf.split(b"\n", 1)
                    if line.strip():
                        yield json.loads(line)
            if buf.strip():
                yield json.loads(buf)
        finally:
            raw.release_conn()


def _ns(namespace: str, plural: str, group: str = "") -> str:
    base = f"/apis/{group}" if group else "/api/v1"
    return f"{base}/namespaces/{namespace}/{plural}"


class CoreV1:
    """``/api/v1``: Nodes, pods, evictions, namespaces, Events, the node proxy."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def read_node(self, name: str, _request_timeout: Any = DEFAULT_TIMEOUT_S) -> Any:
        return self.rest.json("GET", f"/api/v1/nodes/{name}", timeout=_request_timeout)

    def list_node(
        self,
        label_selector: str | None = None,
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
        _raw: bool = False,
    ) -> Any:
        """``_raw``: the answer's bytes, unparsed."""
        query = {"labelSelector": label_selector} if label_selector else None
        return self.rest.json(
            "GET", "/api/v1/nodes", query=query, timeout=_request_timeout, raw=_raw
        )

    def patch_node(
        self, name: str, body: dict[str, Any], _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        """A JSON merge patch (``null`` removes a field)."""
        return self.rest.json(
            "PATCH",
            f"/api/v1/nodes/{name}",
            body=body,
            content_type=MERGE_PATCH,
            timeout=_request_timeout,
        )

    def list_pod_for_all_namespaces(
        self,
        field_selector: str | None = None,
        limit: int | None = None,
        _continue: str | None = None,
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
        _raw: bool = False,
    ) -> Any:
        """One page of at most ``limit`` pods (all when None); ``_continue``: the token the
        previous page's ``metadata.continue`` gave; ``_raw``: the answer's bytes, unparsed."""
        return self.rest.json(
            "GET",
            "/api/v1/pods",
            query={"fieldSelector": field_selector, "limit": limit, "continue": _continue},
            timeout=_request_timeout,
            raw=_raw,
        )

    def _watch_all(
        self,
        plural: str,
        field_selector: str,
        resource_version: str,
        timeout_s: int,
        request_timeout: float,
    ) -> Generator[dict[str, Any], None, None]:
        query = {
            "fieldSelector": field_selector,
            "resourceVersion": resource_version,
            "allowWatchBookmarks": "true",
        }
        return self.rest.watch(f"/api/v1/{plural}", query, timeout_s, request_timeout)

    def watch_pod_for_all_namespaces(
        self, field_selector: str, resource_version: str, timeout_s: int, request_timeout: float
    ) -> Generator[dict[str, Any], None, None]:
        return self._watch_all("pods", field_selector, resource_version, timeout_s, request_timeout)

    def read_namespaced_pod(
        self, name: str, namespace: str, _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self.rest.json("GET", f"{_ns(namespace, 'pods')}/{name}", timeout=_request_timeout)

    def create_namespaced_pod(
        self, namespace: str, body: dict[str, Any], _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self.rest.json("POST", _ns(namespace, "pods"), body=body, timeout=_request_timeout)

    def delete_namespaced_pod(
        self,
        name: str,
        namespace: str,
        grace_period_seconds: int | None = None,
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
    ) -> Any:
        return self.rest.json(
            "DELETE",
            f"{_ns(namespace, 'pods')}/{name}",
            query={"gracePeriodSeconds": grace_period_seconds},
            timeout=_request_timeout,
        )

    def create_namespaced_pod_eviction(
        self,
        name: str,
        namespace: str,
        body: dict[str, Any],
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
    ) -> Any:
        return self.rest.json(
            "POST", f"{_ns(namespace, 'pods')}/{name}/eviction", body=body, timeout=_request_timeout
        )

    def list_namespaced_config_map(
        self,
        namespace: str,
        label_selector: str | None = None,
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
    ) -> Any:
        return self.rest.json(
            "GET",
            _ns(namespace, "configmaps"),
            query={"labelSelector": label_selector},
            timeout=_request_timeout,
        )

    def create_namespaced_config_map(
        self, namespace: str, body: dict[str, Any], _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self.rest.json(
            "POST", _ns(namespace, "configmaps"), body=body, timeout=_request_timeout
        )

    def replace_namespaced_config_map(
        self,
        name: str,
        namespace: str,
        body: dict[str, Any],
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
    ) -> Any:
        """PUT without a resourceVersion: an unconditional update."""
        return self.rest.json(
            "PUT", f"{_ns(namespace, 'configmaps')}/{name}", body=body, timeout=_request_timeout
        )

    def create_namespace(
        self, body: dict[str, Any], _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self.rest.json("POST", "/api/v1/namespaces", body=body, timeout=_request_timeout)

    def create_namespaced_event(
        self, namespace: str, body: dict[str, Any], _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self.rest.json("POST", _ns(namespace, "events"), body=body, timeout=_request_timeout)

    def list_event_for_all_namespaces(
        self, field_selector: str | None = None, _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self.rest.json(
            "GET",
            "/api/v1/events",
            query={"fieldSelector": field_selector},
            timeout=_request_timeout,
        )

    def watch_event_for_all_namespaces(
        self, field_selector: str, resource_version: str, timeout_s: int, request_timeout: float
    ) -> Generator[dict[str, Any], None, None]:
        return self._watch_all(
            "events", field_selector, resource_version, timeout_s, request_timeout
        )

    def connect_get_node_proxy_with_path(
        self, name: str, path: str, _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> tuple[int, bytes]:
        """GET ``/api/v1/nodes/<name>/proxy/<path>``: status and raw body (2xx only; others
        raise)."""
        resp = self.rest.send(
            "GET", f"/api/v1/nodes/{name}/proxy/{path}", accept="*/*", timeout=_request_timeout
        )
        return int(resp.status), bytes(resp.read())


class PolicyV1:
    """``/apis/policy/v1``: PodDisruptionBudgets."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def list_namespaced_pod_disruption_budget(
        self, namespace: str, _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self.rest.json(
            "GET",
            _ns(namespace, "poddisruptionbudgets", "policy/v1"),
            timeout=_request_timeout,
        )

    def list_pod_disruption_budget_for_all_namespaces(
        self, _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self.rest.json(
            "GET", "/apis/policy/v1/poddisruptionbudgets", timeout=_request_timeout
        )


class CoordinationV1:
    """``/apis/coordination.k8s.io/v1``: the cluster lock's Lease."""

    GROUP = "coordination.k8s.io/v1"

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def _lease(
        self, method: str, namespace: str, name: str = "", body: Any = None, timeout: Any = None
    ) -> Any:
        path = _ns(namespace, "leases", self.GROUP) + (f"/{name}" if name else "")
        return self.rest.json(method, path, body=body, timeout=timeout)

    def read_namespaced_lease(
        self, name: str, namespace: str, _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self._lease("GET", namespace, name, timeout=_request_timeout)

    def create_namespaced_lease(
        self, namespace: str, body: dict[str, Any], _request_timeout: Any = DEFAULT_TIMEOUT_S
    ) -> Any:
        return self._lease("POST", namespace, body=body, timeout=_request_timeout)

    def replace_namespaced_lease(
        self,
        name: str,
        namespace: str,
        body: dict[str, Any],
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
    ) -> Any:
        """PUT: a compare-and-swap on the body's ``metadata.resourceVersion`` (409 if stale)."""
        return self._lease("PUT", namespace, name, body, _request_timeout)

    def delete_namespaced_lease(
        self,
        name: str,
        namespace: str,
        body: dict[str, Any],
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
    ) -> Any:
        """DELETE with the body's preconditions (a stale resourceVersion answers 409)."""
        return self._lease("DELETE", namespace, name, body, _request_timeout)

    def watch_namespaced_lease(
        self,
        namespace: str,
        field_selector: str,
        resource_version: str,
        timeout_s: int,
        request_timeout: float,
    ) -> Generator[dict[str, Any], None, None]:
        return self.rest.watch(
            _ns(namespace, "leases", self.GROUP),
            {"fieldSelector": field_selector, "resourceVersion": resource_version},
            timeout_s,
            request_timeout,
        )


class AppsV1:
    """``/apis/apps/v1``: the controllers the admission preview names (read only)."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def _list(self, plural: str, timeout: Any, raw: bool) -> Any:
        """``raw``: the answer's bytes, unparsed."""
        return self.rest.json("GET", f"/apis/apps/v1/{plural}", timeout=timeout, raw=raw)

    def list_deployment_for_all_namespaces(
        self, _request_timeout: Any = DEFAULT_TIMEOUT_S, _raw: bool = False
    ) -> Any:
        return self._list("deployments", _request_timeout, _raw)

    def list_stateful_set_for_all_namespaces(
        self, _request_timeout: Any = DEFAULT_TIMEOUT_S, _raw: bool = False
    ) -> Any:
        return self._list("statefulsets", _request_timeout, _raw)

    def list_daemon_set_for_all_namespaces(
        self, _request_timeout: Any = DEFAULT_TIMEOUT_S, _raw: bool = False
    ) -> Any:
        return self._list("daemonsets", _request_timeout, _raw)

    def list_replica_set_for_all_namespaces(
        self,
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
        metadata_only: bool = False,
        _raw: bool = False,
    ) -> Any:
        """``metadata_only``: the API server's PartialObjectMetadataList (each item's
        ``metadata`` alone, no pod template): what owner resolution reads, a fraction of the
        bytes to send and decode in a cluster of thousands of ReplicaSets."""
        if not metadata_only:
            return self._list("replicasets", _request_timeout, _raw)
        return self.rest.json(
            "GET",
            "/apis/apps/v1/replicasets",
            accept=PARTIAL_METADATA_LIST,
            timeout=_request_timeout,
            raw=_raw,
        )


class Custom:
    """Cluster-scoped lists of any group (ResourceSlices, Argo Rollouts, Flagger Canaries)."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def list_cluster_custom_object(
        self,
        group: str,
        version: str,
        plural: str,
        field_selector: str | None = None,
        _request_timeout: Any = DEFAULT_TIMEOUT_S,
    ) -> Any:
        return self.rest.json(
            "GET",
            f"/apis/{group}/{version}/{plural}",
            query={"fieldSelector": field_selector},
            timeout=_request_timeout,
        )


class Discovery:
    """``/apis`` (the groups served) and ``/version``."""

    def __init__(self, rest: Rest) -> None:
        self.rest = rest

    def get_api_versions(self, _request_timeout: Any = DEFAULT_TIMEOUT_S) -> Any:
        return self.rest.json("GET", "/apis", timeout=_request_timeout)

    def get_code(self, _request_timeout: Any = DEFAULT_TIMEOUT_S) -> Any:
        return self.rest.json("GET", "/version", timeout=_request_timeout)
