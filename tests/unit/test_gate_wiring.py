"""The gate wired into apply: the soak gate's Failed verdict, through the onFailure policy, decides
which canary nodes the orchestrator restores, and the trigger is journaled before any restore; the
lab's ready plan carries a valid demo gate."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import continue_change, node_pool, run_change
from rollout.change.plan.batches import make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.gate_section import GateConfig, OnFailure
from rollout.change.plan.schema import load_plan
from rollout.change.plan.strategy import Strategy
from rollout.change.record.entries import ChangeBegin
from rollout.change.record.journal import Journal
from rollout.change.record.replay import replay
from rollout.gate.analysis import NodeCounts
from rollout.gate.soaking import RollbackPolicyGate, SoakGate
from rollout.lab.inventory import plan_text
from rollout.lab.nodefiles import LabNode
from rollout.models import Phase
from rollout.verdicts import Outcome, SignalState
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    CONF,
    NEW,
    OLD,
    FakeClock,
    FakeCluster,
    FakeRunner,
    make_change,
    make_node,
)

NODES = ["n1", "n2", "n3"]
TAE = "TopologyAffinityError"


class Signal:
    """Counts as a function of the evaluation number (the soak's own clock is faked below)."""

    name = "api"

    def __init__(self, counts: Callable[[int], Mapping[str, NodeCounts]]) -> None:
        self.counts = counts
        self.calls = 0
        self.nodes: list[list[str]] = []

    def start(self, nodes: Any, control: Any = ()) -> None:
        self.nodes.append(list(nodes))

    def state(self, now: float, baseline_before: bool = False) -> SignalState:
        self.calls += 1  # like the real signals: counts of the nodes it was started on only
        got = self.counts(self.calls)
        return SignalState(self.name, {n: got[n] for n in self.nodes[-1] if n in got})

    def stop(self) -> None:
        pass

    def wake(self) -> None:
        pass


def _apply(
    tmp_path: Path,
    counts: Callable[[int], Mapping[str, NodeCounts]],
    policy: OnFailure,
    running: Callable[[str], bool] | None = None,
) -> tuple[Context, FakeCluster, RollbackPolicyGate, str | None]:
    cluster = FakeCluster({n: make_node(n) for n in NODES})
    journal = Journal.create(tmp_path, "20260101T000000Z-gate")
    ctx = Context(
        cluster=cluster,
        runner=FakeRunner(cluster),
        clock=FakeClock(),
        journal=journal,
        drain=DrainPolicy(timeout_s=5, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
    )
    t = [0.0]

    def record(kind: str, data: Mapping[str, Any]) -> None:
        journal.append(kind, Phase.DONE, now=ctx.clock.now(), data=data)

    soak = SoakGate(
        GateConfig(soak=10, interval=1, min_admissions=4, on_failure=policy, probes=False),
        [Signal(counts)],
        clock=lambda: t[0],
        sleep=lambda s: t.__setitem__(0, t[0] + s),
        record=record,
    )
    gate = RollbackPolicyGate(soak, record, lambda: node_pool(replay(journal.entries())), running)
    batches = make_batches(NODES, ["n1", "n2"], Strategy(max_unavailable=2), False)
    status = run_change(ctx, {n: make_change(n) for n in NODES}, batches, gate, False)
    err = ended(status, 5) if status.outcome == "rolled-back" else None  # what stderr says
    return ctx, cluster, gate, err


def _rejecting_n1(i: int) -> dict[str, NodeCounts]:
    return {"n1": NodeCounts(5, {TAE: 2} if i >= 3 else {}), "n2": NodeCounts(5)}


@pytest.mark.parametrize(
    ("policy", "restored"),
    [(OnFailure.ROLLBACK_AFFECTED, ["n1"]), (OnFailure.ROLLBACK_GROUP, ["n1", "n2"])],
)
def test_failed_verdict_restores_by_policy_after_journaling_the_trigger(
    tmp_path: Path, policy: OnFailure, restored: list[str]
) -> None:
    ctx, cluster, gate, err = _apply(tmp_path, _rejecting_n1, policy)
    assert err is not None and "gate failed the canary" in str(err)
    assert f"restored {', '.join(restored)}" in str(err)
    assert gate.verdict is not None and gate.verdict.status is Outcome.FAILED
    for n in ("n1", "n2"):
        assert (cluster.nodes[n].files == {CONF: OLD}) is (n in restored), n
    assert cluster.nodes["n2"].files[CONF] == (OLD if "n2" in restored else NEW)
    assert cluster.nodes["n3"].config.get("cpuManagerPolicy") != "static"  # never touched
    entries = ctx.journal.entries()
    kinds = [e.step for e in entries]
    trig = kinds.index("trigger")
    assert kinds.index("verdict") < trig
    trigger = entries[trig].data
    assert trigger["nodes"] == restored and trigger["policy"] == str(policy)
    assert "2 of 5 admissions rejected" in trigger["reason"]
    # every restore step comes after the trigger record
    first_restore = min(
        i for i, e in enumerate(entries) if e.path is not None and e.path.value == "restore"
    )
    assert first_restore > trig
    assert replay(entries).outcome == "rolled-back"


def test_the_default_policy_restores_the_node_pool() -> None:
    from rollout.change.plan.gate_section import parse_gate_config

    assert parse_gate_config({}).on_failure is OnFailure.ROLLBACK_GROUP
    assert GateConfig().on_failure is OnFailure.ROLLBACK_GROUP
    assert parse_gate_config({"onFailure": "rollback-affected"}).on_failure is (
        OnFailure.ROLLBACK_AFFECTED
    )


def test_rollback_affected_keeps_watching_the_rest_and_rolls_each_back(tmp_path: Path) -> None:
    """n1 rejects first (restored); the soak goes on over n2, which rejects later (the
    controller's next pod landed there): n2 is restored too, each after its own trigger."""

    def counts(i: int) -> dict[str, NodeCounts]:
        return {
            "n1": NodeCounts(5, {TAE: 2} if i >= 3 else {}),
            "n2": NodeCounts(5, {TAE: 2} if i >= 6 else {}),
        }

    ctx, cluster, gate, err = _apply(tmp_path, counts, OnFailure.ROLLBACK_AFFECTED)
    assert err is not None and "restored n1, n2" in str(err)
    assert cluster.nodes["n1"].files == cluster.nodes["n2"].files == {CONF: OLD}
    entries = ctx.journal.entries()
    triggers = [e.data["nodes"] for e in entries if e.step == "trigger"]
    assert triggers == [["n1"], ["n2"]]
    soaks = [e.data["nodes"] for e in entries if e.step == "gate" and e.phase is Phase.BEGIN]
    assert soaks == [["n1", "n2"], ["n2"]]
    n1_back = max(i for i, e in enumerate(entries) if e.node == "n1" and e.step == "uncordon")
    n2_trigger = max(i for i, e in enumerate(entries) if e.step == "trigger")
    assert n1_back < n2_trigger  # n1 was restored before n2 was judged again
    assert gate.verdict is not None and gate.verdict.failed_nodes == ("n1",)
    assert replay(entries).outcome == "rolled-back"


def test_rollback_affected_stops_watching_at_the_soaks_end(tmp_path: Path) -> None:
    def counts(i: int) -> dict[str, NodeCounts]:  # n2 would reject only after the 10 s soak
        return {
            "n1": NodeCounts(5, {TAE: 2} if i >= 3 else {}),
            "n2": NodeCounts(5, {TAE: 2} if i >= 40 else {}),
        }

    ctx, cluster, _, err = _apply(tmp_path, counts, OnFailure.ROLLBACK_AFFECTED)
    assert err is not None and "restored n1\n" in str(err) + "\n"
    assert cluster.nodes["n2"].files[CONF] == NEW  # still on the new config
    assert [e.data["nodes"] for e in ctx.journal.entries() if e.step == "trigger"] == [["n1"]]


@pytest.mark.parametrize("comes_back", [True, False])
def test_outcome_says_whether_the_rejected_owners_run_again(
    tmp_path: Path, comes_back: bool
) -> None:
    rs = "ReplicaSet/ml/train-7f"

    def counts(i: int) -> dict[str, NodeCounts]:
        return {"n1": NodeCounts(5, {TAE: 2}, (rs,)), "n2": NodeCounts(5)}

    asked: list[str] = []

    def running(owner: str) -> bool:
        asked.append(owner)
        return comes_back and len(asked) >= 3  # Running on the third look

    ctx, _, _, err = _apply(tmp_path, counts, OnFailure.ROLLBACK_GROUP, running)
    assert err is not None
    (rec,) = [e.data for e in ctx.journal.entries() if e.step == "recovery"]
    st = replay(ctx.journal.entries())
    if comes_back:
        assert f"Running again after the rollback: {rs}" in str(err)
        assert rec["running"] == [rs] and rec["notRunning"] == [] and len(asked) == 3
    else:
        assert f"NOT Running 60s after the rollback: {rs}" in str(err)
        assert rec["notRunning"] == [rs] and len(asked) > 30  # looked once a second for 60 s
    assert "after the rollback" in (st.message or "")


def test_rollback_group_reaches_the_batches_promoted_before(tmp_path: Path) -> None:
    """promote's gate after batch n3 fails: the pool is every node on the new config, the
    canary (n1, n2) included, not only the batch."""
    ctx, cluster, gate, err = _apply(
        tmp_path, lambda _i: {"n1": NodeCounts(5), "n2": NodeCounts(5)}, OnFailure.ROLLBACK_GROUP
    )
    assert err is None and cluster.nodes["n3"].files[CONF] == NEW  # completed: all applied
    # a later part of the change (as promote runs it) whose gate fails over n3 only
    ctx.journal.append("change", Phase.BEGIN, now=ctx.clock.now(), data={"nodes": NODES})
    gate.gate.signals = [Signal(lambda _i: {"n3": NodeCounts(5, {TAE: 3})})]
    ended(
        continue_change(
            ctx, {}, [], gate, ChangeBegin(nodes=tuple(NODES)), regate=_Regate(("n3",))
        ),
        5,
        "restored n1, n2, n3",
    )
    assert all(cluster.nodes[n].files == {CONF: OLD} for n in NODES)


@dataclass(frozen=True)
class _Regate:
    nodes: tuple[str, ...]
    canary: bool = False
    verdict: Any = None


def test_successful_verdict_goes_on_without_trigger(tmp_path: Path) -> None:
    counts = {"n1": NodeCounts(5), "n2": NodeCounts(5)}
    ctx, cluster, gate, err = _apply(tmp_path, lambda _i: counts, OnFailure.ROLLBACK_AFFECTED)
    assert err is None and gate.verdict is not None and gate.verdict.passed
    assert "trigger" not in [e.step for e in ctx.journal.entries()]
    assert cluster.nodes["n3"].config["cpuManagerPolicy"] == "static"  # the next batch ran
    assert replay(ctx.journal.entries()).outcome == "completed"


def test_no_traffic_holds_and_says_what_it_waits_for(tmp_path: Path) -> None:
    counts = {"n1": NodeCounts(), "n2": NodeCounts()}
    ctx, cluster, gate, err = _apply(tmp_path, lambda _i: counts, OnFailure.ROLLBACK_AFFECTED)
    assert err is None and gate.verdict is not None and gate.verdict.holds
    st = replay(ctx.journal.entries())
    assert st.outcome == "held" and "gate Inconclusive" in (st.message or "")
    assert "at least 4 admissions" in gate.verdict.waiting_for
    assert cluster.nodes["n1"].files[CONF] == NEW  # nothing rolled back
    assert cluster.nodes["n3"].config.get("cpuManagerPolicy") != "static"  # nor went further


def test_lab_plan_has_a_demo_gate(tmp_path: Path) -> None:
    p = tmp_path / "plan.yaml"
    p.write_text(plan_text([LabNode("n1", 1, "kubeadm", "t")], "demo"))
    plan = load_plan(p)
    cfg = plan.gate
    assert cfg is not None
    assert (cfg.soak, cfg.window, cfg.threshold, cfg.probes) == (60.0, 60.0, 0.05, True)
    assert cfg.min_admissions >= 1


def test_soak_progress_reports_changes_not_every_interval() -> None:
    """A quiet soak prints one line per verdict change, not one per interval."""
    from rollout.change.plan.gate_section import Baseline, GateConfig
    from rollout.gate.soaking import SoakGate
    from rollout.verdicts import SignalState

    class Quiet:
        name = "api"

        def start(self, nodes: object, control: object) -> None:
            pass

        def stop(self) -> None:
            pass

        def wake(self) -> None:
            pass

        def state(self, now: float, before: bool) -> SignalState:
            return SignalState(name="api", counts={})

    t = [0.0]
    lines: list[str] = []
    cfg = GateConfig(soak=30.0, window=30.0, interval=1.0, probes=False, baseline=Baseline.NONE)
    gate = SoakGate(
        cfg,
        [Quiet()],
        clock=lambda: t[0],
        sleep=lambda d: t.__setitem__(0, t[0] + d),
        progress=lines.append,
    )
    verdict = gate.evaluate("c1", ["n1"])
    assert len(gate.history) > 20
    assert len(lines) == 1, lines
    assert verdict.holds  # no data never passes


def test_soak_gate_passes_the_predicted_rejections_to_the_verdict() -> None:
    """apply's gate gets preflight's predicted (node, owner) pairs; the Failed reason says which
    rejection was expected and which was not."""
    from rollout.change.plan.gate_section import Baseline, GateConfig
    from rollout.gate.soaking import SoakGate

    counts = {
        "n1": NodeCounts(5, {TAE: 1}, ("ReplicaSet/ml/train-1",)),
        "n2": NodeCounts(5, {TAE: 1}, ("ReplicaSet/ml/web-1",)),
    }
    t = [0.0]
    cfg = GateConfig(soak=10, interval=1, min_admissions=4, probes=False, baseline=Baseline.NONE)
    gate = SoakGate(
        cfg,
        [Signal(lambda _i: counts)],
        clock=lambda: t[0],
        sleep=lambda d: t.__setitem__(0, t[0] + d),
        predicted=frozenset({("n1", "ReplicaSet/ml/train-1")}),
    )
    verdict = gate.evaluate("c1", ["n1", "n2"])
    assert verdict.status is Outcome.FAILED
    assert verdict.reason.endswith(
        "owners: ReplicaSet/ml/train-1 on n1 (expected: predicted by the preview), "
        "ReplicaSet/ml/web-1 on n2 (not predicted: investigate)"
    )


def test_the_api_signal_starts_again_for_the_next_batch() -> None:
    """`promote` soaks the gate after every batch with the same signals: a second start must give
    fresh watch threads (a thread object starts only once) and no errors carried over."""
    from kubernetes import client

    from rollout.kube.client import for_client
    from rollout.kube.watching import ApiSignal

    cfg = client.Configuration()
    cfg.host = "http://127.0.0.1:9"  # nothing listens: the watches fail and retry until stopped
    sig = ApiSignal(for_client(client.ApiClient(cfg)), since=0.0, window=60.0)
    sig.start(["node-a"])
    first = list(sig._threads)
    sig.stop()
    sig.start(["node-b"])
    try:
        assert sig.nodes == ("node-b",)
        assert sig._threads and not set(sig._threads) & set(first)
        assert all(t.is_alive() for t in sig._threads)
    finally:
        sig.stop()


def test_owner_runs_reads_the_controller_and_the_phase() -> None:
    from rollout.kube.workloads import owner_runs

    def pod(phase: str, owner: str = "train-7f", deleting: bool = False) -> dict[str, Any]:
        ref = {"kind": "ReplicaSet", "name": owner, "controller": True}
        meta: dict[str, Any] = {"namespace": "ml", "name": "p", "ownerReferences": [ref]}
        if deleting:
            meta["deletionTimestamp"] = "2026-12-02T00:00:00Z"
        return {"metadata": meta, "status": {"phase": phase}}

    rs = "ReplicaSet/ml/train-7f"
    assert owner_runs(rs, [pod("Failed"), pod("Running")])
    assert not owner_runs(rs, [pod("Failed"), pod("Pending")])  # rejected and not yet admitted
    assert not owner_runs(rs, [pod("Running", "web-1")])  # another owner's pod
    assert not owner_runs(rs, [pod("Running", deleting=True)])


def test_rejected_owners_are_read_from_the_pods_the_kubelet_failed() -> None:
    """The verdict may not know a rejected pod's owner (seen by its Event first): after the
    rollback the owners are read from the pods themselves."""
    from rollout.kube.workloads import rejected_owners_in

    def pod(reason: str, owner: str, created: str, phase: str = "Failed") -> dict[str, Any]:
        ref = {"kind": "ReplicaSet", "name": owner, "controller": True}
        meta = {"namespace": "ml", "ownerReferences": [ref], "creationTimestamp": created}
        return {"metadata": meta, "status": {"phase": phase, "reason": reason}}

    since = 1_780_000_000.0  # 2026-05-28T20:26:40Z
    pods = [
        pod(TAE, "train-7f", "2026-05-28T20:30:00Z"),
        pod("OutOfnvidia.com/gpu", "infer-1", "2026-05-28T20:31:00Z"),
        pod(TAE, "old-9", "2026-05-01T00:00:00Z"),  # before the change
        pod("Evicted", "web-2", "2026-05-28T20:32:00Z"),  # not an admission rejection
        pod(TAE, "ok-3", "2026-05-28T20:33:00Z", phase="Running"),
    ]
    assert rejected_owners_in(pods, since) == ["ReplicaSet/ml/infer-1", "ReplicaSet/ml/train-7f"]


def test_an_interrupt_ends_the_soak_at_once_and_wakes_the_signals_waits() -> None:
    """A rollback handed to the owner mid-soak: the soak's next wait raises StopRequested (the
    signals stopped), and setting the flag called each signal's ``wake``, which ends a wait in
    the API signal's watch. No patched ``sleep``: the interrupt is the gate's parameter."""
    from rollout.interrupt import Interrupt, StopReason, StopRequested

    woken: list[str] = []

    class Waking(Signal):
        def wake(self) -> None:
            woken.append(self.name)

    signal = Waking(lambda _i: {})
    stopped: list[bool] = []
    signal.stop = lambda: stopped.append(True)  # type: ignore[method-assign]
    interrupt = Interrupt()
    t = [0.0]

    def sleep(seconds: float) -> None:  # the first wait: a request arrives meanwhile
        t[0] += seconds
        interrupt.request(StopReason(by="ops", request_id="r1"))

    cfg = GateConfig(soak=600.0, window=60.0, interval=5.0, probes=False)
    gate = SoakGate(cfg, [signal], clock=lambda: t[0], sleep=sleep, interrupt=interrupt)
    with pytest.raises(StopRequested):
        gate.evaluate("c1", ["n1"])
    assert woken == ["api"] and stopped == [True]
    assert t[0] == 5.0  # one interval, not the 600 s soak
