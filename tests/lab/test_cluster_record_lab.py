"""A change outlives the machine that applied it: the lab's real API server, sshd and Ansible,
through the CLI, from two "machines" (separate ``HOME`` and ``ROLLOUT_STATE_DIR``, the same
kubeconfig and inventory).

Machine A runs ``apply --canary``; its state directory is then deleted (the laptop is lost).
Machine B, which never saw the change, finds it with ``rollout status`` (no ``--change``: the
latest change in the cluster), reads it with ``status --change ID``, and rolls it back with
``rollout rollback --change ID --yes``: the node's files come back byte for byte from the backups
mirrored into the cluster, and the Node's ``rollout.dev/state`` annotation says ``restored``.

Machine A killed mid-apply (``ROLLOUT_FAILPOINT`` right after the node's files were written) and
its directory deleted: machine B finishes the change with ``rollout resume`` and rolls it back.

Two ``rollout serve`` replicas, each with a state directory of its own (the in-cluster receiver
shares no disk with the operator), given the same alert naming only the node at once: the change
is found from the Node's ``rollout.dev/change`` label and the cluster record, the Lease decides
who rolls back, and the node is restored once by one rollback, neither trigger failing (the
second hands over to, or is covered by, the first); SIGTERM right after the webhook's 202 lets each
replica's rollback finish before it exits.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.change.record.journal import FAILPOINT_ENV
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab


def _machine(lab: Lab, root: Path, home: Path) -> dict[str, str]:
    """A machine's environment; ``home`` short (ssh's ControlPath under it has a 108-byte limit)."""
    return {**ck.env(lab, root / "state"), "HOME": str(home)}


@pytest.fixture
def homes() -> Any:
    made = [Path(tempfile.mkdtemp(prefix="ro-")) for _ in range(3)]
    yield made
    for h in made:
        shutil.rmtree(h, ignore_errors=True)


def _namespace(lab: Lab, ns: str) -> list[str]:
    code, out = lab.api.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": ns}, "kind": "Namespace"}
    )
    assert code == 201, out
    return ["--lock-namespace", ns]


def _marks(lab: Lab, node: str) -> dict[str, str]:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    notes = body["metadata"].get("annotations") or {}
    return {k: v for k, v in notes.items() if k.startswith("rollout.dev/")}


@dataclass
class TwoMachines:
    """Two lab nodes (the first the canary), a lock namespace of the test's own, the inventory
    and plan, every node's files before the change, and machines A and B."""

    names: list[str]
    canary: list[str]
    ns: str
    lock: list[str]
    inv: Path
    plan: Path
    before: dict[str, dict[str, str]]
    a: dict[str, str]
    b: dict[str, str]

    def apply(self, env: dict[str, str] | None = None) -> Any:
        args = ["apply", "--plan", str(self.plan), "-i", str(self.inv), "--canary", "--yes"]
        return ck.cli([*args, "-o", "json", *self.lock], env or self.a)


def _two_machines(
    lab: Lab, lab_nodes: Any, tmp_path: Path, homes: list[Path], ns: str
) -> TwoMachines:
    names = lab_nodes(2).names
    canary = names[:1]
    return TwoMachines(
        names=names,
        canary=canary,
        ns=ns,
        lock=_namespace(lab, ns),
        inv=ck.inventory(lab, names, canary, tmp_path / "inv.ini"),
        plan=ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm")),
        before={n: ck.snapshot(lab, n) for n in names},
        a=_machine(lab, tmp_path / "a", homes[0]),
        b=_machine(lab, tmp_path / "b", homes[1]),
    )


def test_status_and_rollback_from_a_second_machine_after_the_first_is_lost(
    lab: Lab, lab_nodes: Any, tmp_path: Path, homes: list[Path]
) -> None:
    w = _two_machines(lab, lab_nodes, tmp_path, homes, "rollout-record-lab")
    names, canary, lock, inv, before, a, b = w.names, w.canary, w.lock, w.inv, w.before, w.a, w.b
    r = w.apply()
    assert r.returncode == 0, r.stderr
    change = json.loads(r.stdout)["change"]
    assert "cluster record" not in r.stderr, r.stderr  # no mirror write failed
    assert ck.configz(lab, canary[0]).get("cpuManagerPolicy") == "static"
    marks = _marks(lab, canary[0])
    assert marks["rollout.dev/change"] == change
    assert marks["rollout.dev/state"] == "applied"
    assert len(marks["rollout.dev/intent"]) == 64
    assert _marks(lab, names[1]) == {}  # not part of the canary batch: not touched

    shutil.rmtree(a["ROLLOUT_STATE_DIR"])  # machine A is gone

    r = ck.cli(["status", "-o", "json", *lock], b)
    assert r.returncode == 0, r.stderr
    shown = json.loads(r.stdout)
    assert shown["change"] == change
    assert {n["node"]: n["state"] for n in shown["nodes"]}[canary[0]] == "applied"
    r = ck.cli(["status", "--change", change, *lock], b)
    assert r.returncode == 0 and f"{canary[0]}: applied" in r.stdout, r.stdout + r.stderr

    r = ck.cli(["rollback", "--change", change, "-i", str(inv), "--yes", "-o", "json", *lock], b)
    assert r.returncode == 0, r.stderr
    st = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert st[canary[0]] == "restored"
    for n in names:
        assert ck.snapshot(lab, n) == before[n], n  # byte for byte
    assert ck.configz(lab, canary[0]).get("cpuManagerPolicy") == "none"
    assert _marks(lab, canary[0])["rollout.dev/state"] == "restored"
    assert not ck.unschedulable(lab, canary[0])


def test_resume_from_a_second_machine_after_the_first_died_mid_apply(
    lab: Lab, lab_nodes: Any, tmp_path: Path, homes: list[Path]
) -> None:
    w = _two_machines(lab, lab_nodes, tmp_path, homes, "rollout-record-resume")
    names, canary, lock, inv, plan, before = w.names, w.canary, w.lock, w.inv, w.plan, w.before
    a, b = w.a, w.b

    killed = {**a, FAILPOINT_ENV: f"apply:done:{canary[0]}"}  # files written, not verified
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    r = ck.cli([*args, *lock], killed)
    assert r.returncode == -9, (r.returncode, r.stderr[-2000:])
    journal = ck.latest_journal(Path(a["ROLLOUT_STATE_DIR"]))
    assert journal is not None
    change = journal.change_id
    assert ck.snapshot(lab, canary[0]) != before[canary[0]]  # the new files are on the node
    shutil.rmtree(a["ROLLOUT_STATE_DIR"])  # machine A is gone, mid-change

    r = ck.cli(["resume", "--change", change, "-i", str(inv), "--yes", "-o", "json", *lock], b)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "fetched from the cluster record" in r.stderr
    st = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert st[canary[0]] == "applied", st
    assert ck.configz(lab, canary[0]).get("cpuManagerPolicy") == "static"
    assert not ck.unschedulable(lab, canary[0])
    assert _marks(lab, canary[0])["rollout.dev/state"] == "applied"

    r = ck.cli(["rollback", "--change", change, "-i", str(inv), "--yes", "-o", "json", *lock], b)
    assert r.returncode == 0, r.stderr[-3000:]
    for n in names:
        assert ck.snapshot(lab, n) == before[n], n  # byte for byte
    assert _marks(lab, canary[0])["rollout.dev/state"] == "restored"


def _restores(env: dict[str, str], change: str) -> dict[str, int]:
    """How many times each node's restore ended, in the journal as the cluster record holds it
    (fetched into ``env``'s state directory by ``rollout status``)."""
    from rollout.change.record.journal import Journal

    out: dict[str, int] = {}
    for e in Journal.open(Path(env["ROLLOUT_STATE_DIR"]), change).entries():
        restore = e.path is not None and e.path.value == "restore"
        if e.step == "uncordon" and e.phase.value == "done" and restore:
            out[e.node or ""] = out.get(e.node or "", 0) + 1
    return out


def _rollbacks(env: dict[str, str], change: str) -> list[str]:
    """The ends of the rollbacks in the record (as :func:`_restores` reads it) that restored a
    node: a rollback that found every node restored already ends ``restored: none``."""
    from rollout.change.record.entries import ChangeEnd
    from rollout.change.record.journal import CHANGE_STEP, Journal

    out = []
    for e in Journal.open(Path(env["ROLLOUT_STATE_DIR"]), change).entries():
        if e.node is None and e.step == CHANGE_STEP and e.phase.value in ("done", "failed"):
            end = ChangeEnd.read(e.data)
            if end.cause in ("rollback", "requested") and end.message != "restored: none":
                out.append(f"{end.outcome}: {end.message}")
    return out


def test_two_serve_replicas_given_the_same_alert_roll_back_once(
    lab: Lab, lab_nodes: Any, tmp_path: Path, homes: list[Path]
) -> None:
    import threading

    w = _two_machines(lab, lab_nodes, tmp_path, homes, "rollout-record-serve")
    names, canary, lock, inv, plan, before = w.names, w.canary, w.lock, w.inv, w.plan, w.before
    a = w.a
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    r = ck.cli([*args, *lock], a)
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]

    # two replicas: each its own HOME and state directory, the inventory from its environment
    token = tmp_path / "token"
    token.write_text("s3cret-token\n")
    listen = ["serve", "--listen", "127.0.0.1:0", "--token-file", str(token), *lock]
    procs, ports = [], []
    for i, home in enumerate(homes[1:3]):
        env = {**_machine(lab, tmp_path / f"serve{i}", home), "ROLLOUT_INVENTORY": str(inv)}
        proc = ck.start_cli([*listen, "--drift-interval", "0"], env)
        procs.append(proc)
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "listening on 127.0.0.1:" in line, line
        ports.append(int(line.split("127.0.0.1:")[1].split()[0]))
    alert = {
        "status": "firing",
        "labels": {"alertname": "KubeletTopologyAffinityRejections", "node": canary[0]},
        "fingerprint": "c0ffee",
    }
    body = json.dumps({"version": "4", "status": "firing", "alerts": [alert]}).encode()
    answers: dict[int, tuple[int, Any]] = {}

    def deliver(port: int) -> None:
        req = urllib.request.Request(
            f"http://127.0.0.1:{port}/webhook",
            data=body,
            headers={"Content-Type": "application/json", "Authorization": "Bearer s3cret-token"},
            method="POST",
        )
        for _ in range(3):  # as Alertmanager does: a 5xx is delivered again
            try:
                with urllib.request.urlopen(req, timeout=60) as resp:
                    answers[port] = (resp.status, json.loads(resp.read()))
                return
            except urllib.error.HTTPError as e:
                answers[port] = (e.code, json.loads(e.read()))
                if e.code < 500:
                    return
                time.sleep(2)

    errs = []
    try:
        senders = [threading.Thread(target=deliver, args=(p,)) for p in ports]
        for t in senders:
            t.start()
        for t in senders:
            t.join(180)
        # at once, SIGTERM to both: each exits only once its rollback ended
        for proc in procs:
            proc.terminate()
        for proc in procs:
            _, err = proc.communicate(timeout=240)
            errs.append(err)
            assert proc.returncode == 0, err[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate(timeout=30)
    actions = [answers[p][1]["alerts"][0]["action"] for p in ports]
    ended = [line.split("rollout serve: ", 1)[1] for e in errs for line in e.splitlines()
             if "rollout serve: trigger " in line]  # fmt: skip
    raced = [
        line for e in errs for line in e.splitlines() if "meanwhile" in line or "covered" in line
    ]
    print(f"two replicas answered {[answers[p][0] for p in ports]} {actions}; {ended}; {raced}")
    assert "triggered" in actions, (answers, [e[-3000:] for e in errs])
    # neither trigger failed: one rolled back, the other was handed to it, covered by its
    # rollback, or ran after it and found the node restored
    states = [e.split(": ", 1)[1].split(":", 1)[0] for e in ended]
    assert len(states) == actions.count("triggered"), ended
    assert all(st in ("rolled-back", "handed-over", "covered") for st in states), ended
    for (code, doc), err in zip((answers[p] for p in ports), errs, strict=True):
        out = doc["alerts"][0]
        assert out["action"] in ("triggered", "already-rolled-back", "unowned"), (doc, err[-3000:])
        if out["action"] == "triggered":
            assert code == 202 and out["change_id"] == change, doc
            assert "stopping: new alerts get 503; waiting for" in err, err[-3000:]
            assert f"trigger {out['trigger']} change {change}: " in err, err[-3000:]
        assert err.rstrip().endswith("rollout serve: stopped; no rollback left under way"), err
    for n in names:
        assert ck.snapshot(lab, n) == before[n], n  # byte for byte
    assert _marks(lab, canary[0])["rollout.dev/state"] == "restored"
    # the cluster record, read from machine A: the node restored once, whoever rolled it back
    r = ck.cli(["status", "--change", change, "-o", "json", *lock], a)
    assert r.returncode == 0, r.stderr
    assert "brought up to date from the cluster record" in r.stderr
    st = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert st[canary[0]] == "restored"
    assert _restores(a, change) == {canary[0]: 1}, errs
    rollbacks = _rollbacks(a, change)
    assert len(rollbacks) == 1 and rollbacks[0].startswith("rolled-back"), (rollbacks, ended)


def test_rollback_puts_back_the_nodes_own_copy_when_every_other_copy_is_lost(
    lab: Lab, lab_nodes: Any, tmp_path: Path, homes: list[Path]
) -> None:
    """Machine A applied, then is lost, and the record's backup ConfigMaps are deleted too: the
    journal (in the record) still names every original file's sha256, and the node kept the
    bytes under /var/lib/rollout/backups/<id>/; rollback from machine B restores from there."""
    w = _two_machines(lab, lab_nodes, tmp_path, homes, "rollout-record-node")
    names, canary, lock, inv, plan, before = w.names, w.canary, w.lock, w.inv, w.plan, w.before
    ns, a, b = w.ns, w.a, w.b
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    r = ck.cli([*args, *lock], a)
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    shutil.rmtree(a["ROLLOUT_STATE_DIR"])
    code, out = lab.api.request(
        "DELETE",
        f"/api/v1/namespaces/{ns}/configmaps?labelSelector=rollout.dev/record%3Dbackup",
    )
    assert code == 200, out
    code, left = lab.api.request(
        "GET", f"/api/v1/namespaces/{ns}/configmaps?labelSelector=rollout.dev/record%3Dbackup"
    )
    assert code == 200 and left["items"] == []
    node_copy = (
        lab.machines.node_root(canary[0]) / "var/lib/rollout/backups" / change / "manifest.json"
    )
    assert node_copy.is_file()

    r = ck.cli(["rollback", "--change", change, "-i", str(inv), "--yes", "-o", "json", *lock], b)
    assert r.returncode == 0, r.stderr[-3000:]
    for n in names:
        assert ck.snapshot(lab, n) == before[n], n  # byte for byte, from the node's own copy
    assert ck.configz(lab, canary[0]).get("cpuManagerPolicy") == "none"
