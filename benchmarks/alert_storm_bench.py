"""``rollout serve`` under an alert storm on loopback: the receiver that answers 202 and rolls back
in the background (now) vs the one that answers after the rollback (before), in one run.

Run::

    .venv/bin/python benchmarks/alert_storm_bench.py [--alerts 3000] [--changes 30] [--repeat 2]
        [--bad 300] [--clients 16] [--rollback-s 0.5] [--rounds 2]

What runs, per round and per receiver mode (``background`` on / off), in a fresh child process
(so its peak RSS is its own): ``rollout.gate.serve.make_server`` on 127.0.0.1 with the real HTTP
handler, body limit and payload checks; the rollback trigger is a stand-in that sleeps
``--rollback-s`` (one node's restore takes minutes; its length only decides how long the old
receiver holds a request) and counts its calls per change. The parent process is the storm:
``--clients`` threads POST

* ``--alerts`` distinct firing alerts (one per Alertmanager notification, the worst case for the
  request rate) spread over ``--changes`` changes (``change_id`` label), each delivered
  ``--repeat`` times (Alertmanager's repeats and its retries), shuffled;
* ``--bad`` bad requests among them: a ``Content-Length`` of 10 MB (headers only), non-UTF-8,
  an unknown field, ``change_id: ../../x``, a wrong token, in turn.

Measured: requests per second over the whole storm, each answer's latency (median, p99, max;
and the median of the answers to the notifications that started a rollback, the ones
Alertmanager's webhook timeout bites), the receiver's peak RSS, and the rollbacks each change got
(must be exactly one). Printed raw,
then the medians across rounds and the ratios.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

TOKEN = "storm-token"


def serve(background: bool, rollback_s: float) -> None:
    """The child: a receiver on an ephemeral port (printed), until stdin closes; then its
    stats as one JSON line."""
    from rollout.gate.serve import AlertReceiver, make_server

    calls: Counter[str] = Counter()
    lock = threading.Lock()

    def trigger(change_id: str, nodes: Any, reason: str) -> str:
        with lock:
            calls[change_id] += 1
        time.sleep(rollback_s)
        return "rolled-back"

    receiver = AlertReceiver(trigger, background=background)
    server = make_server(("127.0.0.1", 0), TOKEN, receiver)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    print(server.server_address[1], flush=True)
    sys.stdin.read()
    left = receiver.drain(timeout=60)
    server.shutdown()
    print(
        json.dumps(
            {
                "calls": dict(calls),
                "maxrss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
                "unfinished": len(left),
            }
        ),
        flush=True,
    )


def _alert(i: int, changes: int) -> bytes:
    change = f"20261206T0700{i % changes:02d}Z-storm{i % changes}"
    body = {
        "version": "4",
        "status": "firing",
        "receiver": "rollout",
        "groupKey": f"storm/{i}",
        "alerts": [
            {
                "status": "firing",
                "labels": {
                    "alertname": "KubeletTopologyAffinityRejections",
                    "change_id": change,
                    "node": f"gpu-{i % changes}",
                },
                "annotations": {"summary": "storm"},
                "startsAt": "2026-12-06T07:00:00Z",
                "fingerprint": f"{i:016x}",
            }
        ],
    }
    return json.dumps(body).encode()


def _bad(i: int) -> tuple[bytes, str]:
    """(raw request bytes after the request line's headers, token) of the i-th bad request."""
    kind = i % 5
    if kind == 0:
        return b"", "10MB"
    body = [
        b'{"alerts": [{"labels": {"node": "\xff"}}]}',
        b'{"alerts": [{"labels": {}, "lables": {}}]}',
        b'{"alerts": [{"labels": {"change_id": "../../x"}}]}',
        b'{"alerts": []}',
    ][kind - 1]
    return body, "wrong" if kind == 4 else TOKEN


def _post(
    port: int, body: bytes, token: str = TOKEN, length: int | None = None
) -> tuple[int, str, float]:
    """One request on a fresh connection (as Alertmanager's client does per notification here);
    its status, the first alert's action and seconds."""
    t0 = time.perf_counter()
    size = len(body) if length is None else length
    head = (
        f"POST /webhook HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer {token}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    ).encode()
    with socket.create_connection(("127.0.0.1", port), timeout=60) as s:
        s.sendall(head + body)
        data = b""
        while chunk := s.recv(65536):  # the server closes after each answer (HTTP/1.0)
            data += chunk
    took = time.perf_counter() - t0
    code = int(data.split(b" ", 2)[1])
    action = ""
    if code in (200, 202):
        alerts = json.loads(data.split(b"\r\n\r\n", 1)[1])["alerts"]
        action = alerts[0]["action"]
    return code, action, took


def storm(port: int, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    jobs: list[tuple[str, bytes, str, int | None]] = []
    for i in range(args.alerts):
        jobs += [("alert", _alert(i, args.changes), TOKEN, None)] * args.repeat
    for i in range(args.bad):
        body, token = _bad(i)
        if token == "10MB":
            jobs.append(("bad", b"", TOKEN, 10_000_000))
        else:
            jobs.append(("bad", body, token, None))
    random.Random(seed).shuffle(jobs)

    def one(job: tuple[str, bytes, str, int | None]) -> tuple[str, int, str, float]:
        kind, body, token, length = job
        code, action, took = _post(port, body, token, length)
        return kind, code, action, took

    t0 = time.perf_counter()
    with ThreadPoolExecutor(args.clients) as pool:
        results = list(pool.map(one, jobs))
    wall = time.perf_counter() - t0
    lat = sorted(r[3] for r in results)
    # the answers to the notifications that started a rollback: what Alertmanager waits on
    started = sorted(r[3] for r in results if r[2] in ("triggered", "rolled-back"))
    codes = Counter((r[0], r[1]) for r in results)
    return {
        "requests": len(results),
        "wall_s": round(wall, 3),
        "req_per_s": round(len(results) / wall, 1),
        "alerts_per_s": round(args.alerts * args.repeat / wall, 1),
        "latency_ms": {
            "median": round(statistics.median(lat) * 1000, 2),
            "p99": round(lat[int(len(lat) * 0.99) - 1] * 1000, 2),
            "max": round(lat[-1] * 1000, 2),
            "rollback_starting_median": round(statistics.median(started) * 1000, 2),
        },
        "codes": {f"{k}:{c}": n for (k, c), n in sorted(codes.items())},
    }


def one_mode(background: bool, args: argparse.Namespace, seed: int) -> dict[str, Any]:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", "bg" if background else "sync",
         "--rollback-s", str(args.rollback_s)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert child.stdin is not None and child.stdout is not None
    port = int(child.stdout.readline())
    out = storm(port, args, seed)
    child.stdin.close()
    stats = json.loads(child.stdout.readline())
    child.wait(60)
    calls = stats["calls"]
    out["mode"] = "background (202)" if background else "in the request (before)"
    out["receiver_maxrss_mib"] = round(stats["maxrss_kib"] / 1024, 1)
    out["rollbacks_per_change"] = sorted(set(calls.values()))
    out["changes_rolled_back"] = len(calls)
    out["exactly_one_per_change"] = len(calls) == args.changes and set(calls.values()) == {1}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--alerts", type=int, default=3000)
    p.add_argument("--changes", type=int, default=30)
    p.add_argument("--repeat", type=int, default=2)
    p.add_argument("--bad", type=int, default=300)
    p.add_argument("--clients", type=int, default=16)
    p.add_argument("--rollback-s", type=float, default=0.5)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--serve", choices=["bg", "sync"], help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        serve(args.serve == "bg", args.rollback_s)
        return
    runs: dict[bool, list[dict[str, Any]]] = {True: [], False: []}
    for r in range(args.rounds):
        for background in (True, False) if r % 2 == 0 else (False, True):
            out = one_mode(background, args, seed=r)
            runs[background].append(out)
            print(json.dumps(out), flush=True)
    med = {
        bg: {
            "req_per_s": statistics.median(o["req_per_s"] for o in rs),
            "p99_ms": statistics.median(o["latency_ms"]["p99"] for o in rs),
            "max_ms": statistics.median(o["latency_ms"]["max"] for o in rs),
            "rollback_starting_ms": statistics.median(
                o["latency_ms"]["rollback_starting_median"] for o in rs
            ),
            "maxrss_mib": statistics.median(o["receiver_maxrss_mib"] for o in rs),
            "exactly_one_per_change": all(o["exactly_one_per_change"] for o in rs),
        }
        for bg, rs in runs.items()
    }
    print(json.dumps({"medians": {"background": med[True], "in_request": med[False]}}))
    print(
        f"requests/s background/in-request: "
        f"{med[True]['req_per_s'] / med[False]['req_per_s']:.2f}x; "
        f"p99 latency in-request/background: {med[False]['p99_ms'] / med[True]['p99_ms']:.1f}x; "
        f"answer to a rollback-starting notification in-request/background: "
        f"{med[False]['rollback_starting_ms'] / med[True]['rollback_starting_ms']:.1f}x"
    )


if __name__ == "__main__":
    main()
