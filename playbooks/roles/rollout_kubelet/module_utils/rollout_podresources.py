# ruff: noqa: UP031, SIM905  (runs on the node's own Python, as the facts module does)
"""The kubelet's own account of device and CPU assignments: its podresources gRPC API, read with
the standard library only.

Why not grpcio: the facts module runs on the node with the node's Python, where grpcio is not
installed and nothing may be installed. The two calls needed (``v1.PodResourcesLister/List`` and
``GetAllocatableResources``) are unary with an empty request, so a minimal client is small: HTTP/2
with prior knowledge (h2c) over the kubelet's unix socket ``<root-dir>/pod-resources/kubelet.sock``,
one stream, the gRPC 5-byte message prefix, an HPACK decoder (static and dynamic table, Huffman)
for the response headers and trailers (``grpc-status``), and a protobuf decoder for the messages of
``k8s.io/kubelet/pkg/apis/podresources/v1/api.proto``. The request's headers are HPACK literals
without Huffman, which every decoder accepts.

Flow control: the client keeps HTTP/2's default 65,535-byte windows and returns each DATA frame's
bytes to the connection and the stream with WINDOW_UPDATE as it reads them, so a response of any
size (up to ``MAX_RESPONSE``) arrives. It answers the server's SETTINGS and PING. A response whose
trailers cannot be decoded is returned with an unknown status (``None``) when its message arrived
whole; a non-zero ``grpc-status``, a RST_STREAM, a GOAWAY that abandons the stream (an error, or
a last stream before this one) or a truncated message raises :class:`PodResourcesError`.

Used by ``library/rollout_node_facts.py`` (Ansible ships this file with it as
``ansible.module_utils.rollout_podresources``; ``rollout/ansible/direct.py`` sends it along over
plain ssh). Tests: ``tests/unit/test_podresources_client.py``.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from urllib.parse import unquote

#: The podresources socket, relative to the kubelet's root directory.
SOCKET = "pod-resources/kubelet.sock"
LIST = "/v1.PodResourcesLister/List"
ALLOCATABLE = "/v1.PodResourcesLister/GetAllocatableResources"
#: The largest response this client reads (its own bound: the kubelet's server sets none; List
#: answers a few hundred bytes per pod).
MAX_RESPONSE = 64 << 20

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY = range(8)
WINDOW_UPDATE, CONTINUATION = 8, 9
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
STREAM = 1
DEFAULT_WINDOW = 65535


class PodResourcesError(Exception):
    """The call failed: no socket, a connection or protocol error, or a gRPC error status."""


class HpackError(ValueError):
    """A header block this decoder cannot read."""


# RFC 7541 Appendix A: the static table's names (index 1-61); the values that are not empty.
_STATIC_NAMES = (
    ":authority :method :method :path :path :scheme :scheme :status :status :status :status "
    ":status :status :status accept-charset accept-encoding accept-language accept-ranges "
    "accept access-control-allow-origin age allow authorization cache-control "
    "content-disposition content-encoding content-language content-length content-location "
    "content-range content-type cookie date etag expect expires from host if-match "
    "if-modified-since if-none-match if-range if-unmodified-since last-modified link location "
    "max-forwards proxy-authenticate proxy-authorization range referer refresh retry-after "
    "server set-cookie strict-transport-security transfer-encoding user-agent vary via "
    "www-authenticate"
).split()
_STATIC_VALUES = {
    2: "GET", 3: "POST", 4: "/", 5: "/index.html", 6: "http", 7: "https",
    8: "200", 9: "204", 10: "206", 11: "304", 12: "400", 13: "404", 14: "500",
    16: "gzip, deflate",
}  # fmt: skip

# RFC 7541 Appendix B: each symbol's Huffman code (8 hex digits) and its length in bits.
_HUFFMAN_CODES = (
    "00001ff8007fffd80fffffe20fffffe30fffffe40fffffe50fffffe60fffffe70fffffe800ffffea3ffffffc"
    "0fffffe90fffffea3ffffffd0fffffeb0fffffec0fffffed0fffffee0fffffef0ffffff00ffffff10ffffff2"
    "3ffffffe0ffffff30ffffff40ffffff50ffffff60ffffff70ffffff80ffffff90ffffffa0ffffffb00000014"
    "000003f8000003f900000ffa00001ff900000015000000f8000007fa000003fa000003fb000000f9000007fb"
    "000000fa000000160000001700000018000000000000000100000002000000190000001a0000001b0000001c"
    "0000001d0000001e0000001f0000005c000000fb00007ffc0000002000000ffb000003fc00001ffa00000021"
    "0000005d0000005e0000005f0000006000000061000000620000006300000064000000650000006600000067"
    "00000068000000690000006a0000006b0000006c0000006d0000006e0000006f000000700000007100000072"
    "000000fc00000073000000fd00001ffb0007fff000001ffc00003ffc0000002200007ffd0000000300000023"
    "0000000400000024000000050000002500000026000000270000000600000074000000750000002800000029"
    "0000002a000000070000002b000000760000002c00000008000000090000002d000000770000007800000079"
    "0000007a0000007b00007ffe000007fc00003ffd00001ffd0ffffffc000fffe6003fffd2000fffe7000fffe8"
    "003fffd3003fffd4003fffd5007fffd9003fffd6007fffda007fffdb007fffdc007fffdd007fffde00ffffeb"
    "007fffdf00ffffec00ffffed003fffd7007fffe000ffffee007fffe1007fffe2007fffe3007fffe4001fffdc"
    "003fffd8007fffe5003fffd9007fffe6007fffe700ffffef003fffda001fffdd000fffe9003fffdb003fffdc"
    "007fffe8007fffe9001fffde007fffea003fffdd003fffde00fffff0001fffdf003fffdf007fffeb007fffec"
    "001fffe0001fffe1003fffe0001fffe2007fffed003fffe1007fffee007fffef000fffea003fffe2003fffe3"
    "003fffe4007ffff0003fffe5003fffe6007ffff103ffffe003ffffe1000fffeb0007fff1003fffe7007ffff2"
    "003fffe801ffffec03ffffe203ffffe303ffffe407ffffde07ffffdf03ffffe500fffff101ffffed0007fff2"
    "001fffe303ffffe607ffffe007ffffe103ffffe707ffffe200fffff2001fffe4001fffe503ffffe803ffffe9"
    "0ffffffd07ffffe307ffffe407ffffe5000fffec00fffff3000fffed001fffe6003fffe9001fffe7001fffe8"
    "007ffff3003fffea003fffeb01ffffee01ffffef00fffff400fffff503ffffea007ffff403ffffeb07ffffe6"
    "03ffffec03ffffed07ffffe707ffffe807ffffe907ffffea07ffffeb0ffffffe07ffffec07ffffed07ffffee"
    "07ffffef07fffff003ffffee"
)
_HUFFMAN_LENGTHS = (
    "0d171c1c1c1c1c1c1c181e1c1c1e1c1c1c1c1c1c1c1c1e1c1c1c1c1c1c1c1c1c060a0a0c0d06080b0a0a080b"
    "080606060505050606060606060607080f060c0a0d0607070707070707070707070707070707070707070707"
    "0807080d130d0e060f05060506050606060507070606060506070605050607070707070f0b0e0d1c14161414"
    "1616161716171717171718171818161718171717171516171617171816151416161717151716161815161717"
    "151516151716171714161616171616171a1a1413161716191a1a1a1b1b1a181913151a1b1b1a1b1815151a1a"
    "1c1b1b1b14181415161515171616191918181a171a1b1a1a1b1b1b1b1b1c1b1b1b1b1b1a"
)

#: gRPC status codes by number, for messages (https://grpc.github.io/grpc/core/md_doc_statuscodes.html).
GRPC_CODES = {
    1: "CANCELLED",
    2: "UNKNOWN",
    3: "INVALID_ARGUMENT",
    4: "DEADLINE_EXCEEDED",
    5: "NOT_FOUND",
    7: "PERMISSION_DENIED",
    8: "RESOURCE_EXHAUSTED",
    12: "UNIMPLEMENTED",
    13: "INTERNAL",
    14: "UNAVAILABLE",
    16: "UNAUTHENTICATED",
}

_huffman = {}


def _huffman_table():
    """(bit length, code) -> symbol, built once."""
    if not _huffman:
        for sym in range(256):
            code = int(_HUFFMAN_CODES[sym * 8 : sym * 8 + 8], 16)
            length = int(_HUFFMAN_LENGTHS[sym * 2 : sym * 2 + 2], 16)
            _huffman[(length, code)] = sym
    return _huffman


def huffman_decode(data):
    """The octets of an HPACK Huffman-coded string (RFC 7541 5.2: padding is at most 7 bits of
    the EOS code's leading ones)."""
    table = _huffman_table()
    out = bytearray()
    code = length = 0
    for byte in bytearray(data):
        for shift in range(7, -1, -1):
            code = (code << 1) | ((byte >> shift) & 1)
            length += 1
            sym = table.get((length, code))
            if sym is not None:
                out.append(sym)
                code = length = 0
            elif length >= 30:
                raise HpackError("invalid Huffman code")
    if length > 7 or code != (1 << length) - 1:
        raise HpackError("invalid Huffman padding")
    return bytes(out)


def hpack_int(value, prefix, first=0):
    """An HPACK integer with a ``prefix``-bit prefix, ``first`` holding the octet's other bits."""
    mask = (1 << prefix) - 1
    if value < mask:
        return bytes([first | value])
    out = [first | mask]
    value -= mask
    while value >= 128:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _read_int(buf, pos, prefix):
    mask = (1 << prefix) - 1
    value = buf[pos] & mask
    pos += 1
    if value < mask:
        return value, pos
    shift = 0
    while True:
        if pos >= len(buf):
            raise HpackError("truncated integer")
        b = buf[pos]
        pos += 1
        value += (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            return value, pos
        if shift > 28:
            raise HpackError("integer too large")


def _read_string(buf, pos):
    if pos >= len(buf):
        raise HpackError("truncated string")
    huffman = buf[pos] & 0x80
    n, pos = _read_int(buf, pos, 7)
    raw = bytes(buf[pos : pos + n])
    if len(raw) < n:
        raise HpackError("truncated string")
    text = huffman_decode(raw) if huffman else raw
    return text.decode("utf-8", "replace"), pos + n


class HpackDecoder:
    """One connection's HPACK decoding state (RFC 7541): the static table, the dynamic table and
    its size limit (4,096 octets, SETTINGS_HEADER_TABLE_SIZE's default, which the client never
    changes)."""

    LIMIT = 4096

    def __init__(self):
        self.table = []  # newest first
        self.size = 0
        self.max_size = self.LIMIT

    def _entry(self, index):
        if 1 <= index <= len(_STATIC_NAMES):
            return _STATIC_NAMES[index - 1], _STATIC_VALUES.get(index, "")
        i = index - len(_STATIC_NAMES) - 1
        if index < 1 or i >= len(self.table):
            raise HpackError("header index %d out of range" % index)
        return self.table[i]

    def _evict(self):
        while self.size > self.max_size and self.table:
            name, value = self.table.pop()
            self.size -= len(name.encode()) + len(value.encode()) + 32

    def decode(self, block):
        """The (name, value) pairs of one complete header block."""
        buf = bytearray(block)
        headers = []
        pos = 0
        while pos < len(buf):
            b = buf[pos]
            if b & 0x80:  # indexed field
                index, pos = _read_int(buf, pos, 7)
                headers.append(self._entry(index))
                continue
            if b & 0xE0 == 0x20:  # dynamic table size update
                size, pos = _read_int(buf, pos, 5)
                if size > self.LIMIT:
                    raise HpackError("table size %d above %d" % (size, self.LIMIT))
                self.max_size = size
                self._evict()
                continue
            indexing = b & 0x40
            index, pos = _read_int(buf, pos, 6 if indexing else 4)
            if index:
                name = self._entry(index)[0]
            else:
                name, pos = _read_string(buf, pos)
            value, pos = _read_string(buf, pos)
            headers.append((name, value))
            if indexing:
                self.table.insert(0, (name, value))
                self.size += len(name.encode()) + len(value.encode()) + 32
                self._evict()
        return headers


def request_headers(method):
    """The request's header block: literals without indexing, new names, no Huffman."""
    out = bytearray()
    for name, value in (
        (":method", "POST"),
        (":scheme", "http"),
        (":path", method),
        (":authority", "localhost"),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
    ):
        out.append(0x00)  # literal header field without indexing, new name
        for text in (name, value):
            raw = text.encode("ascii")
            out += hpack_int(len(raw), 7) + raw  # H bit 0: no Huffman
    return bytes(out)


def frame(ftype, flags, stream, payload=b""):
    """One HTTP/2 frame: 24-bit length, type, flags, 31-bit stream id, payload."""
    return struct.pack(">I", len(payload))[1:] + struct.pack(">BBI", ftype, flags, stream) + payload


def grpc_message(message):
    """A gRPC length-prefixed message (not compressed)."""
    return b"\x00" + struct.pack(">I", len(message)) + message


def _unpad(flags, payload, priority=False):
    if flags & PADDED:
        if not payload or payload[0] >= len(payload):
            raise PodResourcesError("malformed padded frame")
        payload = payload[1 : len(payload) - payload[0]]
    if priority:
        payload = payload[5:]
    return payload


class _Connection:
    def __init__(self, sock, deadline):
        self.sock = sock
        self.deadline = deadline

    def _recv(self, n):
        buf = bytearray()
        while len(buf) < n:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")  # noqa: UP041  (Python < 3.10: not TimeoutError)
            self.sock.settimeout(left)
            chunk = self.sock.recv(min(n - len(buf), 1 << 20))
            if not chunk:
                raise PodResourcesError("the kubelet closed the connection")
            buf += chunk
        return bytes(buf)

    def read_frame(self):
        head = self._recv(9)
        length = int.from_bytes(head[:3], "big")
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        return head[3], head[4], stream, self._recv(length)

    def send(self, data):
        self.sock.settimeout(max(self.deadline - time.monotonic(), 0.001))
        self.sock.sendall(data)


def call(path, method, request=b"", timeout=10.0):
    """One unary gRPC call over the unix socket ``path``: (the response message, its
    ``grpc-status``, None when the trailers could not be decoded).

    Raises:
        PodResourcesError: no connection, a protocol error, a non-zero status, no message.
    """
    deadline = time.monotonic() + timeout
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(timeout)
        sock.connect(path)
        return _exchange(_Connection(sock, deadline), method, request)
    except socket.timeout as e:  # noqa: UP041
        raise PodResourcesError("%s %s: no reply within %gs" % (path, method, timeout)) from e
    except OSError as e:
        raise PodResourcesError("%s: %s" % (path, e)) from e
    finally:
        sock.close()


def _exchange(conn, method, request):
    conn.send(
        PREFACE
        + frame(SETTINGS, 0, 0, struct.pack(">HI", 2, 0))  # SETTINGS_ENABLE_PUSH = 0
        + frame(HEADERS, END_HEADERS, STREAM, request_headers(method))
        + frame(DATA, END_STREAM, STREAM, grpc_message(request))
    )
    decoder = HpackDecoder()
    blocks = []  # each complete header block: its fields, None when undecodable
    body = bytearray()
    block = None
    block_ends = False
    broken = False  # once one block fails, the dynamic table is unknown: later ones too
    while True:
        ftype, flags, stream, payload = conn.read_frame()
        if ftype == SETTINGS:
            if not flags & ACK:
                conn.send(frame(SETTINGS, ACK, 0))
        elif ftype == PING:
            if not flags & ACK:
                conn.send(frame(PING, ACK, 0, payload))
        elif ftype == GOAWAY:
            code = int.from_bytes(payload[4:8], "big")
            if code == 0 and int.from_bytes(payload[:4], "big") & 0x7FFFFFFF >= STREAM:
                continue  # a graceful shutdown that still completes this stream
            debug = payload[8:].decode("utf-8", "replace")
            raise PodResourcesError(
                "%s: the kubelet ended the connection (GOAWAY, error code %d) %s"
                % (method, code, debug)
            )
        elif ftype == RST_STREAM and stream == STREAM:
            code = int.from_bytes(payload[:4], "big")
            raise PodResourcesError("%s: stream reset (error code %d)" % (method, code))
        elif ftype == PUSH_PROMISE:
            raise PodResourcesError("%s: PUSH_PROMISE though push is disabled" % method)
        elif ftype in (HEADERS, CONTINUATION) and stream == STREAM:
            if ftype == HEADERS:
                block = bytearray(_unpad(flags, payload, bool(flags & PRIORITY_FLAG)))
                block_ends = bool(flags & END_STREAM)
            elif block is None:
                raise PodResourcesError("%s: CONTINUATION without HEADERS" % method)
            else:
                block += payload
            if flags & END_HEADERS:
                fields = None
                if not broken:
                    try:
                        fields = decoder.decode(bytes(block))
                    except HpackError:
                        broken = True
                blocks.append(fields)
                block = None
                if block_ends:
                    break
        elif ftype == DATA and stream == STREAM:
            if payload:  # hand the window back: connection, and the stream unless it ends
                update = struct.pack(">I", len(payload))
                out = frame(WINDOW_UPDATE, 0, 0, update)
                if not flags & END_STREAM:
                    out += frame(WINDOW_UPDATE, 0, STREAM, update)
                conn.send(out)
            body += _unpad(flags, payload)
            if len(body) > MAX_RESPONSE + 5:
                raise PodResourcesError("%s: response above %d bytes" % (method, MAX_RESPONSE))
            if flags & END_STREAM:
                break
        # WINDOW_UPDATE, PRIORITY and other streams' frames: nothing to do (the request is sent)
    return _reply(method, blocks, bytes(body))


def _reply(method, blocks, body):
    first = blocks[0] if blocks else None
    if first is not None:
        status = dict(first).get(":status")
        if status != "200":
            raise PodResourcesError("%s: HTTP status %s" % (method, status))
    trailers = blocks[-1] if blocks else None
    grpc_status = None
    if trailers is not None and "grpc-status" in dict(trailers):
        t = dict(trailers)
        try:
            grpc_status = int(t["grpc-status"])
        except ValueError:
            grpc_status = None
        if grpc_status:
            raise PodResourcesError(
                "%s: grpc-status %d %s: %s"
                % (
                    method,
                    grpc_status,
                    GRPC_CODES.get(grpc_status, ""),
                    unquote(t.get("grpc-message", "")),
                )
            )
    if len(body) < 5:
        raise PodResourcesError("%s: no response message" % method)
    if body[0]:
        raise PodResourcesError("%s: compressed response message" % method)
    n = struct.unpack(">I", body[1:5])[0]
    if len(body) < 5 + n:
        raise PodResourcesError("%s: response message truncated" % method)
    return body[5 : 5 + n], grpc_status


def _varint(buf, pos):
    value = shift = 0
    while True:
        if pos >= len(buf):
            raise PodResourcesError("truncated protobuf varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift >= 70:
            raise PodResourcesError("protobuf varint too long")


def fields(buf):
    """A protobuf message's (field number, wire type, value) triples: ints for varint and fixed
    types, bytes for length-delimited ones."""
    buf = bytes(buf)
    out = []
    pos = 0
    while pos < len(buf):
        key, pos = _varint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(buf, pos)
        elif wire in (1, 5):
            size = 8 if wire == 1 else 4
            if pos + size > len(buf):
                raise PodResourcesError("truncated protobuf fixed field")
            value = int.from_bytes(buf[pos : pos + size], "little")
            pos += size
        elif wire == 2:
            n, pos = _varint(buf, pos)
            if pos + n > len(buf):
                raise PodResourcesError("truncated protobuf field %d" % num)
            value = buf[pos : pos + n]
            pos += n
        else:
            raise PodResourcesError("protobuf wire type %d not supported" % wire)
        out.append((num, wire, value))
    return out


def _signed(v):
    return v - (1 << 64) if v >= 1 << 63 else v


def _int64s(values):
    """A repeated int64, packed (wire type 2) or not."""
    out = []
    for wire, v in values:
        if wire == 2:
            pos = 0
            while pos < len(v):
                x, pos = _varint(v, pos)
                out.append(_signed(x))
        elif wire == 0:
            out.append(_signed(v))
    return out


def _by_number(buf):
    grouped = {}
    for num, wire, value in fields(buf):
        grouped.setdefault(num, []).append((wire, value))
    return grouped


def _text(grouped, num):
    values = [v for w, v in grouped.get(num, ()) if w == 2]
    return values[-1].decode("utf-8", "replace") if values else ""


def _messages(grouped, num):
    return [v for w, v in grouped.get(num, ()) if w == 2]


def _numa(buf):
    """TopologyInfo: the IDs of its NUMANodes. A NUMANode without its ID field is NUMA node 0:
    proto3 leaves a zero value off the wire, so the kubelet sends ``NUMANode{ID: 0}`` as an
    empty message."""
    return [(_int64s(_by_number(n).get(1, ())) or [0])[-1:] for n in _messages(_by_number(buf), 1)]


def _topology(grouped, num):
    ids = []
    for t in _messages(grouped, num):
        for one in _numa(t):
            ids += one
    return ids


def _devices(buf):
    g = _by_number(buf)
    return {
        "resourceName": _text(g, 1),
        "deviceIds": [v.decode("utf-8", "replace") for v in _messages(g, 2)],
        "numaNodes": _topology(g, 3),
    }


def _memory(buf):
    g = _by_number(buf)
    sizes = [v for w, v in g.get(2, ()) if w == 0]
    return {
        "memoryType": _text(g, 1),
        "size": sizes[-1] if sizes else 0,
        "numaNodes": _topology(g, 3),
    }


def _resources(g, devices, cpus, memory):
    return {
        "devices": [_devices(d) for d in _messages(g, devices)],
        "cpuIds": sorted(_int64s(g.get(cpus, ()))),
        "memory": [_memory(m) for m in _messages(g, memory)],
    }


def _claim_resource(buf):
    """ClaimResource: the device a driver prepared for the claim (driver, pool, device)."""
    g = _by_number(buf)
    return {"driverName": _text(g, 2), "poolName": _text(g, 3), "deviceName": _text(g, 4)}


def _dynamic(buf):
    """DynamicResource: a claim the container uses (name, namespace) and its devices."""
    g = _by_number(buf)
    return {
        "claimName": _text(g, 2),
        "claimNamespace": _text(g, 3),
        "claimResources": [_claim_resource(r) for r in _messages(g, 4)],
    }


def list_response(buf):
    """ListPodResourcesResponse: each pod's name, namespace and containers (name, devices with
    their NUMA nodes, exclusive CPU IDs, memory, and the DRA claims it uses:
    ``dynamicResources``, field 5, filled by kubelets with ``KubeletPodResourcesDynamicResources``
    on)."""
    pods = []
    for p in _messages(_by_number(buf), 1):
        g = _by_number(p)
        containers = []
        for c in _messages(g, 3):
            cg = _by_number(c)
            one = dict({"name": _text(cg, 1)}, **_resources(cg, 2, 3, 4))
            one["dynamicResources"] = [_dynamic(d) for d in _messages(cg, 5)]
            containers.append(one)
        pods.append({"name": _text(g, 1), "namespace": _text(g, 2), "containers": containers})
    return pods


def allocatable_response(buf):
    """AllocatableResourcesResponse: the healthy devices, the allocatable CPU IDs and memory."""
    return _resources(_by_number(buf), 1, 2, 3)


def read(root_dirs, sys_root="/", timeout=5.0):
    """The podresources facts from the first of ``root_dirs`` (kubelet root directories) whose
    socket exists: ``socket`` (the node's path), ``pods`` or ``listError``, ``allocatable`` or
    ``allocatableError`` (``listStatus`` / ``allocatableStatus`` say ``unknown`` when the trailers
    could not be decoded); ``{"error": ...}`` when no root directory has the socket."""
    for d in root_dirs:
        node_path = os.path.join(d, SOCKET)
        path = os.path.join(sys_root, node_path.lstrip("/"))
        if not os.path.exists(path):
            continue
        out = {"socket": node_path}
        for key, method, decode in (
            ("pods", LIST, list_response),
            ("allocatable", ALLOCATABLE, allocatable_response),
        ):
            name = "list" if key == "pods" else key
            try:
                message, status = call(path, method, timeout=timeout)
                out[key] = decode(message)
            except PodResourcesError as e:
                out[name + "Error"] = str(e)
                continue
            if status is None:
                out[name + "Status"] = "unknown: the trailers could not be decoded"
        return out
    return {"error": "no podresources socket (%s) under %s" % (SOCKET, ", ".join(root_dirs))}
