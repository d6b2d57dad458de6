"""In the lab, through the CLI, on a real kubelet: the benchmark in a pod the kubelet placed
(``rollout bench --mode pod``, ``gate.bench.mode: pod``).

One real-kubelet kubeadm node (64 simulated CPUs on two NUMA nodes, 8 simulated GPUs from the lab's
device plugin), the static CPU manager reserving 0,32 and ``restricted``. The lab's runtime
(``fakecri``) runs the commands of a pod annotated ``lab.rollout.dev/run-containers: "true"`` as
real processes in the node's namespaces, with the CRI request's envs (the device plugin's
``NVIDIA_VISIBLE_DEVICES``) and its cpuset (the CPU manager's) as ``ROLLOUT_LAB_CPUSET_CPUS``, and
writes their output to the container's log, which the real kubelet serves as ``pods/log``. The
benchmark is the stand-in ``tests/fixtures/bench/scenario_bench.py`` (its work per scenario).

1. ``rollout bench --mode pod``: the record names the exclusive CPUs and the GPU the kubelet gave
   the pod (its podresources API), and they are what the kubelet put in the container's CRI
   request (the process printed them); the pod is gone afterwards.
2. ``apply --canary`` of ``single-numa-node`` with ``gate.bench.mode: pod``: the canary benched in
   a pod before and after; under ``single-numa-node`` the stand-in does 8x the work, so the
   regression verdict is Failed on the pod's numbers and the canary is rolled back byte for byte.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.change.record.journal import Journal
from rollout.kubelet.cpuset import parse as parse_cpuset
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_lab_kubelet import _configure, _wait_policy
from tests.lab.test_podresources_lab import _posted_since

pytestmark = pytest.mark.lab
GPU = "nvidia.com/gpu"
STANDIN = Path(__file__).resolve().parents[1] / "fixtures" / "bench" / "scenario_bench.py"
RUN = "lab.rollout.dev/run-containers"
NS = "rollout-probes"


def _allocatable(lab: Lab, node: str) -> int:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    if code != 200 or not isinstance(body, dict):
        return -1
    return int((body.get("status") or {}).get("allocatable", {}).get(GPU, "0"))


def _bench_pods(lab: Lab) -> list[str]:
    code, body = lab.api.request(
        "GET", f"/api/v1/namespaces/{NS}/pods?labelSelector=rollout.io%2Fbench%3Dtrue"
    )
    return [] if code == 404 else [p["metadata"]["name"] for p in body["items"]]


def _said(placed: dict[str, Any], key: str) -> str:
    (line,) = [x for x in placed["said"] if x.startswith("scenario:")]
    return line.split(f"{key}=", 1)[1].split(",")[0].strip()


def _check_placed(rec: dict[str, Any], numa: dict[str, str]) -> dict[str, Any]:
    """The pod run names 2 exclusive CPUs and 1 GPU, and the process saw the same."""
    assert rec["mode"] == "pod" and rec["status"] == "pass", rec
    (m,) = rec["models"]
    placed = m["placed"]
    cpus = parse_cpuset(placed["cpus"])
    assert len(cpus) == 2 and not cpus & {0, 32}, placed  # exclusive, not the reserved ones
    assert placed["cpuSource"] == "podresources" and placed["deviceSource"] == "podresources"
    (dev,) = placed["devices"]
    # what the kubelet put in the CRI request: the CPU manager's cpuset, the plugin's envs
    assert parse_cpuset(placed["commandCpus"]) == cpus, placed
    assert _said(placed, "NVIDIA_VISIBLE_DEVICES") == dev, placed
    # restricted: one NUMA node for the CPUs and the GPU
    assert placed["aligned"] is True and len(placed["cpuNumaNodes"]) == 1, placed
    assert cpus <= parse_cpuset(numa[str(placed["cpuNumaNodes"][0])])
    return placed


def _plan(path: Path, scenario: Path) -> Path:
    path.write_text(
        f"""\
apiVersion: rollout.dev/v1alpha1
kind: RolloutPlan
metadata:
  name: lab-bench-pod
kubelet:
  cpuManagerPolicy: static
  reservedSystemCPUs: "0,32"
  topologyManagerPolicy: single-numa-node
strategy:
  canaryGroup: canary
  maxUnavailable: 1
  drain:
    timeout: 20s
    backoffCap: 1s
gate:
  soak: 3s
  window: 30s
  interval: 1s
  minAdmissions: 1
  baseline: none
  probes: true
  bench:
    mode: pod
    pod:
      image: registry.k8s.io/pause:3.10
      cpus: 2
      memory: 64Mi
      annotations:
        {RUN}: "true"
    command: {sys.executable} {STANDIN}
    env:
      BENCH_SCENARIO: {scenario}
    timeout: 90s
    acceptSimulated: true
    maxP99Regression: 200%
    maxBandwidthRegression: 90%
"""
    )
    return path


@pytest.mark.timeout(600)
def test_bench_in_a_pod_the_kubelet_placed_names_its_cpus_and_gpu_and_gates_a_regression(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    made = lab_nodes(1, kubelet="real")
    (node,) = made.names
    restarted = int(time.time())
    _configure(
        lab,
        node,
        {
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0,32",
            "topologyManagerPolicy": "restricted",
        },
    )
    _wait_policy(lab, node, "restricted")
    lab.machines.wait_ready([node], timeout=60)
    ck.wait_for(
        lambda: _posted_since(lab, node, restarted, GPU) == "8", 90, "all 8 GPUs allocatable"
    )
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps({"*": {"placed": 1}}))
    env = ck.env(lab, tmp_path / "state")
    ev = tmp_path / "evidence.json"
    r = ck.cli(
        [
            "evidence", "--label", "before", "-i", str(made.inventory), "--out", str(ev),
            "-o", "json",
        ],
        env,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    numa = json.loads(r.stdout)["collection"]["nodes"][node]["numa"]

    # 1. rollout bench --mode pod
    bench = [
        "bench", "-i", str(made.inventory), "--node", node, "--mode", "pod",
        "--image", "registry.k8s.io/pause:3.10", "--pod-memory", "64Mi",
        "--pod-annotation", f"{RUN}=true",
        "--command", f"{sys.executable} {STANDIN}", "--env", f"BENCH_SCENARIO={sc}",
        "--timeout", "90", "-o", "json",
    ]  # fmt: skip
    r = ck.cli(bench, env, timeout=400)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    rec = json.loads(r.stdout)
    placed = _check_placed(rec, numa)
    assert placed["p99Ms"] > 0 and placed["h2dGbps"] > 0
    assert f"bench pod {NS}/{rec['pod']['name']} on {node}" in r.stderr
    assert _bench_pods(lab) == []  # deleted, and gone before the command returned

    # 2. the gate in pod mode: a regression under single-numa-node rolls the canary back.
    # All 8 GPUs advertised first: a full-suite run once saw the apply's preflight find the
    # node advertising fewer here (refused, exit 3), cause not found; wait and say so if not
    ck.wait_for(lambda: _allocatable(lab, node) == 8, 90, "all 8 GPUs advertised before the canary")
    sc.write_text(json.dumps({"single-numa-node": {"placed": 8}, "*": {"placed": 1}}))
    inv = ck.inventory(lab, [node], [node], tmp_path / "inv.ini")
    text = inv.read_text().replace(
        ck.FAST_VARS, "rollout_kubelet_healthz_retries=90\nrollout_kubelet_healthz_delay=1\n"
    )
    inv.write_text(text)
    plan = _plan(tmp_path / "plan.yaml", sc)
    restricted = ck.snapshot(lab, node)
    apply = ["apply", "--plan", str(plan), "-i", str(inv), "--lock-namespace", namespace]
    r = ck.cli([*apply, "--canary", "--yes", "-o", "json"], env, timeout=500)
    assert r.returncode == 5, (r.returncode, r.stderr[-4000:])
    out = json.loads(r.stdout)
    assert out["outcome"] == "rolled-back", out
    entries = Journal.open(tmp_path / "state", out["change"]).entries()
    benches = {e.data.get("label"): e.data for e in entries if e.step == "bench"}
    assert set(benches) == {"before", "after"}, benches
    for label in ("before", "after"):
        _check_placed(benches[label], numa)
    (v,) = [e.data for e in entries if e.step == "bench-verdict"]
    assert v["policy"]["mode"] == "pod"
    assert v["regression"]["outcome"] == "Failed", v["regression"]
    assert "limit +200%" in v["regression"]["reason"]
    assert v["tightening"]["outcome"] == "Inconclusive"  # no mismatched run in a pod
    triggers = [e.data for e in entries if e.step == "trigger"]
    assert [t.get("source") for t in triggers] == ["bench"], triggers
    assert ck.snapshot(lab, node) == restricted  # back byte for byte
    assert ck.configz(lab, node).get("topologyManagerPolicy") == "restricted"
    assert _bench_pods(lab) == []
    rep = ck.cli(
        ["report", "--change", out["change"], "--lock-namespace", namespace, "-o", "markdown"], env
    )
    assert rep.returncode == 0, rep.stderr
    assert f"| placed by the kubelet (pod {benches['after']['pod']['name']}; GPU " in rep.stdout
    print(f"bench pod mode on the real kubelet: {time.monotonic() - started:.1f}s")


def _pod_names(lab: Lab, node: str | None = None) -> list[str]:
    """Every pod of the tool's namespace (on ``node`` when given), bench or not."""
    code, body = lab.api.request("GET", f"/api/v1/namespaces/{NS}/pods")
    if code == 404:
        return []
    return [
        p["metadata"]["name"]
        for p in body["items"]
        if node is None or (p.get("spec") or {}).get("nodeName") == node
    ]


def _foreign(name: str, owner: str | None) -> dict[str, Any]:
    """A pod with the bench pod's labels the tool must never delete: created by a live process
    (this test's) or naming none; it stays Pending (a nodeSelector no node matches; not bound
    to a missing node, which the pod GC would delete)."""
    meta: dict[str, Any] = {
        "name": name,
        "labels": {"app.kubernetes.io/managed-by": "rollout", "rollout.io/bench": "true"},
    }
    if owner:
        meta["annotations"] = {"rollout.io/bench-owner": owner}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": meta,
        "spec": {
            "nodeSelector": {"rollout.test/nowhere": "true"},
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }


@pytest.mark.timeout(600)
def test_a_bench_pod_left_by_a_killed_tool_is_deleted_by_the_next_run_and_sigterm_deletes_its_own(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    """issue 38: ``rollout bench --mode pod`` killed (SIGKILL, by its PID) once its pod exists
    leaves the pod holding its CPUs and GPU; the next run deletes it (its creator, named on the
    pod, no longer runs) before placing its own, and its record is valid. Bench pods of a live
    process or naming no creator stay. A run sent SIGTERM deletes its own pod before it dies."""
    import getpass
    import os
    import signal
    import socket

    started = time.monotonic()
    made = lab_nodes(1, kubelet="real")
    (node,) = made.names
    lab.machines.wait_ready([node], timeout=60)
    ck.wait_for(lambda: _allocatable(lab, node) == 8, 120, "all 8 GPUs allocatable")
    sc = tmp_path / "scenario.json"
    sc.write_text(json.dumps({"*": {"placed": 1}}))
    env = ck.env(lab, tmp_path / "state")

    def bench(command: str) -> list[str]:
        return [
            "bench", "-i", str(made.inventory), "--node", node, "--mode", "pod",
            "--image", "registry.k8s.io/pause:3.10", "--pod-memory", "64Mi",
            "--pod-annotation", f"{RUN}=true", "--command", command,
            "--env", f"BENCH_SCENARIO={sc}", "--timeout", "90", "-o", "json",
        ]  # fmt: skip

    slow = f"sleep 300; {sys.executable} {STANDIN}"

    def killed(sig: signal.Signals) -> tuple[str, int, str]:
        """A slow bench, sent ``sig`` by its PID once its pod exists: (pod, rc, stderr)."""
        before = set(_bench_pods(lab))
        (pod,), rc, err = ck.signalled_once_ready(
            bench(slow), env, lambda: [n for n in _bench_pods(lab) if n not in before],
            "the bench pod", sig,
        )  # fmt: skip
        return str(pod), rc, err

    # pods the tool did not leave: another live process's (this test's), and one naming none
    me = f"{getpass.getuser()}@{socket.gethostname()} pid {os.getpid()}"
    code, body = lab.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NS}})
    assert code in (201, 409), body
    for name, owner in (("rollout-bench-live", me), ("rollout-bench-unnamed", None)):
        code, body = lab.api.request("POST", f"/api/v1/namespaces/{NS}/pods", _foreign(name, owner))
        assert code == 201, body
    try:
        # 1. SIGKILL: nothing runs in the tool; its pod stays behind
        left, rc, _ = killed(signal.SIGKILL)
        assert rc == -signal.SIGKILL
        time.sleep(1.0)  # a pod the kill left stays (nothing of the tool runs any more)
        assert left in _bench_pods(lab)

        # 2. the next run deletes it before placing its own, and its result is valid
        r = ck.cli(bench(f"{sys.executable} {STANDIN}"), env, timeout=400)
        assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
        assert f"deleting bench pod {NS}/{left} on {node}: left by " in r.stderr, r.stderr
        assert left not in _pod_names(lab)
        rec = json.loads(r.stdout)
        assert rec["mode"] == "pod" and rec["status"] == "pass", rec
        assert rec["pod"]["name"] != left
        (m,) = rec["models"]
        (dev,) = m["placed"]["devices"]
        assert _said(m["placed"], "NVIDIA_VISIBLE_DEVICES") == dev, m["placed"]
        assert m["placed"]["p99Ms"] > 0 and m["placed"]["bindingHeld"] is True
        # never a pod the tool did not leave
        assert {"rollout-bench-live", "rollout-bench-unnamed"} <= set(_pod_names(lab))
        assert _pod_names(lab, node) == []  # its own deleted and gone too

        # 3. SIGTERM: the tool deletes its own pod, then dies by the signal as before
        mine, rc, err = killed(signal.SIGTERM)
        assert rc == -signal.SIGTERM, (rc, err[-2000:])
        ck.wait_for(lambda: mine not in _pod_names(lab), 60, f"{mine} deleted by its SIGTERM")
    finally:
        for name in ("rollout-bench-live", "rollout-bench-unnamed"):
            lab.api.request("DELETE", f"/api/v1/namespaces/{NS}/pods/{name}?gracePeriodSeconds=0")
    print(f"bench pod left by a killed tool: {time.monotonic() - started:.1f}s")
