"""The lab's CPU stand-in for a GPU inference benchmark (``rollout bench --standin``).

It runs on the node with the node's Python (stdlib only) under the binding ``rollout bench``
set, measures real CPU and memory work, and prints one JSON object in the bench output contract
(docs/bench.md), marked ``"simulated": true``:

* ``load_s``: seconds to build a buffer of ``ROLLOUT_STANDIN_MB`` MiB (default 64) and checksum
  it: the stand-in for loading model weights.
* ``h2d_gbps``: memory copy bandwidth, GB/s (10^9 bytes), copying that buffer into a second one
  (best of 5 copies): the stand-in for host-to-device bandwidth.
* ``p50_ms`` / ``p99_ms``: percentiles of ``ROLLOUT_STANDIN_STEPS`` (default 200) timed
  "inference steps", each a CRC-32 over a 1 MiB slice at a different offset of the buffer.
* ``cpus_allowed``: this process's ``Cpus_allowed_list`` (``/proc/self/status``): the CPUs it
  was allowed to run on.

Nothing here touches a GPU: the numbers say how the binding affects CPU and memory work on this
machine, not what a GPU model would do.
"""

from __future__ import annotations

import json
import os
import time
import zlib

MIB = 1 << 20


def _env_int(name: str, default: int) -> int:
    value = int(os.environ.get(name, default))
    if value < 1:
        raise SystemExit(f"{name} must be at least 1")
    return value


def _cpus_allowed() -> str:
    with open("/proc/self/status", encoding="utf-8") as f:
        for line in f:
            if line.startswith("Cpus_allowed_list:"):
                return line.split(":", 1)[1].strip()
    return ""


def _percentile(sorted_values: list[float], q: float) -> float:
    k = (len(sorted_values) - 1) * q
    lo = int(k)
    hi = min(lo + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (k - lo)


def main() -> None:
    size = _env_int("ROLLOUT_STANDIN_MB", 64) * MIB
    steps = _env_int("ROLLOUT_STANDIN_STEPS", 200)

    t0 = time.perf_counter()
    weights = bytearray(os.urandom(MIB)) * (size // MIB)
    zlib.crc32(weights)
    load_s = time.perf_counter() - t0

    target = bytearray(size)
    copies = []
    for _ in range(5):
        t = time.perf_counter()
        target[:] = weights
        copies.append(time.perf_counter() - t)
    best = min(copies)
    h2d_gbps = size / best / 1e9

    view = memoryview(weights)
    slots = max(1, size // MIB)
    latencies = []
    for i in range(steps):
        off = (i * 7919 % slots) * MIB
        t = time.perf_counter_ns()
        zlib.crc32(view[off : off + MIB])
        latencies.append((time.perf_counter_ns() - t) / 1e6)
    latencies.sort()

    print(
        json.dumps(
            {
                "p50_ms": round(_percentile(latencies, 0.50), 4),
                "p99_ms": round(_percentile(latencies, 0.99), 4),
                "h2d_gbps": round(h2d_gbps, 3),
                "load_s": round(load_s, 4),
                "samples": steps,
                "simulated": True,
                "cpus_allowed": _cpus_allowed(),
            }
        )
    )


if __name__ == "__main__":
    main()
