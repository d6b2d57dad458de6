"""The evidence apply collects is journaled with each check's result, and promote refuses a
canary whose last 'after' evidence is missing, partial, not collected or failed (pure over the
journal's entries)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rollout.change.commands.promote_change import evidence_refusal
from rollout.change.record.journal import Journal
from rollout.evidence.checks import build_collection
from rollout.evidence.collecting import describe, journal_evidence
from rollout.kubelet.device_checkpoint import device_checkpoint, render_device
from rollout.models import Phase

GPU = "nvidia.com/gpu"


def _collection(label: str, registered: int, alloc: str) -> dict[str, Any]:
    import json

    cp = json.loads(
        render_device(device_checkpoint([], {GPU: [f"GPU-{i}" for i in range(registered)]}))
    )
    facts = {
        n: {
            "numaNodes": [{"id": 0, "cpus": "0-3"}],
            "checkpoints": {"kubelet_internal_checkpoint": cp},
        }
        for n in ("n1", "n2")
    }
    alloc_of = {n: {GPU: alloc} for n in facts}
    pods: dict[str, list[dict[str, Any]]] = {n: [] for n in facts}
    return build_collection(
        label, "t", facts, alloc_of, pods, {}, capacity={n: {GPU: "8"} for n in facts}
    )


def _journal(tmp: Path) -> Journal:
    return Journal.create(tmp, "20261202T000000Z-abcdef")


def test_journaled_evidence_carries_every_check_and_the_overall_result(tmp_path: Path) -> None:
    j = _journal(tmp_path)
    good = journal_evidence(
        j, "after", ["n2", "n1"], tmp_path / "evidence.json", _collection("after", 8, "8")
    )
    assert good["nodes"] == ["n1", "n2"] and good["label"] == "after"
    assert {c["name"]: c["status"] for c in good["checks"]}["allocatable-matches-healthy"] == "pass"
    # no topologyManagerPolicy collected: numa-aligned is not-collected, which is not a pass
    assert good["overall"] == "not-collected"
    bad = journal_evidence(
        j, "after", ["n1", "n2"], tmp_path / "e.json", _collection("after", 7, "8")
    )
    assert bad["overall"] == "fail"
    assert (
        "allocatable-matches-healthy: n1: allocatable nvidia.com/gpu is 8, 7 healthy"
        in describe(bad)
    )
    (entry, _) = [e for e in j.entries() if e.step == "evidence"]
    assert entry.phase is Phase.DONE and entry.data == good


def test_promote_refuses_without_passing_after_evidence_of_every_canary_node(
    tmp_path: Path,
) -> None:
    canary = ["n1", "n2"]
    j = _journal(tmp_path / "none")
    assert evidence_refusal(j.entries(), canary) == (
        "the canary has no 'after' evidence "
        "(`rollout evidence --label after --change ID` collects it)"
    )
    journal_evidence(j, "before", canary, tmp_path / "e.json", _collection("before", 8, "8"))
    assert "no 'after' evidence" in str(evidence_refusal(j.entries(), canary))

    j = _journal(tmp_path / "error")
    journal_evidence(j, "after", canary, tmp_path / "e.json", error="ssh: n2 unreachable")
    assert "was not collected: ssh: n2 unreachable" in str(evidence_refusal(j.entries(), canary))

    j = _journal(tmp_path / "partial")
    journal_evidence(j, "after", ["n1"], tmp_path / "e.json", _collection("after", 8, "8"))
    assert "'after' evidence lacks n2" in str(evidence_refusal(j.entries(), canary))

    j = _journal(tmp_path / "failed")
    journal_evidence(j, "after", canary, tmp_path / "e.json", _collection("after", 7, "8"))
    why = str(evidence_refusal(j.entries(), canary))
    assert why.startswith("the canary's 'after' evidence failed: allocatable-matches-healthy: n1")

    # the last 'after' collection counts: collected again once the device is back, it passes
    journal_evidence(j, "after", canary, tmp_path / "e.json", _collection("after", 8, "8"))
    assert evidence_refusal(j.entries(), canary) is None


def test_an_unhealthy_device_the_kubelet_does_not_advertise_does_not_refuse(
    tmp_path: Path,
) -> None:
    j = _journal(tmp_path)
    data = journal_evidence(
        j, "after", ["n1", "n2"], tmp_path / "e.json", _collection("after", 7, "7")
    )
    assert data["overall"] != "fail"
    assert evidence_refusal(j.entries(), ["n1", "n2"]) is None


def test_status_shows_the_last_collection_of_each_label(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from rollout.change.record.replay import replay
    from rollout.cli import cli

    j = _journal(tmp_path / "state")
    journal_evidence(j, "after", ["n1", "n2"], tmp_path / "e.json", _collection("after", 7, "8"))
    journal_evidence(j, "before", ["n1", "n2"], tmp_path / "e.json", error="ssh: n2 unreachable")
    ev = replay(j.entries()).to_dict()["evidence"]
    assert ev["after"]["overall"] == "fail" and ev["after"]["nodes"] == ["n1", "n2"]
    assert {"name": "allocatable-matches-healthy", "status": "fail"}.items() <= ev["after"][
        "checks"
    ][0].items()
    assert ev["before"] == {
        "overall": "not-collected",
        "nodes": ["n1", "n2"],
        "file": str(tmp_path / "e.json"),
        "error": "ssh: n2 unreachable",
        "checks": [],
    }
    r = CliRunner().invoke(
        cli,
        ["status", "--change", j.change_id],
        env={"ROLLOUT_STATE_DIR": str(tmp_path / "state"), "KUBECONFIG": str(tmp_path / "none")},
    )
    assert r.exit_code == 0, r.output
    assert "  evidence after (n1, n2): fail (allocatable-matches-healthy)" in r.output
    assert "  evidence before (n1, n2): not-collected: ssh: n2 unreachable" in r.output
