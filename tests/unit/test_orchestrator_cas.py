"""The orchestrator's side of the node files' compare-and-swap, with the fakes: a node whose files
changed after preflight gets nothing written, only our cordon undone, no restore run, and the
change stops with a preflight-class refusal (exit 3) naming node, file and digests."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.change.engine.orchestrator import NoGate, run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.strategy import Strategy
from rollout.change.record.change_outcomes import StopCause
from rollout.change.record.replay import replay
from rollout.models import NodeChange, NodeState
from rollout.protocols import RunResult
from tests.unit.ending import ended
from tests.unit.fakes_change import CONF, NEW, OLD, make_change
from tests.unit.test_orchestrator import NODES, _setup

REFUSAL = (
    f"node n3: file(s) changed on the node, nothing written: {CONF}: expected sha256 a, found b"
)


def test_a_refused_node_keeps_its_files_loses_only_our_cordon_and_stops_the_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, cluster, runner = _setup(tmp_path, cordoned=("n4",))
    real = runner.apply

    def apply(change: NodeChange, change_id: str, backup_dir: str) -> RunResult:
        if change.node == "n3":
            runner.applied.append("n3")
            return RunResult(False, REFUSAL, refused=True)
        return real(change, change_id, backup_dir)

    monkeypatch.setattr(runner, "apply", apply)
    batches = make_batches(NODES, ["n1", "n2"], Strategy(max_unavailable=2), False)
    changes = {n: make_change(n) for n in NODES}
    text = ended(run_change(ctx, changes, batches, NoGate(), False), 3)
    assert f"{CONF}: expected sha256 a, found b" in text
    assert "only the cordon was undone" in text
    n3 = cluster.nodes["n3"]
    assert n3.files == {CONF: OLD} and not n3.info.unschedulable
    assert "n3" not in runner.restored  # nothing written, so nothing to restore
    assert cluster.nodes["n4"].files[CONF] == NEW  # the rest of the batch went on
    assert cluster.nodes["n4"].info.unschedulable  # cordoned before: stays so
    st = replay(ctx.journal.entries())
    assert st.nodes["n3"].state is NodeState.RESTORED and not st.nodes["n3"].files_touched
    assert st.nodes["n4"].state is NodeState.APPLIED
    assert st.outcome == "stopped"


def test_a_failure_that_is_not_a_refusal_still_restores(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ctx, cluster, runner = _setup(tmp_path, refuse=("n1",))
    batches = make_batches(NODES, ["n1", "n2"], Strategy(max_unavailable=2), True)
    status = run_change(ctx, {n: make_change(n) for n in NODES}, batches, NoGate(), True)
    ended(status, 5, "n1")  # a node failed: not the files-changed refusal (3)
    assert status.cause is StopCause.NODE_FAILED
    assert "n1" in runner.restored and cluster.nodes["n1"].files == {CONF: OLD}


def test_a_refused_apply_on_resume_keeps_the_nothing_written_fact(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed as the apply began (nothing written), the node's file edited by hand meanwhile: the
    resumed apply is refused by the compare-and-swap, and resume does what the forward path does:
    only our cordon undone, no restore run (the hand edit stays), the change stops (exit 3)."""
    from rollout.change.engine.forward import apply_node
    from rollout.change.engine.resumption import resume
    from tests.unit.fakes_change import Killed

    ctx, cluster, runner = _setup(tmp_path)

    def killed(change: NodeChange, change_id: str, backup_dir: str) -> RunResult:
        raise Killed  # SIGKILL as the run starts: the apply began, no file was written

    monkeypatch.setattr(runner, "apply", killed)
    with pytest.raises(Killed):
        apply_node(ctx, make_change("n3"))
    edited = "# edited by hand during the incident\n"
    cluster.nodes["n3"].files[CONF] = edited

    def refuse(change: NodeChange, change_id: str, backup_dir: str) -> RunResult:
        runner.applied.append(change.node)
        return RunResult(False, REFUSAL, refused=True)

    monkeypatch.setattr(runner, "apply", refuse)
    text = ended(resume(ctx), 3)
    assert f"{CONF}: expected sha256 a, found b" in text
    assert "only the cordon was undone" in text
    assert runner.applied == ["n3"]  # the resumed apply ran, and was refused
    assert "n3" not in runner.restored  # nothing written, so nothing to restore
    n3 = cluster.nodes["n3"]
    assert n3.files == {CONF: edited} and not n3.info.unschedulable
    st = replay(ctx.journal.entries())
    assert st.nodes["n3"].state is NodeState.RESTORED and not st.nodes["n3"].files_touched
    assert st.outcome == "stopped"
