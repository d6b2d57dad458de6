"""A node's move to DRA and its way back with ``rollout`` versus their floor, side by side in one
run on one lab (issue 37: goal at most 1.3x the floor).

Run as root on a machine with the lab binaries, the real kubelet and the DRA driver::

    .venv/bin/python benchmarks/migration_bench.py [--rounds 3] [--out FILE]

Method. One control plane; three real-kubelet nodes (``mb-dra`` on DRA from the start: the pool
the drained pod's replacement may use, and the cluster's proof that the driver runs; ``mb-x``
and ``mb-y`` on the device plugin); the lab DeviceClass maps ``nvidia.com/gpu`` (KEP-5004); two
DaemonSet objects select on the two path labels (as ``tests/lab/test_migrate_lab.py`` sets it
up). A Deployment pinned to ``mb-x`` runs one pod requesting ``nvidia.com/gpu: 1``: served by
the device plugin on the way there, through a claim for the DeviceClass on the way back; the
drain has that pod to evict both ways, and its replacement (Pending while the node is cordoned)
comes back on ``mb-x`` after the uncordon, before the next measurement (not timed). Every
measurement is on ``mb-x``. Per round, in an order that alternates between rounds:

* **tool**: ``rollout migrate --canary --yes --terminate-claims`` (inventory ``mb-x``, the canary;
  plan ``allocationPath: nodes: dra``) then ``rollout promote --yes``: the migration's wall
  time; then ``rollout rollback --change ID --yes``: the rollback's wall time. Each through the
  CLI as a subprocess, preflight and gate included. The journal's step spans are kept.
* **floor**: the same node moved by hand, the way an operator with ``kubectl`` does it, in the
  same safe order and with nothing checked beyond what each wait needs. There: cordon; drain
  (the Eviction API for each pod bound to the node, then poll until none is left); the
  device-plugin label ``false`` and poll until allocatable ``nvidia.com/gpu`` is 0; the DRA label
  ``true`` and poll until the driver's ResourceSlices for the node list its 8 GPUs (the driver's
  republish delay); uncordon. Back: cordon; drain; the DRA label ``false`` and poll until the
  node's slices are gone (the kubelet wipes them about 30 s after the driver unregisters,
  ``defaultWipingDelay``); the device-plugin label ``true`` and poll until allocatable is 8
  again (the plugin's re-registration); uncordon. Polls every 0.1 s (the tool's every 1 s).

Prints each sample, then medians and tool/floor ratios, and writes every sample and the floor's
parts (drain, allocatable zero, republish, wipe, re-registration) and the tool's journal spans
as JSON (``--out``, default ``benchmarks/migration_bench-results.json``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout.change.record.journal import Journal  # noqa: E402
from rollout.lab import daemonsets as ds  # noqa: E402
from rollout.lab.cluster import Lab  # noqa: E402
from tests.lab import changekit as ck  # noqa: E402

GPU = "nvidia.com/gpu"
GPUS = 8  # a lab node's GPUs
DP, DRA = ds.DEFAULT_LABELS[ds.DEVICE_PLUGIN], ds.DEFAULT_LABELS[ds.DRA_DRIVER]
NODE, SPARE, OTHER = "mb-x", "mb-y", "mb-dra"
NS, DS_NS = "mbench", "gpu-operator-lab"
POLL = 0.1
MERGE = "application/merge-patch+json"


def _wait(fn: Callable[[], bool], timeout: float, what: str) -> None:
    ck.wait_for(fn, timeout, what, every=POLL)


def _node(lab: Lab) -> dict[str, Any]:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{NODE}")
    assert code == 200, body
    return dict(body)


def _allocatable(lab: Lab) -> int:
    return int(_node(lab)["status"].get("allocatable", {}).get(GPU, "0"))


def _patch_node(lab: Lab, body: dict[str, Any]) -> None:
    code, out = lab.api.request("PATCH", f"/api/v1/nodes/{NODE}", body, content_type=MERGE)
    assert code == 200, out


def _labels(lab: Lab, dp: bool, dra: bool) -> None:
    _patch_node(
        lab, {"metadata": {"labels": {DP: "true" if dp else "false", DRA: str(dra).lower()}}}
    )


def _pods_on_node(lab: Lab) -> list[dict[str, Any]]:
    code, body = lab.api.request("GET", f"/api/v1/pods?fieldSelector=spec.nodeName={NODE}")
    assert code == 200, body
    return list(body["items"])


def _drain(lab: Lab) -> None:
    """``kubectl drain``'s work: evict each pod bound to the node, wait until none is left."""
    for p in _pods_on_node(lab):
        owners = p["metadata"].get("ownerReferences") or []
        if any(o.get("kind") == "DaemonSet" for o in owners):
            continue
        ns, name = p["metadata"]["namespace"], p["metadata"]["name"]
        code, out = lab.api.request(
            "POST",
            f"/api/v1/namespaces/{ns}/pods/{name}/eviction",
            {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": name}},
        )
        assert code in (201, 404), out
    _wait(lambda: not _pods_on_node(lab), 120, f"{NODE} drained")


def _timed(parts: dict[str, float], key: str, fn: Callable[[], None]) -> None:
    t = time.monotonic()
    fn()
    parts[key] = round(time.monotonic() - t, 2)


def floor_forward(lab: Lab) -> tuple[float, dict[str, float]]:
    parts: dict[str, float] = {}
    t = time.monotonic()
    _patch_node(lab, {"spec": {"unschedulable": True}})
    _timed(parts, "drain", lambda: _drain(lab))

    def plugin_off() -> None:
        _labels(lab, dp=False, dra=False)
        _wait(lambda: _allocatable(lab) == 0, 120, f"{NODE} allocatable {GPU} 0")

    def driver_on() -> None:
        _labels(lab, dp=False, dra=True)
        _wait(lambda: len(lab.devices.driver_slices(NODE)) == GPUS, 120, f"{NODE} slices")

    _timed(parts, "allocatableZero", plugin_off)
    _timed(parts, "republish", driver_on)
    _patch_node(lab, {"spec": {"unschedulable": False}})
    return time.monotonic() - t, parts


def floor_back(lab: Lab) -> tuple[float, dict[str, float]]:
    parts: dict[str, float] = {}
    t = time.monotonic()
    _patch_node(lab, {"spec": {"unschedulable": True}})
    _timed(parts, "drain", lambda: _drain(lab))

    def driver_off() -> None:
        _labels(lab, dp=False, dra=False)
        _wait(lambda: not lab.devices.driver_slices(NODE), 180, f"{NODE} slices wiped")

    def plugin_on() -> None:
        _labels(lab, dp=True, dra=False)
        _wait(lambda: _allocatable(lab) == GPUS, 180, f"{NODE} allocatable {GPU} {GPUS}")

    _timed(parts, "wipe", driver_off)
    _timed(parts, "reregister", plugin_on)
    _patch_node(lab, {"spec": {"unschedulable": False}})
    return time.monotonic() - t, parts


def _plan(path: Path) -> Path:
    path.write_text(
        "\n".join(
            [
                "apiVersion: rollout.dev/v1alpha1",
                "kind: RolloutPlan",
                "allocationPath:",
                "  groups:",
                "    nodes: dra",
                f"  driver: {ds.DRIVER}",
                f"  deviceClass: {ds.DEVICE_CLASS}",
                "  timeout: 3m",
                "strategy:",
                "  canaryGroup: canary",
                "  maxUnavailable: 1",
                "  drain:",
                "    timeout: 60s",
                "    backoffCap: 1s",
                "",
            ]
        )
    )
    return path


def _spans(journal: Journal, path: str, start: float, end: float) -> dict[str, float]:
    """step -> seconds from its first ``begin`` on NODE along ``path`` to the next step's (the
    last step: to its ``done``), so that the waits the journal does not name (the allocatable
    wait after ``switch``) count in the step before them; ``beforeSteps``: the command's start
    (epoch ``start``) to the first step (process start, preflight); ``afterSteps``: the last
    step's end to ``end`` (the gate, ``promote``, the process's exit)."""
    marks: list[tuple[str, float]] = []
    last = 0.0
    for e in journal.entries():
        if e.node != NODE or e.path is None or e.path.value != path:
            continue
        ts = datetime.fromisoformat(e.ts).timestamp()
        last = max(last, ts)
        if e.phase.value == "begin" and all(step != e.step for step, _ in marks):
            marks.append((e.step, ts))
    out = {"beforeSteps": round(marks[0][1] - start, 2)} if marks else {}
    for (step, ts), nxt in zip(marks, [*[t for _, t in marks[1:]], last], strict=True):
        out[step] = round(nxt - ts, 2)
    out["afterSteps"] = round(end - last, 2)
    return out


def tool(lab: Lab, work: Path) -> tuple[float, float, dict[str, Any]]:
    work.mkdir(parents=True)
    inv = ck.inventory(lab, [NODE], [NODE], work / "inv.ini")
    plan = _plan(work / "plan.yaml")
    env = ck.env(lab, work / "state")
    t, t0 = time.monotonic(), time.time()
    r = ck.cli(
        [
            "migrate",
            "--plan",
            str(plan),
            "-i",
            str(inv),
            "--canary",
            "--yes",
            "--terminate-claims",
            "--no-evidence",  # as measured in the results: the floor collects no evidence
            "-o",
            "json",
        ],
        env,
        timeout=600,
    )
    canary = time.monotonic() - t
    assert r.returncode == 0, r.stderr[-3000:]
    held = json.loads(r.stdout)
    assert held["outcome"] == "held", held
    change = held["change"]
    r = ck.cli(["promote", "--change", change, "--yes", "-o", "json"], env, timeout=600)
    forward, t1 = time.monotonic() - t, time.time()
    assert r.returncode == 0, r.stderr[-3000:]
    assert _node(lab)["metadata"]["labels"].get(DRA) == "true"
    assert len(lab.devices.driver_slices(NODE)) == GPUS and _allocatable(lab) == 0
    t, t2 = time.monotonic(), time.time()
    r = ck.cli(["rollback", "--change", change, "--yes", "-o", "json"], env, timeout=600)
    back, t3 = time.monotonic() - t, time.time()
    assert r.returncode == 0, r.stderr[-3000:]
    assert _allocatable(lab) == GPUS and not lab.devices.driver_slices(NODE)
    journal = Journal.open(work / "state", change)
    detail = {
        "canaryS": round(canary, 2),
        "forwardSteps": _spans(journal, "forward", t0, t1),
        "restoreSteps": _spans(journal, "restore", t2, t3),
    }
    return forward, back, detail


def _deployment() -> dict[str, Any]:
    sel = {"app": "gpu-user"}
    return {
        "metadata": {"name": "gpu-user", "namespace": NS},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": sel},
            "template": {
                "metadata": {"labels": sel},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "nodeSelector": {"kubernetes.io/hostname": NODE},
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.k8s.io/pause",
                            "resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}},
                        }
                    ],
                },
            },
        },
    }


def _workload_running(lab: Lab) -> bool:
    code, body = lab.api.request("GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=app=gpu-user")
    assert code == 200, body
    return any(
        p["spec"].get("nodeName") == NODE
        and p["status"].get("phase") == "Running"
        and not p["metadata"].get("deletionTimestamp")
        for p in body["items"]
    )


def _ready(lab: Lab) -> None:
    """Before each measurement (not timed): the workload's pod Running on the node."""
    _wait(lambda: _workload_running(lab), 180, f"the gpu-user pod Running on {NODE}")


def _setup(lab: Lab) -> None:
    lab.machines.add_nodes([OTHER], ["kubeadm"], kubelet="real", timeout=120, path="dra")
    lab.machines.add_nodes([NODE, SPARE], ["kubeadm"] * 2, kubelet="real", timeout=120)
    lab.machines.device_class(GPU)
    for ns in (NS, DS_NS):
        lab.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    for name, label in (("device-plugin", DP), ("dra-kubelet-plugin", DRA)):
        sel = {"app": name}
        body = {
            "metadata": {"name": name, "namespace": DS_NS},
            "spec": {
                "selector": {"matchLabels": sel},
                "template": {
                    "metadata": {"labels": sel},
                    "spec": {  # a label no node has: the controller starts no pod of theirs
                        "nodeSelector": {label: "true", "rollout-lab/no-such-node": "true"},
                        "containers": [{"name": "c", "image": "registry.k8s.io/pause"}],
                    },
                },
            },
        }
        code, out = lab.api.request("POST", f"/apis/apps/v1/namespaces/{DS_NS}/daemonsets", body)
        assert code in (201, 409), out
    code, out = lab.api.request("POST", f"/apis/apps/v1/namespaces/{NS}/deployments", _deployment())
    assert code == 201, out


def _med(xs: list[float]) -> float:
    return round(statistics.median(xs), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument(
        "--out", type=Path, default=REPO / "benchmarks" / "migration_bench-results.json"
    )
    args = ap.parse_args()
    os.environ["PATH"] = str(Path(sys.executable).parent) + os.pathsep + os.environ["PATH"]
    root = Path(tempfile.mkdtemp(prefix="migration-bench-"))
    lab = Lab(f"mgb{os.getpid()}", root / "lab")
    lab.start_control_plane()
    rounds: list[dict[str, Any]] = []
    started = datetime.now().astimezone().isoformat(timespec="seconds")
    try:
        _setup(lab)
        for rnd in range(args.rounds):
            row: dict[str, Any] = {"round": rnd + 1}
            order = ("tool", "floor") if rnd % 2 == 0 else ("floor", "tool")
            for kind in order:
                _ready(lab)
                if kind == "tool":
                    fwd, back, detail = tool(lab, root / f"tool-{rnd}")
                    row["tool"] = {"forwardS": round(fwd, 2), "backS": round(back, 2), **detail}
                else:
                    fwd, fparts = floor_forward(lab)
                    _ready(lab)
                    back, bparts = floor_back(lab)
                    row["floor"] = {
                        "forwardS": round(fwd, 2),
                        "backS": round(back, 2),
                        "forwardParts": fparts,
                        "backParts": bparts,
                    }
                print(
                    f"round {rnd + 1} {kind:5}: to DRA {fwd:6.1f} s  back {back:6.1f} s"
                    f"  (load {os.getloadavg()[0]:.1f})",
                    flush=True,
                )
            row["loadAvg1m"] = round(os.getloadavg()[0], 1)
            rounds.append(row)
    finally:
        lab.down()
    summary: dict[str, Any] = {}
    for d in ("forwardS", "backS"):
        tl = _med([r["tool"][d] for r in rounds])
        fl = _med([r["floor"][d] for r in rounds])
        summary[d] = {"tool": tl, "floor": fl, "ratio": round(tl / fl, 2)}
    result = {
        "benchmark": "migration_bench",
        "rounds": args.rounds,
        "node": NODE,
        "gpus": GPUS,
        "started": started,
        "medians": summary,
        "samples": rounds,
    }
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nmedians of {args.rounds} round(s)   tool    floor   tool/floor")
    for d, label in (("forwardS", "to DRA (migrate+promote)"), ("backS", "back (rollback)")):
        s = summary[d]
        print(f"{label:26} {s['tool']:7.1f}  {s['floor']:7.1f}  {s['ratio']:6.2f}")
    print(f"raw results: {args.out}")


if __name__ == "__main__":
    main()
