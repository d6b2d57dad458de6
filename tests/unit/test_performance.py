"""The plan's ``gate.bench``: its parsing, and the two pure verdicts over bench records
(:mod:`rollout.gate.performance`): a regression after the change against before, and whether
aligned placement beats the mismatched run by the plan's margin (tightening allowed)."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.change.plan.gate_section import BenchPolicy, parse_bench_policy, parse_gate_config
from rollout.errors import InputError
from rollout.gate.performance import decision_record, judge_regression, judge_tightening
from rollout.verdicts import Outcome

POLICY = BenchPolicy(command="./bench.sh", max_p99_regression=0.1, max_bandwidth_regression=0.1)


def rec(
    local: tuple[float, float],
    remote: tuple[float, float] = (10.0, 20.0),
    *,
    status: str = "pass",
    simulated: bool = False,
    model: str = "NVIDIA-H100",
) -> dict[str, Any]:
    """A bench record: (p99 ms, bandwidth GB/s) of the local and the remote run."""

    def run(p99: float, bw: float) -> dict[str, Any]:
        return {"p50Ms": p99 / 2, "p99Ms": p99, "h2dGbps": bw, "loadS": 1.0}

    return {
        "status": status,
        "problems": [] if status == "pass" else ["allowed CPUs 3 are not within NUMA node 0's 0"],
        "simulated": simulated,
        "simulatedWhy": ["the CPU stand-in ran, not a GPU benchmark"] if simulated else [],
        "models": [{"gpuModel": model, "local": run(*local), "remote": run(*remote)}],
    }


@pytest.mark.parametrize(
    ("after", "outcome", "words"),
    [
        (rec((10.0, 25.0)), Outcome.SUCCESSFUL, "P99 10 -> 10 ms (+0.0%"),
        (rec((10.9, 25.0)), Outcome.SUCCESSFUL, "+9.0%"),  # within the 10% limit
        (rec((11.5, 25.0)), Outcome.FAILED, "P99 10 -> 11.5 ms (+15.0%, limit +10%)"),
        (rec((10.0, 22.0)), Outcome.FAILED, "bandwidth 25 -> 22 GB/s (-12.0%, limit -10%)"),
        (rec((9.0, 30.0)), Outcome.SUCCESSFUL, "-10.0%"),  # faster is no regression
        ("ssh: unreachable", Outcome.ERROR, "after bench failed: ssh: unreachable"),
        (rec((10.0, 25.0), status="fail"), Outcome.INCONCLUSIVE, "did not hold its binding"),
        (rec((10.0, 25.0), simulated=True), Outcome.INCONCLUSIVE, "acceptSimulated"),
        (rec((10.0, 25.0), model="NVIDIA-A100"), Outcome.INCONCLUSIVE, "no before run"),
    ],
)
def test_regression_after_against_before(after: Any, outcome: Outcome, words: str) -> None:
    v = judge_regression(POLICY, {"gpu-1": rec((10.0, 25.0))}, {"gpu-1": after}, ["gpu-1"])
    assert v.status is outcome, v.reason
    assert words in v.reason
    assert v.failed_nodes == (("gpu-1",) if outcome is Outcome.FAILED else ())
    assert bool(v.waiting_for) == v.holds  # a hold says what it waits for


def test_the_worst_node_decides_and_a_missing_node_is_an_error() -> None:
    before = {"a": rec((10.0, 25.0)), "b": rec((10.0, 25.0))}
    v = judge_regression(
        POLICY, before, {"a": rec((10.0, 25.0)), "b": rec((20.0, 25.0))}, ["a", "b"]
    )
    assert v.status is Outcome.FAILED and v.failed_nodes == ("b",) and "b, NVIDIA-H100" in v.reason
    v = judge_regression(POLICY, before, {"a": rec((10.0, 25.0))}, ["a", "b"])
    assert v.status is Outcome.ERROR and "b: no after bench" in v.reason
    v = judge_regression(POLICY, {}, {}, [])
    assert v.status is Outcome.ERROR  # nothing benched never passes


def test_simulated_numbers_decide_only_when_the_plan_accepts_them() -> None:
    lab = BenchPolicy(standin=True, accept_simulated=True, max_p99_regression=0.1)
    before, after = rec((10.0, 25.0), simulated=True), rec((12.0, 25.0), simulated=True)
    assert judge_regression(lab, {"n": before}, {"n": after}, ["n"]).status is Outcome.FAILED
    assert judge_regression(POLICY, {"n": before}, {"n": after}, ["n"]).holds


@pytest.mark.parametrize(
    ("local", "remote", "outcome", "words"),
    [
        ((8.0, 24.0), (10.0, 20.0), Outcome.SUCCESSFUL, "aligned P99 8 ms vs mismatched 10 ms"),
        ((10.0, 20.0), (10.0, 20.0), Outcome.FAILED, "no aligned advantage"),
        ((9.8, 24.0), (10.0, 20.0), Outcome.FAILED, "no aligned advantage"),  # P99 -2% < 5%
        ((8.0, 20.5), (10.0, 20.0), Outcome.FAILED, "no aligned advantage"),  # bandwidth +2.5%
        ((8.0, 24.0), (0.0, 20.0), Outcome.INCONCLUSIVE, "nothing to compare with"),
    ],
)
def test_tightening_needs_aligned_to_beat_mismatched_by_the_margin(
    local: tuple[float, float], remote: tuple[float, float], outcome: Outcome, words: str
) -> None:
    policy = BenchPolicy(command="x", aligned_margin=0.05)
    v = judge_tightening(policy, {"n": rec(local, remote)}, ["n"])
    assert v.status is outcome, v.reason
    assert words in v.reason


def test_tightening_holds_on_data_that_cannot_decide() -> None:
    for after in ("timed out", rec((1.0, 99.0), status="fail"), rec((1.0, 99.0), simulated=True)):
        v = judge_tightening(POLICY, {"n": after}, ["n"])
        assert v.holds and v.status is not Outcome.SUCCESSFUL, v.reason


def test_the_decision_record_says_whether_the_next_stage_may_tighten() -> None:
    before, after = {"n": rec((10.0, 25.0))}, {"n": rec((8.0, 25.0), remote=(10.0, 20.0))}
    reg = judge_regression(POLICY, before, after, ["n"])
    tight = judge_tightening(POLICY, after, ["n"])
    doc = decision_record(POLICY, reg, tight, ["n"])
    assert doc["allowsTightening"] is True and doc["regression"]["outcome"] == "Successful"
    assert doc["policy"]["maxP99Regression"] == 0.1 and doc["nodes"] == ["n"]


def test_gate_bench_parses_with_defaults_and_names_bad_fields() -> None:
    cfg = parse_gate_config({"bench": {"standin": True, "maxP99Regression": "250%"}})
    assert cfg.bench == BenchPolicy(standin=True, max_p99_regression=2.5)
    assert cfg.bench.aligned_margin == 0.05 and cfg.bench.timeout_s == 600.0
    assert parse_gate_config({}).bench is None
    p = parse_bench_policy({"command": " ./b.sh ", "env": {"N": 3}, "timeout": "90s"})
    assert (p.command, dict(p.env), p.timeout_s) == ("./b.sh", {"N": "3"}, 90.0)
    for raw, field in [
        ({}, "gate.bench.command"),
        ({"command": "x", "standin": True}, "gate.bench.command"),
        ({"command": "x", "maxP99Regression": "-5%"}, "gate.bench.maxP99Regression"),
        ({"command": "x", "maxBandwidthRegression": "100%"}, "gate.bench.maxBandwidthRegression"),
        ({"command": "x", "alignedMargin": "lots"}, "gate.bench.alignedMargin"),
        ({"command": "x", "mechanism": "taskset"}, "gate.bench.mechanism"),
        ({"command": "x", "timeout": "soon"}, "gate.bench.timeout"),
        ({"command": "x", "acceptSimulated": "yes"}, "gate.bench.acceptSimulated"),
        ({"command": "x", "p99": 1}, "gate.bench.p99"),
        ("./bench.sh", "gate.bench"),
    ]:
        with pytest.raises(InputError) as e:
            parse_gate_config({"bench": raw}, file="plan.yaml", line_of=lambda f: 7)
        assert e.value.location is not None and e.value.location.field == field, raw
        assert e.value.location.file == "plan.yaml" and e.value.location.line == 7


def pod_rec(p99: float, bw: float, model: str = "NVIDIA-H100") -> dict[str, Any]:
    """A pod-mode bench record: one ``placed`` run per GPU model."""
    run = {"p50Ms": p99 / 2, "p99Ms": p99, "h2dGbps": bw, "loadS": 1.0, "cpus": "4-5"}
    return {
        "status": "pass",
        "problems": [],
        "simulated": False,
        "mode": "pod",
        "models": [{"gpuModel": model, "placed": run}],
    }


def test_pod_mode_regression_compares_the_placed_runs_and_never_allows_tightening() -> None:
    before = {"n": pod_rec(10.0, 25.0)}
    ok = judge_regression(POLICY, before, {"n": pod_rec(10.5, 25.0)}, ["n"])
    assert ok.status is Outcome.SUCCESSFUL, ok.reason
    bad = judge_regression(POLICY, before, {"n": pod_rec(12.0, 25.0)}, ["n"])
    assert bad.status is Outcome.FAILED and "P99 10 -> 12 ms (+20.0%, limit +10%)" in bad.reason
    assert bad.failed_nodes == ("n",)
    tight = judge_tightening(POLICY, {"n": pod_rec(10.0, 25.0)}, ["n"])
    assert tight.status is Outcome.INCONCLUSIVE  # no mismatched run: it holds, never passes
    assert "deliberately mismatched run (mode: host)" in tight.reason


def test_gate_bench_mode_pod_parses_its_pod_and_names_bad_fields() -> None:
    p = parse_bench_policy({"command": "./b.sh", "mode": "pod", "pod": {"image": "r/b:1"}})
    assert p.mode == "pod" and p.pod is not None
    assert (p.pod.image, p.pod.cpus, p.pod.memory, p.pod.gpu_resource, p.pod.namespace) == (
        "r/b:1",
        2,
        "1Gi",
        "nvidia.com/gpu",
        "rollout-probes",
    )
    assert p.as_dict()["mode"] == "pod" and p.as_dict()["pod"]["image"] == "r/b:1"
    assert parse_bench_policy({"command": "./b.sh"}).mode == "host"  # the default
    pod = {"image": "r/b:1"}

    def in_pod(**kw: Any) -> dict[str, Any]:
        return {"command": "x", "mode": "pod", "pod": {**pod, **kw}}

    for raw, field in [
        ({"command": "x", "mode": "vm"}, "gate.bench.mode"),
        ({"command": "x", "mode": "pod"}, "gate.bench.pod"),
        ({"command": "x", "mode": "pod", "pod": {}}, "gate.bench.pod.image"),
        (in_pod(cpus=1.5), "gate.bench.pod.cpus"),
        (in_pod(cpus=0), "gate.bench.pod.cpus"),
        (in_pod(memory="a lot"), "gate.bench.pod.memory"),
        (in_pod(gpuResource="gpu"), "gate.bench.pod.gpuResource"),
        (in_pod(annotations={"a": 1}), "gate.bench.pod.annotations"),
        (in_pod(size=1), "gate.bench.pod.size"),
        ({"command": "x", "pod": pod}, "gate.bench.pod"),  # host mode reads no pod
        ({"standin": True, "mode": "pod", "pod": pod}, "gate.bench.standin"),
    ]:
        with pytest.raises(InputError) as e:
            parse_gate_config({"bench": raw}, file="plan.yaml", line_of=lambda f: 7)
        assert e.value.location is not None and e.value.location.field == field, raw
