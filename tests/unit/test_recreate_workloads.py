"""``apply --recreate-workloads``: which pods are recreated (a table), the one-controller-at-a-time
loop over the drain's eviction code with its journal entries, rejected and blocked paths, and
that without the flag nothing is recreated. The real API server path is
``tests/lab/test_recreate_lab.py::test_recreate_workloads_recreates_a_deployments_pod_and_judges_it``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from rollout.change.commands.evidence_hooks import recreate_evidence
from rollout.change.commands.recreate_workloads import (
    RecreatedWorkloads,
    describe_selection,
    select,
)
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.record.journal import Journal, Kind
from rollout.cli import cli
from rollout.errors import EvictionBlockedError, ExternalError
from rollout.models import Phase, PodRef, Step
from rollout.protocols import Eviction, EvictionResult
from tests.unit.fakes_change import FakeClock

GPU = {"requests": {"nvidia.com/gpu": "1"}, "limits": {"nvidia.com/gpu": "1"}}
SMALL = {"requests": {"cpu": "100m"}}


def pod(
    name: str,
    owner: tuple[str, str] | None = ("ReplicaSet", "web-7d"),
    resources: dict[str, Any] | None = None,
    qos: str = "Burstable",
    phase: str = "Running",
    node: str = "n1",
    ns: str = "default",
    uid: str = "",
    **meta: Any,
) -> dict[str, Any]:
    refs = [] if owner is None else [{"kind": owner[0], "name": owner[1], "controller": True}]
    return {
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": uid or f"uid-{name}",
            "ownerReferences": refs,
            **meta,
        },
        "spec": {
            "nodeName": node,
            "containers": [{"name": "c", "resources": resources or SMALL}],
        },
        "status": {"phase": phase, "qosClass": qos},
    }


@pytest.mark.parametrize(
    ("p", "recreated", "left"),
    [
        (pod("gpu", resources=GPU), "ReplicaSet/default/web-7d", None),
        (pod("guaranteed", qos="Guaranteed"), "ReplicaSet/default/web-7d", None),
        (
            pod("db-0", owner=("StatefulSet", "db"), qos="Guaranteed"),
            "StatefulSet/default/db",
            None,
        ),
        (pod("burstable"), None, None),  # no device, not Guaranteed: nothing to judge
        (pod("bare", owner=None, resources=GPU), None, "no controller"),
        (pod("plugin", owner=("DaemonSet", "nvidia"), resources=GPU), None, "DaemonSet"),
        (
            pod(
                "static",
                owner=("Node", "n1"),
                qos="Guaranteed",
                annotations={"kubernetes.io/config.mirror": "x"},
            ),
            None,
            "mirror",
        ),
        (pod("rollout-device-x", owner=None, resources=GPU, ns="rollout-probes"), None, None),
        (pod("pending", resources=GPU, phase="Pending"), None, None),
        (pod("failed", resources=GPU, phase="Failed"), None, None),
        (pod("leaving", resources=GPU, deletionTimestamp="2026-01-01T00:00:00Z"), None, None),
    ],
)
def test_which_pods_are_recreated(
    p: dict[str, Any], recreated: str | None, left: str | None
) -> None:
    sel = select([p])
    key = f"{p['metadata']['namespace']}/{p['metadata']['name']}"
    assert list(sel.owners) == ([recreated] if recreated else [])
    if left is None:
        assert key not in sel.left
    else:
        assert left in sel.left[key]


def test_the_dry_run_lines_name_each_pod_and_why_one_is_left() -> None:
    sel = select([pod("gpu", resources=GPU), pod("bare", owner=None, resources=GPU)])
    assert describe_selection("n1", sel) == [
        "  recreate ReplicaSet/default/web-7d: default/gpu",
        "  leave default/bare: no controller: nothing would recreate it",
    ]
    assert describe_selection("n1", select([pod("burstable")])) == [
        "  no GPU or Guaranteed pod of a controller on n1 now"
    ]


class FakeKube:
    """Pods as JSON; an evicted pod's controller creates a replacement at once, on ``lands_on``
    and in ``outcome`` (Running, or Failed with the kubelet's admission reason); ``blocked``
    pods are refused by a PodDisruptionBudget every time."""

    def __init__(
        self,
        pods: Sequence[dict[str, Any]],
        lands_on: str = "n1",
        outcome: tuple[str, str, str] = ("Running", "", ""),
        blocked: Sequence[str] = (),
    ) -> None:
        self.pods = list(pods)
        self.lands_on, self.outcome, self.blocked = lands_on, outcome, set(blocked)
        self.calls: list[str] = []
        self.n = 0

    def on_node(self, node: str) -> list[dict[str, Any]]:
        return [p for p in self.pods if p["spec"]["nodeName"] == node]

    def of_owner(self, owner: str) -> list[dict[str, Any]]:
        out = []
        for p in self.pods:
            (ref,) = p["metadata"]["ownerReferences"] or [{"kind": "", "name": ""}]
            if f"{ref['kind']}/{p['metadata']['namespace']}/{ref['name']}" == owner:
                out.append(p)
        return out

    def pending(self, namespace: str) -> list[dict[str, Any]]:
        self.calls.append(f"pending {namespace}")
        return [
            p
            for p in self.pods
            if p["metadata"]["namespace"] == namespace and p["status"]["phase"] == "Pending"
        ]

    def evict(self, ref: PodRef, grace_period_s: int | None) -> EvictionResult:
        self.calls.append(f"evict {ref.key}")
        if ref.key in self.blocked:
            return EvictionResult(
                Eviction.BLOCKED,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )
        (old,) = [p for p in self.pods if p["metadata"]["uid"] == ref.uid]
        self.pods.remove(old)
        self.n += 1
        phase, reason, message = self.outcome
        new = pod(
            f"{old['metadata']['name']}-r{self.n}",
            owner=(
                old["metadata"]["ownerReferences"][0]["kind"],
                old["metadata"]["ownerReferences"][0]["name"],
            ),
            resources=old["spec"]["containers"][0]["resources"],
            phase=phase,
            node=self.lands_on,
        )
        new["status"].update(reason=reason, message=message)
        self.pods.append(new)
        return EvictionResult(Eviction.EVICTED)

    def delete_pod(self, ref: PodRef, grace_period_s: int | None) -> None:
        raise AssertionError("--recreate-workloads never deletes: it evicts")

    def pod_gone(self, ref: PodRef) -> bool:
        return not [p for p in self.pods if p["metadata"]["uid"] == ref.uid]

    def pdbs_for(self, ref: PodRef) -> list[str]:
        return [f"{ref.namespace}/web-pdb"] if ref.key in self.blocked else []

    def node(self, name: str) -> Any:
        raise AssertionError

    cordon = uncordon = pods_on_node = healthz = configz = node


def _run(
    tmp_path: Path, kube: FakeKube, nodes: Sequence[str] = ("n1",)
) -> tuple[Journal, list[str]]:
    journal = Journal.create(tmp_path, "20260101T000000Z-aaaaaa")
    said: list[str] = []
    policy = DrainPolicy(timeout_s=5, disable_eviction=True)  # the recreation evicts anyway
    loop = RecreatedWorkloads(kube, kube, policy, FakeClock(), said.append, timeout=5)
    try:
        loop.run(journal, list(nodes))
    finally:
        said.append("--")
    return journal, said


def _recreates(journal: Journal) -> list[tuple[Phase, dict[str, Any]]]:
    return [(e.phase, dict(e.data)) for e in journal.entries() if e.step == Kind.RECREATE]


def test_each_controller_is_evicted_after_the_previous_ones_replacements_run(
    tmp_path: Path,
) -> None:
    kube = FakeKube(
        [
            pod("web-a", resources=GPU),
            pod("db-0", owner=("StatefulSet", "db"), qos="Guaranteed"),
            pod("bare", owner=None, resources=GPU),
            pod("agent", owner=("DaemonSet", "plugin"), resources=GPU),
            pod("other", resources=GPU, node="n2"),  # not a changed node of this run
        ]
    )
    journal, said = _run(tmp_path, kube)
    assert kube.calls == ["evict default/web-a", "evict default/db-0"]  # never bare or DS pods
    entries = _recreates(journal)
    assert [(ph, d["owner"]) for ph, d in entries] == [
        (Phase.BEGIN, "ReplicaSet/default/web-7d"),
        (Phase.DONE, "ReplicaSet/default/web-7d"),
        (Phase.BEGIN, "StatefulSet/default/db"),
        (Phase.DONE, "StatefulSet/default/db"),
    ]
    assert entries[0][1] == {
        "node": "n1",
        "owner": "ReplicaSet/default/web-7d",
        "pods": ["default/web-a"],
    }
    assert entries[1][1]["replacements"] == {"default/web-a-r1": "n1"}
    assert entries[1][1]["offChangedNodes"] == []
    assert "n1: not recreating default/bare: no controller: nothing would recreate it" in said
    assert "n1: ReplicaSet/default/web-7d: replacement default/web-a-r1 Running on n1" in said
    assert [p["metadata"]["name"] for p in kube.pods if p["spec"]["nodeName"] == "n2"] == ["other"]


def test_a_replacement_the_kubelet_rejects_fails_with_its_reason_and_is_journaled(
    tmp_path: Path,
) -> None:
    message = (
        "Allocate failed due to no healthy devices present; cannot allocate unhealthy devices "
        "nvidia.com/gpu, which is unexpected"
    )
    kube = FakeKube(
        [pod("web-a", resources=GPU)], outcome=("Failed", "UnexpectedAdmissionError", message)
    )
    with pytest.raises(ExternalError, match="UnexpectedAdmissionError: Allocate failed") as e:
        _run(tmp_path, kube)
    assert "replacement default/web-a-r1 of ReplicaSet/default/web-7d on n1" in str(e.value)
    journal = Journal.open(tmp_path)
    (_begin, failed) = _recreates(journal)
    assert failed[0] is Phase.FAILED and "UnexpectedAdmissionError" in failed[1]["error"]


def test_a_budget_that_keeps_refusing_stops_the_recreation_naming_it(tmp_path: Path) -> None:
    kube = FakeKube(
        [pod("web-a", resources=GPU), pod("db-0", owner=("StatefulSet", "db"), qos="Guaranteed")],
        blocked=["default/web-a"],
    )
    with pytest.raises(EvictionBlockedError, match="recreate of node n1 timed out") as e:
        _run(tmp_path, kube)
    assert "PodDisruptionBudget default/web-pdb" in str(e.value)
    assert not [c for c in kube.calls if "db-0" in c]  # the next controller is not touched
    assert [ph for ph, _ in _recreates(Journal.open(tmp_path))] == [Phase.BEGIN, Phase.FAILED]


def test_a_replacement_that_never_runs_times_out_naming_it(tmp_path: Path) -> None:
    kube = FakeKube([pod("web-a", resources=GPU)], outcome=("Pending", "", ""))
    with pytest.raises(
        ExternalError, match=r"0 of 1 replacement\(s\) of ReplicaSet/default/web-7d"
    ):
        _run(tmp_path, kube)


def test_a_replacement_elsewhere_is_named_and_not_judged(tmp_path: Path) -> None:
    kube = FakeKube([pod("web-a", resources=GPU)], lands_on="n9")
    journal, said = _run(tmp_path, kube)
    done = _recreates(journal)[-1][1]
    assert done["replacements"] == {"default/web-a-r1": "n9"}
    assert done["offChangedNodes"] == ["default/web-a-r1"]
    assert any("do not judge" in s or "does not judge" in s for s in said), said


class FakeHooks:
    def __init__(self) -> None:
        self.calls: list[tuple[str, Any]] = []

    def collect(self, journal: Journal, label: str, nodes: list[str], raw_facts: Any = None) -> Any:
        self.calls.append(("collect", label))

    def open_sessions(self, nodes: list[str]) -> None:
        return None

    def record(self, journal: Journal, label: str, nodes: list[str], collected: Any) -> None:
        self.calls.append(("record", label))

    def after_recreate(
        self,
        journal: Journal,
        nodes: list[str],
        workloads: DrainPolicy | None = None,
        probes: bool = True,
    ) -> Any:
        self.calls.append(("after_recreate", (workloads, probes)))
        return None, "fake"


@pytest.mark.parametrize(
    ("probes", "workloads", "called"),
    [
        (False, None, []),
        (True, None, [("after_recreate", (None, True))]),
        (False, DrainPolicy(timeout_s=7), [("after_recreate", (DrainPolicy(timeout_s=7), False))]),
    ],
)
def test_without_the_flag_no_pod_is_recreated(
    tmp_path: Path,
    probes: bool,
    workloads: DrainPolicy | None,
    called: list[tuple[str, Any]],
) -> None:
    hooks = FakeHooks()
    journal = Journal.create(tmp_path, "20260101T000000Z-aaaaaa")
    recreate_evidence(hooks, journal, ["n1"], probes=probes, workloads=workloads)
    assert hooks.calls == ([*called, ("record", "after-recreate")] if called else [])


def test_recreate_workloads_with_no_evidence_is_refused_before_any_io(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_STATE_DIR", str(tmp_path / "state"))
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\n"
        "kubelet:\n  cpuManagerPolicy: static\n"
    )
    r = CliRunner().invoke(
        cli, ["apply", "--plan", str(plan), "--yes", "--recreate-workloads", "--no-evidence"]
    )
    assert r.exit_code == 2, r.output
    assert "--recreate-workloads collects the after-recreate evidence" in r.output
    assert not (tmp_path / "state").exists()


def test_promote_refuses_recreate_workloads_with_no_evidence_before_any_io(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli,
        [
            "promote",
            "--change",
            "20260101T000000Z-aaaaaa",
            "--kubeconfig",
            str(tmp_path / "absent"),  # never read: the refusal comes first
            "--recreate-workloads",
            "--no-evidence",
        ],
    )
    assert r.exit_code == 2, r.output
    assert "field '--recreate-workloads'" in r.output, r.output


def test_the_drained_pods_are_waited_for_before_the_node_is_read(tmp_path: Path) -> None:
    """The change's drain evicted web-a: its replacement waits Pending for the uncordoned node.
    The recreation waits for it before it reads the node's pods, then recreates it; nothing is
    waited for on a node the drain evicted nothing from."""
    back = pod("web-b", resources=GPU, phase="Pending", node="")
    kube = FakeKube([back])
    journal = Journal.create(tmp_path, "20260101T000000Z-aaaaaa")
    clock = FakeClock()
    drained = {"evicted": ["default/web-a"]}
    journal.append(Step.DRAIN, Phase.DONE, now=clock.now(), node="n1", data=drained)
    reads = 0
    real_pending = kube.pending

    def pending(namespace: str) -> list[dict[str, Any]]:
        nonlocal reads
        reads += 1
        if reads == 3:  # the scheduler places it and the kubelet admits it
            back["spec"]["nodeName"], back["status"]["phase"] = "n1", "Running"
        return real_pending(namespace)

    kube.pending = pending  # type: ignore[method-assign]
    said: list[str] = []
    loop = RecreatedWorkloads(kube, kube, DrainPolicy(timeout_s=5), clock, said.append, timeout=5)
    (done,) = loop.run(journal, ["n1", "n2"])
    assert done.pods == ("default/web-b",) and reads == 3
    assert done.replacements == {"default/web-b-r1": "n1"}
    assert kube.calls == [
        "pending default",
        "pending default",
        "pending default",
        "evict default/web-b",
    ]


def test_a_pod_still_pending_when_the_time_is_up_is_named_and_the_rest_goes_on(
    tmp_path: Path,
) -> None:
    kube = FakeKube(
        [pod("stuck", resources=GPU, phase="Pending", node=""), pod("web-a", resources=GPU)]
    )
    journal = Journal.create(tmp_path, "20260101T000000Z-aaaaaa")
    clock = FakeClock()
    journal.append(
        Step.DRAIN, Phase.DONE, now=clock.now(), node="n1", data={"evicted": ["default/x"]}
    )
    said: list[str] = []
    loop = RecreatedWorkloads(kube, kube, DrainPolicy(timeout_s=5), clock, said.append, timeout=5)
    (done,) = loop.run(journal, ["n1"])
    assert done.pods == ("default/web-a",)
    assert any(
        m.startswith("warning: n1: still Pending after 5s: default/stuck; recreating what runs")
        for m in said
    ), said
