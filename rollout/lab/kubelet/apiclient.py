"""A small JSON REST client for the API server, over TCP or a unix socket, with client-cert TLS.

The lab kubelet runs inside a node's network namespace; when the lab gives it a unix socket that
relays to the API server, TLS is spoken over that socket (SNI/verification against ``localhost``
or the API server's address). Only the standard library: the ``kubernetes`` package takes about a
second to import, and several lab kubelets start at once on two cores.
"""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import urllib.parse
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


class APIError(Exception):
    """A non-2xx answer from the API server."""

    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status = status
        self.body = body


class _UnixHTTPSConnection(http.client.HTTPSConnection):
    def __init__(
        self, path: str, server_hostname: str, context: ssl.SSLContext, timeout: float
    ) -> None:
        super().__init__(server_hostname, context=context, timeout=timeout)
        self._path = path
        self._server_hostname = server_hostname
        self._ctx = context

    def connect(self) -> None:
        raw = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        raw.settimeout(self.timeout)
        raw.connect(self._path)
        self.sock = self._ctx.wrap_socket(raw, server_hostname=self._server_hostname)


@dataclass(frozen=True)
class Endpoint:
    """Where the API server is: a unix socket path or an https URL, and the TLS material."""

    ca: str
    cert: str
    key: str
    socket_path: str | None = None
    url: str | None = None
    server_hostname: str = "localhost"


class APIClient:
    """GET/POST/PUT/PATCH/DELETE JSON, and streaming watches."""

    def __init__(self, endpoint: Endpoint, timeout: float = 10.0) -> None:
        self.endpoint = endpoint
        self.timeout = timeout
        ctx = ssl.create_default_context(cafile=endpoint.ca)
        ctx.load_cert_chain(endpoint.cert, endpoint.key)
        self._ctx = ctx
        if endpoint.url:
            u = urllib.parse.urlsplit(endpoint.url)
            self._host = u.hostname or "127.0.0.1"
            self._port = u.port or 443

    def _conn(self, timeout: float | None) -> http.client.HTTPConnection:
        t = self.timeout if timeout is None else timeout
        ep = self.endpoint
        if ep.socket_path:
            return _UnixHTTPSConnection(ep.socket_path, ep.server_hostname, self._ctx, t)
        return http.client.HTTPSConnection(self._host, self._port, context=self._ctx, timeout=t)

    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> Any:
        conn = self._conn(timeout)
        try:
            data = None if body is None else json.dumps(body).encode()
            headers = {"Accept": "application/json", "User-Agent": "rollout-lab-kubelet"}
            if data is not None:
                headers["Content-Type"] = content_type
            conn.request(method, path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read().decode("utf-8", "replace")
        finally:
            conn.close()
        if resp.status >= 300:
            raise APIError(resp.status, raw)
        return json.loads(raw) if raw else None

    def get(self, path: str) -> Any:
        return self.request("GET", path)

    def post(self, path: str, body: Any) -> Any:
        return self.request("POST", path, body)

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def patch(self, path: str, body: Any, kind: str = "merge") -> Any:
        ctype = {
            "merge": "application/merge-patch+json",
            "strategic": "application/strategic-merge-patch+json",
        }[kind]
        return self.request("PATCH", path, body, content_type=ctype)

    def delete(self, path: str, body: Any = None) -> Any:
        return self.request("DELETE", path, body)

    def watch(
        self, path: str, params: Mapping[str, str], timeout_seconds: int = 60
    ) -> Iterator[dict[str, Any]]:
        """Yield watch events (``{"type", "object"}``) until the server closes the stream."""
        q = dict(params)
        q["watch"] = "1"
        q["timeoutSeconds"] = str(timeout_seconds)
        q["allowWatchBookmarks"] = "true"
        conn = self._conn(timeout_seconds + 15)
        try:
            conn.request(
                "GET",
                f"{path}?{urllib.parse.urlencode(q)}",
                headers={"Accept": "application/json", "User-Agent": "rollout-lab-kubelet"},
            )
            resp = conn.getresponse()
            if resp.status >= 300:
                raise APIError(resp.status, resp.read().decode("utf-8", "replace"))
            while True:
                line = resp.readline()
                if not line:
                    return
                if line.strip():
                    yield json.loads(line)
        finally:
            conn.close()
