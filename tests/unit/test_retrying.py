"""The one retry helper (``rollout.retrying``) and each policy its callers keep: the waits, the
deadline, the attempts, what is retried and what is raised on giving up. A fake clock; runtime:
well under 1 s.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.change.engine import drain
from rollout.change.kinds import allocation_path
from rollout.errors import ExternalError, NodeOperationError
from rollout.kube import client, watching
from rollout.kube.rest import AnswerError
from rollout.retrying import Backoff, Poll, retry, wait_until
from tests.unit.fakes_change import RecordingClock


class Flaky:
    """Fails with ``errors`` in turn, then answers ``"ok"``; counts the calls."""

    def __init__(self, *errors: Exception) -> None:
        self.errors = list(errors)
        self.calls = 0

    def __call__(self) -> str:
        self.calls += 1
        if self.errors:
            raise self.errors.pop(0)
        return "ok"


def _any(e: Exception) -> bool:
    return True


def test_backoff_is_exponential_and_capped() -> None:
    # planning.backoff_delay's table (the drain's 429 waits), now Backoff's
    assert [Backoff(0.5, 3).delay(i) for i in range(5)] == [0.5, 1, 2, 3, 3]
    assert Backoff(0.5, 3).delay(-1) == 0.5
    assert [Backoff(1, 100, factor=3).delay(i) for i in range(3)] == [1, 3, 9]


def test_the_callers_backoffs_are_the_doubling_they_replaced() -> None:
    def doubling(first: float, cap: float, n: int) -> list[float]:
        out, d = [], first
        for _ in range(n):
            out.append(d)
            d = min(d * 2, cap)
        return out

    # client.call: 0.2 s doubling, 2 s cap; a watch: 0.2 s doubling, 5 s cap; the drain's looks
    # at evicted pods: 0.05 s doubling, 0.25 s cap (bit-for-bit: doubling a float is exact)
    assert [client.BACKOFF.delay(i) for i in range(8)] == doubling(0.2, 2.0, 8)
    assert [watching.BACKOFF.delay(i) for i in range(8)] == doubling(0.2, 5.0, 8)
    assert [drain._LOOKS.delay(i) for i in range(6)] == doubling(0.05, 0.25, 6)


def test_poll_is_fast_then_slow() -> None:
    p = Poll(0.25, 10.0, 1.0)
    assert [p.interval(t) for t in (0, 9.99, 10.0, 30)] == [0.25, 0.25, 1.0, 1.0]
    assert Poll.every(2.0).interval(0) == Poll.every(2.0).interval(100) == 2.0


def test_retry_returns_the_first_answer_and_waits_the_backoff_between_tries() -> None:
    clock, fn = RecordingClock(), Flaky(OSError("a"), OSError("b"), OSError("c"))
    got = retry(fn, _any, backoff=Backoff(1, 3), sleep=clock.sleep, monotonic=clock.monotonic)
    assert got == "ok" and fn.calls == 4 and clock.slept == [1, 2, 3]


def test_retry_raises_a_failure_it_does_not_retry_at_once() -> None:
    clock, fn = RecordingClock(), Flaky(KeyError("k"), OSError("never reached"))
    with pytest.raises(KeyError):
        retry(fn, lambda e: isinstance(e, OSError), backoff=Backoff(1, 3), sleep=clock.sleep)
    assert fn.calls == 1 and clock.slept == []


def test_retry_gives_up_after_the_attempts_with_the_last_failure_or_give_ups() -> None:
    fn = Flaky(*(OSError(str(i)) for i in range(5)))
    with pytest.raises(OSError, match="2"):
        retry(fn, _any, attempts=3)  # no backoff: tried again at once
    assert fn.calls == 3

    fn = Flaky(*(OSError(str(i)) for i in range(5)))
    with pytest.raises(ExternalError, match="gave up on 1") as e:
        retry(fn, _any, attempts=2, give_up=lambda e: ExternalError(f"gave up on {e}"))
    assert isinstance(e.value.__cause__, OSError) and fn.calls == 2


def test_retry_gives_up_on_a_failure_at_or_after_the_deadline() -> None:
    clock = RecordingClock()
    fn = Flaky(*(OSError(str(i)) for i in range(10)))
    with pytest.raises(OSError, match="3"):
        retry(
            fn,
            _any,
            backoff=Backoff(1, 2),
            within_s=5,
            sleep=clock.sleep,
            monotonic=clock.monotonic,
        )
    # failures at t=0, 1, 3 are retried (waits 1, 2, 2); the one at t=5 is the deadline's
    assert clock.slept == [1, 2, 2] and fn.calls == 4

    fn = Flaky(OSError("x"), OSError("y"))
    with pytest.raises(OSError, match="x"):
        retry(fn, _any, backoff=Backoff(1, 2), within_s=0, sleep=clock.sleep)
    assert fn.calls == 1


def test_wait_until_asks_until_done_or_the_timeout() -> None:
    clock = RecordingClock()
    answers = iter([False, False, True])
    assert wait_until(lambda: next(answers), 10, Poll.every(2), clock.sleep, clock.monotonic)
    assert clock.slept == [2, 2]

    clock = RecordingClock()
    asked: list[float] = []

    def never() -> bool:
        asked.append(clock.t)
        return False

    assert not wait_until(never, 3, Poll(0.5, 1.0, 2.0), clock.sleep, clock.monotonic)
    # fast for the first second, then slow; asked once more after the last sleep
    assert clock.slept == [0.5, 0.5, 2.0] and asked == [0, 0.5, 1.0, 3.0]

    clock = RecordingClock()
    clock.t = 7.0
    assert not wait_until(never, 3, Poll.every(1), clock.sleep, clock.monotonic, start=4.0)
    assert clock.slept == []


# --- the callers' policies, through the helper ------------------------------------------------


def _answer(status: int) -> AnswerError:
    return AnswerError(status, "Service Unavailable" if status == 503 else "Conflict")


def test_call_retries_5xx_and_connection_errors_then_names_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = RecordingClock()
    monkeypatch.setattr(client.time, "monotonic", clock.monotonic)
    fn = Flaky(_answer(503), ConnectionResetError("reset"))
    assert client.call("read node n", lambda **_: fn(), sleep=clock.sleep) == "ok"
    assert clock.slept == [0.2, 0.4]

    fn = Flaky(*(_answer(503) for _ in range(100)))
    with pytest.raises(ExternalError, match="read node n: API server unavailable: 503") as e:
        client.call("read node n", lambda **_: fn(), retry_s=3.0, sleep=clock.sleep)
    assert isinstance(e.value.__cause__, AnswerError)
    assert clock.slept[2:] == [0.2, 0.4, 0.8, 1.6]  # 3.0 s spent at the fifth failure


def test_call_hands_a_4xx_to_the_caller_untried_and_sets_the_request_timeout() -> None:
    seen: dict[str, Any] = {}

    def fn(**kw: Any) -> str:
        seen.update(kw)
        raise _answer(409)

    with pytest.raises(AnswerError) as e:
        client.call("label node n", fn, sleep=lambda s: pytest.fail("slept"))
    assert e.value.status == 409 and seen == {"_request_timeout": client.REQUEST_TIMEOUT_S}


def test_allocation_path_waits_fast_for_ten_seconds_then_every_poll() -> None:
    clock = RecordingClock()
    with pytest.raises(NodeOperationError) as e:
        allocation_path._wait(clock, 12, "node n: republish", lambda: "2 devices", poll_s=1)  # type: ignore[arg-type]
    assert str(e.value) == "node n: republish: still 2 devices after 12s"
    assert clock.slept == [0.25] * 40 + [1.0, 1.0]

    clock, left = RecordingClock(), iter(["1 device", None])
    allocation_path._wait(clock, 12, "x", lambda: next(left))  # type: ignore[arg-type]
    assert clock.slept == [0.25]


# --- the fixed polls moved onto the helper (issue 38): each one's cadence and bound ------------


class Pods:
    """The pods' side of a wait: each named state in turn, then the last one for ever."""

    def __init__(self, *states: Any) -> None:
        self.states = list(states)
        self.asked = 0

    def next(self) -> Any:
        self.asked += 1
        return self.states.pop(0) if len(self.states) > 1 else self.states[0]


def test_the_lease_owner_retries_a_failed_renewal_every_second_and_loses_it_after_its_duration(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The API server away: the watch is tried again every 0.5 s, the renewal (due at a third
    of the duration) every second; the Lease is lost at the first failure past the duration."""
    from rollout.kube import leases

    clock = RecordingClock()
    lock = leases.LeaseLock(object(), duration_s=15, monotonic=clock.monotonic)  # type: ignore[arg-type]
    lock.change_id, lock._lease, lock._wait = "c", {}, clock.sleep
    renewals: list[float] = []

    def watch(*a: Any) -> Any:
        raise ConnectionRefusedError("away")

    def write(*a: Any, **kw: Any) -> Any:
        renewals.append(clock.t)
        raise ConnectionRefusedError("away")

    monkeypatch.setattr(leases, "watch_lease", watch)
    monkeypatch.setattr(leases, "write_lease", write)
    lock._run()
    assert renewals == [5.0 + i for i in range(12)]  # 5, 6, ..., 16
    assert set(clock.slept) == {0.5} and clock.t == 16.0
    assert lock.lost is not None and "could not renew the Lease for 15s" in lock.lost
    reason = lock.interrupt.reason()
    assert reason is not None and reason.lost


def test_the_lease_owner_renews_every_third_of_the_duration_watching_in_between(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollout.kube import leases

    clock = RecordingClock()
    lock = leases.LeaseLock(object(), duration_s=15, monotonic=clock.monotonic)  # type: ignore[arg-type]
    lock.change_id, lock._wait = "c", clock.sleep
    lock._lease = lock._body("c", datetime.now(UTC), None)
    watched: list[tuple[float, float]] = []
    renewals: list[float] = []

    def watch(api: Any, ns: str, rv: str, left: float, stop: Any) -> Any:
        watched.append((clock.t, left))
        clock.t += left  # the watch ends at its timeout: nothing happened
        return iter(())

    def write(api: Any, ns: str, body: dict[str, Any], create: bool) -> Any:
        renewals.append(clock.t)
        if len(renewals) == 3:
            lock._stop.set()
        return body

    monkeypatch.setattr(leases, "watch_lease", watch)
    monkeypatch.setattr(leases, "write_lease", write)
    lock._run()
    assert renewals == [5.0, 10.0, 15.0] and clock.slept == []
    assert watched == [(0.0, 5.0), (5.0, 5.0), (10.0, 5.0)] and lock.lost is None


def test_the_recreation_looks_every_half_second_until_its_timeout(tmp_path: Path) -> None:
    from rollout.change.commands.recreate_workloads import RecreatedWorkloads
    from rollout.change.plan.drain_rules import DrainPolicy
    from rollout.change.record.journal import Journal
    from rollout.models import Phase, Step

    clock = RecordingClock()
    clock.now = lambda: datetime(2026, 1, 1, tzinfo=UTC)  # type: ignore[attr-defined]
    pending = {"metadata": {"namespace": "ml", "name": "p"}, "status": {"phase": "Pending"}}
    looks = Pods([pending])

    class Workloads:
        def pending(self, ns: str) -> Any:
            return looks.next()

        def of_owner(self, owner: str) -> Any:
            return looks.next()

    said: list[str] = []
    rw = RecreatedWorkloads(object(), Workloads(), DrainPolicy(), clock, said.append, timeout=30)  # type: ignore[arg-type]

    drained = Journal.create(tmp_path, "20260101T000000Z-aaaaaa")
    drained.append(Step.DRAIN, Phase.DONE, now=clock.now(), node="n1", data={"evicted": ["ml/p"]})
    rw._settle(drained, "n1")
    assert clock.slept == [0.5] * 60 and looks.asked == 61
    assert said[-1].startswith("warning: n1: still Pending after 30s: ml/p")
    assert [m for m in said if "waiting for the drained pods" in m] == [
        f"n1: waiting for the drained pods to come back before recreating: 1 Pending ({s}s left)"
        for s in (20, 10)
    ]

    clock, looks = RecordingClock(), Pods([])
    rw.clock = clock  # type: ignore[assignment]
    with pytest.raises(
        ExternalError, match=r"0 of 1 replacement\(s\) of RS/ml/w Running after 30s"
    ):
        rw._replacements("n1", "RS/ml/w", set(), 1)
    assert clock.slept == [0.5] * 60 and looks.asked == 61


def test_the_device_probes_are_looked_at_every_half_second_until_their_timeout() -> None:
    from rollout.evidence.recreating import RecreatedProbes

    clock = RecordingClock()
    rp = RecreatedProbes.__new__(RecreatedProbes)
    rp.timeout, rp.clock, rp.sleep = 20.0, clock.monotonic, clock.sleep
    states = Pods(*([{"phase": "Pending"}] * 3), {"phase": "Running"})

    class Probes:
        def state(self, name: str) -> Any:
            return states.next()

    rp.pods = Probes()  # type: ignore[assignment]
    rp._wait(["p"], "running")
    assert clock.slept == [0.5] * 3 and states.asked == 4
    states = Pods({"phase": "Pending"})
    with pytest.raises(ExternalError, match=r"probe\(s\) p not running after 20s"):
        rp._wait(["p"], "running")
    assert clock.slept[3:] == [0.5] * 40


def test_the_bench_pod_is_looked_at_every_second_for_its_timeout_and_two_minutes() -> None:
    from rollout.bench import in_pod

    class BenchPods:
        def __init__(self, *states: Any) -> None:
            self.states = Pods(*states)

        def status(self, name: str) -> Any:
            return self.states.next()

        def log(self, name: str, container: str) -> str:
            return f"{in_pod.EXIT_MARK}0\n"

    clock = RecordingClock()
    pods = BenchPods({"phase": "Pending"}, {"phase": "Pending"}, {"phase": "Running"})
    got = in_pod._await_log(pods, "b", "n1", 60, clock.sleep, clock.monotonic)  # type: ignore[arg-type]
    assert got == f"{in_pod.EXIT_MARK}0\n" and clock.slept == [1.0, 1.0]
    clock, pods = RecordingClock(), BenchPods({"phase": "Pending"})
    with pytest.raises(ExternalError, match="no result within 180s"):
        in_pod._await_log(pods, "b", "n1", 60, clock.sleep, clock.monotonic)  # type: ignore[arg-type]
    assert clock.slept == [1.0] * 180


def test_the_drift_loop_runs_a_round_every_interval_and_survives_a_failed_one(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from rollout.fleet import survey
    from rollout.gate.trigger import drift_loop

    results: list[Any] = [ExternalError("API server away"), ["r2"], ["r3"]]

    def surveyed(api: Any, ns: str) -> Any:
        r = results.pop(0)
        if isinstance(r, Exception):
            raise r
        return r

    class Metrics:
        def __init__(self) -> None:
            self.drift: list[Any] = []

        def set_drift(self, reports: Any, at: float) -> None:
            self.drift.append(reports)

    monkeypatch.setattr(survey, "survey", surveyed)
    clock, said, metrics = RecordingClock(), [], Metrics()
    drift_loop(lambda: None, "ns", metrics, 300.0, said.append, clock.sleep, rounds=3)
    assert clock.slept == [300.0, 300.0] and metrics.drift == [["r2"], ["r3"]]
    assert said == ["rollout serve: drift check failed: API server away"]
