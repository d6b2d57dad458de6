"""The gate's pure counting and verdict (rollout.samples, rollout.gate.analysis), table-driven."""

from __future__ import annotations

import pytest

from rollout.change.plan.gate_section import Baseline, GateConfig, OnFailure, parse_gate_config
from rollout.errors import InputError
from rollout.gate.analysis import evaluate
from rollout.samples import (
    AdmissionSample,
    CounterReading,
    NodeCounts,
    count_window,
    counter_delta,
    is_admission_reason,
    reading_delta,
    sum_deltas,
)
from rollout.verdicts import Outcome, SignalState

TAE = "TopologyAffinityError"


def ok(node: str, uid: str, t: float, owner: str | None = None) -> AdmissionSample:
    return AdmissionSample(node, uid, t, None, owner)


def rej(
    node: str, uid: str, t: float, owner: str | None = None, reason: str = TAE
) -> AdmissionSample:
    return AdmissionSample(node, uid, t, reason, owner)


# ---------------------------------------------------------------- counting


def test_storm_from_one_owner_counts_once_per_window() -> None:
    storm = [rej("n1", f"p{i}", 10 + i, owner="ReplicaSet/ns/web-1") for i in range(50)]
    admitted = [ok("n1", f"a{i}", 5 + i) for i in range(10)]
    c = count_window(storm + admitted, ["n1"], now=60, window=60)["n1"]
    assert (c.admissions, c.rejected, c.owners) == (11, 1, ("ReplicaSet/ns/web-1",))


def test_bare_pods_count_by_uid_and_duplicates_once() -> None:
    samples = [
        rej("n1", "p1", 10),
        rej("n1", "p1", 11),
        rej("n1", "p2", 12),
        ok("n1", "a", 3),
        ok("n1", "a", 4),
    ]
    c = count_window(samples, ["n1"], now=20, window=60)["n1"]
    assert (c.admissions, c.rejected) == (3, 2)


@pytest.mark.parametrize(
    ("now", "window", "expected"),
    [(30, 60, 2), (70, 60, 1), (100, 60, 0), (15, 60, 1)],
    ids=["both-in", "first-slid-out", "all-out", "future-excluded"],
)
def test_sliding_window(now: float, window: float, expected: int) -> None:
    samples = [rej("n1", "p1", 10), rej("n1", "p2", 20)]
    assert count_window(samples, ["n1"], now=now, window=window)["n1"].rejected == expected


def test_other_nodes_are_ignored_and_every_node_is_reported() -> None:
    got = count_window([rej("other", "p", 1)], ["n1", "n2"], now=10, window=60)
    assert got == {"n1": NodeCounts(), "n2": NodeCounts()}


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        (TAE, True),
        ("UnexpectedAdmissionError", True),
        ("SMTAlignmentError", True),
        ("OutOfcpu", True),
        ("OutOfnvidia.com/gpu", True),
        ("Evicted", False),
        ("", False),
        (None, False),
    ],
)
def test_admission_reasons(reason: str | None, expected: bool) -> None:
    assert is_admission_reason(reason) is expected


@pytest.mark.parametrize(
    ("prev", "cur", "delta"),
    [(None, 5, 0), (5, 8, 3), (8, 8, 0), (8, 2, 2), (8, 0, 0)],
    ids=["first", "increase", "flat", "reset", "reset-to-zero"],
)
def test_counter_delta(prev: float | None, cur: float, delta: float) -> None:
    assert counter_delta(prev, cur) == delta


def test_reading_delta_by_reason_and_reset() -> None:
    a = CounterReading("n1", 0, requests=10, errors=1, rejections={TAE: 1})
    b = CounterReading("n1", 5, requests=14, errors=3, rejections={TAE: 3, "OutOfcpu": 1})
    assert reading_delta(a, b) == NodeCounts(4, {TAE: 2, "OutOfcpu": 1})
    restarted = CounterReading("n1", 9, requests=2, errors=1, rejections={TAE: 1})
    assert reading_delta(b, restarted) == NodeCounts(2, {TAE: 1})


def test_reading_delta_without_rejections_metric_uses_topology_errors() -> None:
    a = CounterReading("n1", 0, requests=0, errors=0)
    b = CounterReading("n1", 5, requests=4, errors=2)
    assert reading_delta(a, b) == NodeCounts(4, {TAE: 2})


def test_sum_deltas_uses_the_scrape_before_the_window_as_base() -> None:
    rs = [
        CounterReading("n1", 0, 0, 0, {TAE: 0}),
        CounterReading("n1", 50, 10, 0, {TAE: 0}),
        CounterReading("n1", 70, 12, 2, {TAE: 2}),
        CounterReading("n1", 80, 1, 1, {TAE: 1}),  # kubelet restarted
    ]
    got = sum_deltas(rs, ["n1"], now=80, window=60)["n1"]
    assert (got.admissions, got.rejected) == (13, 3)  # 10 + 2 + 1 after the reset


# ---------------------------------------------------------------- config


def test_defaults_and_full_config() -> None:
    assert parse_gate_config(None) == GateConfig()
    cfg = parse_gate_config(
        {
            "window": "2m",
            "soak": "1m30s",
            "interval": 1,
            "threshold": "10%",
            "minAdmissions": 20,
            "baseline": "before",
            "consecutiveErrorLimit": 2,
            "probes": False,
            "prometheus": {"url": "http://127.0.0.1:9090/", "query": "sum by (node) (x)"},
            "onFailure": "rollback-group",
        }
    )
    assert (cfg.window, cfg.soak, cfg.interval, cfg.threshold) == (120, 90, 1, 0.1)
    assert cfg.baseline is Baseline.BEFORE and cfg.on_failure is OnFailure.ROLLBACK_GROUP
    assert cfg.prometheus is not None and cfg.prometheus.url == "http://127.0.0.1:9090"
    assert not cfg.probes and cfg.min_admissions == 20 and cfg.consecutive_error_limit == 2


@pytest.mark.parametrize(
    ("raw", "field", "words"),
    [
        ({"window": "soon"}, "gate.window", "duration"),
        ({"soak": 0}, "gate.soak", "positive"),
        ({"threshold": "120%"}, "gate.threshold", "between 0 and 1"),
        ({"threshold": "lots"}, "gate.threshold", "percentage"),
        ({"minAdmissions": 0}, "gate.minAdmissions", "at least 1"),
        ({"minAdmissions": True}, "gate.minAdmissions", "integer"),
        ({"baseline": "yesterday"}, "gate.baseline", "control-group, before, none"),
        ({"onFailure": "panic"}, "gate.onFailure", "rollback-affected"),
        ({"probes": "yes"}, "gate.probes", "true or false"),
        ({"prometheus": {"url": "ftp://x", "query": "up"}}, "gate.prometheus.url", "http"),
        ({"prometheus": {"url": "http://x", "query": ""}}, "gate.prometheus.query", "PromQL"),
        ({"windw": "1m"}, "gate.windw", "unknown field"),
        ({"interval": "2m", "soak": "1m"}, "gate.interval", "gate.soak"),
    ],
)
def test_bad_config_names_file_field_and_line(
    raw: dict[str, object], field: str, words: str
) -> None:
    lines = {field: 42}
    with pytest.raises(InputError) as e:
        parse_gate_config(raw, file="plan.yaml", line_of=lines.get)
    assert f"plan.yaml:42, field '{field}'" in str(e.value)
    assert words in str(e.value)


# ---------------------------------------------------------------- verdict

CFG = GateConfig(threshold=0.05, min_admissions=4, consecutive_error_limit=3)


def sig(counts: dict[str, NodeCounts], name: str = "api", **kw: object) -> SignalState:
    return SignalState(name, counts, **kw)  # type: ignore[arg-type]


def nc(adm: int, rej: int = 0, owners: tuple[str, ...] = ()) -> NodeCounts:
    return NodeCounts(adm, {TAE: rej} if rej else {}, owners)


@pytest.mark.parametrize(
    ("signals", "outcome", "failed"),
    [
        ([sig({"a": nc(10), "b": nc(10)}, baseline=nc(10))], Outcome.SUCCESSFUL, ()),
        ([sig({"a": nc(10, 3), "b": nc(10)}, baseline=nc(10))], Outcome.FAILED, ("a",)),
        # one early rejection: judged against the minimum (3 per node here) -> 33% > 5%
        ([sig({"a": nc(1, 1), "b": nc(0)})], Outcome.FAILED, ("a",)),
        # the control group rejects as much: not the change's doing
        ([sig({"a": nc(20, 2), "b": nc(20, 2)}, baseline=nc(20, 2))], Outcome.SUCCESSFUL, ()),
        # under the threshold
        ([sig({"a": nc(50, 1), "b": nc(50)})], Outcome.SUCCESSFUL, ()),
        # no traffic: hold, never pass
        ([sig({"a": nc(0), "b": nc(0)})], Outcome.INCONCLUSIVE, ()),
        ([sig({"a": nc(10), "b": nc(0)})], Outcome.INCONCLUSIVE, ()),
        ([sig({"a": nc(1), "b": nc(1)})], Outcome.INCONCLUSIVE, ()),
        # errors below the limit: last good data is used
        (
            [sig({"a": nc(5), "b": nc(5)}, consecutive_errors=2, last_error="timeout")],
            Outcome.SUCCESSFUL,
            (),
        ),
        (
            [sig({"a": nc(5), "b": nc(5)}, consecutive_errors=3, last_error="timeout")],
            Outcome.ERROR,
            (),
        ),
        ([sig({}, has_data=False, last_error="connection refused")], Outcome.ERROR, ()),
        ([], Outcome.ERROR, ()),
        # worst wins across signals: Failed beats Error beats Inconclusive
        ([sig({"a": nc(5), "b": nc(5)}), sig({}, "kubelet", has_data=False)], Outcome.ERROR, ()),
        ([sig({"a": nc(0), "b": nc(0)}), sig({}, "kubelet", has_data=False)], Outcome.ERROR, ()),
        (
            [sig({"a": nc(5), "b": nc(5, 2)}), sig({}, "kubelet", has_data=False)],
            Outcome.FAILED,
            ("b",),
        ),
        (
            [sig({"a": nc(5), "b": nc(5)}), sig({"a": nc(5), "b": nc(0)}, "kubelet")],
            Outcome.INCONCLUSIVE,
            (),
        ),
    ],
    ids=[
        "clean",
        "one-node-fails",
        "early-clear-failure",
        "baseline-explains",
        "under-threshold",
        "no-traffic",
        "idle-node",
        "too-few",
        "errors-below-limit",
        "errors-at-limit",
        "never-read",
        "no-signal",
        "error-beats-success",
        "error-beats-inconclusive",
        "failed-beats-error",
        "inconclusive-beats-success",
    ],
)
def test_verdict_table(
    signals: list[SignalState], outcome: Outcome, failed: tuple[str, ...]
) -> None:
    v = evaluate(CFG, signals, now=100.0)
    assert v.outcome is outcome, v.reason
    assert v.failed_nodes == failed
    assert v.at == 100.0
    assert v.holds is (outcome in (Outcome.INCONCLUSIVE, Outcome.ERROR))
    assert v.reason


def test_failed_node_reason_also_gives_the_group() -> None:
    v = evaluate(GateConfig(threshold=0.05), [sig({"a": nc(10, 3), "b": nc(10)})], now=0)
    assert v.failed_nodes == ("a",)
    assert "3 of 10 admissions rejected (30%) on a" in v.reason
    assert "group: 3 of 20 (15%)" in v.reason


def test_reason_reads_like_a_sentence() -> None:
    counts = {"gpu-07": nc(10, 2, ("ReplicaSet/ml/train-7f",)), "gpu-08": nc(10, 1)}
    v = evaluate(GateConfig(threshold=0.05), [sig(counts, baseline=nc(30))], now=0)
    assert v.reason == (
        "api: 3 of 20 admissions rejected (15%) on gpu-07 and gpu-08 [TopologyAffinityError: 3], "
        "threshold 5%, baseline 0% (0 of 30); owners: ReplicaSet/ml/train-7f"
    )
    assert v.failed_nodes == ("gpu-07", "gpu-08")
    assert v.inputs["signals"]["api"]["nodes"]["gpu-07"]["rejections"] == {TAE: 2}


TRAIN = "ReplicaSet/ml/train-7f"
WEB = "ReplicaSet/ml/web-5c"
EXPECTED = "expected: predicted by the preview"
SURPRISE = "not predicted: investigate"


@pytest.mark.parametrize(
    ("predicted", "owners"),
    [
        # no preview ran (rollout watch): owners listed as before, unmarked
        (None, f"owners: {TRAIN}, {WEB}"),
        # the preview predicted nothing: every rejection is a surprise
        (frozenset(), f"owners: {TRAIN} on gpu-07 ({SURPRISE}), {WEB} on gpu-08 ({SURPRISE})"),
        (
            frozenset({("gpu-07", TRAIN)}),
            f"owners: {TRAIN} on gpu-07 ({EXPECTED}), {WEB} on gpu-08 ({SURPRISE})",
        ),
        # predicted on another node is not this rejection's prediction
        (
            frozenset({("gpu-08", TRAIN), ("gpu-08", WEB)}),
            f"owners: {TRAIN} on gpu-07 ({SURPRISE}), {WEB} on gpu-08 ({EXPECTED})",
        ),
        (
            frozenset({("gpu-07", TRAIN), ("gpu-08", WEB)}),
            f"owners: {TRAIN} on gpu-07 ({EXPECTED}), {WEB} on gpu-08 ({EXPECTED})",
        ),
    ],
    ids=["no-preview", "nothing-predicted", "one-expected", "other-node", "all-expected"],
)
def test_failed_reason_marks_each_owner_predicted_or_not(
    predicted: frozenset[tuple[str, str]] | None, owners: str
) -> None:
    counts = {"gpu-07": nc(10, 2, (TRAIN,)), "gpu-08": nc(10, 1, (WEB,))}
    v = evaluate(
        GateConfig(threshold=0.05), [sig(counts, baseline=nc(30))], now=0, predicted=predicted
    )
    assert v.outcome is Outcome.FAILED
    assert v.reason == (
        "api: 3 of 20 admissions rejected (15%) on gpu-07 and gpu-08 [TopologyAffinityError: 3], "
        f"threshold 5%, baseline 0% (0 of 30); {owners}"
    )


def test_rejections_only_signal_marks_owners_too() -> None:
    counts = {"gpu-07": nc(0, 1, (TRAIN,))}
    v = evaluate(
        GateConfig(threshold=0.05),
        [sig(counts, "prometheus", rejections_only=True)],
        now=0,
        predicted=frozenset({("gpu-07", TRAIN)}),
    )
    assert v.reason.endswith(f"baseline 0; owners: {TRAIN} on gpu-07 ({EXPECTED})")


def test_successful_reason_is_not_marked() -> None:
    counts = {"a": nc(50, 1, (TRAIN,)), "b": nc(50)}
    v = evaluate(GateConfig(threshold=0.05), [sig(counts)], now=0, predicted=frozenset())
    assert v.outcome is Outcome.SUCCESSFUL and "predicted" not in v.reason


def test_hold_says_what_it_waits_for() -> None:
    v = evaluate(GateConfig(min_admissions=5), [sig({"a": nc(2)})], now=0)
    assert v.outcome is Outcome.INCONCLUSIVE
    assert "2 admissions in the last 60s, at least 5 needed" in v.reason
    assert "probe pods are on" in v.waiting_for
    v = evaluate(
        GateConfig(), [sig({}, "kubelet", has_data=False, last_error="403 Forbidden")], now=0
    )
    assert v.outcome is Outcome.ERROR and "403 Forbidden" in v.reason and "kubelet" in v.waiting_for


def test_rejections_only_signal_fails_on_any_rejection_and_never_holds() -> None:
    quiet = sig({"a": NodeCounts(), "b": NodeCounts()}, "prometheus", rejections_only=True)
    assert evaluate(CFG, [quiet], now=0).outcome is Outcome.SUCCESSFUL
    loud = sig(
        {"a": NodeCounts(0, {TAE: 2}), "b": NodeCounts()}, "prometheus", rejections_only=True
    )
    v = evaluate(CFG, [loud, sig({"a": nc(5), "b": nc(5)})], now=0)
    assert v.outcome is Outcome.FAILED and v.failed_nodes == ("a",)
    assert "prometheus: 2 admissions rejected on a [TopologyAffinityError: 2]" in v.reason


# ------------------------------------------------------- the soak loop (rollout.gate.soaking)


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class ScriptedSignal:
    """A signal whose counts are a function of the time since the soak started."""

    name = "api"

    def __init__(self, counts_at: object) -> None:
        self.counts_at = counts_at
        self.started: tuple[object, ...] = ()
        self.stopped = False
        self.t0: float | None = None

    def start(self, nodes: object, control: object = ()) -> None:
        self.started = (nodes, control)

    def state(self, now: float, baseline_before: bool = False) -> SignalState:
        self.t0 = now if self.t0 is None else self.t0
        return SignalState(self.name, self.counts_at(now - self.t0), nc(20))  # type: ignore[operator]

    def stop(self) -> None:
        self.stopped = True

    def wake(self) -> None:
        pass


class FakeProbes:
    def __init__(self) -> None:
        self.launched: list[tuple[str, tuple[str, ...], int]] = []
        self.cleaned = False

    def launch(self, change_id: str, nodes: object, per_node: int) -> list[str]:
        self.launched.append((change_id, tuple(nodes), per_node))  # type: ignore[arg-type]
        return ["probe-a-0", "probe-b-0"]

    def cleanup(self) -> None:
        self.cleaned = True


def run_gate(counts_at: object, **cfg: object) -> tuple[object, ...]:
    from rollout.gate.soaking import SoakGate

    clock = FakeClock()
    sig_ = ScriptedSignal(counts_at)
    probes = FakeProbes()
    events: list[tuple[str, str, bool]] = []
    records: list[tuple[str, dict[str, object]]] = []

    class Events:
        def post(self, node: str, reason: str, message: str, warning: bool, now: object) -> None:
            events.append((node, reason, warning))

    gate = SoakGate(
        GateConfig(**{"soak": 60.0, "interval": 2.0, "min_admissions": 4, **cfg}),  # type: ignore[arg-type]
        [sig_],
        clock=clock,
        sleep=clock.sleep,
        control=("c",),
        probes=probes,
        events=Events(),
        record=lambda kind, data: records.append((kind, dict(data))),
    )
    v = gate.evaluate("chg-1", ["a", "b"])
    return v, clock.t - 1000.0, sig_, probes, events, records


def test_soak_fails_early_and_records_everything() -> None:
    v, elapsed, s, probes, events, records = run_gate(
        lambda dt: {"a": nc(5, 2 if dt >= 6 else 0), "b": nc(5)}
    )
    assert v.status is Outcome.FAILED and v.failed_nodes == ("a",)  # type: ignore[attr-defined]
    assert elapsed == 6.0  # detected at the first evaluation after the rejections, not at 60s
    assert s.started == (["a", "b"], ("c",)) and s.stopped  # type: ignore[attr-defined]
    assert events == [("a", "RolloutGateFailed", True), ("b", "RolloutGateFailed", False)]
    assert records[0][0] == "verdict" and records[0][1]["outcome"] == "Failed"
    assert records[0][1]["inputs"]["control"] == ["c"]
    assert probes.launched == []  # type: ignore[attr-defined]


def test_soak_passes_only_at_the_end() -> None:
    v, elapsed, *_ = run_gate(lambda dt: {"a": nc(5), "b": nc(5)})
    assert v.status is Outcome.SUCCESSFUL and elapsed == 60.0  # type: ignore[attr-defined]


def test_no_traffic_launches_probes_which_turn_it_into_a_verdict() -> None:
    v, _, _, probes, _, _ = run_gate(
        lambda dt: {"a": nc(2 if dt > 2 else 0), "b": nc(2 if dt > 2 else 0)}
    )
    assert probes.launched == [("chg-1", ("a", "b"), 2)] and probes.cleaned  # type: ignore[attr-defined]
    assert v.status is Outcome.SUCCESSFUL  # type: ignore[attr-defined]
    assert v.inputs["probes"] == ["probe-a-0", "probe-b-0"]  # type: ignore[attr-defined]


def test_no_traffic_without_probes_holds() -> None:
    v, elapsed, _, probes, events, _ = run_gate(lambda dt: {"a": nc(0), "b": nc(0)}, probes=False)
    assert v.status is Outcome.INCONCLUSIVE and elapsed == 60.0  # type: ignore[attr-defined]
    assert probes.launched == []  # type: ignore[attr-defined]
    assert {e[1] for e in events} == {"RolloutGateInconclusive"}  # type: ignore[attr-defined]


@pytest.mark.parametrize(
    ("policy", "expected"), [("rollback-affected", ["a"]), ("rollback-group", ["a", "b"])]
)
def test_rollback_targets_follow_the_policy(policy: str, expected: list[str]) -> None:
    from rollout.gate.soaking import rollback_targets

    cfg = parse_gate_config({"onFailure": policy})
    v = evaluate(cfg, [sig({"a": nc(5, 3), "b": nc(5)})], now=0)
    assert rollback_targets(v, cfg, ["a", "b"]) == expected
    assert rollback_targets(evaluate(cfg, [sig({"a": nc(5), "b": nc(5)})], 0), cfg, ["a"]) == []


class LateSignal:
    """A signal with no good read until ``first_at`` seconds into the soak (``error``: the
    failure its reads give until then; None: none failed, the first read is just not in)."""

    name = "api"

    def __init__(self, first_at: float, error: str | None = None) -> None:
        self.first_at, self.error = first_at, error
        self.t0: float | None = None

    def start(self, nodes: object, control: object = ()) -> None:
        pass

    def state(self, now: float, baseline_before: bool = False) -> SignalState:
        self.t0 = now if self.t0 is None else self.t0
        if now - self.t0 < self.first_at:
            errors = 1 if self.error else 0
            return SignalState(self.name, {}, None, errors, self.error, has_data=False)
        return SignalState(self.name, {"a": nc(5)}, nc(20))

    def stop(self) -> None:
        pass


def soak_lines(signal: LateSignal) -> tuple[Outcome, list[str]]:
    from rollout.gate.soaking import SoakGate

    clock, lines = FakeClock(), []
    cfg = GateConfig(soak=60.0, interval=2.0, min_admissions=4)
    gate = SoakGate(cfg, [signal], clock=clock, sleep=clock.sleep, progress=lines.append)
    return gate.evaluate("chg-1", ["a"]).status, lines


def test_the_soak_says_it_waits_for_the_first_samples_not_error() -> None:
    status, lines = soak_lines(LateSignal(first_at=4))
    assert lines[0] == "waiting for the first samples from api (soak: 60s left)"
    assert not any("Error" in line for line in lines), lines
    assert lines[-1].startswith("Successful: ") and status is Outcome.SUCCESSFUL


def test_a_soak_that_never_gets_data_still_ends_in_error() -> None:
    status, lines = soak_lines(LateSignal(first_at=999))
    assert status is Outcome.ERROR  # the verdict is unchanged; only the progress line waits
    assert lines == ["waiting for the first samples from api (soak: 60s left)"]


def test_a_failed_read_before_the_first_samples_is_shown_as_the_error() -> None:
    status, lines = soak_lines(LateSignal(first_at=999, error="connection refused"))
    assert status is Outcome.ERROR
    assert lines == ["Error: api: no data yet (connection refused) (soak: 60s left)"]
