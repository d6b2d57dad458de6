"""What counts as a model-serving canary in progress (``rollout.kube.canaries``, pure parts):
tables of Argo Rollout / Flagger phases, KServe InferenceService statuses, Deployment statuses
(``kubectl rollout status``'s words), label selectors, and the Deployments kept because a pod of
theirs runs on a node the command changes. The lab test that drives them through the CLI with the
real CRDs installed is ``tests/lab/test_preflight_checks_lab.py``."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.kube.canaries import (
    ARGO_PHASES,
    FLAGGER_PHASES,
    deployment_rollout,
    in_progress,
    isvc_rollout,
    rolling_on,
    selects,
)

PHASES = [
    # kind's phases, phase, in progress
    (ARGO_PHASES, "Progressing", True),
    (ARGO_PHASES, "Paused", True),
    (ARGO_PHASES, "Healthy", False),
    (ARGO_PHASES, "Degraded", False),
    (FLAGGER_PHASES, "Progressing", True),
    (FLAGGER_PHASES, "WaitingPromotion", True),
    (FLAGGER_PHASES, "Promoting", True),
    (FLAGGER_PHASES, "Finalising", True),
    (FLAGGER_PHASES, "Initialized", False),
    (FLAGGER_PHASES, "Succeeded", False),
    (FLAGGER_PHASES, "Failed", False),
    (FLAGGER_PHASES, "", False),
]


@pytest.mark.parametrize(("phases", "phase", "want"), PHASES)
def test_phases(phases: tuple[str, ...], phase: str, want: bool) -> None:
    assert (in_progress({"status": {"phase": phase}}, phases) == phase) is want
    assert in_progress({}, phases) is None


def _traffic(*split: tuple[str, int]) -> list[dict[str, Any]]:
    return [
        {"revisionName": r, "percent": p, "latestRevision": i == 0}
        for i, (r, p) in enumerate(split)
    ]


ISVC = [
    ("no status yet", {}, None),
    (
        "rolled out, 100% on the latest",
        {
            "predictor": {
                "latestCreatedRevision": "p-2",
                "latestReadyRevision": "p-2",
                "latestRolledoutRevision": "p-2",
                "traffic": _traffic(("p-2", 100)),
            }
        },
        None,
    ),
    (
        "canaryTrafficPercent 10: latest and prev both take traffic",
        {
            "predictor": {
                "latestCreatedRevision": "p-2",
                "latestReadyRevision": "p-2",
                "latestRolledoutRevision": "p-1",
                "traffic": _traffic(("p-2", 10), ("p-1", 90)),
            }
        },
        "predictor traffic split p-2 10%, p-1 90%",
    ),
    (
        "a new revision created, not ready",
        {
            "predictor": {
                "latestCreatedRevision": "p-3",
                "latestReadyRevision": "p-2",
                "latestRolledoutRevision": "p-2",
                "traffic": _traffic(("p-2", 100)),
            }
        },
        "predictor revision p-3 created, p-2 the latest ready",
    ),
    (
        "ready but not yet rolled out (traffic not moved)",
        {"transformer": {"latestReadyRevision": "t-2", "latestRolledoutRevision": "t-1"}},
        "transformer revision t-2 ready, t-1 the latest rolled out",
    ),
    (
        "a zero-percent tag is not a split",
        {"predictor": {"traffic": _traffic(("p-2", 100), ("p-1", 0))}},
        None,
    ),
]


@pytest.mark.parametrize(("case", "components", "want"), ISVC, ids=[c[0] for c in ISVC])
def test_inference_services(case: str, components: dict[str, Any], want: str | None) -> None:
    assert isvc_rollout({"status": {"components": components}}) == want, case


DEPLOYMENTS = [
    # case, spec.replicas, status, kubectl's words (None: not a version change in progress)
    ("complete", 2, {"replicas": 2, "updatedReplicas": 2, "availableReplicas": 2}, None),
    ("first revision starting", 3, {"replicas": 3, "updatedReplicas": 3}, None),
    ("first revision not observed yet", 3, {}, None),
    (
        "new pods being created beside old ones",
        2,
        {"replicas": 3, "updatedReplicas": 1},
        'Waiting for deployment "d" rollout to finish: 1 out of 2 new replicas have been '
        "updated...",
    ),
    (
        "old pods terminating",
        2,
        {"replicas": 3, "updatedReplicas": 2},
        'Waiting for deployment "d" rollout to finish: 1 old replicas are pending termination...',
    ),
    (
        "stalled",
        2,
        {
            "replicas": 3,
            "updatedReplicas": 1,
            "conditions": [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}],
        },
        'deployment "d" exceeded its progress deadline',
    ),
]


@pytest.mark.parametrize(
    ("case", "replicas", "status", "want"), DEPLOYMENTS, ids=[c[0] for c in DEPLOYMENTS]
)
def test_deployments(case: str, replicas: int, status: dict[str, Any], want: str | None) -> None:
    obj = {"metadata": {"name": "d"}, "spec": {"replicas": replicas}, "status": status}
    assert deployment_rollout(obj) == want, case


SELECTORS = [
    ({"matchLabels": {"app": "a"}}, {"app": "a", "x": "1"}, True),
    ({"matchLabels": {"app": "a"}}, {"app": "b"}, False),
    (
        {"matchExpressions": [{"key": "tier", "operator": "In", "values": ["gpu"]}]},
        {"tier": "gpu"},
        True,
    ),
    ({"matchExpressions": [{"key": "tier", "operator": "Exists"}]}, {"app": "a"}, False),
    ({}, {"app": "a"}, False),
    (None, {"app": "a"}, False),
]


@pytest.mark.parametrize(("selector", "labels", "want"), SELECTORS)
def test_selectors(selector: dict[str, Any] | None, labels: dict[str, str], want: bool) -> None:
    assert selects(selector, labels) is want


def test_deployments_are_kept_when_a_pod_of_theirs_is_on_a_changed_node() -> None:
    def dep(name: str, ns: str = "ml") -> dict[str, Any]:
        return {
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "selector": {"matchLabels": {"app": name}}},
            "status": {"replicas": 2, "updatedReplicas": 1},
        }

    def pod(name: str, app: str, ns: str = "ml") -> dict[str, Any]:
        return {"metadata": {"name": name, "namespace": ns, "labels": {"app": app}}}

    done = {**dep("done"), "status": {"replicas": 1, "updatedReplicas": 1}}
    pods = {
        "n1": [pod("llm-old", "llm"), pod("done-a", "done"), pod("other-ns", "emb", ns="x")],
        "n2": [pod("emb-a", "emb")],
    }
    got = rolling_on([dep("llm"), dep("emb"), done], ["n1"], pods)
    assert got == [
        'Deployment ml/llm is rolling out (ml/llm-old on n1): Waiting for deployment "llm" '
        "rollout to finish: 1 old replicas are pending termination...; change the "
        "device-allocation layer and a model-serving version in separate windows"
    ]
    assert len(rolling_on([dep("llm"), dep("emb")], ["n1", "n2"], pods)) == 2
