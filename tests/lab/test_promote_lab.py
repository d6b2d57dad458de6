"""Promote through the CLI: ``apply --canary`` holds, ``promote`` continues the same change to the
rest of the fleet with the gate after every batch, then one ``rollback --change`` restores every
node byte for byte; a canary whose gate did not pass is refused (exit 3) unless ``--force REASON``,
which is journaled and shown by ``status``. (The refusal rules: tests/unit/test_promote.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab


@pytest.mark.timeout(400)
def test_canary_promote_then_one_rollback_of_the_whole_change(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    names = lab_nodes(3).names
    inv = ck.inventory(lab, names, names[:1], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"), max_unavailable=1)
    # a short gate after every batch (probe pods make the admissions): promote soaks it again
    # with the same signals for each batch it runs
    with plan.open("a") as f:
        f.write(
            "gate:\n  soak: 12s\n  window: 30s\n  interval: 1s\n  minAdmissions: 1\n"
            "  baseline: none\n  probes: true\n"
        )
    state = tmp_path / "state"
    env = ck.env(lab, state)
    before = {n: ck.snapshot(lab, n) for n in names}
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 0, r.stderr
    change = json.loads(r.stdout)["change"]
    assert json.loads(r.stdout)["outcome"] == "held"
    # apply collected the canary's evidence itself, before and after, and journaled each check
    held = ck.latest_journal(state)
    assert held is not None
    evidence = {e.data["label"]: e.data for e in held.entries() if e.step == "evidence"}
    assert set(evidence) == {"before", "after"}, evidence
    assert evidence["after"]["nodes"] == [names[0]] and evidence["after"]["overall"] != "fail"
    checks = {c["name"]: c for c in evidence["after"]["checks"]}
    assert checks["allocatable-matches-healthy"]["status"] == "pass", checks
    assert (held.dir / "evidence.json").is_file()
    assert f"evidence after: {evidence['after']['overall']}" in r.stderr

    dry = ck.cli(["promote", "--change", change, "--dry-run", "-o", "json"], env)
    assert dry.returncode == 0, dry.stderr
    assert json.loads(dry.stdout)["batches"] == [[names[1]], [names[2]]]
    assert ck.snapshot(lab, names[1]) == before[names[1]]  # dry run: nothing changed

    r = ck.cli(["promote", "--change", change, "--yes", "-o", "json"], env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["change"] == change and out["outcome"] == "completed"
    assert {n["node"]: n["state"] for n in out["nodes"]} == dict.fromkeys(names, "applied")
    assert out["promotion"]["batches"] == [[names[1]], [names[2]]]
    assert [p.name for p in (state / "changes").iterdir()] == [change]  # one change, one journal
    for n in names:
        assert ck.snapshot(lab, n) != before[n]
        assert ck.configz(lab, n).get("cpuManagerPolicy") == "static"
    journal = ck.latest_journal(state)
    assert journal is not None
    gates = [e for e in journal.entries() if e.step == "gate" and e.phase.value == "done"]
    assert [g.data["nodes"] for g in gates] == [[n] for n in names]  # canary, then each batch
    assert {g.data["status"] for g in gates} == {"Successful"}
    st = ck.cli(["status", "--change", change], env)
    assert "promoted by" in st.stdout
    # promote collected its nodes' evidence too, journaled, beside the canary's in the file
    collected = [e.data for e in journal.entries() if e.step == "evidence"]
    assert [(d["label"], d["nodes"]) for d in collected] == [
        ("before", [names[0]]),
        ("after", [names[0]]),
        ("before", names[1:]),
        ("after", names[1:]),
    ], collected
    assert collected[-1]["overall"] != "fail", collected[-1]
    doc = json.loads((journal.dir / "evidence.json").read_text())
    after = [c for c in doc["collections"] if c["label"] == "after"]
    assert len(after) == 1 and sorted(after[0]["nodes"]) == sorted(names), after

    r = ck.cli(["rollback", "--change", change, "--yes", "-o", "json"], env)
    assert r.returncode == 0, r.stderr
    assert {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]} == dict.fromkeys(
        names, "restored"
    )
    for n in names:
        assert ck.snapshot(lab, n) == before[n]
        assert not ck.unschedulable(lab, n)


@pytest.mark.timeout(400)
def test_promote_refuses_a_canary_whose_gate_did_not_pass_unless_forced(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    """The canary's gate holds (Inconclusive: no admissions in a short soak): ``promote`` is
    refused with exit 3, nothing changes; ``promote --force REASON`` goes on, and the reason is
    journaled and shown by ``status`` and ``status -o json``."""
    from tests.lab.test_gate import _gate_plan

    names = lab_nodes(2).names
    inv = ck.inventory(lab, names, names[:1], tmp_path / "inv.ini")
    plan = _gate_plan(tmp_path / "plan.yaml", names, soak="4s", window="20s")
    # the same intent without the gate: the promoted batch is not soaked again (held again)
    gateless = tmp_path / "gateless.yaml"
    gateless.write_text(plan.read_text().split("gate:\n")[0])
    state = tmp_path / "state"
    env = ck.env(lab, state)
    before = ck.snapshot(lab, names[1])
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 8, r.stderr  # the gate holds
    change = json.loads(r.stdout)["change"]

    refused = ck.cli(["promote", "--change", change, "--yes", "-o", "json"], env)
    assert refused.returncode == 3, refused.stderr
    assert "the canary's last gate verdict is not Successful (Inconclusive" in refused.stderr
    assert "--force REASON" in refused.stderr
    assert ck.snapshot(lab, names[1]) == before  # nothing changed
    assert ck.states(state)[names[1]] == "pending"

    reason = "gate had no traffic in the lab"
    args = ["promote", "--change", change, "--plan", str(gateless), "--yes", "-o", "json"]
    r = ck.cli([*args, "--force", reason], env)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["outcome"] == "completed"
    assert out["promotion"]["forced"] == reason
    assert "not Successful (Inconclusive" in out["promotion"]["refusal"]
    assert ck.states(state) == dict.fromkeys(names, "applied")
    journal = ck.latest_journal(state)
    assert journal is not None
    begins = [e for e in journal.entries() if e.step == "change" and e.phase.value == "begin"]
    assert begins[-1].data["promotion"]["forced"] == reason  # journaled
    st = ck.cli(["status", "--change", change], env)
    assert f"forced: {reason}" in st.stdout
    js = json.loads(ck.cli(["status", "--change", change, "-o", "json"], env).stdout)
    assert js["promotion"]["forced"] == reason
    r = ck.cli(["rollback", "--change", change, "--yes"], env)
    assert r.returncode == 0, r.stderr
    assert ck.snapshot(lab, names[1]) == before


def _bare_pod(lab: Lab, ns: str, name: str, node: str) -> None:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10"}],
        },
    }
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert code == 201, out


@pytest.mark.timeout(300)
def test_promote_refuses_only_for_the_nodes_it_will_drain(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    """A debug pod made on the held canary is not promote's business (the canary is not drained
    again); one on the next batch's node is refused, named, until --force-delete-unmanaged,
    which promote journals."""
    canary, rest = lab_nodes(2).names
    inv = ck.inventory(lab, [canary, rest], [canary], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", {canary: "kubeadm", rest: "kubeadm"}, max_unavailable=1)
    env = ck.env(lab, tmp_path / "state")
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 0, r.stderr
    change = json.loads(r.stdout)["change"]
    _bare_pod(lab, namespace, "debug-canary", canary)
    _bare_pod(lab, namespace, "debug-rest", rest)
    r = ck.cli(["promote", "--change", change, "--yes", "-o", "json"], env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert (
        f"node {rest}: cannot delete Pods that declare no controller "
        f"(use --force-delete-unmanaged to override): {namespace}/debug-rest"
    ) in r.stderr
    assert "debug-canary" not in r.stderr and not ck.unschedulable(lab, rest)
    r = ck.cli(
        ["promote", "--change", change, "--yes", "-o", "json", "--force-delete-unmanaged"], env
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert json.loads(r.stdout)["outcome"] == "completed"
    j = ck.latest_journal(tmp_path / "state")
    assert j is not None
    (allowed,) = [e.data for e in j.entries() if e.step == "drain-overrides"]
    assert allowed == {"flags": ["--force-delete-unmanaged"], "pods": [f"{namespace}/debug-rest"]}
    assert ck.cli(["rollback", "--change", change, "--yes"], env).returncode == 0
