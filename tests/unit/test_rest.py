"""The thin JSON client (rollout/kube/rest.py) against a loopback HTTP server: paths, query
encoding, bodies and content types as sent, errors as the project's AnswerError, and a watch
stream split at arbitrary bytes read back as whole events. (The lab tests run it against the real
kube-apiserver; this pins the transport details that the lab would only show as a symptom.)"""

from __future__ import annotations

import inspect
import json
import threading
import tomllib
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client import Configuration
from kubernetes.client.api_client import ApiClient
from kubernetes.client.exceptions import ApiException
from packaging.requirements import Requirement

from rollout.kube.client import Api, call, for_client
from rollout.kube.rest import AnswerError

SEEN: list[dict[str, Any]] = []
WATCH_EVENTS = [
    {"type": "ADDED", "object": {"metadata": {"name": "a", "resourceVersion": "5"}}},
    {"type": "MODIFIED", "object": {"metadata": {"name": "a", "resourceVersion": "6"}}},
    {"type": "BOOKMARK", "object": {"metadata": {"resourceVersion": "7"}}},
]
FLAKY = {"left": 0}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args: Any) -> None:
        pass

    def _answer(self, status: int, body: Any) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> None:
        n = int(self.headers.get("Content-Length") or 0)
        SEEN.append(
            {
                "method": self.command,
                "path": self.path,
                "contentType": self.headers.get("Content-Type"),
                "body": json.loads(self.rfile.read(n)) if n else None,
            }
        )

    def do_GET(self) -> None:
        self._record()
        if "watch=true" in self.path:
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            stream = b"".join(json.dumps(e).encode() + b"\n" for e in WATCH_EVENTS)
            for i in range(0, len(stream), 7):  # chunks that split lines and JSON mid-token
                part = stream[i : i + 7]
                self.wfile.write(f"{len(part):x}\r\n".encode() + part + b"\r\n")
            self.wfile.write(b"0\r\n\r\n")
        elif self.path.startswith("/api/v1/nodes/missing"):
            self._answer(404, {"kind": "Status", "message": 'nodes "missing" not found'})
        elif self.path.startswith("/api/v1/nodes/flaky"):
            if FLAKY["left"] > 0:
                FLAKY["left"] -= 1
                self._answer(503, {"kind": "Status", "message": "etcdserver: leader changed"})
            else:
                self._answer(200, {"metadata": {"name": "flaky"}})
        elif "/proxy/" in self.path:
            data = b"ok"
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(data)
        else:
            self._answer(200, {"kind": "List", "items": [{"metadata": {"name": "n1"}}]})

    def do_PATCH(self) -> None:
        self._record()
        self._answer(200, {"metadata": {"name": "n1"}, "spec": SEEN[-1]["body"]["spec"]})

    def do_PUT(self) -> None:
        self._record()
        self._answer(409, {"kind": "Status", "message": "the object has been modified"})

    def do_POST(self) -> None:
        self._record()
        self._answer(201, {"kind": "Eviction"})


@pytest.fixture(scope="module")
def api() -> Iterator[Api]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    cfg = Configuration()
    cfg.host = f"http://127.0.0.1:{server.server_address[1]}"
    client = ApiClient(cfg)
    try:
        yield for_client(client)
    finally:
        client.rest_client.pool_manager.clear()
        server.shutdown()
        server.server_close()


def test_a_list_sends_its_selector_encoded_and_returns_the_json(api: Api) -> None:
    SEEN.clear()
    out = api.core.list_pod_for_all_namespaces(field_selector="spec.nodeName=n1,status.phase!=X")
    assert out["items"][0]["metadata"]["name"] == "n1"
    assert SEEN[0]["path"] == (
        "/api/v1/pods?fieldSelector=spec.nodeName%3Dn1%2Cstatus.phase%21%3DX"
    )


def test_a_cordon_is_a_merge_patch(api: Api) -> None:
    SEEN.clear()
    api.core.patch_node("n1", {"spec": {"unschedulable": None}})
    assert SEEN[0]["method"] == "PATCH"
    assert SEEN[0]["path"] == "/api/v1/nodes/n1"
    assert SEEN[0]["contentType"] == "application/merge-patch+json"
    assert SEEN[0]["body"] == {"spec": {"unschedulable": None}}


def test_an_eviction_posts_its_body(api: Api) -> None:
    SEEN.clear()
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "p"}}
    api.core.create_namespaced_pod_eviction("p", "ns", body)
    assert SEEN[0]["path"] == "/api/v1/namespaces/ns/pods/p/eviction"
    assert SEEN[0]["body"] == body
    assert SEEN[0]["contentType"] == "application/json"


def test_errors_are_answer_errors_with_status_and_body(api: Api) -> None:
    with pytest.raises(AnswerError) as e:
        api.core.read_node("missing")
    assert e.value.status == 404
    assert 'nodes \\"missing\\" not found' in str(e.value.body)
    with pytest.raises(AnswerError) as e:
        api.coordination.replace_namespaced_lease("rollout-lock", "kube-system", {"x": 1})
    assert e.value.status == 409


def test_call_retries_a_5xx_then_returns(api: Api) -> None:
    FLAKY["left"] = 2
    out = call("read node flaky", api.core.read_node, "flaky", sleep=lambda s: None)
    assert out["metadata"]["name"] == "flaky"
    assert FLAKY["left"] == 0


def test_a_watch_split_mid_line_gives_whole_events_in_order(api: Api) -> None:
    SEEN.clear()
    events = list(api.core.watch_pod_for_all_namespaces("spec.nodeName=n1", "4", 30, 40))
    assert events == WATCH_EVENTS
    path = SEEN[0]["path"]
    assert path.startswith("/api/v1/pods?")
    for part in ("watch=true", "resourceVersion=4", "timeoutSeconds=30", "allowWatchBookmarks"):
        assert part in path


def test_a_watch_closed_early_stops_reading(api: Api) -> None:
    events = api.coordination.watch_namespaced_lease("ns", "metadata.name=x", "1", 5, 10)
    first = next(events)
    events.close()
    assert first == WATCH_EVENTS[0]
    with pytest.raises(StopIteration):
        next(events)


def test_the_node_proxy_returns_status_and_raw_bytes(api: Api) -> None:
    assert api.core.connect_get_node_proxy_with_path("n1", "healthz") == (200, b"ok")


def test_the_installed_client_has_the_v7_calls_rest_uses() -> None:
    """rest.py's contract with the generated client: the keywords it passes exist."""
    serialize = inspect.signature(ApiClient.param_serialize).parameters
    for name in (
        "method",
        "resource_path",
        "query_params",
        "header_params",
        "body",
        "auth_settings",
    ):
        assert name in serialize, name
    assert "_request_timeout" in inspect.signature(ApiClient.call_api).parameters
    assert {"status", "reason", "http_resp", "body"} <= set(
        inspect.signature(ApiException.__init__).parameters
    )


def test_the_kubernetes_floor_excludes_the_legacy_generator_clients() -> None:
    """36.0.3 is the last release of the legacy generator (no ``param_serialize``: it installs,
    then fails at the first request); 37.0.0 is the first OpenAPI Generator v7 client."""
    meta = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    (req,) = [Requirement(d) for d in meta["project"]["dependencies"] if d.startswith("kubernetes")]
    assert not req.specifier.contains("36.0.3"), req
    assert not req.specifier.contains("31.0.0"), req
    assert req.specifier.contains("37.0.0"), req
