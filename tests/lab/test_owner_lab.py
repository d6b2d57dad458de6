"""One owner per change, through the CLI against the lab's real API server, sshd and Ansible.

* ``rollout rollback`` while ``apply --canary`` soaks its gate: handed to apply (the owner), which
  stops the soak, rolls back once, exits 5 naming who asked; the requester reports it (exit 0);
  the Lease is gone afterwards. The hand-over latency (request written -> owner's rollback
  journaled) is printed;
* ``rollout rollback --force`` handed over: the owner overwrites a file edited after its write;
  without ``--force`` its restore is refused and the edit kept;
* the same during a drain held open by a PodDisruptionBudget;
* two requests at once: one rollback per node;
* an Alertmanager webhook (``rollout serve``) during the soak: handed over, the owner names the
  alert;
* the API server stopped longer than the lease duration: the owner stops, restores its node in
  flight and starts nothing new (exit 4).
"""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.change.record.journal import Journal
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_failures import _one_pod_with_pdb
from tests.lab.test_gate import _gate_plan, _post, _trigger_end

pytestmark = pytest.mark.lab

LEASE = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/rollout-lock"


def _lock_ns(lab: Lab, name: str) -> str:
    """A namespace of the test's own for the Lease (labs of other tests share kube-system)."""
    code, out = lab.api.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": name}, "kind": "Namespace"}
    )
    assert code == 201, out
    return name


def _serve(env: dict[str, str], token: Path, ns: str) -> tuple[Any, int]:
    """``rollout serve`` on 127.0.0.1, an ephemeral port (read from its first stderr line)."""
    args = ["serve", "--listen", "127.0.0.1:0", "--token-file", str(token), "--lock-namespace", ns]
    proc = ck.start_cli(args, env)
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "listening on 127.0.0.1:" in line, line
    return proc, int(line.split("127.0.0.1:")[1].split()[0])


def _lease(lab: Lab, ns: str) -> Any:
    code, body = lab.api.request("GET", LEASE.format(ns=ns))
    return body if code == 200 else None


def _restores(state: Path, change: str) -> dict[str, int]:
    """How many times each node's restore ended (the restore path's uncordon done)."""
    out: dict[str, int] = {}
    for e in Journal.open(state, change).entries():
        if (
            e.step == "uncordon"
            and e.phase.value == "done"
            and e.path
            and e.path.value == "restore"
        ):
            out[e.node or ""] = out.get(e.node or "", 0) + 1
    return out


def _start_soaking(
    lab: Lab, lab_nodes: Any, tmp_path: Path, ns: str, count: int = 1
) -> tuple[list[str], Any, dict[str, str], dict[str, dict[str, str]]]:
    """``apply --canary`` with a 10-minute soak; returns once the canary soaks."""
    names = lab_nodes(count).names
    inv = ck.inventory(lab, names, names, tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", names, soak="600s")
    env = ck.env(lab, tmp_path / "state")
    before = {n: ck.snapshot(lab, n) for n in names}
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes"]
    proc = ck.start_cli([*args, "--lock-namespace", ns, "--progress", "plain"], env)
    for n in names:
        ck.wait_for(lambda n=n: ck.journal_has(tmp_path / "state", n, "uncordon", "done"), 150)
    return names, proc, env, before


def _finish(proc: Any, timeout: float = 120) -> tuple[int, str]:
    try:
        _, err = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)
    return proc.returncode, err


@pytest.mark.timeout(300)
def test_rollback_during_the_soak_is_handed_to_the_owner(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    ns = _lock_ns(lab, "lock-soak")
    names, apply, env, before = _start_soaking(lab, lab_nodes, tmp_path, ns)
    state = tmp_path / "state"
    change = Journal.open(state).change_id
    assert f"pid {apply.pid}" in _lease(lab, ns)["spec"]["holderIdentity"]
    r = ck.cli(["rollback", "--change", change, "--yes", "-o", "json", "--lock-namespace", ns], env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["outcome"] == "rolled-back" and f"pid {apply.pid}" in out["handedTo"]
    code, err = _finish(apply)
    assert code == 5, err[-3000:]
    assert "rolled back on request of" in err and "rolled back on request of" in out["message"]
    assert _lease(lab, ns) is None  # released
    assert _restores(state, change) == {names[0]: 1}  # one rollback
    assert ck.snapshot(lab, names[0]) == before[names[0]]
    assert not ck.unschedulable(lab, names[0])
    # hand-over latency: the request's write (the requester's clock, same host) to the owner's
    # stop flag (journaled by the owner), and on to its first restore step
    (req,) = [e for e in Journal.open(state, change).entries() if e.step == "request"]
    seen = req.data["seenAt"] - out["requestedAt"]
    first_restore = min(
        datetime.fromisoformat(e.ts).timestamp()
        for e in Journal.open(state, change).entries()
        if e.path and e.path.value == "restore"
    )
    print(
        f"request written -> owner stops: {seen * 1000:.0f} ms; -> first restore step: "
        f"{first_restore - out['requestedAt']:.2f} s; test {time.monotonic() - started:.1f}s"
    )
    assert 0 <= seen < 1.0


@pytest.mark.timeout(360)
@pytest.mark.parametrize("force", [True, False])
def test_a_handed_over_rollback_overwrites_an_edited_file_only_with_force(
    lab: Lab, lab_nodes: Any, tmp_path: Path, force: bool
) -> None:
    """A file the change wrote is edited during the soak. ``rollout rollback --force`` handed to
    the owner: the owner journals the request's force, then its restore overwrites the edit (the
    node byte-identical to before). Without ``--force`` the owner's restore is refused naming
    the file, the edit is kept, and a later ``rollback --force`` (run here: the owner is gone)
    puts the node back."""
    ns = _lock_ns(lab, f"lock-force-{str(force).lower()}")
    names, apply, env, before = _start_soaking(lab, lab_nodes, tmp_path, ns)
    node = names[0]
    state = tmp_path / "state"
    change = Journal.open(state).change_id
    written = [f for f, sha in ck.snapshot(lab, node).items() if before[node].get(f) != sha]
    assert written, "the canary's change wrote no watched file"
    edited_path = lab.machines.node_root(node) / written[0].lstrip("/")
    with open(edited_path, "ab") as f:
        f.write(b"\n# edited by hand during the soak\n")
    edited = edited_path.read_bytes()
    args = ["rollback", "--change", change, "--yes", "-o", "json", "--lock-namespace", ns]
    r = ck.cli([*args, *(["--force"] if force else [])], env)
    code, err = _finish(apply)
    assert code == 5, err[-3000:]
    (req,) = [e for e in Journal.open(state, change).entries() if e.step == "request"]
    assert req.data.get("force", False) is force
    if force:
        assert r.returncode == 0, r.stderr
        assert json.loads(r.stdout)["outcome"] == "rolled-back"
        assert ck.snapshot(lab, node) == before[node]
    else:
        assert r.returncode == 5, r.stderr
        assert "since our write" in err and written[0] in err, err[-3000:]
        assert edited_path.read_bytes() == edited  # refused: the edit kept
        r = ck.cli([*args, "--force"], env)
        assert r.returncode == 0, r.stderr
        assert ck.snapshot(lab, node) == before[node]
    assert not ck.unschedulable(lab, node)
    assert _lease(lab, ns) is None


@pytest.mark.timeout(300)
def test_rollback_during_a_drain_stops_it_and_restores_the_node(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    ns = _lock_ns(lab, "lock-drain")
    names = lab_nodes(2).names
    inv = ck.inventory(lab, names, names[:1], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"), drain_timeout="300s")
    env = ck.env(lab, tmp_path / "state")
    state = tmp_path / "state"
    before = ck.snapshot(lab, names[0])
    _one_pod_with_pdb(lab, namespace, names[0], min_available=1)  # the drain never ends
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--yes", "--lock-namespace", ns]
    apply = ck.start_cli([*args, "--force-delete-unmanaged"], env)  # the pod has no controller
    ck.wait_for(lambda: ck.journal_has(state, names[0], "drain", "begin"), 150, "the drain")
    change = Journal.open(state).change_id
    t0 = time.monotonic()
    r = ck.cli(["rollback", "--change", change, "--yes", "--lock-namespace", ns], env)
    assert r.returncode == 0, r.stderr
    code, err = _finish(apply)
    assert code == 5, err[-3000:]
    assert time.monotonic() - t0 < 60  # not the drain's 300 s timeout
    assert "rolled back on request of" in err
    st = ck.states(state)
    assert st == {names[0]: "restored", names[1]: "pending"}, st
    assert not ck.unschedulable(lab, names[0]) and not ck.unschedulable(lab, names[1])
    assert ck.snapshot(lab, names[0]) == before
    assert _lease(lab, ns) is None


@pytest.mark.timeout(300)
def test_two_concurrent_requests_give_one_rollback_per_node(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    ns = _lock_ns(lab, "lock-two")
    names, apply, env, before = _start_soaking(lab, lab_nodes, tmp_path, ns, count=2)
    state = tmp_path / "state"
    change = Journal.open(state).change_id
    base = ["rollback", "--change", change, "--yes", "-o", "json", "--lock-namespace", ns]
    first = ck.start_cli([*base, "--node", names[0]], env)
    second = ck.start_cli(base, env)
    outs = [p.communicate(timeout=180) for p in (first, second)]
    assert (first.returncode, second.returncode) == (0, 0), [o[1][-2000:] for o in outs]
    code, err = _finish(apply)
    assert code == 5, err[-3000:]
    assert _restores(state, change) == {names[0]: 1, names[1]: 1}
    for n in names:
        assert ck.snapshot(lab, n) == before[n]
    assert _lease(lab, ns) is None


@pytest.mark.timeout(300)
def test_webhook_during_the_soak_is_handed_to_the_owner(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    ns = _lock_ns(lab, "lock-hook")
    names, apply, env, before = _start_soaking(lab, lab_nodes, tmp_path, ns)
    state = tmp_path / "state"
    change = Journal.open(state).change_id
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    server, port = _serve(env, token, ns)
    try:
        alert = {
            "alerts": [
                {
                    "status": "firing",
                    "labels": {
                        "alertname": "KubeletTopologyAffinityRejections",
                        "change_id": change,
                    },
                    "fingerprint": "f00d",
                }
            ]
        }
        code, body = _post(port, alert, "s3cret-token")
        assert code == 202 and body["alerts"][0]["action"] == "triggered", body
        run = _trigger_end(port, body["alerts"][0]["trigger"], "s3cret-token")
        assert run["state"] == "handed-over", run
        code, body = _post(port, alert, "s3cret-token")
        assert code == 200 and body["alerts"][0]["action"] == "duplicate", body
        rc, err = _finish(apply)
    finally:
        server.terminate()
        server.communicate(timeout=10)
    assert rc == 5, err[-3000:]
    assert "rolled back on request of alert f00d" in err
    assert _restores(state, change) == {names[0]: 1}
    assert ck.snapshot(lab, names[0]) == before[names[0]]
    assert _lease(lab, ns) is None


@pytest.mark.timeout(300)
def test_lease_lost_while_the_api_server_is_down_starts_nothing_new(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    ns = _lock_ns(lab, "lock-lost")
    names = lab_nodes(2).names
    inv = ck.inventory(lab, names, names[:1], tmp_path / "inv.ini")
    plan = ck.plan(
        tmp_path / "plan.yaml",
        dict.fromkeys(names, "kubeadm"),
        max_unavailable=1,
        drain_timeout="300s",
    )
    env = {**ck.env(lab, tmp_path / "state"), "ROLLOUT_LEASE_DURATION_S": "6"}
    state = tmp_path / "state"
    before = ck.snapshot(lab, names[0])
    _one_pod_with_pdb(lab, namespace, names[0], min_available=1)  # holds the first batch open
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--yes", "--lock-namespace", ns]
    apply = ck.start_cli([*args, "--force-delete-unmanaged"], env)  # the pod has no controller
    ck.wait_for(lambda: ck.journal_has(state, names[0], "drain", "begin"), 150, "the drain")
    lab.restart_apiserver(downtime=12.0)  # twice the lease duration
    code, err = _finish(apply, 180)
    assert code == 4, err[-3000:]
    assert "lost the cluster lock" in err and "started nothing new" in err
    st = ck.states(state)
    assert st == {names[0]: "restored", names[1]: "pending"}, st
    assert not any(e.node == names[1] for e in Journal.open(state).entries())
    assert not ck.unschedulable(lab, names[0]) and not ck.unschedulable(lab, names[1])
    assert ck.snapshot(lab, names[0]) == before
