"""Gate detection latency in the lab: the kubelet's first rejection -> Failed verdict, p50/p99.

Run as root on a machine with the lab binaries (``ROLLOUT_LAB_BIN`` or the cache dir)::

    .venv/bin/python benchmarks/gate_lab_bench.py [--trials 8] [--interval 5]

What runs: a lab control plane and one lab node whose kubelet serves ``single-numa-node``. Each
trial starts two analyses side by side on that node:

* the gate as ``rollout apply`` / ``rollout watch`` build it (``build_soak_gate``: per-node pod
  watch + kubelet Warning events + kubelet ``/metrics`` through the node proxy; the API signal's
  wake-up is the soak loop's sleep);
* an Argo-style analysis: every ``--interval`` seconds, one query (list the node's pods) and a
  verdict on the rejected fraction, as an AnalysisRun's metric does at its ``interval``.

After a random delay within one interval, a Guaranteed pod asking for 6 GPUs (the node has 8, a
NUMA node 4) is bound to the node; the lab kubelet rejects it with ``TopologyAffinityError``. The
moment of rejection is the kubelet's own: its Warning Event is named ``<pod>.<UnixNano hex>``, as
client-go's recorder names events. Latency = Failed verdict time - that moment, for each analysis.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import tempfile
import threading
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from rollout.change.plan.gate_section import GateConfig
from rollout.gate.assembly import build_soak_gate
from rollout.kube.client import connect
from rollout.kubelet import checkpoints
from rollout.lab.cluster import Lab
from rollout.verdicts import Outcome

TAE = "TopologyAffinityError"


def _single_numa(lab: Lab, node: str) -> None:
    """Serve single-numa-node with the static CPU manager (what a canary change does)."""
    root = lab.machines.node_root(node)
    path = root / "var/lib/kubelet/config.yaml"
    lab.machines.stop_kubelet(node)
    cfg = yaml.safe_load(path.read_text())
    cfg.update(
        {
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0,32",
            "topologyManagerPolicy": "single-numa-node",
        }
    )
    path.write_text(yaml.safe_dump(cfg, sort_keys=True))
    for f in (checkpoints.CPU_STATE_FILE, checkpoints.MEMORY_STATE_FILE):
        (root / "var/lib/kubelet" / f).unlink(missing_ok=True)
    lab.machines.start_kubelet(node)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        code, body = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/configz", timeout=3)
        if code == 200 and body.get("kubeletconfig", {}).get("topologyManagerPolicy") == (
            "single-numa-node"
        ):
            lab.machines.wait_ready([node], timeout=30)
            return
        time.sleep(0.2)
    raise SystemExit(f"{node} did not come back with single-numa-node")


def _pod(name: str, node: str) -> dict[str, Any]:
    res = {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": "6"}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "app",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"requests": res, "limits": res},
                }
            ],
        },
    }


def _rejected_at(lab: Lab, ns: str, pod: str, timeout: float = 30) -> float:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        code, out = lab.api.request(
            "GET", f"/api/v1/namespaces/{ns}/events?fieldSelector=involvedObject.name%3D{pod}"
        )
        for e in out.get("items", []) if code == 200 else ():
            if e.get("reason") == TAE:
                return int(e["metadata"]["name"].rsplit(".", 1)[1], 16) / 1e9
        time.sleep(0.1)
    raise SystemExit(f"pod {pod} was not rejected")


def _poller(lab: Lab, node: str, since: float, interval: float, stop: threading.Event) -> float:
    """Argo-style: query every ``interval``; Failed when a rejection is in the result."""
    while not stop.wait(interval):
        code, out = lab.api.request(
            "GET", f"/api/v1/pods?fieldSelector=spec.nodeName%3D{node}", timeout=5
        )
        if code != 200:
            continue
        for p in out["items"]:
            created = p["metadata"]["creationTimestamp"]
            if datetime.fromisoformat(created.replace("Z", "+00:00")).timestamp() < since - 1:
                continue
            if p.get("status", {}).get("reason") == TAE:
                return time.time()
    return float("nan")


def _trial(
    lab: Lab, api: Any, cfg: GateConfig, node: str, ns: str, name: str, phase: float
) -> tuple[float, float]:
    """One trial: both analyses running, a misfit pod after ``phase`` s; both latencies."""
    since = time.time()
    gate = build_soak_gate(cfg, api, since=since, record=lambda _k, _d: None, output="none")
    verdicts: list[Any] = []
    polled: list[float] = []
    stop = threading.Event()
    g = threading.Thread(target=lambda: verdicts.append(gate.evaluate("bench", [node])))
    p = threading.Thread(
        target=lambda: polled.append(_poller(lab, node, since, cfg.interval, stop))
    )
    g.start()
    p.start()
    time.sleep(1.0 + phase)  # the watches have listed; the rejection lands at a random phase
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{ns}/pods", _pod(name, node))
    assert code == 201, out
    t0 = _rejected_at(lab, ns, name)
    g.join(timeout=70)
    p.join(timeout=cfg.interval * 3)
    stop.set()
    (v,) = verdicts
    assert v.status is Outcome.FAILED, v.reason
    lab.api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{name}")
    return v.at - t0, polled[0] - t0


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, round(q * (len(s) - 1))))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=8)
    ap.add_argument("--interval", type=float, default=5.0, help="the polling analysis's interval")
    args = ap.parse_args()
    rng = random.Random(5)
    lab = Lab(f"gbench{os.getpid()}", Path(tempfile.mkdtemp(prefix="gate-lab-bench-")))
    lab.start_control_plane()
    try:
        (node,) = [
            n.name for n in lab.machines.add_nodes(["gbench-1"], ["kubeadm"], wait_ready=True)
        ]
        _single_numa(lab, node)
        ns = "gate-bench"
        lab.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        time.sleep(2)  # the ServiceAccount controller's "default"
        api = connect(str(lab.kubeconfig))
        cfg = GateConfig(soak=60, window=60, interval=args.interval, min_admissions=1, probes=False)
        watch_lat: list[float] = []
        poll_lat: list[float] = []
        for trial in range(args.trials):
            w, pl = _trial(
                lab, api, cfg, node, ns, f"misfit-{trial}", rng.uniform(0, args.interval)
            )
            watch_lat.append(w)
            poll_lat.append(pl)
            print(f"trial {trial}: watch {w * 1000:.0f} ms, poll {pl:.2f} s")
        print(f"\n{args.trials} trials, polling interval {args.interval:g} s")
        print("| analysis | p50 | p99 |\n|---|---|---|")
        for label, xs in (("watch (rollout)", watch_lat), ("polling (Argo-style)", poll_lat)):
            print(f"| {label} | {_pct(xs, 0.5) * 1000:.0f} ms | {_pct(xs, 0.99) * 1000:.0f} ms |")
        print(
            f"mean: watch {statistics.mean(watch_lat) * 1000:.0f} ms, "
            f"polling {statistics.mean(poll_lat) * 1000:.0f} ms"
        )
    finally:
        lab.down()


if __name__ == "__main__":
    main()
