"""Rollback hand-over latency against the lab's real API server: request written -> owner stops.

Run on a machine with the lab binaries (``ROLLOUT_LAB_BIN`` or the cache dir)::

    .venv/bin/python benchmarks/handover_bench.py [--trials 20] [--duration 30]

What runs: a lab control plane (etcd + kube-apiserver, no nodes). Each trial, in this process:

* an owner takes the ``rollout-lock`` Lease (``LeaseLock.acquire``, the same object ``rollout
  apply`` holds) and starts its thread (compare-and-swap renewal every ``duration/3`` s, a watch on
  the Lease in between);
* after a random delay within one renewal period, a requester writes a rollback request on it
  (``hand_over``, what ``rollout rollback`` / ``rollout serve`` call);
* latency = the moment the owner's :class:`~rollout.interrupt.Interrupt` is set (what stops the
  soak, the drain and the batch loop) - the moment just before the request's write began.

Side by side, in the same run: what an owner that only looked at the Lease when it renews (no
watch; the old renew loop's period ``duration/3``) would see for the same request times: the wait
until its next renewal tick. Not included in either: a ``rollout rollback`` process's start-up
(Python + imports, ~1 s here), which the lab test
``test_rollback_during_the_soak_is_handed_to_the_owner`` includes in the latency it prints.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import threading
import time
from pathlib import Path

from rollout.kube.client import connect
from rollout.kube.handover import hand_over
from rollout.kube.leases import LeaseLock
from rollout.lab.cluster import Lab


def _pct(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, round(p / 100 * (len(xs) - 1)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--duration", type=int, default=30, help="Lease duration, seconds")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="handover-bench-") as tmp:
        lab = Lab(f"hb{random.randrange(1 << 16)}", Path(tmp))
        lab.start_control_plane()
        try:
            api = connect(str(lab.kubeconfig))
            watch_ms: list[float] = []
            tick_ms: list[float] = []
            period = args.duration / 3
            for i in range(args.trials):
                owner = LeaseLock(api, "default", duration_s=args.duration)
                owner.acquire(f"bench-{i}")
                acquired = time.monotonic()
                seen = threading.Event()
                owner.interrupt.add_waker(seen.set)
                time.sleep(random.uniform(0.2, period))
                t0 = time.monotonic()
                handed = hand_over(api, "default", f"bench-{i}", None, "bench pid 0")
                assert handed is not None
                assert seen.wait(30), "the owner never saw the request"
                watch_ms.append((owner.request_seen_at or time.monotonic()) * 1000 - t0 * 1000)
                since = t0 - acquired
                tick_ms.append((period - since % period) * 1000)
                owner.release()
                print(
                    f"trial {i + 1}: watch {watch_ms[-1]:.1f} ms, renew-tick {tick_ms[-1]:.0f} ms"
                )
        finally:
            lab.down()
    w50, t50 = statistics.median(watch_ms), statistics.median(tick_ms)
    print(f"\n{args.trials} trials, lease duration {args.duration}s (renewal every {period:.0f}s)")
    print("| hand-over | p50 | p99 | max |")
    print("|---|---|---|---|")
    print(
        f"| watch (rollout) | {w50:.1f} ms | {_pct(watch_ms, 99):.1f} ms | {max(watch_ms):.1f} ms |"
    )
    print(
        f"| at the next renewal (no watch) | {t50:.0f} ms | {_pct(tick_ms, 99):.0f} ms "
        f"| {max(tick_ms):.0f} ms |"
    )
    print(f"| ratio (p50) | {t50 / w50:.0f}x | | |")


if __name__ == "__main__":
    main()
