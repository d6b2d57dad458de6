"""``rollout resume --dry-run``: what resume would do, decided from the journal as resume
decides (``rollout.change.engine.resumption.resume_preview``), checked against what resume then does
on the same journal; and the CLI on a journal in the state directory, which it leaves as it was.
Fakes (the crash journals of tests/unit/test_resume_rollback.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout.change.engine.orchestrator import rollback
from rollout.change.engine.resumption import (
    resume,
    resume_preview,
    resume_rollback,
    unfinished_rollback,
)
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.models import NodeState
from tests.unit.fakes_change import FakeCluster, FakeRunner, Killed, make_node
from tests.unit.test_resume_rollback import (
    NODES,
    _ctx,
    _die,
    _DrainDies,
    _run,
    _setup,
    _VerifyDies,
)

CHANGE = "20260101T000000Z-abc"


def _preview(journal: Journal) -> Any:
    return resume_preview(journal.entries(), journal.change_id, has_gate=False)


def _agrees(preview: Any, journal: Journal, cluster: FakeCluster) -> None:
    """Each node the preview names ends as its action says once resume settles it."""
    resume(_ctx(journal, FakeCluster(cluster.nodes)), end=False)
    after = replay(journal.entries()).nodes
    for node, (_, action) in preview.nodes.items():
        want = (
            NodeState.APPLIED if action.startswith(("verify", "run apply")) else NodeState.RESTORED
        )
        assert after[node].state is want, (node, action, after[node].state)


def test_a_node_cut_in_its_drain_is_uncordoned_and_run_again_with_the_batches_left(
    tmp_path: Path,
) -> None:
    cluster = _DrainDies({n: make_node(n) for n in NODES})
    ctx = _ctx(Journal.create(tmp_path, CHANGE), cluster)
    with pytest.raises(Killed):
        _run(ctx)
    p = _preview(ctx.journal)
    assert p.outcome == "running" and p.rollback is None and p.stops == ""
    assert p.nodes == {"n1": ("applying", "restore: nothing written, undo the cordon")}
    assert p.rerun == ("n1",)
    assert p.batches == tuple(tuple(b) for b in replay(ctx.journal.entries()).info.batches)
    assert p.batches[0] == ("n1",)
    _agrees(p, ctx.journal, cluster)


def test_a_node_killed_in_verify_is_finished_and_the_rest_goes_on(tmp_path: Path) -> None:
    cluster = _VerifyDies({n: make_node(n) for n in NODES})
    ctx = _ctx(Journal.create(tmp_path, CHANGE), cluster)
    with pytest.raises(Killed):
        _run(ctx)
    p = _preview(ctx.journal)
    assert p.nodes == {"n1": ("applying", "verify, uncordon (restore on failure)")}
    assert p.rerun == () and p.stops == ""
    assert ("n1",) not in p.batches and p.batches  # n1 is finished, not run again
    assert {n for b in p.batches for n in b} == set(NODES) - {"n1"}
    _agrees(p, ctx.journal, cluster)


def test_a_failed_node_stops_the_later_batches(tmp_path: Path) -> None:
    ctx, cluster = _setup(tmp_path)
    ctx.runner = FakeRunner(cluster, refuse=["n1"])
    _run(ctx)
    p = _preview(ctx.journal)
    assert p.outcome != "running" and p.batches == ()
    assert "the change has ended" in p.stops


def test_a_rollback_owed_is_finished_never_gone_forward_from(tmp_path: Path) -> None:
    ctx, cluster = _setup(tmp_path)
    _run(ctx)
    ctx.runner.restore_many = _die  # type: ignore[attr-defined]
    with pytest.raises(Killed):
        rollback(ctx, ["n1", "n2"])
    p = _preview(ctx.journal)
    assert p.rollback is not None and p.rollback.nodes == ("n1", "n2")
    assert p.batches == () and p.rerun == () and p.stops == "a rollback is owed"
    targets = {n for n, (_, a) in p.nodes.items() if a == "restore (the rollback owed)"}
    assert targets == {"n1", "n2"}
    again = _ctx(ctx.journal, FakeCluster(cluster.nodes))
    pending = unfinished_rollback(ctx.journal.entries())
    assert pending is not None
    resume_rollback(again, pending)
    states = {n: s.state for n, s in replay(ctx.journal.entries()).nodes.items()}
    assert {n for n, s in states.items() if s is NodeState.RESTORED} == targets


def test_cli_resume_dry_run_prints_the_preview_and_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rollout.cli import cli

    cluster = _DrainDies({n: make_node(n) for n in NODES})
    state = tmp_path / "state"
    ctx = _ctx(Journal.create(state, CHANGE), cluster)
    with pytest.raises(Killed):
        _run(ctx)
    journal_file = state / "changes" / CHANGE / "journal.jsonl"
    before = journal_file.read_bytes()
    monkeypatch.setenv("ROLLOUT_STATE_DIR", str(state))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "no-such-kubeconfig"))
    runner = CliRunner()
    r = runner.invoke(cli, ["resume", "--change", CHANGE, "--dry-run", "-o", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["dryRun"] is True and out["rerun"] == ["n1"]
    assert out["nodes"] == [
        {"node": "n1", "state": "applying", "action": "restore: nothing written, undo the cordon"}
    ]
    r = runner.invoke(cli, ["resume", "--change", CHANGE, "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "n1 (applying): restore: nothing written, undo the cordon" in r.stdout
    assert "then batch 1/" in r.stdout
    assert journal_file.read_bytes() == before  # nothing journaled, nothing changed
