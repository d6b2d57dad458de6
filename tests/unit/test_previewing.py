"""The admission preview (rollout.kubelet.admission.node_preview): scheduling match and predictions,
from real Pod, Deployment and Node dicts as the API serves them."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.kubelet.admission.node_preview import (
    decide,
    fleet_misfits,
    lands_on,
    predicted_rejections,
    preview_node,
    render_text,
    workload_of,
    workloads,
)
from rollout.kubelet.facts import node_facts_from_dict

# two NUMA nodes of 8 CPUs, 4 GPUs each (the lab's shape)
FACTS = node_facts_from_dict(
    {
        "onlineCPUs": "0-15",
        "numaNodes": [
            {"id": 0, "cpus": "0-7", "memoryBytes": 32 << 30},
            {"id": 1, "cpus": "8-15", "memoryBytes": 32 << 30},
        ],
        "gpus": [{"id": f"GPU-{i}", "numaNode": i // 4} for i in range(8)],
    }
)
SINGLE = {
    "cpuManagerPolicy": "static",
    "reservedSystemCPUs": "0",
    "topologyManagerPolicy": "single-numa-node",
    "topologyManagerScope": "pod",
}
NODE = {
    "metadata": {"name": "gpu-07", "labels": {"pool": "gpu", "zone": "a", "gen": "5"}},
    "spec": {"taints": [{"key": "gpu", "value": "true", "effect": "NoSchedule"}]},
}


def _spec(gpus: int, cpu: str = "2", **extra: Any) -> dict[str, Any]:
    res = {"cpu": cpu, "memory": "1Gi", "nvidia.com/gpu": str(gpus)}
    return {
        "containers": [{"name": "app", "resources": {"requests": res, "limits": res}}],
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        **extra,
    }


def _deployment(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "ml", "uid": f"d-{name}"},
        "spec": {"replicas": 1, "template": {"metadata": {"labels": {"app": name}}, "spec": spec}},
    }


def _replicaset(name: str, deployment: str) -> dict[str, Any]:
    return {
        "kind": "ReplicaSet",
        "metadata": {
            "name": name,
            "namespace": "ml",
            "ownerReferences": [{"kind": "Deployment", "name": deployment, "controller": True}],
        },
        "spec": {"template": {"spec": _spec(1)}},
    }


def _pod(name: str, rs: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "metadata": {
            "name": name,
            "namespace": "ml",
            "uid": f"p-{name}",
            "ownerReferences": [{"kind": "ReplicaSet", "name": rs, "controller": True}],
        },
        "spec": {**spec, "nodeName": "gpu-07"},
        "status": {"phase": "Running"},
    }


def _affinity(*exprs: dict[str, Any]) -> dict[str, Any]:
    terms = [{"matchExpressions": list(exprs)}]
    return {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}
        }
    }


NO_TOLERATION = {"containers": [{"name": "app"}]}
WRONG_VALUE = {
    "containers": [{"name": "app"}],
    "tolerations": [{"key": "gpu", "operator": "Equal", "value": "no", "effect": "NoSchedule"}],
}
TOLERATE_ALL = {"containers": [{"name": "app"}], "tolerations": [{"operator": "Exists"}]}
NO_EXECUTE_ONLY = {
    "containers": [{"name": "app"}],
    "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoExecute"}],
}


@pytest.mark.parametrize(
    ("spec", "lands"),
    [
        (_spec(1), True),
        (_spec(1, nodeSelector={"pool": "gpu"}), True),
        (_spec(1, nodeSelector={"pool": "cpu"}), False),
        (_spec(1, nodeSelector={"pool": "gpu", "missing": "x"}), False),
        (
            _spec(1, affinity=_affinity({"key": "zone", "operator": "In", "values": ["a", "b"]})),
            True,
        ),
        (_spec(1, affinity=_affinity({"key": "zone", "operator": "In", "values": ["b"]})), False),
        (_spec(1, affinity=_affinity({"key": "zone", "operator": "NotIn", "values": ["b"]})), True),
        (
            _spec(1, affinity=_affinity({"key": "zone", "operator": "NotIn", "values": ["a"]})),
            False,
        ),
        (_spec(1, affinity=_affinity({"key": "pool", "operator": "Exists"})), True),
        (_spec(1, affinity=_affinity({"key": "spot", "operator": "Exists"})), False),
        (_spec(1, affinity=_affinity({"key": "spot", "operator": "DoesNotExist"})), True),
        (_spec(1, affinity=_affinity({"key": "pool", "operator": "DoesNotExist"})), False),
        (_spec(1, affinity=_affinity({"key": "gen", "operator": "Gt", "values": ["4"]})), True),
        (_spec(1, affinity=_affinity({"key": "gen", "operator": "Lt", "values": ["4"]})), False),
        (  # expressions of one term are ANDed
            _spec(
                1,
                affinity=_affinity(
                    {"key": "pool", "operator": "In", "values": ["gpu"]},
                    {"key": "zone", "operator": "In", "values": ["b"]},
                ),
            ),
            False,
        ),
        (  # terms are ORed
            _spec(
                1,
                affinity={
                    "nodeAffinity": {
                        "requiredDuringSchedulingIgnoredDuringExecution": {
                            "nodeSelectorTerms": [
                                {
                                    "matchExpressions": [
                                        {"key": "zone", "operator": "In", "values": ["b"]}
                                    ]
                                },
                                {
                                    "matchExpressions": [
                                        {"key": "pool", "operator": "In", "values": ["gpu"]}
                                    ]
                                },
                            ]
                        }
                    }
                },
            ),
            True,
        ),
        (NO_TOLERATION, False),
        (WRONG_VALUE, False),
        (TOLERATE_ALL, True),
        (NO_EXECUTE_ONLY, False),
    ],
)
def test_lands_on(spec: dict[str, Any], lands: bool) -> None:
    assert lands_on(spec, NODE) is lands


def test_a_template_with_a_node_name_lands_on_that_node_alone() -> None:
    # a kwok Deployment pins its pods by spec.nodeName; pinned elsewhere, never on this node
    assert not lands_on({**TOLERATE_ALL, "nodeName": "gpu-08"}, NODE)
    # pinned here, the other rules still apply (the kubelet checks them at admission too)
    assert lands_on({**TOLERATE_ALL, "nodeName": "gpu-07"}, NODE)
    assert not lands_on({**NO_TOLERATION, "nodeName": "gpu-07"}, NODE)
    assert not lands_on({**TOLERATE_ALL, "nodeName": "gpu-07", "nodeSelector": {"zone": "b"}}, NODE)


def test_prefer_no_schedule_taint_does_not_keep_pods_off() -> None:
    node = {
        "metadata": {"name": "n"},
        "spec": {"taints": [{"key": "k", "effect": "PreferNoSchedule"}]},
    }
    assert lands_on(NO_TOLERATION, node)


def test_workloads_leave_out_replicasets_of_deployments() -> None:
    objs = [
        _deployment("big", _spec(6)),
        _replicaset("big-5d8f", "big"),
        {"kind": "ReplicaSet", "metadata": {"name": "bare", "namespace": "ml"}, "spec": {}},
        {"kind": "StatefulSet", "metadata": {"name": "db", "namespace": "ml"}, "spec": {}},
        {"kind": "ConfigMap", "metadata": {"name": "x", "namespace": "ml"}},
    ]
    assert sorted(workloads(objs)) == [
        "Deployment/ml/big",
        "ReplicaSet/ml/bare",
        "StatefulSet/ml/db",
    ]
    assert workload_of(_pod("big-5d8f-x", "big-5d8f", _spec(6)), objs) == "Deployment/ml/big"
    orphan = {"metadata": {"name": "lone", "namespace": "ml"}}
    assert workload_of(orphan, objs) == "Pod/ml/lone"


@pytest.mark.parametrize(
    ("config", "gpus", "admitted", "reason", "numbers"),
    [
        (
            SINGLE,
            6,
            False,
            "TopologyAffinityError",
            "needs 6 nvidia.com/gpu on one NUMA node; the largest NUMA node of gpu-07 has 4",
        ),
        (SINGLE, 4, True, "", "admitted on NUMA node(s) 0 of gpu-07"),
        # restricted also refuses what no single NUMA node can hold when the GPUs could fit
        # on two: the merged hint is preferred only on one NUMA node, restricted needs preferred
        (
            {**SINGLE, "topologyManagerPolicy": "restricted"},
            6,
            False,
            "TopologyAffinityError",
            "needs 6 nvidia.com/gpu on the fewest NUMA nodes; the largest NUMA node of gpu-07 "
            "has 4",
        ),
        ({**SINGLE, "topologyManagerPolicy": "best-effort"}, 6, True, "", None),
        ({}, 6, True, "", None),  # no managers: nothing aligned, nothing refused
    ],
)
def test_running_pod_predictions(
    config: dict[str, Any], gpus: int, admitted: bool, reason: str, numbers: str | None
) -> None:
    objs = [_deployment("train", _spec(gpus)), _replicaset("train-1", "train")]
    pod = _pod("train-1-a", "train-1", _spec(gpus))
    pv = preview_node(NODE, FACTS, config, [pod], objs)
    (p,) = pv.predictions  # the Deployment runs here: predicted once, as its pod
    assert (p.workload, p.pod, p.running) == ("Deployment/ml/train", "ml/train-1-a", True)
    assert (p.admitted, p.reason) == (admitted, reason)
    if numbers is not None:
        assert p.numbers == numbers
    if not admitted:
        assert p.message == "Resources cannot be allocated with Topology locality"
        assert pv.rejected_running == [p]
        assert "predicted rejected on node gpu-07" in p.describe("gpu-07")


def test_a_controller_known_by_its_metadata_alone_is_not_predicted() -> None:
    """Preflight reads whole only the controllers whose pods land on the change's Nodes; the
    others come as their metadata (``ClusterReader.controllers``). One of those has no template
    to judge, and an empty one would land on any untainted Node."""
    untainted = {"metadata": {"name": "cpu-01", "labels": {}}, "spec": {}}
    objs = [
        {"kind": "Deployment", "metadata": {"name": "elsewhere", "namespace": "ml"}},
        _deployment("small", _spec(2)),
    ]
    pv = preview_node(untainted, FACTS, SINGLE, [], objs)
    assert [p.workload for p in pv.predictions] == ["Deployment/ml/small"]


def test_running_pods_admit_in_order_and_hold_what_they_got() -> None:
    # two pods of 3 GPUs: each fits a NUMA node alone; the second takes the other NUMA node;
    # a third has no NUMA node with 3 GPUs left
    objs: list[dict[str, Any]] = []
    pods = [_pod(f"p{i}", f"rs{i}", _spec(3)) for i in range(3)]
    pv = preview_node(NODE, FACTS, SINGLE, pods, objs)
    assert [p.admitted for p in pv.predictions] == [True, True, False]
    assert pv.predictions[2].reason == "TopologyAffinityError"


def test_candidates_are_predicted_alone_and_filtered_by_scheduling() -> None:
    objs = [
        _deployment("big", _spec(6)),
        _deployment("small", _spec(2)),
        _deployment("elsewhere", _spec(6, nodeSelector={"pool": "cpu"})),
    ]
    pv = preview_node(NODE, FACTS, SINGLE, [], objs)
    got = {p.workload: (p.running, p.admitted) for p in pv.predictions}
    assert got == {"Deployment/ml/big": (False, False), "Deployment/ml/small": (False, True)}
    assert [p.workload for p in pv.rejected_candidates] == ["Deployment/ml/big"]
    assert pv.rejected_running == []
    doc = pv.to_dict()
    assert doc["node"] == "gpu-07"
    assert {p["workload"]: p["verdict"] for p in doc["pods"]} == {
        "Deployment/ml/big": "rejected",
        "Deployment/ml/small": "admitted",
    }


def test_fleet_view_lists_workloads_that_fit_no_node() -> None:
    other = {"metadata": {"name": "gpu-08", "labels": {"pool": "gpu"}}, "spec": {}}
    objs = [_deployment("big", _spec(6)), _deployment("small", _spec(2))]
    previews = [
        preview_node(NODE, FACTS, SINGLE, [], objs),
        preview_node(other, FACTS, {}, [], objs),  # gpu-08 keeps no topology alignment
    ]
    assert fleet_misfits(previews) == []
    previews[1] = preview_node(other, FACTS, SINGLE, [], objs)
    assert fleet_misfits(previews) == ["Deployment/ml/big"]
    text = render_text(previews)
    assert "fits no node in scope: Deployment/ml/big" in text
    assert "REJECTED TopologyAffinityError" in text
    assert "the largest NUMA node of gpu-08 has 4" in text


@pytest.mark.parametrize(
    ("accept", "refused", "accepted"),
    [(False, 1, 0), (True, 0, 1)],
)
def test_decide_refuses_a_running_pod_unless_accepted(
    accept: bool, refused: int, accepted: int
) -> None:
    objs = [
        _deployment("train", _spec(6)),
        _replicaset("train-1", "train"),
        _deployment("big", _spec(6)),
        _deployment("small", _spec(2)),
    ]
    pv = preview_node(NODE, FACTS, SINGLE, [_pod("train-1-a", "train-1", _spec(6))], objs)
    got_refused, warnings, got_accepted = decide([pv], accept)
    assert (len(got_refused), len(got_accepted)) == (refused, accepted)
    line = (got_refused or got_accepted)[0]
    assert line.startswith(
        "pod ml/train-1-a of Deployment/ml/train predicted rejected on node gpu-07"
    )
    assert "needs 6 nvidia.com/gpu on one NUMA node; the largest NUMA node of gpu-07 has 4" in line
    assert ("--accept-predicted-rejections" in line) is not accept
    # the 6-GPU workloads fit no node of this scope; the 2-GPU one is admitted
    assert warnings == [
        "workload Deployment/ml/big predicted rejected on node gpu-07: TopologyAffinityError: "
        "needs 6 nvidia.com/gpu on one NUMA node; the largest NUMA node of gpu-07 has 4",
        "Deployment/ml/big fits no node in scope under the new config",
        "Deployment/ml/train fits no node in scope under the new config",
    ]


def test_predicted_rejections_name_owners_as_the_gate_sees_them() -> None:
    """The gate's samples name a pod's controlling owner (a Deployment's pod: its ReplicaSet);
    the pairs carry that form and the workload's own key, for rejected predictions only."""
    objs = [
        _deployment("train", _spec(6)),
        _replicaset("train-1", "train"),
        _deployment("big", _spec(6)),
        _replicaset("big-1", "big"),
        _replicaset("big-0", "big"),  # an older ReplicaSet of the same Deployment
        _deployment("small", _spec(2)),
        _replicaset("small-1", "small"),
    ]
    bare = {
        "metadata": {"name": "solo", "namespace": "ml", "uid": "p-solo"},
        "spec": {**_spec(6), "nodeName": "gpu-07"},
    }
    pods = [_pod("train-1-a", "train-1", _spec(6)), bare]
    pv = preview_node(NODE, FACTS, SINGLE, pods, objs)
    assert {p.workload: p.owners for p in pv.predictions} == {
        "Deployment/ml/train": ("ReplicaSet/ml/train-1",),
        "Pod/ml/solo": (),
        "Deployment/ml/big": ("ReplicaSet/ml/big-0", "ReplicaSet/ml/big-1"),
        "Deployment/ml/small": ("ReplicaSet/ml/small-1",),
    }
    assert predicted_rejections([pv]) == {
        ("gpu-07", "Deployment/ml/train"),
        ("gpu-07", "ReplicaSet/ml/train-1"),
        ("gpu-07", "Pod/ml/solo"),
        ("gpu-07", "Deployment/ml/big"),
        ("gpu-07", "ReplicaSet/ml/big-0"),
        ("gpu-07", "ReplicaSet/ml/big-1"),
    }


# ---------------------------------------------------------- pod-level resources (KEP-2837)
def _pod_level_pod(name: str, pod_level: bool = True) -> dict[str, Any]:
    spec = _spec(1, cpu="4")
    if pod_level:
        res = {"cpu": "4", "memory": "1Gi"}
        spec["resources"] = {"requests": res, "limits": res}
    return {"metadata": {"name": name, "namespace": "ml", "uid": name}, "spec": spec}


def test_pod_level_resources_get_no_exclusive_cpus_while_the_gate_is_off() -> None:
    from rollout.kubelet.admission.inputs import (
        config_from_kubelet,
        machine_from_facts,
        pod_from_api,
    )
    from rollout.kubelet.admission.model import Node

    machine, config = machine_from_facts(FACTS), config_from_kubelet(SINGLE)
    plain = Node(machine, config).admit(pod_from_api(_pod_level_pod("a", pod_level=False)))
    assert plain.admitted and plain.cpus  # exclusive CPUs, aligned with the GPU
    off = Node(machine, config).admit(pod_from_api(_pod_level_pod("b")))
    assert off.admitted and not off.cpus  # the CPU manager skips it: no exclusive CPUs
    on = Node(machine, config).admit(pod_from_api(_pod_level_pod("c"), managers=True))
    assert on.cpus


def test_preview_warns_that_pod_level_pods_are_not_aligned() -> None:
    pv = preview_node(NODE, FACTS, SINGLE, [_pod_level_pod("p1")], [])
    [p] = pv.predictions
    assert p.admitted
    assert p.note.startswith(
        "uses pod-level resources (spec.resources) and PodLevelResourceManagers is off: admitted "
        "without exclusive CPUs, pinned memory or NUMA alignment"
    )
    assert "CPU Manager allocation skipped, pod is using pod-level resources but the " in p.note
    refusals, warnings, _ = decide([pv], accept=False)
    assert refusals == []
    assert warnings == [f"pod ml/p1 of Pod/ml/p1 on node gpu-07: {p.note}"]
    assert "note: uses pod-level resources" in render_text([pv])
    assert pv.to_dict()["pods"][0]["note"] == p.note
    # the gate on, or a pod without pod-level resources: nothing to say
    gated = {**SINGLE, "featureGates": {"PodLevelResourceManagers": True}}
    note = preview_node(NODE, FACTS, gated, [_pod_level_pod("p1")], []).predictions[0].note
    assert "pod-level" not in note
    plain = preview_node(NODE, FACTS, SINGLE, [_pod_level_pod("p1", pod_level=False)], [])
    assert "pod-level" not in plain.predictions[0].note


def test_preview_warns_that_running_guaranteed_pods_cannot_be_resized_under_static() -> None:
    running = {"metadata": {"name": "g", "namespace": "ml", "uid": "g"}, "spec": _spec(1)}
    [p] = preview_node(NODE, FACTS, SINGLE, [running], []).predictions
    assert p.admitted
    assert p.note == (
        'in-place resize of this Guaranteed pod will be refused ("Resize is infeasible for '
        'Guaranteed Pods alongside CPU Manager static policy": PodResizePending, reason '
        "Infeasible); resize by recreating the pod"
    )
    memory = {**SINGLE, "memoryManagerPolicy": "Static"}
    memory["reservedMemory"] = [{"numaNode": 0, "limits": {"memory": "100Mi"}}]
    [m] = preview_node(NODE, FACTS, memory, [running], []).predictions
    assert "alongside Memory Manager static policy" in m.note
    # not Guaranteed, or the none policy: resizable, nothing to say
    burst = _spec(1)
    burst["containers"][0]["resources"]["limits"] = {"nvidia.com/gpu": "1"}
    pod = {"metadata": {"name": "b", "namespace": "ml", "uid": "b"}, "spec": burst}
    assert preview_node(NODE, FACTS, SINGLE, [pod], []).predictions[0].note == ""
    none = {"cpuManagerPolicy": "none"}
    assert preview_node(NODE, FACTS, none, [running], []).predictions[0].note == ""


def test_preview_warns_about_init_and_sidecar_containers_with_exclusive_cpus() -> None:
    res = {"cpu": "1", "memory": "100Mi"}
    spec = _spec(1)
    spec["initContainers"] = [
        {"name": "setup", "resources": {"requests": res, "limits": res}},
        {"name": "proxy", "restartPolicy": "Always", "resources": {"requests": res, "limits": res}},
    ]
    pod = {"metadata": {"name": "s", "namespace": "ml", "uid": "s"}, "spec": spec}
    [p] = preview_node(NODE, FACTS, SINGLE, [pod], []).predictions
    assert (
        "sidecar (restartable init) container(s) proxy get exclusive CPUs that the app "
        "containers do not reuse (#119447)"
    ) in p.note
    assert (
        "init container(s) setup request integer CPUs under single-numa-node: pods like this "
        "have been rejected with TopologyAffinityError or UnexpectedAdmissionError"
    ) in p.note
    refusals, warnings, _ = decide([preview_node(NODE, FACTS, SINGLE, [pod], [])], False)
    assert refusals == []
    assert any("#119447" in w for w in warnings)
    # the same workload as a Deployment that can land: the same notes
    [w] = preview_node(NODE, FACTS, SINGLE, [], [_deployment("s", spec)]).predictions
    assert "#119447" in w.note and "#123816" in w.note
    # without init containers, or under the none policy: nothing about them
    [plain] = preview_node(NODE, FACTS, SINGLE, [], [_deployment("p", _spec(1))]).predictions
    assert "init container" not in plain.note
    none = preview_node(NODE, FACTS, {"cpuManagerPolicy": "none"}, [pod], []).predictions[0]
    assert none.note == ""
