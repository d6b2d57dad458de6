"""Parsing the kubelet's /metrics and turning counters into deltas (rollout.kube.scraping)."""

from __future__ import annotations

import pytest

from rollout.errors import ExternalError
from rollout.kube.scraping import KubeletCounters, parse_metrics

TAE = "TopologyAffinityError"


def metrics(requests: float, errors: float, rejections: dict[str, float] | None = None) -> str:
    lines = [
        "# HELP kubelet_topology_manager_admission_requests_total [ALPHA] Number of admission"
        " requests where resources have to be aligned.",
        "# TYPE kubelet_topology_manager_admission_requests_total counter",
        f"kubelet_topology_manager_admission_requests_total {requests}",
        "# HELP kubelet_topology_manager_admission_errors_total [ALPHA] Number of admission request"
        " failures where resources could not be aligned.",
        "# TYPE kubelet_topology_manager_admission_errors_total counter",
        f"kubelet_topology_manager_admission_errors_total {errors}",
    ]
    if rejections is not None:
        lines += [
            "# HELP kubelet_admission_rejections_total [ALPHA] Cumulative number pod admission"
            " rejections by the Kubelet.",
            "# TYPE kubelet_admission_rejections_total counter",
        ]
        lines += [
            f'kubelet_admission_rejections_total{{reason="{r}"}} {v}' for r, v in rejections.items()
        ]
    lines.append('kubelet_node_name{node="n1"} 1')
    return "\n".join(lines) + "\n"


def test_parse_reads_the_three_counters() -> None:
    r = parse_metrics("n1", metrics(12, 3, {TAE: 3, "OutOfcpu": 1}), now=5)
    assert (r.node, r.time, r.requests, r.errors) == ("n1", 5, 12, 3)
    assert r.rejections == {TAE: 3, "OutOfcpu": 1}


def test_parse_untyped_exposition_too() -> None:
    text = (
        "kubelet_topology_manager_admission_requests_total 4\n"
        "kubelet_topology_manager_admission_errors_total 1\n"
    )
    assert parse_metrics("n1", text, 0).requests == 4


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ('kubelet_admission_rejections_total{reason="x"} 1\n', "does not export"),
        ("this is { not metrics\n", "does not parse"),
    ],
)
def test_parse_failures_are_explained(text: str, words: str) -> None:
    with pytest.raises(ValueError, match=words):
        parse_metrics("n1", text, 0)


class Fetcher:
    """A scripted sequence of /metrics answers per node (strings, or exceptions to raise)."""

    def __init__(self, script: dict[str, list[str | Exception]]) -> None:
        self.script = script

    def fetch(self, node: str) -> str:
        item = self.script[node].pop(0)
        if isinstance(item, Exception):
            raise item
        return item


def test_counters_over_a_kubelet_restart_and_error_streak() -> None:
    f = Fetcher(
        {
            "n1": [
                metrics(10, 0, {}),
                metrics(14, 2, {TAE: 2}),
                ExternalError("503"),
                metrics(1, 1, {TAE: 1}),
            ],
            "n2": [metrics(5, 0, {}), metrics(7, 0, {}), metrics(8, 0, {}), metrics(9, 0, {})],
        }
    )
    k = KubeletCounters(("n1", "n2"))
    k.scrape(f, 0)
    assert not k.has_data  # one scrape is only a base
    k.scrape(f, 10)
    assert k.has_data and k.consecutive_errors == 0
    k.scrape(f, 20)
    assert k.consecutive_errors == 1 and "503" in (k.last_error or "")
    k.scrape(f, 30)  # n1's kubelet restarted: counters start again from zero
    assert k.consecutive_errors == 0
    c = k.counts(now=30, window=60)
    assert (c["n1"].admissions, c["n1"].rejections) == (4 + 1, {TAE: 3})
    assert (c["n2"].admissions, c["n2"].rejected) == (4, 0)
    k.forget_before(25)
    # the scrape at 10 is kept as the base: only the increase after the restart remains
    assert k.counts(now=30, window=60)["n1"] == k.counts(now=30, window=15)["n1"]
    assert len(k.readings) == 4


# ---------------------------------------------------------------- the API path's tracker


def pod(
    uid: str,
    phase: str,
    reason: str | None = None,
    node: str = "n1",
    rs: str | None = "web-1",
    created: str = "2026-11-30T12:00:10Z",
) -> dict[str, object]:
    meta: dict[str, object] = {"uid": uid, "namespace": "ns", "creationTimestamp": created}
    if rs:
        meta["ownerReferences"] = [{"kind": "ReplicaSet", "name": rs, "controller": True}]
    status: dict[str, object] = {"phase": phase}
    if reason:
        status["reason"] = reason
    return {"metadata": meta, "spec": {"nodeName": node}, "status": status}


SINCE = 1_796_040_000.0  # 2026-11-30T12:00:00Z


def test_tracker_relist_and_resume_count_nothing_twice() -> None:
    from rollout.kube.watching import AdmissionTracker
    from rollout.samples import count_window

    t = AdmissionTracker(SINCE)
    assert t.observe_pod(pod("a", "Pending"), 1) is None  # not decided yet
    assert t.observe_pod(pod("a", "Running"), 2) is not None
    assert t.observe_pod(pod("b", "Failed", TAE), 3) is not None
    # a relist after 410 Gone and a resumed watch replay both pods
    assert t.observe_pod(pod("a", "Running"), 9) is None
    assert t.observe_pod(pod("b", "Failed", TAE), 9) is None
    c = count_window(t.samples(), ["n1"], now=10, window=60)["n1"]
    assert (c.admissions, c.rejected, c.owners) == (2, 1, ("ReplicaSet/ns/web-1",))


def test_tracker_event_then_pod_is_one_rejection_with_its_owner() -> None:
    from rollout.kube.watching import AdmissionTracker
    from rollout.samples import count_window

    t = AdmissionTracker(SINCE)
    ev = {
        "type": "Warning",
        "reason": TAE,
        "message": "Resources cannot be allocated with Topology locality",
        "source": {"component": "kubelet", "host": "n1"},
        "involvedObject": {"kind": "Pod", "uid": "b"},
        "lastTimestamp": "2026-11-30T12:00:20Z",
    }
    assert t.observe_event(ev, ["n1"], 3) is not None
    assert t.observe_event({**ev, "source": {"host": "elsewhere"}}, ["n1"], 3) is None
    assert t.observe_pod(pod("b", "Failed", TAE), 4) is None
    assert t.observe_pod(pod("c", "Failed", TAE), 5) is not None  # same ReplicaSet: a storm
    c = count_window(t.samples(), ["n1"], now=10, window=60)["n1"]
    assert (c.admissions, c.rejected, c.owners) == (1, 1, ("ReplicaSet/ns/web-1",))


def test_tracker_pods_from_before_the_change_are_baseline() -> None:
    from rollout.kube.watching import AdmissionTracker

    t = AdmissionTracker(SINCE)
    assert t.observe_pod(pod("old", "Running", created="2026-11-30T11:59:00Z"), 5) is None
    assert t.samples() == [] and [s.pod_uid for s in t.before()] == ["old"]
    assert t.before()[0].time == SINCE - 60


def test_tracker_event_before_its_pod_in_a_storm_keeps_the_owner() -> None:
    from rollout.kube.watching import AdmissionTracker
    from rollout.samples import count_window

    t = AdmissionTracker(SINCE)
    first = pod("a", "Failed", TAE, rs="web-7f9c")
    first["metadata"]["name"] = "web-7f9c-x1x2x"  # type: ignore[index]
    assert t.observe_pod(first, 2) is not None
    ev = {
        "type": "Warning",
        "reason": TAE,
        "source": {"component": "kubelet", "host": "n1"},
        "involvedObject": {"kind": "Pod", "uid": "b", "namespace": "ns", "name": "web-7f9c-q8w7e"},
        "lastTimestamp": "2026-11-30T12:00:20Z",
    }
    got = t.observe_event(ev, ["n1"], 3)  # its status is not there yet
    assert got is not None and got.owner == "ReplicaSet/ns/web-7f9c"
    other = {**ev, "involvedObject": {**ev["involvedObject"], "uid": "c", "name": "db-0"}}  # type: ignore[dict-item]
    assert t.observe_event(other, ["n1"], 4).owner is None  # type: ignore[union-attr]
    c = count_window(t.samples(), ["n1"], now=10, window=60)["n1"]
    assert (c.admissions, c.rejected, c.owners) == (2, 2, ("ReplicaSet/ns/web-7f9c",))
