"""The orchestrator's decisions, driven with tiny fakes: what is restored when, cordon bookkeeping,
gate outcomes and resume after a crash at each step."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.forward import apply_node
from rollout.change.engine.orchestrator import NoGate, rollback, run_change
from rollout.change.engine.resumption import resume
from rollout.change.plan.batches import make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.strategy import Strategy
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.models import NodeState, PodRef
from rollout.verdicts import VerdictStatus
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    EXPECTED,
    NEW,
    OLD,
    FakeClock,
    FakeCluster,
    FakeRunner,
    Killed,
    ScriptedGate,
    make_change,
    make_node,
)

NODES = ["n1", "n2", "n3", "n4"]


def _setup(
    tmp_path: Path,
    cordoned: tuple[str, ...] = (),
    refuse: tuple[str, ...] = (),
    blocked: tuple[str, ...] = (),
    fail_restore: tuple[str, ...] = (),
    pipelined: bool = False,
) -> tuple[Context, FakeCluster, FakeRunner]:
    cluster = FakeCluster({n: make_node(n, n in cordoned) for n in NODES}, blocked=blocked)
    runner = FakeRunner(cluster, refuse=refuse, fail_restore=fail_restore)
    if pipelined:  # a run per node is cheap (the node step over plain ssh)
        runner.pipelined = True
    ctx = Context(
        cluster=cluster,
        runner=runner,
        clock=FakeClock(),
        journal=Journal.create(tmp_path, "20260101T000000Z-abc"),
        drain=DrainPolicy(timeout_s=5, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
    )
    return ctx, cluster, runner


def _run(ctx: Context, canary_only: bool = True, gate: object = None) -> object:
    batches = make_batches(NODES, ["n1", "n2"], Strategy(max_unavailable=2), canary_only)
    changes = {n: make_change(n) for n in NODES}
    return run_change(ctx, changes, batches, gate or NoGate(), canary_only)  # type: ignore[arg-type]


def test_canary_applies_only_canary_nodes_and_holds(tmp_path: Path) -> None:
    ctx, cluster, _ = _setup(tmp_path)
    status = _run(ctx)
    assert status.outcome == "held"  # type: ignore[attr-defined]
    for n in ("n1", "n2"):
        node = cluster.nodes[n]
        assert node.config["cpuManagerPolicy"] == "static"
        assert not node.info.unschedulable
        assert node.pods == []
    for n in ("n3", "n4"):
        assert cluster.nodes[n].files == {CONF: OLD}
        assert ("cordon", n) not in cluster.calls
    states = {n: s.state for n, s in replay(ctx.journal.entries()).nodes.items()}
    assert states == {
        "n1": NodeState.APPLIED,
        "n2": NodeState.APPLIED,
        "n3": NodeState.PENDING,
        "n4": NodeState.PENDING,
    }


def test_full_rollout_continues_after_canary(tmp_path: Path) -> None:
    ctx, cluster, _ = _setup(tmp_path)
    status = _run(ctx, canary_only=False)
    assert status.outcome == "completed"  # type: ignore[attr-defined]
    assert all(cluster.nodes[n].config["cpuManagerPolicy"] == "static" for n in NODES)


def test_node_cordoned_before_stays_cordoned_after_apply_and_rollback(tmp_path: Path) -> None:
    ctx, cluster, _ = _setup(tmp_path, cordoned=("n2",))
    _run(ctx)
    assert cluster.nodes["n2"].info.unschedulable
    assert ("uncordon", "n2") not in cluster.calls
    assert cluster.nodes["n2"].config["cpuManagerPolicy"] == "static"
    rollback(ctx)
    assert cluster.nodes["n2"].info.unschedulable
    assert ("uncordon", "n2") not in cluster.calls
    assert not cluster.nodes["n1"].info.unschedulable


def test_rollback_restores_files_byte_for_byte_and_removes_created(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path)
    _run(ctx)
    assert cluster.nodes["n1"].files[CONF] == NEW
    status = rollback(ctx, ["n1"])
    assert cluster.nodes["n1"].files == {CONF: OLD}
    assert cluster.nodes["n2"].files[CONF] == NEW  # not asked for
    assert status.nodes["n1"].state is NodeState.RESTORED
    assert status.nodes["n2"].state is NodeState.APPLIED
    assert runner.restored == ["n1"]


def test_kubelet_refusing_new_config_restores_node_and_stops(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path, refuse=("n1",))
    msg = ended(_run(ctx, canary_only=False), 5)
    assert "node n1: apply failed" in msg and "node restored" in msg
    assert "n3: pending" in msg  # every node's state is named
    n1 = cluster.nodes["n1"]
    assert n1.files == {CONF: OLD} and n1.healthy and not n1.info.unschedulable
    assert "n3" not in runner.applied  # the next batch never started
    st = replay(ctx.journal.entries())
    assert st.nodes["n1"].state is NodeState.RESTORED
    assert st.outcome == "stopped"


def test_pdb_that_never_allows_eviction_times_out_names_pod_and_pdb(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path, blocked=("default/n1-p0",))
    msg = ended(_run(ctx), 5)
    assert "pod default/n1-p0" in msg and "PodDisruptionBudget default/never" in msg
    assert "timed out after 5s" in msg
    assert "n1" not in runner.applied and "n1" not in runner.restored  # files never touched
    assert not cluster.nodes["n1"].info.unschedulable
    assert replay(ctx.journal.entries()).nodes["n1"].state is NodeState.RESTORED
    # capped backoff: 5 s with waits 0.5, 1, 2, 2 ... is a handful of attempts, not a busy loop
    attempts = [c for c in cluster.calls if c == ("evict", "default/n1-p0")]
    assert 3 <= len(attempts) <= 6


def test_disable_eviction_deletes_instead(tmp_path: Path) -> None:
    ctx, cluster, _ = _setup(tmp_path, blocked=("default/n1-p0",))
    ctx.drain = DrainPolicy(timeout_s=5, disable_eviction=True)
    _run(ctx)
    assert ("delete", "default/n1-p0") in cluster.calls
    assert ("evict", "default/n1-p0") not in cluster.calls


def test_failed_restore_leaves_state_failed_with_message(tmp_path: Path) -> None:
    ctx, _, _ = _setup(tmp_path, refuse=("n1",), fail_restore=("n1",))
    text = ended(_run(ctx), 5)
    assert "Connection refused" in text
    s = replay(ctx.journal.entries()).nodes["n1"]
    assert s.state is NodeState.FAILED and "Connection refused" in s.message


@pytest.mark.parametrize(
    ("verdict", "outcome", "restored"),
    [
        (VerdictStatus.SUCCESSFUL, "completed", False),
        (VerdictStatus.INCONCLUSIVE, "held", False),
        (VerdictStatus.ERROR, "held", False),
        (VerdictStatus.FAILED, "rolled-back", True),
    ],
)
def test_gate_verdict_after_canary(
    tmp_path: Path, verdict: VerdictStatus, outcome: str, restored: bool
) -> None:
    ctx, cluster, _ = _setup(tmp_path)
    gate = ScriptedGate(verdict)
    if verdict is VerdictStatus.FAILED:
        ended(_run(ctx, canary_only=False, gate=gate), 5, "gate failed the canary")
    else:
        _run(ctx, canary_only=False, gate=gate)
    st = replay(ctx.journal.entries())
    assert st.outcome == outcome
    assert gate.seen == [["n1", "n2"]]
    assert (cluster.nodes["n1"].files == {CONF: OLD}) is restored
    touched_rest = cluster.nodes["n3"].config["cpuManagerPolicy"] == "static"
    assert touched_rest is (verdict is VerdictStatus.SUCCESSFUL)


STEPS = ["cordon", "pods_on_node", "save", "apply", "healthz", "uncordon"]


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("at", STEPS)
def test_resume_after_kill_at_each_step_settles_every_node(
    tmp_path: Path, at: str, pipelined: bool
) -> None:
    ctx, cluster, runner = _setup(tmp_path, pipelined=pipelined)
    target: object = runner if at == "apply" else cluster
    if at == "save":
        target = ctx.journal
        at = "save_backup"
    original = getattr(target, at)
    calls = {"n": 0}

    def dying(*a: object, **k: object) -> object:
        calls["n"] += 1
        if at == "save_backup" and calls["n"] < 2:
            return original(*a, **k)
        if at == "apply":
            original(*a, **k)  # the playbook ran; the process died before journaling "done"
        raise Killed

    setattr(target, at, dying)
    with pytest.raises(Killed):
        apply_node(ctx, make_change("n1"))
    setattr(target, at, original)
    status = resume(ctx)
    n1 = status.nodes["n1"]
    node = cluster.nodes["n1"]
    assert n1.state in (NodeState.APPLIED, NodeState.RESTORED)
    assert not node.info.unschedulable
    if n1.state is NodeState.APPLIED:
        assert (
            node.files[CONF] == NEW
            and node.config["cpuManagerPolicy"] == EXPECTED["cpuManagerPolicy"]
        )
    else:
        assert node.files == {CONF: OLD}
    # resume is idempotent: a second run has nothing left to do
    again = resume(ctx)
    assert again.nodes["n1"].state is n1.state


def test_batch_shares_one_apply_run_and_outcomes_stay_per_node(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path, refuse=("n2",))
    text = ended(_run(ctx), 5)
    assert runner.runs == [("apply", ("n1", "n2")), ("restore", ("n2",))]
    assert "node n2: apply failed" in text and "n1" not in runner.restored
    st = replay(ctx.journal.entries())
    assert (st.nodes["n1"].state, st.nodes["n2"].state) == (NodeState.APPLIED, NodeState.RESTORED)
    assert cluster.nodes["n1"].files[CONF] == NEW and cluster.nodes["n2"].files == {CONF: OLD}
    # every node's apply is journaled begin before the shared run and done/failed after it
    steps = [(x.node, x.phase.value) for x in ctx.journal.entries() if x.step == "apply"]
    assert steps == [("n1", "begin"), ("n2", "begin"), ("n1", "done"), ("n2", "failed")]


def test_node_failing_before_apply_is_left_out_of_the_shared_run(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path, blocked=("default/n1-p0",))
    ended(_run(ctx), 5, "node n1: drain failed")
    assert runner.runs == [("apply", ("n2",))]  # n1's files were never touched: no restore run
    assert cluster.nodes["n2"].config["cpuManagerPolicy"] == "static"
    assert not cluster.nodes["n1"].info.unschedulable


def test_playbook_that_cannot_start_fails_every_node_of_the_run(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path)

    def broken(changes: object, change_id: str) -> object:
        raise RuntimeError("ansible-playbook not found")

    runner.apply_many = broken  # type: ignore[method-assign]
    text = ended(_run(ctx), 5)
    for n in ("n1", "n2"):
        assert (
            f"node {n}: apply failed: apply playbook failed on {n}: RuntimeError: ansible" in text
        )
    st = replay(ctx.journal.entries())
    assert {st.nodes[n].state for n in ("n1", "n2")} == {NodeState.RESTORED}
    assert all(not cluster.nodes[n].info.unschedulable for n in ("n1", "n2"))


def test_rollback_restores_nodes_in_one_run(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path)
    _run(ctx)
    rollback(ctx)
    assert runner.runs[-1] == ("restore", ("n1", "n2"))
    assert all(cluster.nodes[n].files == {CONF: OLD} for n in ("n1", "n2"))


def test_pipelined_batch_runs_each_node_alone_and_restores_only_the_failed(tmp_path: Path) -> None:
    """With a runner whose run per node is cheap, each node of a batch goes through its own
    forward path (its own apply run); a node whose kubelet refuses the config is restored, the
    other node of its batch is applied, the rollout stops before the next batch."""
    ctx, cluster, runner = _setup(tmp_path, refuse=("n2",), pipelined=True)
    text = ended(_run(ctx, canary_only=False), 5)
    assert sorted(runner.runs) == [("apply", ("n1",)), ("apply", ("n2",)), ("restore", ("n2",))]
    assert "node n2: apply failed" in text and "n1" not in runner.restored
    st = replay(ctx.journal.entries())
    assert (st.nodes["n1"].state, st.nodes["n2"].state) == (NodeState.APPLIED, NodeState.RESTORED)
    assert st.nodes["n3"].state is NodeState.PENDING  # the next batch never started
    assert cluster.nodes["n1"].files[CONF] == NEW and cluster.nodes["n2"].files == {CONF: OLD}
    assert not any(cluster.nodes[n].info.unschedulable for n in NODES)
    for n in ("n1", "n2"):  # every node's steps journaled in order, begin before done/failed
        steps = [(x.step, x.phase.value) for x in ctx.journal.entries() if x.node == n]
        assert steps.index(("backup", "done")) < steps.index(("apply", "begin"))
    assert [
        x.phase.value for x in ctx.journal.entries() if x.node == "n2" and x.step == "apply"
    ] == [
        "begin",
        "failed",
    ]


def test_pipelined_node_blocked_in_drain_is_restored_and_the_other_applied(tmp_path: Path) -> None:
    ctx, cluster, runner = _setup(tmp_path, blocked=("default/n1-p0",), pipelined=True)
    ended(_run(ctx), 5, "node n1: drain failed")
    assert runner.runs == [("apply", ("n2",))]  # n1's files were never touched: no restore run
    assert cluster.nodes["n2"].config["cpuManagerPolicy"] == "static"
    assert not cluster.nodes["n1"].info.unschedulable


def test_pipelined_node_cordoned_before_stays_cordoned(tmp_path: Path) -> None:
    ctx, cluster, _ = _setup(tmp_path, cordoned=("n1",), pipelined=True)
    _run(ctx)
    assert cluster.nodes["n1"].info.unschedulable and not cluster.nodes["n2"].info.unschedulable
    rollback(ctx)
    assert cluster.nodes["n1"].info.unschedulable and not cluster.nodes["n2"].info.unschedulable


def test_pod_no_controller_recreates_refuses_the_node_before_its_cordon(tmp_path: Path) -> None:
    """A bare pod that came after preflight: the node step refuses before cordoning; the flag
    (DrainPolicy.delete_unmanaged, from --force-delete-unmanaged) lets the drain evict it."""
    ctx, cluster, runner = _setup(tmp_path)
    cluster.nodes["n1"].pods.append(PodRef("default", "debug", node="n1", unmanaged=True))
    text = ended(_run(ctx), 5)
    assert "cannot delete Pods that declare no controller" in text
    assert "default/debug" in text
    assert ("cordon", "n1") not in cluster.calls and ("evict", "default/debug") not in cluster.calls
    assert "n1" not in runner.applied
    ctx2, cluster2, _ = _setup(tmp_path / "again")
    ctx2.drain = DrainPolicy(timeout_s=5, delete_unmanaged=True)
    cluster2.nodes["n1"].pods.append(PodRef("default", "debug", node="n1", unmanaged=True))
    _run(ctx2)
    assert ("evict", "default/debug") in cluster2.calls


def test_each_batch_readies_the_next_as_it_begins(tmp_path: Path) -> None:
    """As a batch begins, the caller hears which nodes come next (none: the last batch),
    before any of them is touched; a failure there is said and never stops the change."""
    ctx, _, runner = _setup(tmp_path, pipelined=True)
    heard: list[tuple[tuple[str, ...], list[str]]] = []
    ctx.next_batch = lambda later: heard.append((tuple(later), sorted(runner.applied)))
    status = _run(ctx, canary_only=False)
    assert status.outcome == "completed"  # type: ignore[attr-defined]
    assert heard == [(("n3", "n4"), []), ((), ["n1", "n2"])]

    ctx, _, runner = _setup(tmp_path / "again", pipelined=True)
    events: list[str] = []
    ctx.on_event = events.append

    def broken(later: object) -> None:
        raise OSError("no ssh")

    ctx.next_batch = broken
    status = _run(ctx, canary_only=False)
    assert status.outcome == "completed"  # type: ignore[attr-defined]
    assert "warning: could not ready the next batch ahead: no ssh" in events
