"""The stdlib gRPC client of the kubelet's podresources API (the role's module_utils), without a
kubelet: HPACK against RFC 7541's examples and the header blocks a grpc-go server sent (recorded
from the lab's fake device plugin, a grpc-go server, on 2026-12-04), protobuf against messages
built here by the wire format, and a whole call against a fake HTTP/2 server on a unix socket that
enforces the default flow-control window (a 200 kB response needs the client's WINDOW_UPDATEs),
sends SETTINGS and PING, and ends with grpc-go's trailers. The facts module reports what the
socket said, or why not. The real kubelet answers the same client in
``tests/lab/test_podresources_lab.py``. Runtime: about 3 s (two runs of the facts module).
"""

from __future__ import annotations

import importlib.util
import socket
import struct
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROLE = Path(__file__).resolve().parents[2] / "playbooks/roles/rollout_kubelet"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "rollout_podresources", ROLE / "module_utils/rollout_podresources.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


pr = _load()

# grpc-go's frames for a unary call (recorded): SETTINGS, PING, the response headers
# (:status 200, content-type application/grpc, Huffman-coded), the trailers (grpc-status 0,
# grpc-message "", added to the dynamic table), and a trailers-only UNIMPLEMENTED reply.
GO_SETTINGS = bytes.fromhex("000500004000")
GO_PING = bytes.fromhex("02041010090e0707")
GO_HEADERS = bytes.fromhex("885f8b1d75d0620d263d4c4d6564")
GO_TRAILERS = bytes.fromhex("40889acac8b21234da8f013040899acac8b5254207317f00")
GO_UNIMPLEMENTED = bytes.fromhex(
    "885f8b1d75d0620d263d4c4d656440889acac8b21234da8f02313240899acac8b5254207317fa6b6aeb51fc5"
    "4a5254ce7914d27acaa4a7b14416cee62154ee18ca91857be5ee62175d16cc6abf"
)


def test_hpack_decodes_rfc7541_huffman_examples_with_the_dynamic_table() -> None:
    d = pr.HpackDecoder()
    # C.4.1 and C.4.2: requests with Huffman coding; the second indexes the first's entry
    assert d.decode(bytes.fromhex("828684418cf1e3c2e5f23a6ba0ab90f4ff")) == [
        (":method", "GET"),
        (":scheme", "http"),
        (":path", "/"),
        (":authority", "www.example.com"),
    ]
    assert d.decode(bytes.fromhex("828684be5886a8eb10649cbf"))[-2:] == [
        (":authority", "www.example.com"),
        ("cache-control", "no-cache"),
    ]
    assert pr.huffman_decode(bytes.fromhex("f1e3c2e5f23a6ba0ab90f4ff")) == b"www.example.com"
    with pytest.raises(pr.HpackError):
        pr.huffman_decode(b"\xf1\xe3\x00")  # padding that is not the EOS prefix


def test_hpack_decodes_grpc_gos_headers_trailers_and_error() -> None:
    d = pr.HpackDecoder()
    assert d.decode(GO_HEADERS) == [(":status", "200"), ("content-type", "application/grpc")]
    assert d.decode(GO_TRAILERS) == [("grpc-status", "0"), ("grpc-message", "")]
    err = dict(pr.HpackDecoder().decode(GO_UNIMPLEMENTED))
    assert err["grpc-status"] == "12"
    assert err["grpc-message"] == "unknown method Nope for service v1beta1.DevicePlugin"


def test_the_request_is_plain_hpack_literals() -> None:
    block = pr.request_headers(pr.LIST)
    assert b"\x00\x07:method\x04POST" in block
    assert pr.HpackDecoder().decode(block) == [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", "/v1.PodResourcesLister/List"),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ]


# protobuf, by the wire format
def _varint(n: int) -> bytes:
    n &= (1 << 64) - 1
    out = bytearray()
    while True:
        b = n & 0x7F
        n >>= 7
        out.append(b | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _f(num: int, value: bytes | str | int) -> bytes:
    if isinstance(value, int):
        return _varint(num << 3) + _varint(value)
    raw = value.encode() if isinstance(value, str) else value
    return _varint(num << 3 | 2) + _varint(len(raw)) + raw


def _topology(*nodes: int) -> bytes:
    return b"".join(_f(1, _f(1, n)) for n in nodes)


def _device(resource: str, ids: list[str], *numa: int) -> bytes:
    return _f(1, resource) + b"".join(_f(2, i) for i in ids) + _f(3, _topology(*numa))


def _container(name: str, devices: list[bytes], cpus: list[int], packed: bool = True) -> bytes:
    out = _f(1, name) + b"".join(_f(2, d) for d in devices)
    if packed:
        out += _f(3, b"".join(_varint(c) for c in cpus)) if cpus else b""
    else:
        out += b"".join(_f(3, c) for c in cpus)
    return out + _f(4, _f(1, "memory") + _f(2, 64 << 20) + _f(3, _topology(0)))


def _pod(name: str, ns: str, *containers: bytes) -> bytes:
    return _f(1, name) + _f(2, ns) + b"".join(_f(3, c) for c in containers)


def list_response(*pods: bytes) -> bytes:
    return b"".join(_f(1, p) for p in pods)


def test_protobuf_list_and_allocatable_responses() -> None:
    msg = list_response(
        _pod(
            "train-0",
            "ml",
            _container("app", [_device("nvidia.com/gpu", ["GPU-3"], 0)], [4, 5, 36, 37]),
            _container("side", [], [9, 8], packed=False),
        ),
        _pod("idle", "default", _container("app", [], [])),
    )
    pods = pr.list_response(msg)
    assert pods[0]["name"] == "train-0" and pods[0]["namespace"] == "ml"
    app, side = pods[0]["containers"]
    assert app["devices"] == [
        {"resourceName": "nvidia.com/gpu", "deviceIds": ["GPU-3"], "numaNodes": [0]}
    ]
    assert app["cpuIds"] == [4, 5, 36, 37] and side["cpuIds"] == [8, 9]
    assert app["memory"] == [{"memoryType": "memory", "size": 64 << 20, "numaNodes": [0]}]
    assert pods[1] == {
        "name": "idle",
        "namespace": "default",
        "containers": [
            {
                "name": "app",
                "devices": [],
                "cpuIds": [],
                "memory": app["memory"],
                "dynamicResources": [],
            }
        ],
    }
    alloc = pr.allocatable_response(
        _f(1, _device("nvidia.com/gpu", ["GPU-0"], 0))
        + _f(1, _device("nvidia.com/gpu", ["GPU-4"], 1))
        + _f(2, b"".join(_varint(c) for c in (1, 2, 3)))
    )
    assert [d["deviceIds"] for d in alloc["devices"]] == [["GPU-0"], ["GPU-4"]]
    assert alloc["cpuIds"] == [1, 2, 3]
    with pytest.raises(pr.PodResourcesError):
        pr.list_response(b"\x0a\x05ab")  # a field longer than the message


def test_the_list_reads_each_containers_dra_claims_and_their_devices() -> None:
    """``ContainerResources.dynamic_resources`` (field 5, kubernetes v1.36 ``api.proto``):
    ``DynamicResource{claim_name=2, claim_namespace=3, claim_resources=4}``,
    ``ClaimResource{cdi_devices=1, driver_name=2, pool_name=3, device_name=4}``: the
    allocation-path change's release step names a claim the kubelet still has in use."""
    resource = (
        _f(1, _f(1, "gpu.example.com/gpu=gpu-1"))
        + _f(2, "gpu.example.com")
        + _f(3, "node-a")
        + _f(4, "gpu-1")
    )
    dynamic = _f(2, "one-gpu") + _f(3, "ml") + _f(4, resource)
    msg = list_response(_pod("holder", "ml", _container("c", [], []) + _f(5, dynamic)))
    (c,) = pr.list_response(msg)[0]["containers"]
    assert c["dynamicResources"] == [
        {
            "claimName": "one-gpu",
            "claimNamespace": "ml",
            "claimResources": [
                {"driverName": "gpu.example.com", "poolName": "node-a", "deviceName": "gpu-1"}
            ],
        }
    ]


def test_numa_node_0_as_proto3_sends_it_is_kept() -> None:
    """Go's proto3 encoder leaves ``ID: 0`` off the wire: NUMA node 0 is an empty NUMANode.
    Dropped, every device on NUMA node 0 lost its NUMA node, and the evidence's cross-check with
    the PCI devices' ``numa_node`` never ran (the lab's device plugin showed it)."""
    zero = _f(3, _f(1, b""))  # TopologyInfo{Nodes: [NUMANode{}]}
    alloc = pr.allocatable_response(
        _f(1, _f(1, "nvidia.com/gpu") + _f(2, "GPU-0") + zero)
        + _f(1, _device("nvidia.com/gpu", ["GPU-4"], 1))
        + _f(1, _f(1, "example.com/nic") + _f(2, "nic-0"))  # no topology at all
    )
    assert [d["numaNodes"] for d in alloc["devices"]] == [[0], [1], []]


# a fake HTTP/2 server (one connection, the script below)
def _frame(ftype: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", ftype, flags, stream) + payload


class FakeServer:
    """Answers one unary call on a unix socket as grpc-go does, sending at most the peer's
    flow-control window (65,535 bytes until WINDOW_UPDATE), and records the client's frames."""

    def __init__(self, path: str, reply: Callable[[FakeServer, socket.socket], None]) -> None:
        self.path = path
        self.reply = reply
        self.frames: list[tuple[int, int, int, bytes]] = []
        self.preface = b""
        self.window = {0: 65535, 1: 65535}
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        self.sock.listen(1)
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _recv(self, conn: socket.socket, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = conn.recv(n - len(buf))
            if not chunk:
                raise EOFError
            buf += chunk
        return buf

    def read_frame(self, conn: socket.socket) -> tuple[int, int, int, bytes]:
        head = self._recv(conn, 9)
        n = int.from_bytes(head[:3], "big")
        f = (head[3], head[4], int.from_bytes(head[5:9], "big"), self._recv(conn, n))
        self.frames.append(f)
        if f[0] == 8:
            self.window[f[2]] += int.from_bytes(f[3], "big")
        return f

    def until_request(self, conn: socket.socket) -> None:
        self.preface = self._recv(conn, 24)
        while not any(f[0] == 0 and f[1] & 1 for f in self.frames):
            self.read_frame(conn)

    def send_data(self, conn: socket.socket, data: bytes, end: bool) -> None:
        while data:
            while min(self.window.values()) <= 0:
                self.read_frame(conn)
            n = min(len(data), 16384, *self.window.values())
            last = end and n == len(data)
            conn.sendall(_frame(0, 1 if last else 0, 1, data[:n]))
            self.window[0] -= n
            self.window[1] -= n
            data = data[n:]

    def _serve(self) -> None:
        conn, _ = self.sock.accept()
        try:
            self.reply(self, conn)
            conn.settimeout(0.5)
            try:
                while True:
                    self.read_frame(conn)
            except (EOFError, OSError):
                pass
        finally:
            conn.close()
            self.sock.close()


@pytest.fixture
def short_dir() -> Iterator[Path]:
    # a unix socket path is at most 107 bytes: pytest's tmp_path can be longer
    with tempfile.TemporaryDirectory(dir="/tmp", prefix="podres-") as d:
        yield Path(d)


def _message(body: bytes) -> bytes:
    return b"\x00" + struct.pack(">I", len(body)) + body


def test_a_call_answers_settings_and_ping_and_returns_window_updates(short_dir: Path) -> None:
    many = [
        _pod(f"p-{i}", "ns", _container("app", [_device("nvidia.com/gpu", [f"GPU-{i}"], 0)], [i]))
        for i in range(3000)
    ]
    body = list_response(*many)
    assert len(body) > 3 * 65535

    def reply(s: FakeServer, conn: socket.socket) -> None:
        conn.sendall(_frame(4, 0, 0, GO_SETTINGS) + _frame(6, 0, 0, GO_PING))
        s.until_request(conn)
        conn.sendall(_frame(1, 4, 1, GO_HEADERS))
        s.send_data(conn, _message(body), end=False)
        conn.sendall(_frame(1, 5, 1, GO_TRAILERS))

    server = FakeServer(str(short_dir / "kubelet.sock"), reply)
    message, status = pr.call(server.path, pr.LIST, timeout=10)
    server.thread.join(5)
    assert status == 0 and message == body
    assert len(pr.list_response(message)) == 3000
    assert server.preface == pr.PREFACE
    kinds = [(f[0], f[1]) for f in server.frames]
    assert (4, 1) in kinds and (6, 1) in kinds  # SETTINGS ACK, PING ACK
    assert [f[3] for f in server.frames if f[0] == 6] == [GO_PING]
    headers = next(f for f in server.frames if f[0] == 1)
    assert dict(pr.HpackDecoder().decode(headers[3]))[":path"] == pr.LIST
    data = next(f for f in server.frames if f[0] == 0)
    assert data[3] == b"\x00\x00\x00\x00\x00"  # the empty request, gRPC-framed


def test_a_grpc_error_an_undecodable_trailer_goaway_and_a_reset(short_dir: Path) -> None:
    def unimplemented(s: FakeServer, conn: socket.socket) -> None:
        s.until_request(conn)
        conn.sendall(_frame(1, 5, 1, GO_UNIMPLEMENTED))

    server = FakeServer(str(short_dir / "a.sock"), unimplemented)
    with pytest.raises(pr.PodResourcesError, match="grpc-status 12 UNIMPLEMENTED: unknown method"):
        pr.call(server.path, pr.ALLOCATABLE, timeout=5)

    def garbled(s: FakeServer, conn: socket.socket) -> None:
        s.until_request(conn)
        conn.sendall(_frame(1, 4, 1, GO_HEADERS))
        s.send_data(conn, _message(b"\x10\x01"), end=False)
        conn.sendall(_frame(1, 5, 1, b"\xff\xff\xff\xff\x0f"))  # index out of range

    server = FakeServer(str(short_dir / "b.sock"), garbled)
    assert pr.call(server.path, pr.LIST, timeout=5) == (b"\x10\x01", None)

    def graceful(s: FakeServer, conn: socket.socket) -> None:
        s.until_request(conn)
        conn.sendall(_frame(7, 0, 0, struct.pack(">II", 1, 0)))  # GOAWAY: stream 1 still served
        conn.sendall(_frame(1, 4, 1, GO_HEADERS))
        s.send_data(conn, _message(b"\x10\x02"), end=False)
        conn.sendall(_frame(1, 5, 1, GO_TRAILERS))

    server = FakeServer(str(short_dir / "g.sock"), graceful)
    assert pr.call(server.path, pr.LIST, timeout=5) == (b"\x10\x02", 0)

    def going(s: FakeServer, conn: socket.socket) -> None:
        s.until_request(conn)
        conn.sendall(_frame(7, 0, 0, struct.pack(">II", 0, 2) + b"bye"))

    server = FakeServer(str(short_dir / "h.sock"), going)
    with pytest.raises(pr.PodResourcesError, match=r"GOAWAY, error code 2\) bye"):
        pr.call(server.path, pr.LIST, timeout=5)

    def reset(s: FakeServer, conn: socket.socket) -> None:
        s.until_request(conn)
        conn.sendall(_frame(3, 0, 1, struct.pack(">I", 2)))

    server = FakeServer(str(short_dir / "c.sock"), reset)
    with pytest.raises(pr.PodResourcesError, match="stream reset"):
        pr.call(server.path, pr.LIST, timeout=5)
    with pytest.raises(pr.PodResourcesError, match=r"No such file|Connection refused"):
        pr.call(str(short_dir / "absent.sock"), pr.LIST, timeout=1)


def _facts(root: Path) -> dict[str, Any]:
    from tests.unit.test_node_facts_module import _run

    got = _run(
        root,
        markers=[],
        kubelet_paths=[],
        checkpoint_dirs=["/var/lib/kubelet", "/var/snap/microk8s/common/var/lib/kubelet"],
    )
    facts: dict[str, Any] = got["podResources"]
    return facts


def test_the_facts_module_asks_the_socket_under_the_kubelet_root(short_dir: Path) -> None:
    assert _facts(short_dir) == {
        "error": "no podresources socket (pod-resources/kubelet.sock) under /var/lib/kubelet, "
        "/var/snap/microk8s/common/var/lib/kubelet"
    }
    sock_dir = short_dir / "var/snap/microk8s/common/var/lib/kubelet/pod-resources"
    sock_dir.mkdir(parents=True)
    body = list_response(_pod("a", "ns", _container("app", [], [3])))

    def reply(s: FakeServer, conn: socket.socket) -> None:
        s.until_request(conn)
        conn.sendall(_frame(1, 4, 1, GO_HEADERS))
        s.send_data(conn, _message(body), end=False)
        conn.sendall(_frame(1, 5, 1, GO_TRAILERS))

    # one connection is served: List answers, GetAllocatableResources finds no listener
    server = FakeServer(str(sock_dir / "kubelet.sock"), reply)
    got = _facts(short_dir)
    server.thread.join(5)
    assert got["socket"] == "/var/snap/microk8s/common/var/lib/kubelet/pod-resources/kubelet.sock"
    assert got["pods"][0]["containers"][0]["cpuIds"] == [3]
    assert "allocatable" not in got and "allocatableError" in got
