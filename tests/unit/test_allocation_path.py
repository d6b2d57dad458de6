"""The allocation-path change on fakes: a node moved from the device plugin to DRA and back
through the engine, in the design document's order, never serving the extended resource through
both paths, each step out of order refused by name, and a crash after every journal entry
resumed (the lab tests prove the same against the real API server, kubelet and driver)."""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, rollback, run_change
from rollout.change.engine.resumption import resume
from rollout.change.kinds.allocation_path import OutOfOrderError, PathChange
from rollout.change.kinds.registry import recorded_kind
from rollout.change.plan.allocation_path_section import (
    DEVICE_PLUGIN_LABEL,
    DRA_LABEL,
    AllocationPath,
    PathSettings,
    parse_path_plan,
)
from rollout.change.plan.batches import make_batches
from rollout.change.plan.strategy import Strategy
from rollout.change.record.entries import ChangeBegin
from rollout.change.record.journal import Journal
from rollout.change.record.replay import status_of
from rollout.errors import InputError, Location, NodeFilesChangedError
from rollout.models import NodeState, PodRef
from rollout.verdicts import VerdictStatus
from tests.unit.fakes_change import (
    FakeClock,
    FakeCluster,
    FakeNode,
    FakeRunner,
    Killed,
    ScriptedGate,
    fake_context,
)

NODES = ["n1", "n2"]
GPUS = 4
DRIVER = "gpu.example.com"
SETTINGS = PathSettings(driver=DRIVER, device_class="gpu.example.com", timeout_s=60)


class FakeGpuCluster(FakeCluster):
    """Nodes whose path follows their labels, as DaemonSets with node selectors make it: the
    device plugin's allocatable drops ``stop_s`` after its label goes off, the driver's slices
    appear ``publish_s`` after its label goes on and are wiped ``wipe_s`` after it goes off.
    Pods named ``*-claim`` hold a claim allocated from their node's pool; pods named ``*-gpu``
    hold device-plugin GPUs. Every observation of a node serving the name through both paths
    is kept in ``both``."""

    def __init__(self, clock: FakeClock, dra: tuple[str, ...] = ()) -> None:
        nodes = {}
        for n in NODES:
            labels = {DEVICE_PLUGIN_LABEL: "true"} if n not in dra else {DRA_LABEL: "true"}
            nodes[n] = FakeNode(
                info=_info(n, labels),
                config={},
                files={},
                pods=[PodRef("default", f"{n}-gpu", node=n, uid=f"{n}u")],
            )
        super().__init__(nodes)
        self.clock = clock
        self.stop_s, self.publish_s, self.wipe_s = 2.0, 30.0, 31.0
        self.changed: dict[tuple[str, str], float] = {}
        self.both: list[str] = []
        self.patches: list[tuple[str, dict[str, str | None]]] = []
        self.stuck: set[str] = set()  # claims the kubelet still holds prepared

    def _on(self, node: str, label: str) -> bool:
        return self.nodes[node].info.labels.get(label) == "true"

    def _since(self, node: str, label: str) -> float:
        return self.clock.t - self.changed.get((node, label), -1e9)

    def node(self, name: str) -> Any:
        info = self.nodes[name].info
        dp = self._on(name, DEVICE_PLUGIN_LABEL) or self._since(name, DEVICE_PLUGIN_LABEL) < (
            self.stop_s
        )
        info = replace(info, allocatable={"nvidia.com/gpu": str(GPUS if dp else 0)})
        if dp and self.slice_devices(DRIVER, name):
            self.both.append(f"{name} at {self.clock.t}")
        return info

    def patch_labels(
        self, node: str, expect: Mapping[str, str | None], labels: Mapping[str, str | None]
    ) -> None:
        info = self.nodes[node].info
        for k, v in expect.items():
            if info.labels.get(k) != v:
                raise NodeFilesChangedError(f"label {k} of node {node} changed")
        new = {**info.labels, **labels}
        self.nodes[node].info = replace(
            info, labels={k: v for k, v in new.items() if v is not None}
        )
        for k in labels:
            self.changed[(node, k)] = self.clock.t
        self.patches.append((node, dict(labels)))
        self.node(node)  # the moment after each write is judged too

    def slice_devices(self, driver: str, node: str) -> list[str]:
        if self._on(node, DRA_LABEL):
            up = (node, DRA_LABEL) not in self.changed or self._since(node, DRA_LABEL) >= (
                self.publish_s
            )
        else:
            up = self._since(node, DRA_LABEL) < self.wipe_s
        return [f"gpu-{i}" for i in range(GPUS)] if up else []

    def claim_holders(self, driver: str, node: str) -> list[PodRef]:
        return [p for p in self.nodes[node].pods if p.name.endswith("-claim")]

    def claims_on(self, driver: str, node: str) -> list[str]:
        return [f"{p.namespace}/{p.name}" for p in self.claim_holders(driver, node)]

    def prepared(self, driver: str, node: str) -> list[str]:
        return sorted(self.stuck)

    def assigned(self, resource: str, node: str) -> list[str]:
        return [f"GPU-{p.name}" for p in self.nodes[node].pods if p.name.endswith("-gpu")]


class FakeGpuRunner(FakeRunner):
    """The node's facts as the facts module reports them: the kubelet's own account
    (``podResources`` and the checkpoints) is ``kubelet[host]``, else empty (released)."""

    def __init__(self, cluster: FakeGpuCluster) -> None:
        super().__init__(cluster)
        self.kubelet: dict[str, dict[str, Any]] = {}
        self.reads: list[str] = []

    def node_facts(self, host: str) -> Mapping[str, Any]:
        self.reads.append(host)
        return self.kubelet.get(host, {"podResources": {"pods": []}, "checkpoints": {}})


def _info(name: str, labels: Mapping[str, str]) -> Any:
    from rollout.models import NodeInfo

    return NodeInfo(name, labels=dict(labels), allocatable={"nvidia.com/gpu": str(GPUS)})


def _setup(tmp_path: Path, dra: tuple[str, ...] = ()) -> tuple[Context, FakeGpuCluster]:
    clock = FakeClock()
    cluster = FakeGpuCluster(clock, dra)
    journal = Journal.create(tmp_path, "20260101T000000Z-abc")
    ctx = fake_context(cluster, FakeGpuRunner(cluster), journal)
    ctx.clock = clock
    ctx.verify_timeout_s = 60
    ctx.kind = recorded_kind(ChangeBegin(kind="allocation-path"))
    return ctx, cluster


def _run(
    ctx: Context,
    target: AllocationPath = AllocationPath.DRA,
    canary_only: bool = True,
    gate: Any = None,
    settings: PathSettings = SETTINGS,
) -> Any:
    batches = make_batches(NODES, ["n1"], Strategy(max_unavailable=1), canary_only)
    works = {n: PathChange(n, n, target, settings) for n in NODES}
    return run_change(ctx, works, batches, gate or NoGate(), canary_only)


def _steps(ctx: Context, node: str, path: str = "forward") -> list[str]:
    return [
        f"{e.step} {e.phase.value}"
        for e in ctx.journal.entries()
        if e.node == node and e.path is not None and e.path.value == path
    ]


def _path(cluster: FakeGpuCluster, node: str) -> str:
    return SETTINGS.path_of(cluster.nodes[node].info.labels) or "none"


def test_a_canary_moves_to_dra_in_order_and_holds_never_serving_through_both(
    tmp_path: Path,
) -> None:
    ctx, cluster = _setup(tmp_path)
    status = _run(ctx)
    assert status.outcome == "held"
    assert status.info.kind == "allocation-path"
    assert [s.split()[0] for s in _steps(ctx, "n1") if s.endswith("begin")] == [
        "preflight",
        "cordon",
        "drain",
        "release",
        "switch",
        "allocatable-zero",
        "start-driver",
        "verify",
        "uncordon",
    ]
    assert cluster.nodes["n1"].info.labels == {DEVICE_PLUGIN_LABEL: "false", DRA_LABEL: "true"}
    assert cluster.node("n1").allocatable["nvidia.com/gpu"] == "0"
    assert len(cluster.slice_devices(DRIVER, "n1")) == GPUS
    assert not cluster.nodes["n1"].info.unschedulable
    assert _path(cluster, "n2") == "device-plugin"  # untouched until promoted
    assert cluster.both == []
    # the DRA label went on only once the plugin's allocatable was 0 (2 s after its label)
    assert cluster.patches[:2] == [
        ("n1", {DEVICE_PLUGIN_LABEL: "false"}),
        ("n1", {DRA_LABEL: "true"}),
    ]


def test_a_pool_rolls_back_in_the_design_order_and_its_labels_come_back_as_they_were(
    tmp_path: Path,
) -> None:
    ctx, cluster = _setup(tmp_path)
    _run(ctx, canary_only=False)
    assert {_path(cluster, n) for n in NODES} == {"dra"}
    status = rollback(ctx)
    assert status.outcome == "rolled-back", status.message
    begins = [s.split()[0] for s in _steps(ctx, "n1", "restore") if s.endswith("begin")]
    assert begins == [
        "cordon",
        "claims",
        "drain",
        "release",
        "stop-driver",
        "slices-gone",
        "switch",
        "restore-verify",
        "uncordon",
    ]
    for n in NODES:
        assert cluster.nodes[n].info.labels == {DEVICE_PLUGIN_LABEL: "true"}  # byte for byte
        assert cluster.node(n).allocatable["nvidia.com/gpu"] == str(GPUS)
        assert cluster.slice_devices(DRIVER, n) == []
        assert not cluster.nodes[n].info.unschedulable
    assert cluster.both == []


def test_rollback_with_a_pod_holding_a_claim_waits_and_without_consent_fails_naming_it(
    tmp_path: Path,
) -> None:
    ctx, cluster = _setup(tmp_path)
    _run(ctx)
    cluster.nodes["n1"].pods.append(PodRef("ml", "train-claim", node="n1", uid="c1"))
    status = rollback(ctx)
    assert status.outcome == "rollback-failed"
    assert "failed at claims" in status.message and "ml/train-claim" in status.message
    assert "--terminate-claims" in status.message
    assert _path(cluster, "n1") == "dra"  # the driver was never stopped under the claim
    assert ("delete", "ml/train-claim") not in cluster.calls
    assert ("evict", "ml/train-claim") not in cluster.calls


def test_rollback_with_consent_terminates_the_claim_holders_then_stops_the_driver(
    tmp_path: Path,
) -> None:
    consent = replace(SETTINGS, terminate_claims=True)
    ctx, cluster = _setup(tmp_path)
    _run(ctx, settings=consent)
    cluster.nodes["n1"].pods.append(PodRef("ml", "train-claim", node="n1", uid="c1"))
    status = rollback(ctx)
    assert status.outcome == "rolled-back", status.message
    assert ("evict", "ml/train-claim") in cluster.calls
    assert _path(cluster, "n1") == "device-plugin"


def test_each_step_out_of_order_is_refused_by_name(tmp_path: Path) -> None:
    from rollout.change.kinds.allocation_path import _to_device_plugin, _to_dra
    from rollout.models import StepPath

    ctx, cluster = _setup(tmp_path, dra=("n2",))
    final = SETTINGS.labels_for(AllocationPath.DRA)
    # the device plugin still has a GPU assigned (the pod was never drained)
    with pytest.raises(OutOfOrderError, match="refusing switch on node n1: the device plugin"):
        _to_dra(ctx, "n1", SETTINGS, final, StepPath.FORWARD, ctx.clock)
    # a claim still allocated from the pool: the driver is not stopped
    cluster.nodes["n2"].pods = [PodRef("ml", "x-claim", node="n2", uid="c")]
    back = SETTINGS.labels_for(AllocationPath.DEVICE_PLUGIN)
    with pytest.raises(OutOfOrderError, match=r"refusing stop-driver on node n2: .*ml/x-claim"):
        _to_device_plugin(ctx, "n2", SETTINGS, back, StepPath.FORWARD, ctx.clock)
    # the kubelet still has a claim prepared (its own account)
    cluster.nodes["n2"].pods = []
    cluster.stuck = {"ml/gone-claim"}
    with pytest.raises(OutOfOrderError, match=r"ml/gone-claim.* still reserved for a pod"):
        _to_device_plugin(ctx, "n2", SETTINGS, back, StepPath.FORWARD, ctx.clock)
    assert cluster.patches == []


def test_a_dra_pool_moves_back_to_the_device_plugin_as_a_change(tmp_path: Path) -> None:
    ctx, cluster = _setup(tmp_path, dra=("n1", "n2"))
    for n in NODES:
        cluster.nodes[n].pods = []
    status = _run(ctx, target=AllocationPath.DEVICE_PLUGIN, canary_only=False)
    assert status.outcome == "completed", status.message
    begins = [s.split()[0] for s in _steps(ctx, "n1") if s.endswith("begin")]
    assert begins[3:7] == ["release", "stop-driver", "slices-gone", "switch"]
    assert {_path(cluster, n) for n in NODES} == {"device-plugin"}
    assert cluster.both == []


def test_a_failed_gate_rolls_the_canary_back_to_the_device_plugin(tmp_path: Path) -> None:
    ctx, cluster = _setup(tmp_path)
    status = _run(ctx, gate=ScriptedGate(VerdictStatus.FAILED))
    assert status.outcome == "rolled-back"
    assert _path(cluster, "n1") == "device-plugin"
    assert cluster.both == []


def _journal_kills_after(ctx: Context, n: int) -> None:
    original = ctx.journal.append
    count = {"n": 0}

    def append(*a: Any, **k: Any) -> Any:
        out = original(*a, **k)
        count["n"] += 1
        if count["n"] == n:
            raise Killed
        return out

    ctx.journal.append = append  # type: ignore[method-assign]


def test_a_crash_after_every_journal_entry_resumes_to_one_path(tmp_path: Path) -> None:
    ctx, _ = _setup(tmp_path / "count")
    _run(ctx)
    entries = ctx.journal.entries()
    total = len(entries)
    assert total > 15
    # the matrix covers the allocatable-0 wait's own entries, between the label writes
    n1 = [f"{e.step} {e.phase.value}" for e in entries if e.node == "n1"]
    at = n1.index("allocatable-zero begin")
    assert n1[at - 1 : at + 3] == [
        "switch done", "allocatable-zero begin", "allocatable-zero done", "start-driver begin",
    ]  # fmt: skip
    for k in range(1, total + 1):
        ctx, cluster = _setup(tmp_path / str(k))
        _journal_kills_after(ctx, k)
        with contextlib.suppress(Killed):
            _run(ctx)
        # a new process, on any machine: the kind comes from the journal
        again = fake_context(
            cluster, ctx.runner, Journal.open(tmp_path / str(k), ctx.journal.change_id)
        )
        again.clock = cluster.clock
        again.verify_timeout_s = 60
        again.kind = recorded_kind(status_of(again.journal).info)
        resume(again)
        n1 = status_of(again.journal).nodes["n1"]
        assert n1.state in (NodeState.APPLIED, NodeState.RESTORED, NodeState.PENDING), k
        want = "dra" if n1.state is NodeState.APPLIED else "device-plugin"
        assert _path(cluster, "n1") == want, (k, n1)
        assert not cluster.nodes["n1"].info.unschedulable, k
        assert cluster.both == [], k


def test_the_plan_section_names_field_and_line_on_bad_input() -> None:
    def loc(f: str) -> Location:
        return Location(file="plan.yaml", field=f, line=7)

    good = parse_path_plan(
        {"groups": {"gpu-a": "dra"}, "driver": DRIVER, "deviceClass": "gpu.example.com"}, loc
    )
    assert good.groups == {"gpu-a": AllocationPath.DRA}
    assert good.settings.device_plugin_label == "nvidia.com/gpu.deploy.device-plugin"
    assert good.settings.dra_label == "nvidia.com/dra-kubelet-plugin"
    assert good.settings.resource == "nvidia.com/gpu"
    bad = [
        ({"groups": {"g": "cdi"}, "driver": "d", "deviceClass": "c"}, "allocationPath.groups.g"),
        ({"groups": {"g": "dra"}, "deviceClass": "c"}, "allocationPath.driver"),
        ({"groups": {}, "driver": "d", "deviceClass": "c"}, "allocationPath.groups"),
        ({"groups": {"g": "dra"}, "driver": "d", "deviceClass": "c", "vendor": 1}, "vendor"),
        (
            {
                "groups": {"g": "dra"},
                "driver": "d",
                "deviceClass": "c",
                "draLabel": DEVICE_PLUGIN_LABEL,
            },
            "allocationPath.draLabel",
        ),
    ]
    for section, where in bad:
        with pytest.raises(InputError) as e:
            parse_path_plan(section, loc)
        assert where in str(e.value) and "plan.yaml:7" in str(e.value)


def test_a_crash_after_every_entry_of_a_rollback_is_finished_by_resume(tmp_path: Path) -> None:
    from rollout.change.engine.resumption import resume_rollback, unfinished_rollback

    ctx, _ = _setup(tmp_path / "count")
    _run(ctx)
    before = len(ctx.journal.entries())
    rollback(ctx)
    total = len(ctx.journal.entries()) - before
    assert total > 15
    for k in range(1, total + 1):
        ctx, cluster = _setup(tmp_path / str(k))
        _run(ctx)
        _journal_kills_after(ctx, k)
        with contextlib.suppress(Killed):
            rollback(ctx)
        journal = Journal.open(tmp_path / str(k), ctx.journal.change_id)
        again = fake_context(cluster, ctx.runner, journal)
        again.clock = cluster.clock
        again.verify_timeout_s = 60
        again.kind = recorded_kind(status_of(journal).info)
        pending = unfinished_rollback(journal.entries())
        if pending is not None:
            resume_rollback(again, pending)
        n1 = status_of(journal).nodes["n1"]
        assert n1.state is NodeState.RESTORED, (k, n1)
        assert _path(cluster, "n1") == "device-plugin", k
        assert cluster.nodes["n1"].info.labels == {DEVICE_PLUGIN_LABEL: "true"}, k
        assert not cluster.nodes["n1"].info.unschedulable, k
        assert cluster.both == [], k


def test_consent_given_after_the_canary_moved_carries_to_its_rollback(tmp_path: Path) -> None:
    """``--terminate-claims`` given to ``promote`` (a ``change`` begin with ``terminateClaims``,
    as ``run_migration_promotion`` writes it) reaches the canary whose own record says no:
    a rollback from any process reads the change record (``claims_consent``)."""
    from dataclasses import replace

    from rollout.change.kinds.allocation_path import claims_consent
    from rollout.change.record.entries import Promotion
    from rollout.change.record.journal import CHANGE_STEP
    from rollout.models import Phase

    ctx, cluster = _setup(tmp_path)
    status = _run(ctx)  # no consent
    assert status.outcome == "held"
    assert not claims_consent(ctx.journal.entries())
    ctx.journal.append(
        CHANGE_STEP,
        Phase.BEGIN,
        now=ctx.clock.now(),
        data=replace(
            status_of(ctx.journal).info,
            terminate_claims=True,
            promotion=Promotion(by="ops", at="", batches=(), terminate_claims=True),
        ).data(),
    )
    assert claims_consent(ctx.journal.entries())
    cluster.nodes["n1"].pods.append(PodRef("ml", "train-claim", node="n1", uid="c1"))
    again = fake_context(cluster, ctx.runner, Journal.open(tmp_path, ctx.journal.change_id))
    again.clock = cluster.clock
    again.kind = recorded_kind(status_of(again.journal).info)
    done = rollback(again)
    assert done.outcome == "rolled-back", done.message
    assert ("evict", "ml/train-claim") in cluster.calls
    claims = [e for e in again.journal.entries() if e.step == "claims" and e.node == "n1"]
    assert claims[0].data["terminate"] is True
    assert _path(cluster, "n1") == "device-plugin"


def _listed(pod: str, container: dict[str, Any]) -> dict[str, Any]:
    """Facts whose podresources ``List`` shows ``pod`` (``ns/name``) with ``container``."""
    ns, name = pod.split("/")
    pods = [{"name": name, "namespace": ns, "containers": [{"name": "c", **container}]}]
    return {"podResources": {"pods": pods}, "checkpoints": {}}


def test_release_waits_for_the_kubelets_own_account_and_names_what_it_still_holds(
    tmp_path: Path,
) -> None:
    """issue 37: the API server may show the node drained while the kubelet still has a
    container with a GPU (podresources): release waits, then fails naming the device, the pod
    and the kubelet's account; nothing is switched."""
    ctx, cluster = _setup(tmp_path)
    runner = ctx.runner
    assert isinstance(runner, FakeGpuRunner)
    held = {"devices": [{"resourceName": "nvidia.com/gpu", "deviceIds": ["GPU-7"]}]}
    runner.kubelet["n1"] = _listed("ml/ghost", held)
    status = _run(ctx)
    assert status.outcome != "held"
    assert "node n1: release failed" in status.message, status.message
    assert "the kubelet's own account says nvidia.com/gpu GPU-7 held by pod ml/ghost " in (
        status.message
    )
    assert "(podresources)" in status.message
    assert _path(cluster, "n1") == "device-plugin" and cluster.patches == []
    assert "n1" in runner.reads


def test_release_journals_the_kubelets_account_it_confirmed(tmp_path: Path) -> None:
    ctx, _ = _setup(tmp_path)
    assert _run(ctx).outcome == "held"
    # read once: the check before the first label write, right after release confirmed it
    # (its journal entry the node's last), asks the API server only
    runner = ctx.runner
    assert isinstance(runner, FakeGpuRunner) and runner.reads == ["n1"]
    done = [
        e
        for e in ctx.journal.entries()
        if e.node == "n1" and e.step == "release" and e.phase.value == "done"
    ]
    assert done[0].data["kubelet"]["sources"] == ["podresources"]
    assert done[0].data["kubelet"]["held"] == []


def test_the_way_back_refuses_to_stop_the_driver_while_the_kubelet_has_a_claim_prepared(
    tmp_path: Path,
) -> None:
    from rollout.change.kinds.allocation_path import _to_device_plugin
    from rollout.models import StepPath

    ctx, cluster = _setup(tmp_path, dra=("n2",))
    cluster.nodes["n2"].pods = []
    runner = ctx.runner
    assert isinstance(runner, FakeGpuRunner)
    claim = {
        "claimName": "one-gpu",
        "claimNamespace": "ml",
        "claimResources": [{"driverName": DRIVER, "poolName": "n2", "deviceName": "gpu-0"}],
    }
    runner.kubelet["n2"] = _listed("ml/holder", {"dynamicResources": [claim]})
    back = SETTINGS.labels_for(AllocationPath.DEVICE_PLUGIN)
    with pytest.raises(
        OutOfOrderError,
        match=r"refusing stop-driver on node n2: the kubelet's own account says "
        r"ResourceClaim ml/one-gpu \(n2/gpu-0\) held by pod ml/holder container c",
    ):
        _to_device_plugin(ctx, "n2", SETTINGS, back, StepPath.FORWARD, ctx.clock)
    assert cluster.patches == []
