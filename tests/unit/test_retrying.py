"""The one retry helper (``rollout.retrying``) and each policy its callers keep: the waits, the
deadline, the attempts, what is retried and what is raised on giving up. A fake clock; runtime:
well under 1 s.
"""

from __future__ import annotations

from typing import Any

import pytest

from rollout.change.engine import drain
from rollout.change.kinds import allocation_path
from rollout.errors import ExternalError, NodeOperationError
from rollout.kube import client, watching
from rollout.kube.rest import AnswerError
from rollout.retrying import Backoff, Poll, retry, wait_until


class Clock:
    """Monotonic time that moves only when slept through; every sleep recorded."""

    def __init__(self) -> None:
        self.t = 0.0
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


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
    clock, fn = Clock(), Flaky(OSError("a"), OSError("b"), OSError("c"))
    got = retry(fn, _any, backoff=Backoff(1, 3), sleep=clock.sleep, monotonic=clock.monotonic)
    assert got == "ok" and fn.calls == 4 and clock.slept == [1, 2, 3]


def test_retry_raises_a_failure_it_does_not_retry_at_once() -> None:
    clock, fn = Clock(), Flaky(KeyError("k"), OSError("never reached"))
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
    clock = Clock()
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
    clock = Clock()
    answers = iter([False, False, True])
    assert wait_until(lambda: next(answers), 10, Poll.every(2), clock.sleep, clock.monotonic)
    assert clock.slept == [2, 2]

    clock = Clock()
    asked: list[float] = []

    def never() -> bool:
        asked.append(clock.t)
        return False

    assert not wait_until(never, 3, Poll(0.5, 1.0, 2.0), clock.sleep, clock.monotonic)
    # fast for the first second, then slow; asked once more after the last sleep
    assert clock.slept == [0.5, 0.5, 2.0] and asked == [0, 0.5, 1.0, 3.0]

    clock = Clock()
    clock.t = 7.0
    assert not wait_until(never, 3, Poll.every(1), clock.sleep, clock.monotonic, start=4.0)
    assert clock.slept == []


# --- the callers' policies, through the helper ------------------------------------------------


def _answer(status: int) -> AnswerError:
    return AnswerError(status, "Service Unavailable" if status == 503 else "Conflict")


def test_call_retries_5xx_and_connection_errors_then_names_the_call(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    clock = Clock()
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
    clock = Clock()
    with pytest.raises(NodeOperationError) as e:
        allocation_path._wait(clock, 12, "node n: republish", lambda: "2 devices", poll_s=1)  # type: ignore[arg-type]
    assert str(e.value) == "node n: republish: still 2 devices after 12s"
    assert clock.slept == [0.25] * 40 + [1.0, 1.0]

    clock, left = Clock(), iter(["1 device", None])
    allocation_path._wait(clock, 12, "x", lambda: next(left))  # type: ignore[arg-type]
    assert clock.slept == [0.25]
