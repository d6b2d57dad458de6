"""``apply --recreate-probes`` on the real kubelet: once the canary is applied, a device probe
(one ``nvidia.com/gpu``, the tool's own pod) runs, is deleted and runs again on it, and the
``after-recreate`` evidence is collected while the second one runs. The kubelet's device manager
hands the recreated probe a GPU afresh; ``unique-device-ids`` and ``numa-aligned`` judge it.
The probes are gone afterwards."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab]


@pytest.fixture(scope="module")
def real(lab: Lab) -> Iterator[list[str]]:
    names = ["rc-real-1"]
    lab.machines.add_nodes(names, ["kubeadm"], kubelet="real", timeout=120)
    try:
        yield names
    finally:
        lab.machines.remove_nodes(names)


@pytest.mark.timeout(420)
def test_recreated_probe_gets_a_gpu_afresh_and_the_after_recreate_evidence_judges_it(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    canary = real[0]
    inv = ck.inventory(lab, real, real, tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", {canary: "kubeadm"})
    state = tmp_path / "state"
    env = ck.env(lab, state)
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    bad = ck.cli([*args, "--recreate-probes", "--no-evidence"], env)
    assert bad.returncode == 2 and "--no-evidence contradicts it" in bad.stderr, bad.stderr
    assert not state.exists()

    r = ck.cli([*args, "--recreate-probes"], env)
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    journal = ck.latest_journal(state)
    assert journal is not None
    collected = {e.data["label"]: e.data for e in journal.entries() if e.step == "evidence"}
    assert list(collected) == ["before", "after", "after-recreate"], collected
    again = collected["after-recreate"]
    assert not again.get("error"), again
    checks = {c["name"]: c for c in again["checks"]}
    assert checks["unique-device-ids"]["status"] == "pass", checks
    assert checks["numa-aligned"]["status"] == "pass", checks
    assert checks["numa-aligned"]["checked"] >= 1, checks  # the recreated probe
    doc = json.loads((journal.dir / "evidence.json").read_text())
    (node,) = [c["nodes"][canary] for c in doc["collections"] if c["label"] == "after-recreate"]
    probes = [p for p in node["pods"] if p["name"].startswith("rollout-device-")]
    assert [p["name"].split("-")[-2] for p in probes] == ["1"], probes  # the second probe only
    (gpu,) = probes[0]["devices"]["nvidia.com/gpu"]
    assert gpu in node["deviceNuma"], node
    code, body = lab.api.request("GET", "/api/v1/namespaces/rollout-probes/pods")
    assert code == 200 and not [
        p for p in body["items"] if p["metadata"]["name"].startswith("rollout-device-")
    ], body  # deleted afterwards

    back = ck.cli(["rollback", "--change", change, "--yes"], env)
    assert back.returncode == 0, back.stderr[-3000:]
