"""``rollout serve`` given bad input, over real sockets on 127.0.0.1: each refusal names the
problem (4xx), changes nothing (no rollback, no journal, no file), and the server stays up.
Also: TLS from certificate files, and the drain that shutdown waits on.

The two-replica and Alertmanager-over-TLS proofs are lab tests (``tests/lab/test_serve_lab.py``,
``tests/lab/test_monitoring.py``).
"""

from __future__ import annotations

import json
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.errors import InputError
from rollout.gate.payloads import BadBody, parse_alerts
from rollout.gate.serve import AlertReceiver, make_server, tls_context
from tests.unit.test_serve import (
    CHANGE,
    TOKEN,
    FakeTrigger,
    _journal,
    alert,
    post,
    settled,
    webhook,
)

LIMIT = 64 * 1024


class Served:
    def __init__(self, root: Path, tls: ssl.SSLContext | None = None) -> None:
        from rollout.gate.owning import JournalOwners, journal_recorder

        self.root = root
        self.trigger = FakeTrigger()
        self.receiver = AlertReceiver(
            self.trigger,
            owners=JournalOwners(root, lambda: None),
            record=journal_recorder(root),
        )
        self.server = make_server(
            ("127.0.0.1", 0), TOKEN, self.receiver, tls=tls, max_body=LIMIT, read_timeout=0.5
        )
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.02,))
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(5)

    def files(self) -> list[str]:
        return sorted(str(p.relative_to(self.root)) for p in self.root.rglob("*"))

    def up(self) -> bool:
        with urllib.request.urlopen(self.url + "/healthz", timeout=5) as r:
            return r.status == 200


@pytest.fixture
def srv(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path / "state")
    try:
        yield s
    finally:
        s.close()


def raw(
    port: int,
    head: bytes,
    body: bytes = b"",
    *,
    half_close: bool = True,
    wait: float = 5,
) -> tuple[int, dict[str, Any], float]:
    """Send ``head`` and ``body`` as they are; the status, JSON body and seconds to the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=wait) as s:
        t0 = time.monotonic()
        s.sendall(head + body)
        if half_close:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while b"\r\n\r\n" not in data or len(data.split(b"\r\n\r\n", 1)[1]) < _length(data):
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        took = time.monotonic() - t0
    status = int(data.split(b" ", 2)[1])
    return status, json.loads(data.split(b"\r\n\r\n", 1)[1]), took


def _length(data: bytes) -> int:
    for line in data.split(b"\r\n\r\n", 1)[0].split(b"\r\n"):
        if line.lower().startswith(b"content-length:"):
            return int(line.split(b":", 1)[1])
    return 1 << 30


def head(length: int | None, token: str = TOKEN, extra: str = "") -> bytes:
    h = f"POST /webhook HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n{extra}"
    if length is not None:
        h += f"Content-Length: {length}\r\n"
    return (h + "\r\n").encode()


def unchanged(s: Served) -> None:
    """Nothing happened: no rollback, nothing journaled, no file, and the server still up."""
    assert s.trigger.calls == []
    assert s.receiver.runs() == []
    assert s.files() == []
    assert s.up()


# ------------------------------------------------------------------ the body as bytes


def test_oversized_body_is_413_from_the_header_and_never_read(srv: Served) -> None:
    # only the headers are sent and the connection stays open: the answer comes from the
    # Content-Length alone, at once (never waiting for, or reading, the 10 MB announced)
    code, body, took = raw(srv.port, head(10_000_000), half_close=False)
    assert code == 413 and body["field"] == "Content-Length", body
    assert "10000000 bytes is over the limit of 65536" in body["error"]
    assert took < 0.4  # under the read timeout: nothing was waited for
    # and with the body really sent: still 413, the server drops the connection
    big = json.dumps(webhook(alert(), *[alert(f"f{i}") for i in range(2000)])).encode()
    assert len(big) > LIMIT
    assert post(srv.url + "/webhook", json.loads(big))[0] == 413
    unchanged(srv)


def test_a_wrong_token_is_401_before_the_body_or_its_size_is_looked_at(srv: Served) -> None:
    code, body, _ = raw(srv.port, head(10_000_000, token="wrong"), half_close=False)
    assert code == 401 and body["field"] == "Authorization"
    code, body, _ = raw(srv.port, head(5, token=""), b"{...}")
    assert code == 401
    unchanged(srv)


def test_truncated_body_is_400_naming_what_arrived(srv: Served) -> None:
    whole = json.dumps(webhook(alert())).encode()
    code, body, _ = raw(srv.port, head(len(whole)), whole[:20])
    assert code == 400, body
    assert body["error"] == f"body truncated: 20 of {len(whole)} bytes arrived"
    unchanged(srv)


def test_a_stalled_body_is_408_after_the_read_timeout(srv: Served) -> None:
    whole = json.dumps(webhook(alert())).encode()
    code, body, took = raw(srv.port, head(len(whole)), whole[:20], half_close=False)
    assert code == 408 and "did not arrive within 0.5s" in body["error"], body
    assert 0.4 < took < 3
    unchanged(srv)


@pytest.mark.parametrize(
    ("extra", "length", "field"),
    [
        ("", None, "Content-Length"),
        ("Transfer-Encoding: chunked\r\n", None, "Transfer-Encoding"),
        ("", -1, "Content-Length"),
        ("Content-Length: 7\r\n", 5, "Content-Length"),  # two that disagree
    ],
)
def test_a_body_without_one_honest_length_is_refused(
    srv: Served, extra: str, length: int | None, field: str
) -> None:
    code, body, _ = raw(srv.port, head(length, extra=extra), b"[]")
    assert code in (400, 411) and body["field"] == field, body
    unchanged(srv)


# ------------------------------------------------------------------ the body as JSON


BAD_BODIES: list[tuple[str, bytes, str, str]] = [
    ("non-utf8", b'{"alerts": [{"labels": {"node": "\xff\xfe"}}]}', "", "not UTF-8"),
    ("not-json", b'{"alerts": [', "", "body is not JSON: Expecting value: line 1"),
    ("nan", b'{"alerts": [], "truncatedAlerts": NaN}', "", "NaN is not JSON"),
    ("deep", b"[" * 30_000 + b"]" * 30_000, "", "nested too deeply"),
    (
        "deep-in-labels",
        json.dumps({"alerts": [{"labels": {"node": [[[[[["x"]]]]]]}}]}).encode(),
        "alerts[0].labels.node",
        "must be a string, not a list",
    ),
    ("scalar", b"42", "", "expected Alertmanager's payload"),
    ("no-alerts", b'{"version": "4"}', "alerts", "missing"),
    ("alerts-not-list", b'{"alerts": {}}', "alerts", "must be a list, not an object"),
    ("alert-not-object", b'{"alerts": ["x"]}', "alerts[0]", "an alert must be an object"),
    ("labels-missing", b'{"alerts": [{"status": "firing"}]}', "alerts[0].labels", "missing"),
    ("labels-wrong-type", b'{"alerts": [{"labels": "n1"}]}', "alerts[0].labels", "map"),
    ("label-value", b'{"alerts": [{"labels": {"node": 7}}]}', "alerts[0].labels.node", "string"),
    ("status", b'{"alerts": [{"labels": {}, "status": "maybe"}]}', "alerts[0].status", "neither"),
    ("truncated-type", b'{"alerts": [], "truncatedAlerts": true}', "truncatedAlerts", "integer"),
    ("unknown-top", b'{"alerts": [], "alertz": []}', "alertz", "unknown field"),
    ("unknown-alert", b'{"alerts": [{"labels": {}, "lables": {}}]}', "alerts[0].lables", "unknown"),
    (
        "change-id-path",
        json.dumps({"alerts": [{"labels": {"change_id": "../../x"}}]}).encode(),
        "alerts[0].labels.change_id",
        "'../../x' is not a change id",
    ),
    (
        "change-id-annotation",
        json.dumps({"alerts": [{"labels": {}, "annotations": {"change_id": "a/b"}}]}).encode(),
        "alerts[0].annotations.change_id",
        "is not a change id",
    ),
    (
        "node-path",
        json.dumps([{"labels": {"node": "../../etc"}}]).encode(),
        "[0].labels.node",
        "is not a Node name",
    ),
]


@pytest.mark.parametrize(
    ("body", "field", "problem"), [b[1:] for b in BAD_BODIES], ids=[b[0] for b in BAD_BODIES]
)
def test_bad_body_is_400_naming_the_field_and_changes_nothing(
    srv: Served, body: bytes, field: str, problem: str
) -> None:
    code, doc, _ = raw(srv.port, head(len(body)), body)
    assert code == 400, doc
    assert doc["field"] == field and problem in doc["error"], doc
    unchanged(srv)


def test_a_change_id_that_is_a_path_never_reaches_the_file_system(
    srv: Served, tmp_path: Path
) -> None:
    # a journal outside the state directory where "../../x" would lead: never touched
    (tmp_path / "x").mkdir()
    for cid in ("../../x", "../x", "/etc", CHANGE + "/../../x", CHANGE + "\n"):
        code, doc = post(srv.url + "/webhook", webhook(alert(change=cid)))
        assert code == 400 and doc["field"] == "alerts[0].labels.change_id", (cid, doc)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x"]
    assert list((tmp_path / "x").iterdir()) == []
    unchanged(srv)


def test_a_node_no_change_owns_is_422_naming_it(srv: Served) -> None:
    code, doc = post(srv.url + "/webhook", webhook(alert(change=None, node="gpu-7")))
    assert code == 422 and doc["error"] == "alerts[0]: no change owns node gpu-7 now", doc
    code, doc = post(srv.url + "/webhook", webhook(alert(change=None)))
    assert code == 422 and "names no node and no change_id" in doc["error"], doc
    unchanged(srv)


def test_parse_alerts_accepts_both_of_alertmanagers_payloads() -> None:
    # the webhook message as Alertmanager 0.35 sends it (notify/webhook), and a postable alert
    message = {
        "version": "4",
        "groupKey": '{}/{rollout="rollback"}:{alertname="KubeletTopologyAffinityRejections"}',
        "truncatedAlerts": 0,
        "status": "firing",
        "receiver": "rollout",
        "notification_reason": "first notification",
        "groupLabels": {"alertname": "KubeletTopologyAffinityRejections"},
        "commonLabels": {"alertname": "KubeletTopologyAffinityRejections", "node": "gpu-1"},
        "commonAnnotations": {"summary": "s"},
        "routeLabels": {"rollout": "rollback"},
        "externalURL": "http://alertmanager:9093",
        "alerts": [
            {
                "status": "firing",
                "labels": {"alertname": "KubeletTopologyAffinityRejections", "node": "gpu-1"},
                "annotations": {"summary": "s"},
                "startsAt": "2026-12-06T07:00:00Z",
                "endsAt": "0001-01-01T00:00:00Z",
                "generatorURL": "http://prometheus:9090/graph",
                "fingerprint": "8d4f0c2c5a1b3e7f",
            }
        ],
    }
    assert parse_alerts(json.dumps(message).encode()) == message["alerts"]
    postable = [{"labels": {"node": "gpu-1", "change_id": CHANGE}, "startsAt": "x"}]
    assert parse_alerts(json.dumps(postable).encode()) == postable
    with pytest.raises(BadBody) as e:
        parse_alerts(b'{"alerts": [{"labels": {}}], "extra": 1}')
    assert e.value.code == 400 and str(e.value).startswith("extra: unknown field")


# ------------------------------------------------------------------ TLS


@pytest.fixture
def certs(tmp_path: Path) -> tuple[Path, Path, Path]:
    from rollout.lab.pki import PKI

    pki = PKI(tmp_path / "pki")
    cert, key = pki.issue("serve", "rollout-serve", server=True, ips=["127.0.0.1"])
    return pki.ca_cert_path, cert, key


def test_tls_serves_https_only_from_the_certificate_files(
    tmp_path: Path, certs: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = certs
    s = Served(tmp_path / "state", tls=tls_context(cert, key))
    _journal(s.root, CHANGE, {"n1": "applied"})
    try:
        client = ssl.create_default_context(cafile=str(ca))
        req = urllib.request.Request(
            f"https://127.0.0.1:{s.port}/webhook",
            data=json.dumps(webhook(alert())).encode(),
            headers={"Authorization": f"Bearer {TOKEN}"},
            method="POST",
        )
        with urllib.request.urlopen(req, timeout=5, context=client) as r:
            assert r.status == 202
        assert [r.state for r in settled(s.receiver)] == ["rolled-back"]
        # plain HTTP on the TLS port gets no answer; a client that does not trust the CA
        # fails its handshake; neither harms the server
        with pytest.raises((urllib.error.URLError, ConnectionError, OSError)):
            urllib.request.urlopen(s.url + "/healthz", timeout=5)
        with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
            urllib.request.urlopen(
                f"https://127.0.0.1:{s.port}/healthz",
                timeout=5,
                context=ssl.create_default_context(),
            )
        # a peer that connects and says nothing is dropped after the read timeout
        with socket.create_connection(("127.0.0.1", s.port), timeout=5) as idle:
            assert idle.recv(1) == b""
        with urllib.request.urlopen(
            f"https://127.0.0.1:{s.port}/healthz", timeout=5, context=client
        ) as r:
            assert r.status == 200
    finally:
        s.close()


def test_tls_files_that_do_not_load_are_bad_input(
    tmp_path: Path, certs: tuple[Path, Path, Path]
) -> None:
    ca, cert, key = certs
    with pytest.raises(InputError, match="no such file"):
        tls_context(tmp_path / "missing.crt", key)
    with pytest.raises(InputError, match="cannot load the certificate and key"):
        tls_context(cert, ca)  # a certificate where the key should be


# ------------------------------------------------------------------ shutdown


def test_drain_refuses_new_alerts_and_waits_for_the_rollback_under_way(srv: Served) -> None:
    _journal(srv.root, CHANGE, {"n1": "applied"})
    srv.trigger.release.clear()
    code, _ = post(srv.url + "/webhook", webhook(alert()))
    assert code == 202
    left: list[Any] = []
    drainer = threading.Thread(target=lambda: left.append(srv.receiver.drain()))
    drainer.start()
    time.sleep(0.2)
    assert drainer.is_alive()  # the rollback is still running: drain waits for it
    code, doc = post(srv.url + "/webhook", webhook(alert("other", change="20261130T130000Z-b")))
    assert code == 503 and "shutting down" in doc["error"], doc
    assert srv.receiver.drain(timeout=0.05)[0].state == "running"  # bounded wait: still there
    srv.trigger.release.set()
    drainer.join(5)
    assert left == [[]] and [r.state for r in srv.receiver.runs()] == ["rolled-back"]
    assert len(srv.trigger.calls) == 1
