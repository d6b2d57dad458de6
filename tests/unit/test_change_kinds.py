"""The seam for kinds of change (``rollout.change.engine.context.KindSteps``): a second kind,
written here as nothing but its own steps, runs through the engine's skeleton (preflight, cordon,
drain, its steps, verify, uncordon; restore likewise), with the engine's canary, gate, journal,
restore on failure and resume after a crash; the journal names the kind, and resume picks it from
there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, rollback, run_change
from rollout.change.engine.resumption import resume
from rollout.change.kinds.kubelet_config import KUBELET_CONFIG
from rollout.change.kinds.registry import KNOWN, kind_of, recorded_kind
from rollout.change.plan.batches import make_batches
from rollout.change.plan.strategy import Strategy
from rollout.change.record.entries import ChangeBegin
from rollout.change.record.journal import Journal
from rollout.change.record.replay import NodeStatus, replay, status_of
from rollout.errors import InputError, NodeOperationError, RolloutError
from rollout.models import NodeInfo, NodeState, Phase, Step, StepPath
from rollout.verdicts import VerdictStatus
from tests.unit.fakes_change import (
    FakeCluster,
    FakeRunner,
    Killed,
    ScriptedGate,
    fake_context,
    make_node,
)

NODES = ["n1", "n2", "n3"]


@dataclass(frozen=True)
class Colour:
    """The test kind's per-node change: one node label, from one value to another."""

    node: str
    host: str
    old: str
    new: str


class Paint:
    """A second kind of change, written as its own steps only: it records the label's value
    (``backup``), sets it (``apply``, the write), proves it (verify), and sets it back."""

    def __init__(self, cluster: FakeCluster, fail_verify: Sequence[str] = ()) -> None:
        self.labels: dict[str, str] = {n: "blue" for n in cluster.nodes}
        self.fail_verify = set(fail_verify)
        self.crash_after_write: str | None = None

    @property
    def name(self) -> str:
        return "paint"

    def per_node(self, ctx: Context, works: Sequence[Any]) -> bool:
        return True

    def baseline(self, ctx: Context, work: Any, info: NodeInfo) -> dict[str, Any]:
        return {"allocatable": dict(info.allocatable)}

    def prepare(self, ctx: Context, work: Any) -> None:
        ctx.record(work.node, Step.BACKUP, Phase.BEGIN, StepPath.FORWARD)
        record = {"old": self.labels[work.node], "new": work.new}
        ctx.record(work.node, Step.BACKUP, Phase.DONE, StepPath.FORWARD, {"change": record})

    def write(self, ctx: Context, works: Sequence[Any]) -> dict[str, RolloutError]:
        for w in works:
            ctx.record(w.node, Step.APPLY, Phase.BEGIN, StepPath.FORWARD)
            self.labels[w.node] = w.new
            if self.crash_after_write == w.node:
                raise Killed()
            ctx.record(w.node, Step.APPLY, Phase.DONE, StepPath.FORWARD)
        return {}

    def expected(self, work: Any) -> dict[str, Any]:
        return {"colour": work.new}

    def verify(self, ctx: Context, work: Any, before: NodeStatus) -> None:
        if work.node in self.fail_verify or self.labels[work.node] != work.new:
            raise NodeOperationError(f"{work.node} is {self.labels[work.node]}")

    def rebuild(self, ctx: Context, status: NodeStatus, for_restore: bool) -> Any:
        r = status.record
        return Colour(status.node, status.node, str(r["old"]), str(r["new"]))

    def restore_before_drain(self, ctx: Context, status: NodeStatus, work: Any) -> None:
        return None

    def restore_prepare(self, ctx: Context, status: NodeStatus, work: Any) -> Any:
        ctx.record(status.node, Step.RESTORE, Phase.BEGIN, StepPath.RESTORE)
        return work

    def restore_write(
        self, ctx: Context, items: Sequence[tuple[NodeStatus, Any]]
    ) -> dict[str, RolloutError]:
        for _, w in items:
            self.labels[w.node] = w.old
        return {}

    def restore_done(self, ctx: Context, status: NodeStatus) -> None:
        ctx.record(status.node, Step.RESTORE, Phase.DONE, StepPath.RESTORE)

    def restore_expected(self, status: NodeStatus) -> dict[str, Any]:
        return {"colour": status.record["old"]}

    def restore_verify(self, ctx: Context, status: NodeStatus) -> None:
        if self.labels[status.node] != status.record["old"]:
            raise NodeOperationError(f"{status.node} is not back")


def _setup(tmp_path: Path, **paint: Any) -> tuple[Context, FakeCluster, Paint]:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    kind = Paint(cluster, **paint)
    journal = Journal.create(tmp_path, "20260101T000000Z-abc")
    ctx = fake_context(cluster, FakeRunner(cluster), journal, kind=kind)
    return ctx, cluster, kind


def _run(ctx: Context, gate: Any = None, canary_only: bool = True) -> Any:
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), canary_only)
    works = {n: Colour(n, n, "blue", "red") for n in NODES}
    return run_change(ctx, works, batches, gate or NoGate(), canary_only)


def _steps(ctx: Context, node: str) -> list[str]:
    return [
        f"{e.path.value if e.path else ''} {e.step} {e.phase.value}"
        for e in ctx.journal.entries()
        if e.node == node
    ]


def test_a_second_kind_runs_through_the_engines_skeleton_and_the_journal_names_it(
    tmp_path: Path,
) -> None:
    ctx, cluster, kind = _setup(tmp_path)
    status = _run(ctx)
    assert status.outcome == "held"  # the canary applied, the engine held
    assert status.info.kind == "paint"
    assert kind.labels == {"n1": "red", "n2": "blue", "n3": "blue"}
    assert [s.split()[1] for s in _steps(ctx, "n1") if s.endswith("begin")] == [
        "preflight",
        "cordon",
        "drain",
        "backup",
        "apply",
        "verify",
        "uncordon",
    ]
    assert cluster.nodes["n1"].pods == []  # the engine's drain ran
    assert not cluster.nodes["n1"].info.unschedulable
    assert status.nodes["n1"].state is NodeState.APPLIED
    assert status.nodes["n1"].files_touched  # the kind's write step marks the node changed
    assert status.nodes["n2"].state is NodeState.PENDING


def test_the_kubelet_config_change_journals_no_kind_and_old_journals_read_as_it(
    tmp_path: Path,
) -> None:
    assert kind_of(fake_context(*(None,) * 3)) is KUBELET_CONFIG
    assert recorded_kind(ChangeBegin.read({})) is KUBELET_CONFIG
    assert recorded_kind(ChangeBegin.read({"kind": "kubelet-config"})) is KUBELET_CONFIG
    assert KNOWN["kubelet-config"] is KUBELET_CONFIG
    with pytest.raises(InputError, match="names kind 'paint', which this version"):
        recorded_kind(ChangeBegin.read({"kind": "paint"}))


def test_a_failed_verify_restores_the_node_through_the_kinds_restore_steps(
    tmp_path: Path,
) -> None:
    ctx, cluster, kind = _setup(tmp_path, fail_verify=["n1"])
    status = _run(ctx)
    assert status.outcome == "stopped"
    assert "n1 is red" in status.message
    assert kind.labels["n1"] == "blue"
    restore = [s.split()[1] for s in _steps(ctx, "n1") if s.startswith("restore ")]
    assert restore[::2] == ["cordon", "drain", "restore", "restore-verify", "uncordon"]
    assert status.nodes["n1"].state is NodeState.RESTORED
    assert not cluster.nodes["n1"].info.unschedulable


def test_a_failed_gate_and_a_rollback_restore_through_the_kind(tmp_path: Path) -> None:
    ctx, _, kind = _setup(tmp_path)
    status = _run(ctx, gate=ScriptedGate(VerdictStatus.FAILED))
    assert status.outcome == "rolled-back"
    assert kind.labels["n1"] == "blue"
    ctx, _, kind = _setup(tmp_path / "again")
    _run(ctx, canary_only=False)
    assert set(kind.labels.values()) == {"red"}
    assert rollback(ctx).outcome == "rolled-back"
    assert set(kind.labels.values()) == {"blue"}


def test_a_crash_inside_the_kinds_write_resumes_with_the_kind_the_journal_names(
    tmp_path: Path,
) -> None:
    ctx, cluster, kind = _setup(tmp_path)
    kind.crash_after_write = "n1"
    with pytest.raises(Killed):
        _run(ctx)
    status = replay(ctx.journal.entries())
    n1 = status.nodes["n1"]
    assert (n1.state, n1.step, n1.phase) == (NodeState.APPLYING, Step.APPLY, Phase.BEGIN)
    assert cluster.nodes["n1"].info.unschedulable
    kind.crash_after_write = None
    # a new process: the context knows no kind until the journal names it
    again = fake_context(cluster, ctx.runner, ctx.journal)
    assert recorded_kind(status_of(ctx.journal).info, {"paint": kind}) is kind
    again.kind = recorded_kind(status_of(ctx.journal).info, {"paint": kind})
    assert resume(again).outcome == "resumed"
    n1 = status_of(ctx.journal).nodes["n1"]
    assert n1.state is NodeState.APPLIED  # the write ran again, verified, uncordoned
    assert kind.labels["n1"] == "red"
    assert not cluster.nodes["n1"].info.unschedulable
