"""A loopback stand-in for the API server's read side at fleet scale: N Nodes with P pods each,
served as JSON over HTTP the way kube-apiserver serves them (``limit`` / ``continue`` pages,
``spec.nodeName`` and ``status.phase`` field selectors), counting every request by kind.

What it is for: counting the requests preflight sends, and the client-side cost of reading a
cluster of thousands of Nodes, without a cluster of thousands of Nodes
(``tests/unit/test_pod_listing.py``, ``benchmarks/scale_bench.py``). It is not an API server:
only the reads preflight makes are answered, everything else is an empty list.
"""

from __future__ import annotations

import gzip
import json
import socket
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

#: kube-apiserver compresses an answer over this many bytes when the client accepts gzip
GZIP_OVER = 128 * 1024


def node_name(i: int) -> str:
    return f"node-{i:05d}"


def node_object(i: int) -> dict[str, Any]:
    name = node_name(i)
    return {
        "metadata": {
            "name": name,
            "uid": f"uid-{name}",
            "labels": {"kubernetes.io/hostname": name, "node.kubernetes.io/instance-type": "gpu"},
        },
        "spec": {},
        "status": {
            "allocatable": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "capacity": {"cpu": "64", "memory": "256Gi", "nvidia.com/gpu": "8", "pods": "110"},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def pod_object(node: int, j: int, phase: str = "Running") -> dict[str, Any]:
    name = f"web-{node:05d}-{j:02d}"
    return {
        "metadata": {
            "name": name,
            "namespace": f"team-{node % 20}",
            "uid": f"uid-{name}",
            "creationTimestamp": f"2026-12-01T00:{j % 60:02d}:00Z",
            "labels": {"app": "web", "pod-template-hash": "5d8f7c9b6"},
            "ownerReferences": [
                {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f7c9b6"}
            ],
        },
        "spec": {
            "nodeName": node_name(node),
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
        "status": {"phase": phase, "qosClass": "Burstable"},
    }


class Fleet:
    """The cluster served: ``nodes`` Nodes, ``pods`` pods on each (plus, on node 0, one finished
    pod and, unbound, one pending pod: neither is a pod on a node for preflight)."""

    def __init__(self, nodes: int, pods: int) -> None:
        self.nodes = [node_object(i) for i in range(nodes)]
        self.by_node: dict[str, list[dict[str, Any]]] = {
            node_name(i): [pod_object(i, j) for j in range(pods)] for i in range(nodes)
        }
        if nodes:
            self.by_node[node_name(0)].append(pod_object(0, 99, "Succeeded"))
        unbound = pod_object(0, 98, "Pending")
        del unbound["spec"]["nodeName"]
        self.unbound = [unbound]
        self.requests: Counter[str] = Counter()
        self.compressed: Counter[str] = Counter()  # answers sent gzip-compressed, by path
        self.expire_once: set[str] = set()  # continue tokens answered 410 Gone, once each
        self.lock = threading.Lock()
        self._listed: dict[str, list[dict[str, Any]]] = {}

    def pods(self, selector: str) -> list[dict[str, Any]]:
        terms = [t for t in selector.split(",") if t]
        on = [t.split("=", 1)[1] for t in terms if t.startswith("spec.nodeName=")]
        if not on and selector in self._listed:  # the same cluster-wide selection, page after page
            return self._listed[selector]
        pods = self.by_node.get(on[0], []) if on else self.all_pods()
        skip = {t.split("!=", 1)[1] for t in terms if t.startswith("status.phase!=")}
        out = [p for p in pods if p["status"]["phase"] not in skip]
        if not on:
            self._listed[selector] = out
        return out

    def all_pods(self) -> list[dict[str, Any]]:
        return [p for pods in self.by_node.values() for p in pods] + self.unbound


def _handler(fleet: Fleet) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # headers and body are separate writes: without this, Nagle's algorithm and the
            # client's delayed ACK add 40 ms to every answer (kube-apiserver has no such wait)
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, *args: Any) -> None:
            pass

        def _answer(self, status: int, body: Any) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            # as kube-apiserver does: an answer over 128 KiB to a client that accepts gzip
            if len(data) > GZIP_OVER and "gzip" in self.headers.get("Accept-Encoding", ""):
                data = gzip.compress(data, 1)
                self.send_header("Content-Encoding", "gzip")
                with fleet.lock:
                    fleet.compressed[urlsplit(self.path).path] += 1
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self) -> None:
            url = urlsplit(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            selector = q.get("fieldSelector", "")
            if url.path == "/_requests":  # the counts, for a client in another process
                with fleet.lock:
                    self._answer(200, dict(fleet.requests))
                    fleet.requests.clear()
                return
            kind = url.path
            if url.path == "/api/v1/pods":
                kind = "pods on a node" if "spec.nodeName=" in selector else "pods, a page"
            with fleet.lock:
                fleet.requests[kind] += 1
            if url.path == "/version":
                self._answer(200, {"gitVersion": "v1.36.3"})
            elif url.path == "/api/v1/nodes":
                self._answer(200, {"kind": "NodeList", "metadata": {}, "items": fleet.nodes})
            elif url.path == "/api/v1/pods":
                self._pods(q, selector)
            else:
                self._answer(200, {"kind": "List", "metadata": {}, "items": [], "groups": []})

        def _pods(self, q: dict[str, str], selector: str) -> None:
            token = q.get("continue")
            if token and token in fleet.expire_once:
                fleet.expire_once.discard(token)
                msg = "The provided continue parameter is too old to display a consistent list"
                self._answer(
                    410, {"kind": "Status", "code": 410, "reason": "Expired", "message": msg}
                )
                return
            pods = fleet.pods(selector)
            start = int(token or 0)
            limit = int(q.get("limit") or 0) or len(pods)
            page = pods[start : start + limit]
            meta = {"resourceVersion": "1000"}
            if start + limit < len(pods):
                meta["continue"] = str(start + limit)
            self._answer(200, {"kind": "PodList", "metadata": meta, "items": page})

    return Handler


@contextmanager
def serving(fleet: Fleet) -> Iterator[str]:
    """Serve ``fleet`` on a loopback port; yields the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fleet))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def serve_forever(nodes: int, pods: int, port_out: Any) -> None:
    """Build a :class:`Fleet` and serve it until killed (a benchmark's server process; the port
    is sent on ``port_out``, a ``multiprocessing`` connection). ``GET /_requests`` answers the
    request counts so far and resets them."""
    fleet = Fleet(nodes, pods)
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(fleet))
    port_out.send(server.server_address[1])
    server.serve_forever()


def api_for(url: str) -> Any:
    """A ``rollout.kube.client.Api`` talking to ``url`` (no credentials)."""
    from kubernetes.client import Configuration
    from kubernetes.client.api_client import ApiClient

    from rollout.kube.client import for_client

    cfg = Configuration()
    cfg.host = url
    return for_client(ApiClient(cfg))
