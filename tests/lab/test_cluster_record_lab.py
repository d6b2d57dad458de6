"""A change outlives the machine that applied it: the lab's real API server, sshd and Ansible,
through the CLI, from two "machines" (separate ``HOME`` and ``ROLLOUT_STATE_DIR``, the same
kubeconfig and inventory).

Machine A runs ``apply --canary``; its state directory is then deleted (the laptop is lost).
Machine B, which never saw the change, finds it with ``rollout status`` (no ``--change``: the
latest change in the cluster), reads it with ``status --change ID``, and rolls it back with
``rollout rollback --change ID --yes``: the node's files come back byte for byte from the backups
mirrored into the cluster, and the Node's ``rollout.dev/state`` annotation says ``restored``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab


def _machine(lab: Lab, root: Path, home: Path) -> dict[str, str]:
    """A machine's environment; ``home`` short (ssh's ControlPath under it has a 108-byte limit)."""
    return {**ck.env(lab, root / "state"), "HOME": str(home)}


@pytest.fixture
def homes() -> Any:
    made = [Path(tempfile.mkdtemp(prefix="ro-")) for _ in range(2)]
    yield made
    for h in made:
        shutil.rmtree(h, ignore_errors=True)


def _marks(lab: Lab, node: str) -> dict[str, str]:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    notes = body["metadata"].get("annotations") or {}
    return {k: v for k, v in notes.items() if k.startswith("rollout.dev/")}


def test_status_and_rollback_from_a_second_machine_after_the_first_is_lost(
    lab: Lab, lab_nodes: Any, tmp_path: Path, homes: list[Path]
) -> None:
    names = lab_nodes(2).names
    canary = names[:1]
    ns = "rollout-record-lab"
    code, out = lab.api.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": ns}, "kind": "Namespace"}
    )
    assert code == 201, out
    lock = ["--lock-namespace", ns]
    inv = ck.inventory(lab, names, canary, tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"))
    before = {n: ck.snapshot(lab, n) for n in names}
    a, b = _machine(lab, tmp_path / "a", homes[0]), _machine(lab, tmp_path / "b", homes[1])

    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json", *lock],
        a,
    )
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
