"""Failure paths in the lab: a PDB that never allows the eviction, a kubelet that refuses the new
config, sshd stopped mid-batch, the API server restarted mid-drain. Every node must end applied or
restored, byte for byte. (A crash after each journal entry, then ``rollout resume``:
tests/lab/test_crash_lab.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.change.engine.context import Context
from rollout.change.engine.forward import apply_node
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.record.journal import Journal, new_change_id
from rollout.change.record.replay import replay
from rollout.errors import NodeOperationError
from rollout.lab.cluster import Lab
from rollout.models import NodeState
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab


def _one_pod_with_pdb(lab: Lab, ns: str, node: str, min_available: int) -> None:
    """A ReplicaSet-less pod pinned to ``node`` and a PDB over it."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "guarded", "namespace": ns, "labels": {"app": "guarded"}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.invalid/pause:3.10"}],
        },
    }
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert code == 201, out
    pdb = {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "never", "namespace": ns},
        "spec": {"minAvailable": min_available, "selector": {"matchLabels": {"app": "guarded"}}},
    }
    code, out = lab.api.request(
        "POST", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets", pdb
    )
    assert code == 201, out

    def settled() -> bool:
        code, b = lab.api.request(
            "GET", f"/apis/policy/v1/namespaces/{ns}/poddisruptionbudgets/never"
        )
        return code == 200 and b.get("status", {}).get("expectedPods") == 1

    ck.wait_for(settled, 30, "PDB status")


def _setup(
    lab: Lab, lab_nodes: Any, tmp_path: Path, count: int = 2, canary: int = 1, **plan: Any
) -> tuple[list[str], list[str], dict[str, str]]:
    names = lab_nodes(count).names
    inv = ck.inventory(lab, names, names[:canary], tmp_path / "inv.ini")
    p = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"), **plan)
    args = ["apply", "--plan", str(p), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    return names, args, ck.env(lab, tmp_path / "state")


def test_pdb_that_never_allows_eviction_times_out_and_restores(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    names, args, env = _setup(lab, lab_nodes, tmp_path, drain_timeout="3s")
    _one_pod_with_pdb(lab, namespace, names[0], min_available=1)
    before = ck.snapshot(lab, names[0])
    r = ck.cli([*args, "--force-delete-unmanaged"], env)  # the pod declares no controller
    assert r.returncode == 5, r.stderr
    assert f"pod {namespace}/guarded (blocked by PodDisruptionBudget {namespace}/never" in r.stderr
    assert "timed out after 3s" in r.stderr
    assert "warning: node" in r.stderr and "would block eviction" in r.stderr  # named at preflight
    assert ck.states(tmp_path / "state")[names[0]] == "restored"
    assert not ck.unschedulable(lab, names[0])
    assert ck.snapshot(lab, names[0]) == before  # drain failed before any file was written


def _pod_json(lab: Lab, ns: str, name: str) -> dict[str, Any]:
    code, body = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
    assert code == 200, body
    return dict(body)


def test_pod_no_controller_recreates_is_refused_named_and_left_running(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    """A hand-made pod and a pod with emptyDir data on the canary: apply refuses (exit 3) before
    anything is cordoned, in kubectl drain's words, naming both; they still run. With
    --force-delete-unmanaged --delete-emptydir-data the drain evicts them and the journal
    says so."""
    names, args, env = _setup(lab, lab_nodes, tmp_path)
    canary = names[0]
    for name, volumes in (("debug", []), ("scratch", [{"name": "tmp", "emptyDir": {}}])):
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {
                "nodeName": canary,
                "terminationGracePeriodSeconds": 0,
                "volumes": volumes,
                "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
            },
        }
        code, out = lab.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", pod)
        assert code == 201, out
    for name in ("debug", "scratch"):
        ck.wait_for(
            lambda n=name: _pod_json(lab, namespace, n)["status"].get("phase") == "Running",
            60,
            f"pod {name} running",
        )
    before = ck.snapshot(lab, canary)
    r = ck.cli(args, env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert (
        f"node {canary}: cannot delete Pods that declare no controller "
        f"(use --force-delete-unmanaged to override): {namespace}/debug, {namespace}/scratch"
    ) in r.stderr
    assert (
        f"node {canary}: cannot delete Pods with local storage "
        f"(use --delete-emptydir-data to override): {namespace}/scratch"
    ) in r.stderr
    assert not any(ck.unschedulable(lab, n) for n in names)  # nothing cordoned
    assert ck.latest_journal(tmp_path / "state") is None  # nothing journaled
    assert ck.snapshot(lab, canary) == before
    for name in ("debug", "scratch"):
        p = _pod_json(lab, namespace, name)
        assert p["status"]["phase"] == "Running" and not p["metadata"].get("deletionTimestamp")

    r = ck.cli([*args, "--force-delete-unmanaged", "--delete-emptydir-data"], env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    j = ck.latest_journal(tmp_path / "state")
    assert j is not None
    (allowed,) = [e for e in j.entries() if e.step == "drain-overrides"]
    assert allowed.data == {
        "flags": ["--force-delete-unmanaged", "--delete-emptydir-data"],
        "pods": [f"{namespace}/debug", f"{namespace}/scratch"],
    }
    (drained,) = [e for e in j.entries() if e.step == "drain" and e.phase.value == "done"]
    assert sorted(drained.data["evicted"]) == [f"{namespace}/debug", f"{namespace}/scratch"]
    back = ck.cli(["rollback", "--change", j.change_id, "--yes"], env)
    assert back.returncode == 0, back.stderr


def _gpu_spec(gpus: int) -> dict[str, Any]:
    res = {"cpu": "2", "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    return {
        "terminationGracePeriodSeconds": 0,
        "containers": [
            {
                "name": "app",
                "image": "registry.k8s.io/pause:3.10",
                "resources": {"requests": res, "limits": res},
            }
        ],
    }


def test_gpu_pod_with_no_room_elsewhere_is_refused_before_cordon(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    """A Deployment's 4-GPU pod on the canary; the only other node has all 8 of its GPUs in use
    (CPU and memory to spare): apply refuses (exit 3) before anything is cordoned, naming the pod,
    its requests and the other node's free GPUs; --capacity-warn-only makes it a warning."""
    names, args, env = _setup(lab, lab_nodes, tmp_path)
    canary, other = names
    hog = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "hog", "namespace": namespace}}
    hog["spec"] = {**_gpu_spec(8), "nodeName": other}
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{namespace}/pods", hog)
    assert code == 201, out
    ck.wait_for(
        lambda: _pod_json(lab, namespace, "hog")["status"].get("phase") == "Running", 60, "hog"
    )
    deploy = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "train"},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": "train"}},
            "template": {"metadata": {"labels": {"app": "train"}}, "spec": _gpu_spec(4)},
        },
    }
    code, out = lab.api.request("POST", f"/apis/apps/v1/namespaces/{namespace}/deployments", deploy)
    assert code == 201, out

    def train() -> list[dict[str, Any]]:
        code, body = lab.api.request(
            "GET", f"/api/v1/namespaces/{namespace}/pods?labelSelector=app%3Dtrain"
        )
        assert code == 200
        return [p for p in body["items"] if p["status"].get("phase") == "Running"]

    (pod,) = ck.wait_for(train, 60, "the 4-GPU pod running")
    assert pod["spec"]["nodeName"] == canary  # the scheduler had no GPU left on the other
    key = f"{namespace}/{pod['metadata']['name']}"
    before = ck.snapshot(lab, canary)
    r = ck.cli(args, env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert (
        f"pod {key} evicted from {canary} fits no other node: it requests cpu 2000m, "
        f"memory 1073741824 bytes, nvidia.com/gpu 4; the nodes its placement allows: "
        f"{other}: nvidia.com/gpu 0 free"
    ) in r.stderr
    assert f"not enough nvidia.com/gpu left for the pods evicted from {canary}" in r.stderr
    assert not any(ck.unschedulable(lab, n) for n in names)  # refused before any cordon
    assert ck.latest_journal(tmp_path / "state") is None
    assert ck.snapshot(lab, canary) == before
    assert [p["metadata"]["uid"] for p in train()] == [pod["metadata"]["uid"]]  # not evicted

    dry = [a for a in args if a not in ("--yes", "-o", "json")] + ["--dry-run"]
    r = ck.cli([*dry, "--capacity-warn-only"], env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert f"warning: pod {key} evicted from {canary} fits no other node" in r.stderr
    assert "(--capacity-warn-only: not refused)" in r.stderr


def test_kubelet_refusing_new_config_is_restored_automatically(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    """The change forgets to reset the CPU manager checkpoint (as a wrong render would): the lab
    kubelet refuses to start, as the real one does; the node is restored and healthy again."""
    from rollout.change.engine.node_runner import PlaybookNodeRunner
    from rollout.kube.client import connect
    from rollout.kube.cluster import KubeCluster
    from rollout.models import NodeChange

    names, _, _ = _setup(lab, lab_nodes, tmp_path)
    node = names[0]
    inv = ck.inventory(lab, names, names[:1], tmp_path / "inv2.ini")
    before = ck.snapshot(lab, node)
    root = lab.machines.node_root(node)
    cfg_path = "/var/lib/kubelet/config.yaml"
    old = (root / cfg_path.lstrip("/")).read_bytes()
    cfg = yaml.safe_load(old)
    cfg.update({"cpuManagerPolicy": "static", "reservedSystemCPUs": "0,32"})
    new = yaml.safe_dump(cfg, sort_keys=True).encode()
    change = NodeChange(
        node=node,
        host=node,
        files={cfg_path: new},
        checkpoint_reset=(),  # the mistake
        expected={"cpuManagerPolicy": "static"},
        before={cfg_path: old},
        mode={cfg_path: ("0644", "root", "root")},
        before_meta={cfg_path: ("0644", "root", "root")},
    )
    api = connect(str(lab.kubeconfig))
    journal = Journal.create(tmp_path / "state", new_change_id(ck_now()))
    ctx = Context(
        cluster=KubeCluster(api),
        runner=PlaybookNodeRunner(tmp_path / "ansible", inv),
        clock=_Clock(),
        journal=journal,
        drain=DrainPolicy(timeout_s=20),
        verify_timeout_s=30,
    )
    with pytest.raises(NodeOperationError) as e:
        apply_node(ctx, change)
    assert "apply failed" in str(e.value) and "node restored" in str(e.value)
    s = replay(journal.entries()).nodes[node]
    assert s.state is NodeState.RESTORED
    assert ck.snapshot(lab, node) == before
    assert ck.configz(lab, node).get("cpuManagerPolicy") == "none"
    assert not ck.unschedulable(lab, node)


def ck_now() -> Any:
    from datetime import UTC, datetime

    return datetime.now(UTC)


class _Clock:
    def now(self) -> Any:
        return ck_now()

    def monotonic(self) -> float:
        import time

        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        import time

        time.sleep(seconds)


def test_sshd_stopped_mid_batch_then_resume_restores(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    names, args, env = _setup(lab, lab_nodes, tmp_path, count=2, canary=2, max_unavailable=2)
    state = tmp_path / "state"
    before = {n: ck.snapshot(lab, n) for n in names}
    proc = ck.start_cli(args, env)
    try:
        ck.wait_for(lambda: ck.journal_has(state, names[1], "cordon", "done"), 120, "batch started")
        lab.machines.stop_sshd(names[1])
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 5, err
    assert "unreachable" in err
    st = ck.states(state)
    assert st[names[0]] == "applied"  # the other node of the batch finished
    assert st[names[1]] in ("failed", "restored")
    lab.machines.start_sshd(names[1])
    change = ck.latest_journal(state).change_id  # type: ignore[union-attr]
    r = ck.cli(["resume", "--change", change, "--yes", "-o", "json"], env)
    assert r.returncode == 0, r.stderr
    st = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert st == {names[0]: "applied", names[1]: "restored"}
    assert ck.snapshot(lab, names[1]) == before[names[1]]
    assert not ck.unschedulable(lab, names[1])
    r = ck.cli(["rollback", "--change", change, "--yes"], env)
    assert r.returncode == 0, r.stderr
    assert ck.snapshot(lab, names[0]) == before[names[0]]


def test_apiserver_restarted_mid_drain(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    names, args, env = _setup(lab, lab_nodes, tmp_path, drain_timeout="60s")
    state = tmp_path / "state"
    _one_pod_with_pdb(lab, namespace, names[0], min_available=1)  # holds the drain open
    proc = ck.start_cli([*args, "--force-delete-unmanaged"], env)
    try:
        ck.wait_for(lambda: ck.journal_has(state, names[0], "drain", "begin"), 120, "drain started")
        lab.restart_apiserver(downtime=2.0)
        code, _ = lab.api.request(
            "DELETE", f"/apis/policy/v1/namespaces/{namespace}/poddisruptionbudgets/never"
        )
        assert code == 200
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    assert proc.returncode == 0, err
    assert {n["node"]: n["state"] for n in json.loads(out)["nodes"]}[names[0]] == "applied"
    assert not ck.unschedulable(lab, names[0])
    assert ck.cli(["rollback", "--change", json.loads(out)["change"], "--yes"], env).returncode == 0
