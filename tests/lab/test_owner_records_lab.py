"""One writer per change's record, through the CLI against the lab's real API server, sshd, Ansible
and kubelets, each command a process of its own with a state directory of its own (three machines,
one cluster record):

* ``apply`` owns the change (its second batch's drain held open by a PodDisruptionBudget) while
  ``rollout watch`` decides Failed over the first batch's node and ``rollout serve`` gets an alert
  that rolls it back: watch's verdict and serve's trigger are handed to apply through the Lease
  and written by apply; every entry of the cluster record written while apply held the Lease names
  apply's process as its writer; apply's own journal and the cluster record agree;
* nobody owns the change (``apply --canary`` ended, held): watch writes its verdict and trigger,
  and rolls back, under the Lease it takes; serve then does the same for its alert: the record's
  writers come one after another (apply, then watch, then serve), never interleaved, and the Lease
  is free at the end.

Each entry names its writer (``writer``, ``user@host pid N`` as the Lease names its holder) and,
when handed to the owner, who asked (``handed.by``): that is what is checked.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.change.record.journal import Entry, Journal
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_failures import _one_pod_with_pdb
from tests.lab.test_gate import _deployment, _gate_plan, _post, _trigger_end
from tests.lab.test_owner_lab import _finish, _lease, _lock_ns, _serve

pytestmark = pytest.mark.lab

TOKEN = "s3cret-token"


def _record(lab: Lab, ns: str, change: str, root: Path) -> list[Entry]:
    """The change's cluster record, fetched into a state directory of its own (a fourth
    machine)."""
    from rollout.change.record.cluster_mirror import fetch_change
    from rollout.kube.client import connect

    assert fetch_change(connect(str(lab.kubeconfig), None), ns, root, change) == change
    return Journal.open(root, change).entries()


def _writers(entries: list[Entry]) -> list[str]:
    """The writers in record order, runs of one writer collapsed."""
    out: list[str] = []
    for e in entries:
        assert e.writer, e
        if not out or out[-1] != e.writer:
            out.append(e.writer)
    return out


def _alert(change: str, node: str, fp: str) -> dict[str, Any]:
    labels = {"alertname": "KubeletTopologyAffinityRejections", "change_id": change, "node": node}
    return {"alerts": [{"status": "firing", "labels": labels, "fingerprint": fp}]}


def _pid_of(writer: str | None) -> int:
    assert writer and " pid " in writer, writer
    return int(writer.rpartition(" pid ")[2])


@pytest.mark.timeout(300)
def test_watch_and_serve_hand_their_entries_to_the_owner(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    ns = _lock_ns(lab, "lock-records")
    names = lab_nodes(2).names
    inv = ck.inventory(lab, names, names[:1], tmp_path / "inv.ini")
    plan = ck.plan(
        tmp_path / "plan.yaml",
        dict.fromkeys(names, "kubeadm"),
        max_unavailable=1,
        drain_timeout="300s",
    )
    apply_state, watch_state = tmp_path / "apply-state", tmp_path / "watch-state"
    before = ck.snapshot(lab, names[0])
    _one_pod_with_pdb(lab, namespace, names[1], min_available=1)  # the second batch waits
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--yes", "--lock-namespace", ns]
    apply = ck.start_cli([*args, "--force-delete-unmanaged"], ck.env(lab, apply_state))
    server = None
    try:
        ck.wait_for(
            lambda: ck.journal_has(apply_state, names[1], "drain", "begin"), 150, "the 2nd drain"
        )
        change = Journal.open(apply_state).change_id
        owner = _lease(lab, ns)["spec"]["holderIdentity"]
        assert _pid_of(owner) == apply.pid
        # the first batch's node is on the new config: a workload that fits the node but not
        # one NUMA node is rejected there, and watch (another machine) decides Failed
        _deployment(lab, namespace, "numa-misfit", names[0], 6)
        watch_plan = _gate_plan(tmp_path / "watch.yaml", names, soak="90s")
        watch = ck.start_cli(
            [
                *("watch", "--change", change, "--plan", str(watch_plan), "--no-rollback"),
                *("--lock-namespace", ns, "-o", "json"),
            ],
            ck.env(lab, watch_state),
        )
        out, err = watch.communicate(timeout=150)
        assert watch.returncode == 5, err[-3000:]
        assert json.loads(out)["outcome"] == "Failed", out
        assert "not journaled" not in err, err[-2000:]
        # serve (a third machine) gets an alert for that node while apply still owns the change
        token = tmp_path / "token"
        token.write_text(TOKEN + "\n")
        server, port = _serve(ck.env(lab, tmp_path / "serve-state"), token, ns)
        code, body = _post(port, _alert(change, names[0], "f00d"), TOKEN)
        assert code == 202 and body["alerts"][0]["action"] == "triggered", body
        run = _trigger_end(port, body["alerts"][0]["trigger"], TOKEN)
        assert run["state"] == "handed-over", run
        rc, err = _finish(apply)
        assert rc == 5, err[-3000:]
        assert "rolled back on request of alert f00d" in err
    finally:
        if server is not None:
            server.terminate()
            server.communicate(timeout=30)
        if apply.poll() is None:
            apply.kill()
            apply.communicate(timeout=10)
    record = _record(lab, ns, change, tmp_path / "record")
    mine = Journal.open(apply_state, change).entries()
    # apply's journal is the record's beginning, byte for byte: nobody wrote over it
    assert [e.to_json() for e in record[: len(mine)]] == [e.to_json() for e in mine]
    last = max(i for i, e in enumerate(record) if e.step == "change")  # apply's end
    held = record[: last + 1]
    assert {e.writer for e in held} == {owner}, _writers(record)
    (verdict,) = [e for e in held if e.step == "verdict"]
    assert verdict.data["outcome"] == "Failed" and verdict.handed is not None
    assert _pid_of(verdict.handed.by) == watch.pid
    alerted = [e for e in held if e.step == "trigger" and "outcome" not in e.data]
    assert len(alerted) == 1 and alerted[0].handed is not None, alerted
    assert _pid_of(alerted[0].handed.by) == server.pid
    # the trigger's outcome was journaled before the run showed it ended (``handed-over``): by
    # apply while it held the Lease, or by serve, under the Lease, once apply let it go
    assert {_pid_of(e.writer) for e in record[last + 1 :]} <= {server.pid}
    ended = [e for e in record if e.step == "trigger" and "outcome" in e.data]
    assert len(ended) == 1 and ended[0].data["outcome"] == "handed-over", ended
    assert ck.snapshot(lab, names[0]) == before
    assert _lease(lab, ns) is None
    print(
        f"owner wrote {len(held)} entries ({sum(1 for e in held if e.handed)} handed), then "
        f"{len(record) - len(held)} by serve; "
        f"test {time.monotonic() - started:.1f}s"
    )


@pytest.mark.timeout(300)
def test_without_an_owner_watch_and_serve_take_the_lease_for_their_writes(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    ns = _lock_ns(lab, "lock-norecords")
    names = lab_nodes(2).names
    inv = ck.inventory(lab, names, names, tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"))
    apply_state = tmp_path / "apply-state"
    before = {n: ck.snapshot(lab, n) for n in names}
    r = ck.cli(
        [
            *("apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"),
            *("--lock-namespace", ns),
        ],
        ck.env(lab, apply_state),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    assert _lease(lab, ns) is None  # nobody owns the change now
    # watch (another machine) decides Failed on the node with rejections and rolls it back
    _deployment(lab, namespace, "numa-misfit", names[0], 6)
    watch_plan = _gate_plan(
        tmp_path / "watch.yaml", names, soak="90s", onFailure="rollback-affected"
    )
    watch = ck.start_cli(
        [
            *("watch", "--change", change, "--plan", str(watch_plan), "--lock-namespace", ns),
            *("-o", "json"),
        ],
        ck.env(lab, tmp_path / "watch-state"),
    )
    out, err = watch.communicate(timeout=200)
    assert watch.returncode == 5, err[-3000:]
    got = json.loads(out)
    assert got["outcome"] == "Failed" and got["rollback"] == [names[0]], got
    assert "not journaled" not in err, err[-2000:]
    assert _lease(lab, ns) is None
    # serve (a third machine) gets an alert for the other node: it rolls back under the Lease
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    server, port = _serve(ck.env(lab, tmp_path / "serve-state"), token, ns)
    try:
        code, body = _post(port, _alert(change, names[1], "beef"), TOKEN)
        assert code == 202 and body["alerts"][0]["action"] == "triggered", body
        run = _trigger_end(port, body["alerts"][0]["trigger"], TOKEN)
        assert run["state"] == "rolled-back", run  # shown once its outcome is journaled
    finally:
        server.terminate()
        server.communicate(timeout=30)
    record = _record(lab, ns, change, tmp_path / "record")
    pids = [_pid_of(w) for w in _writers(record)]
    # one writer after another, never two at once: apply, then watch, then serve
    assert pids[1:] == [watch.pid, server.pid], pids
    assert all(e.handed is None for e in record)  # nobody owned it: nothing was handed
    by_watch = [e for e in record if _pid_of(e.writer) == watch.pid]
    assert [e.step for e in by_watch[:2]] == ["verdict", "trigger"], by_watch[:3]
    assert by_watch[0].data["outcome"] == "Failed"
    assert {e.node for e in by_watch if e.node} == {names[0]}
    by_serve = [e for e in record if _pid_of(e.writer) == server.pid]
    assert by_serve[0].step == "trigger" and by_serve[0].data["nodes"] == [names[1]]
    assert by_serve[-1].step == "trigger" and by_serve[-1].data["outcome"] == "rolled-back"
    assert {e.node for e in by_serve if e.node} == {names[1]}
    for n in names:
        assert ck.snapshot(lab, n) == before[n]
    assert _lease(lab, ns) is None
    print(
        f"writers apply {len(record) - len(by_watch) - len(by_serve)}, watch {len(by_watch)}, "
        f"serve {len(by_serve)} entries; test {time.monotonic() - started:.1f}s"
    )
