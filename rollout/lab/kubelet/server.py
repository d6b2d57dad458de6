"""The kubelet's HTTPS endpoints that ``rollout`` reaches through the API server's node proxy.

``kubectl get --raw /api/v1/nodes/N/proxy/configz`` makes the API server connect to the node's
InternalIP on ``daemonEndpoints.kubeletEndpoint.Port`` with its kubelet client certificate and
verify the kubelet's serving certificate: so this server speaks TLS with the node's serving cert
and requires a client certificate signed by the cluster CA (the kubelet's ``--client-ca-file``
authentication; authorization is not delegated back to the API server in the lab).

The kubelet also answers plain-HTTP ``/healthz`` on ``healthzBindAddress:healthzPort`` (default
``127.0.0.1:10248``): that is what kubeadm and ``rollout``'s restart step poll on the node.
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Protocol


class Endpoints(Protocol):
    def configz(self) -> dict[str, Any]: ...

    def metrics(self) -> str: ...

    def pods(self) -> dict[str, Any]: ...


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 64

    def __init__(self, addr: tuple[str, int], ctx: ssl.SSLContext, endpoints: Endpoints) -> None:
        self.ctx = ctx
        self.endpoints = endpoints
        super().__init__(addr, _Handler)

    def get_request(self) -> tuple[socket.socket, Any]:
        sock, addr = self.socket.accept()
        # Handshake in the handler thread: a slow client must not block the accept loop.
        tls = self.ctx.wrap_socket(sock, server_side=True, do_handshake_on_connect=False)
        return tls, addr


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"
    timeout = 15

    def setup(self) -> None:
        super().setup()
        try:
            assert isinstance(self.request, ssl.SSLSocket)
            self.request.do_handshake()
        except (OSError, ssl.SSLError):
            self.close_connection = True
            raise

    def log_message(self, format: str, *args: Any) -> None:
        return  # the kubelet does not log every request at the default verbosity

    def _send(self, code: int, body: bytes, ctype: str) -> None:
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0].rstrip("/") or "/"
        if path == "/healthz":
            self._send(200, b"ok", "text/plain; charset=utf-8")
            return
        assert isinstance(self.request, ssl.SSLSocket)
        if self.request.getpeercert() is None:
            self._send(401, b"Unauthorized", "text/plain; charset=utf-8")
            return
        ep = self.server.endpoints
        routes: dict[str, Callable[[], tuple[bytes, str]]] = {
            "/configz": lambda: (json.dumps(ep.configz()).encode(), "application/json"),
            "/metrics": lambda: (
                ep.metrics().encode(),
                "text/plain; version=0.0.4; charset=utf-8",
            ),
            "/pods": lambda: (json.dumps(ep.pods()).encode(), "application/json"),
        }
        route = routes.get(path)
        if route is None:
            self._send(404, b"404 page not found\n", "text/plain; charset=utf-8")
            return
        body, ctype = route()
        self._send(200, body, ctype)


def serve(
    host: str,
    port: int,
    *,
    cert: str,
    key: str,
    client_ca: str,
    endpoints: Endpoints,
) -> ThreadingHTTPServer:
    """Start serving in a daemon thread; return the server (``shutdown()`` stops it)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    ctx.load_verify_locations(client_ca)
    ctx.verify_mode = ssl.CERT_OPTIONAL
    server = _Server((host, port), ctx, endpoints)
    threading.Thread(target=server.serve_forever, name="kubelet-server", daemon=True).start()
    return server


class _HealthzHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    timeout = 15

    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_GET(self) -> None:
        ok = self.path.split("?", 1)[0].rstrip("/") == "/healthz"
        body = b"ok" if ok else b"404 page not found\n"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Type", "text/plain; charset=utf-8")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def serve_healthz(host: str, port: int) -> ThreadingHTTPServer:
    """The kubelet's plain-HTTP healthz endpoint, in a daemon thread."""
    server = ThreadingHTTPServer((host, port), _HealthzHandler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name="kubelet-healthz", daemon=True).start()
    return server
