"""The engine never restarts a kubelet on a tightened policy with pods still running there: a
kubelet restart re-runs admission for every pod (maintainers, kubernetes PR #104817 review), so a
restart of an undrained node under ``static`` + ``single-numa-node`` can kill running pods with
TopologyAffinityError / SMTAlignmentError. Every apply and every restore (a rollback is the same
restart) must find the node cordoned and its evictable pods gone. DaemonSet and static (mirror)
pods stay on the node and are re-admitted: the admission preview predicts them as running pods,
and one predicted rejected refuses the change (``previewing.decide``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout.change.engine.orchestrator import NoGate, rollback, run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.strategy import Strategy
from rollout.change.record.journal import Journal
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    FakeCluster,
    FakeRunner,
    fake_context,
    make_change,
    make_node,
)

NODES = ["n1", "n2", "n3"]


class Watching(FakeRunner):
    """Records, at each kubelet restart (apply or restore), what ran on the node."""

    def __init__(self, cluster: FakeCluster, **kw: Any) -> None:
        super().__init__(cluster, **kw)
        self.seen: list[tuple[str, str, bool, int]] = []

    def apply(self, change: Any, change_id: str, backup_dir: str) -> Any:
        n = self.cluster.nodes[change.node]
        self.seen.append(("apply", change.node, n.info.unschedulable, len(n.pods)))
        return super().apply(change, change_id, backup_dir)

    def restore(self, change: Any, change_id: str, files: Any) -> Any:
        n = self.cluster.nodes[change.node]
        self.seen.append(("restore", change.node, n.info.unschedulable, len(n.pods)))
        return super().restore(change, change_id, files)


@pytest.mark.parametrize("pipelined", [False, True])
@pytest.mark.parametrize("refuse", [(), ("n2",)])
def test_every_restart_finds_the_node_cordoned_and_drained(
    tmp_path: Path, pipelined: bool, refuse: tuple[str, ...]
) -> None:
    cluster = FakeCluster({n: make_node(n, pods=3) for n in NODES}, blocked=("default/n3-p0",))
    runner = Watching(cluster, refuse=refuse)
    if pipelined:
        runner.pipelined = True
    ctx = fake_context(cluster, runner, Journal.create(tmp_path, "20260101T000000Z-abc"))
    batches = make_batches(NODES, NODES, Strategy(max_unavailable=3), False)
    # n3's drain times out (and n2's kubelet refuses): the change stops, restoring
    ended(run_change(ctx, {n: make_change(n) for n in NODES}, batches, NoGate(), False), 5, "n3")
    rollback(ctx)
    applied = {node for step, node, _, _ in runner.seen if step == "apply"}
    assert "n1" in applied  # the check below ran on real restarts
    assert "n3" not in applied  # its drain never finished (a PDB): never restarted
    restored = {node for step, node, _, _ in runner.seen if step == "restore"}
    assert "n1" in restored  # the rollback's restart, checked the same way
    for step, node, cordoned, pods in runner.seen:
        assert (cordoned, pods) == (True, 0), (step, node)
