"""kwok in the lab: ``rollout lab up --kwok-nodes 500`` around 3 SSH nodes (10 Deployment-owned
pods on each kwok Node), a canary apply and a rollback through the CLI that touch only the
inventory's nodes, preflight's requests counted from the API server's metrics, and ``lab down``
leaving no kwok behind.

Measured on the 2-core machine (2026-12-04): 500 Nodes Ready about 16 s after their creation;
their 5,000 pods Running in 314 s with the controller-manager's default client QPS (20), in 124 s
with the QPS a kwok lab gives it (200, ``rollout.lab.kwok.kcm_args``).
"""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.binaries import find_bin_dir, missing_binaries
from rollout.lab.cluster import Lab
from rollout.lab.kwok import KWOK_LABEL, NAMESPACE, ready_count
from rollout.lab.pids import exe_is
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab

IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
KWOK_NODES = 500
PODS_PER_NODE = 10
_METRIC = re.compile(r"^apiserver_request_total\{(?P<labels>[^}]*)\} (?P<value>\S+)$")


def _requests(lab: Lab) -> dict[tuple[str, str, str], float]:
    """apiserver_request_total summed by (verb, resource, scope)."""
    code, text = lab.api.request("GET", "/metrics", timeout=30)
    assert code == 200 and isinstance(text, str), code
    out: dict[tuple[str, str, str], float] = {}
    for line in text.splitlines():
        m = _METRIC.match(line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m["labels"]))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("scope", ""))
        out[key] = out.get(key, 0.0) + float(m["value"])
    return out


def _delta(
    after: dict[tuple[str, str, str], float], before: dict[tuple[str, str, str], float]
) -> dict[tuple[str, str, str], float]:
    return {k: v - before.get(k, 0.0) for k, v in after.items() if v - before.get(k, 0.0)}


def _items(resp: Any) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = json.loads(resp.read())["items"]
    return items


def _kwok_nodes(lab: Lab) -> list[dict[str, Any]]:
    code, body = lab.api.request(
        "GET", f"/api/v1/nodes?labelSelector={KWOK_LABEL}%3D{lab.name}", timeout=30
    )
    assert code == 200, body
    items: list[dict[str, Any]] = body["items"]
    return items


def _spec_of(nodes: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        n["metadata"]["name"]: (n["spec"], n["metadata"].get("labels"), n["status"]["allocatable"])
        for n in nodes
    }


@pytest.fixture
def kwok_lab(tmp_path: Path) -> Any:
    missing = missing_binaries(find_bin_dir())
    if missing:
        msg = f"lab binaries missing in {find_bin_dir()}: {missing}"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    name = f"kw{os.getpid()}"
    workdir = tmp_path / "lab"
    args = ["lab", "up", "--nodes", "3", "--kwok-nodes", str(KWOK_NODES)]
    args += ["--kwok-pods-per-node", str(PODS_PER_NODE), "--name", name]
    args += ["--workdir", str(workdir), "-o", "json"]
    t0 = time.monotonic()
    r = ck.cli(args, dict(os.environ), timeout=600)
    up_s = time.monotonic() - t0
    try:
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        assert doc["kwok"]["nodes"] == KWOK_NODES, doc
        print(f"lab up with {KWOK_NODES} kwok Nodes x {PODS_PER_NODE} pods: {up_s:.1f}s")
        yield Lab.attach(name, workdir)
    finally:
        lab = Lab.attach(name, workdir) if (workdir / "lab.json").exists() else None
        kwok = lab.kwok if lab is not None else None
        d = ck.cli(["lab", "down", "--name", name, "--workdir", str(workdir)], dict(os.environ))
        assert d.returncode == 0, d.stderr
        if kwok is not None:
            assert not exe_is(kwok.pid, Path(kwok.bin_dir) / "kwok")  # kwok is gone
        assert not workdir.exists()


def test_canary_apply_and_rollback_among_500_kwok_nodes(kwok_lab: Lab, tmp_path: Path) -> None:
    lab = kwok_lab
    started = time.monotonic()
    kwok = lab.kwok
    assert kwok is not None and exe_is(kwok.pid, Path(kwok.bin_dir) / "kwok")
    nodes = _kwok_nodes(lab)
    assert len(nodes) == KWOK_NODES and ready_count(nodes) == KWOK_NODES
    n0 = nodes[0]
    assert n0["status"]["allocatable"]["nvidia.com/gpu"] == "8"
    assert n0["metadata"]["labels"]["rollout.dev/lab"] == lab.name
    code, pods = lab.api.request(
        "GET", f"/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=status.phase%3DRunning"
    )
    assert code == 200
    on = {p["spec"]["nodeName"] for p in pods["items"]}
    assert len(pods["items"]) == KWOK_NODES * PODS_PER_NODE
    assert on == {n["metadata"]["name"] for n in nodes}  # on kwok Nodes, every one of them
    assert all(p["metadata"]["ownerReferences"][0]["kind"] == "ReplicaSet" for p in pods["items"])
    # the preview's controllers from the real API server: ReplicaSets as metadata only (no
    # pod template), still naming each kwok pod's Deployment
    from rollout.kube.client import connect
    from rollout.kube.workloads import controller_objects
    from rollout.kubelet.admission.node_preview import workload_of

    objects = controller_objects(connect(str(lab.kubeconfig)))
    replica_sets = [o for o in objects if o["kind"] == "ReplicaSet"]
    assert len(replica_sets) >= KWOK_NODES
    assert all("spec" not in o and o["metadata"]["ownerReferences"] for o in replica_sets)
    owners = {workload_of(p, objects) for p in pods["items"][:200]}
    assert all(o.startswith(f"Deployment/{NAMESPACE}/") for o in owners), sorted(owners)[:5]
    # the listings ask for gzip (rollout.kube.rest.Rest.json): the real API server compresses
    # the Node listing of 500 kwok Nodes, and it reads back as the plain one
    rest = connect(str(lab.kubeconfig)).core.rest
    packed = rest.send("GET", "/api/v1/nodes", gzip=True)
    assert packed.headers.get("Content-Encoding") == "gzip"
    plain = rest.send("GET", "/api/v1/nodes")
    assert plain.headers.get("Content-Encoding") is None
    # (names and allocatable: kwok may renew a Node's status between the two reads)
    assert [(n["metadata"]["name"], n["status"]["allocatable"]) for n in _items(packed)] == [
        (n["metadata"]["name"], n["status"]["allocatable"]) for n in _items(plain)
    ]
    inventory_text = lab.inventory.read_text()
    assert "kwok" not in inventory_text.replace(f"# lab {lab.name}", "")
    names = sorted(lab.nodes)
    assert len(names) == 3
    canary = names[:2]
    inv = ck.inventory(lab, names, canary, tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"))
    env = ck.env(lab, tmp_path / "state")
    before_nodes = _spec_of(nodes)

    m0 = _requests(lab)
    dry = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--dry-run", "-o", "json"]
    r = ck.cli(dry, env)
    m1 = _requests(lab)
    assert r.returncode == 0, r.stderr[-3000:]
    pre = _delta(m1, m0)
    print(
        "preflight's requests (apply --dry-run):", {"/".join(k): v for k, v in sorted(pre.items())}
    )
    # no request per kwok Node: single-Node GETs and pod LISTs stay far below 500
    assert pre.get(("GET", "nodes", "resource"), 0) < 50, pre
    assert sum(v for k, v in pre.items() if k[:2] == ("LIST", "pods")) < 50, pre

    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout)
    st = {n["node"]: n["state"] for n in out["nodes"]}
    assert st == {canary[0]: "applied", canary[1]: "applied", names[2]: "pending"}, st
    r = ck.cli(["rollback", "--change", out["change"], "--yes", "-o", "json"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    st = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert st[canary[0]] == st[canary[1]] == "restored", st

    after = _kwok_nodes(lab)
    assert ready_count(after) == KWOK_NODES
    assert _spec_of(after) == before_nodes  # no kwok Node cordoned, tainted or relabelled
    print(f"preflight + canary apply + rollback: {time.monotonic() - started:.1f}s")
