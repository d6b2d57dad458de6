"""Gate benchmark: detection latency (watch vs Argo-style polling) and the watcher's cost at scale.

Usage: ``.venv/bin/python benchmarks/gate_bench.py [--trials N] [--interval S]``

1. Latency: a producer thread plays a pod stream (admitted pods, then the first rejection at a
   random moment) into the gate's real counting code (``AdmissionTracker`` + ``evaluate``). The
   watch-driven gate sleeps on the API signal's wake-up event (as ``rollout watch`` does); the
   Argo-style analysis evaluates every ``--interval`` seconds. Both run in the same process and
   time first rejection -> Failed verdict.
2. Cost: synthetic pod streams for clusters of 1,000 to 5,000 nodes with ten pods per node and a
   10-node canary. ``rollout`` watches ``spec.nodeName=<node>`` per canary node, so the API server
   sends only the canary's pods; a cluster-wide watch (what a tool without field selectors does)
   receives every pod and filters client-side. CPU (``process_time``) and peak memory
   (``tracemalloc``) of feeding each stream to the tracker and evaluating once.
"""

from __future__ import annotations

import argparse
import random
import statistics
import threading
import time
import tracemalloc
from typing import Any

from rollout.change.plan.gate_section import GateConfig
from rollout.gate.analysis import evaluate
from rollout.kube.watching import AdmissionTracker
from rollout.samples import count_window
from rollout.verdicts import Outcome, SignalState

CFG = GateConfig(window=60, soak=60, interval=1, threshold=0.05, min_admissions=5)
NODES = [f"gpu-{i:02d}" for i in range(10)]


def pod(uid: str, node: str, rejected: bool, owner: str = "web-1") -> dict[str, Any]:
    status: dict[str, Any] = {"phase": "Failed", "reason": "TopologyAffinityError"}
    if not rejected:
        status = {"phase": "Running", "startTime": "2026-11-30T12:00:01Z"}
    return {
        "metadata": {
            "uid": uid,
            "namespace": "ml",
            "creationTimestamp": "2026-11-30T12:00:00Z",
            "ownerReferences": [{"kind": "ReplicaSet", "name": owner, "controller": True}],
        },
        "spec": {"nodeName": node},
        "status": status,
    }


def verdict_of(tracker: AdmissionTracker, now: float) -> Outcome:
    counts = count_window(tracker.samples(), NODES, now, CFG.window)
    return evaluate(CFG, [SignalState("api", counts)], now).status


def one_trial(polling: bool, interval: float, rng: random.Random) -> float:
    tracker = AdmissionTracker(since=0)
    woke = threading.Event()
    injected: list[float] = []
    for i, n in enumerate(NODES):
        tracker.observe_pod(pod(f"ok-{i}", n, False), time.time())

    def producer() -> None:
        time.sleep(rng.uniform(0.05, interval))
        injected.append(time.perf_counter())
        if tracker.observe_pod(pod("bad", NODES[3], True, "train-7f"), time.time()):
            woke.set()

    t = threading.Thread(target=producer)
    t.start()
    deadline = time.perf_counter() + 5 * interval + 1
    while time.perf_counter() < deadline:
        if verdict_of(tracker, time.time()) is Outcome.FAILED:
            break
        if polling:
            time.sleep(interval)
        else:
            woke.wait(interval)
            woke.clear()
    done = time.perf_counter()
    t.join()
    return done - injected[0]


def pct(xs: list[float], p: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, round(p / 100 * (len(s) - 1)))]


def latency(trials: int, interval: float) -> None:
    rng = random.Random(7)
    watch = [one_trial(False, interval, rng) for _ in range(trials)]
    poll = [one_trial(True, interval, rng) for _ in range(trials)]
    print(f"detection latency, {trials} trials, polling interval {interval:g}s")
    for name, xs in (("watch (rollout)", watch), ("polling (Argo-style)", poll)):
        print(f"  {name:22s} p50 {pct(xs, 50) * 1000:8.2f} ms   p99 {pct(xs, 99) * 1000:8.2f} ms")
    print(
        f"  ratio polling/watch    p50 {statistics.median(poll) / statistics.median(watch):8.0f}x"
    )


def cost(cluster_nodes: int, pods_per_node: int, selective: bool) -> tuple[float, float, int]:
    """CPU seconds, peak MB and pods received for consuming one stream (built before timing)."""
    canary = set(NODES)
    names = NODES + [f"node-{i}" for i in range(cluster_nodes - len(NODES))]
    sent = [n for n in names if n in canary] if selective else names  # the field selector
    stream = [
        pod(f"p{n}-{k}", n, k == 0 and n == NODES[0], owner=f"rs-{n}-{k % 3}")
        for n in sent
        for k in range(pods_per_node)
    ]
    tracemalloc.start()
    t0 = time.process_time()
    tracker = AdmissionTracker(since=0)
    for obj in stream:
        if obj["spec"]["nodeName"] in canary:  # a cluster-wide watch must filter client-side
            tracker.observe_pod(obj, 1.0)
    outcome = verdict_of(tracker, 2.0)
    cpu = time.process_time() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert outcome is Outcome.FAILED
    return cpu, peak / 1e6, len(stream)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=40)
    ap.add_argument("--interval", type=float, default=0.5)
    a = ap.parse_args()
    latency(a.trials, a.interval)
    print("\nwatcher cost, 10-node canary, 10 pods per node")
    head = f"  {'cluster nodes':>13} {'pods':>7} | {'per-node watches':>29}"
    print(f"{head} | {'cluster-wide watch':>29}")
    for n in (1000, 2500, 5000, 10000):
        c1, m1, s1 = cost(n, 10, True)
        c2, m2, s2 = cost(n, 10, False)
        print(
            f"  {n:>13} {n * 10:>7} | {s1:>6} pods {c1 * 1000:6.1f} ms {m1:5.2f} MB"
            f" | {s2:>6} pods {c2 * 1000:6.1f} ms {m2:5.2f} MB"
        )


if __name__ == "__main__":
    main()
