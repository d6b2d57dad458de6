"""The requester's wait on the owner's Lease (``rollout.kube.handover.wait_outcome``) when its watch
fails (the API server away): the Lease is read again and watched anew after ``WATCH_RETRY``'s
interval, on the clock passed in, and the wait still ends at its timeout. Plain data, no cluster:
the Lease reads and watches are replaced by scripted ones."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from rollout.errors import ExternalError
from rollout.kube import handover
from rollout.kube.handover import WATCH_RETRY, HandOver, wait_outcome
from rollout.kube.lease_objects import OUTCOME_ANNOTATION, RollbackRequest
from rollout.retrying import Poll
from tests.unit.fakes_change import RecordingClock

OWNER = "ops@elsewhere pid 41"
REQUEST = RollbackRequest("r1", "me", None)


def _lease(rv: int, outcome: bool = False) -> dict[str, Any]:
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    annotations = {}
    if outcome:
        annotations[OUTCOME_ANNOTATION] = (
            '{"request": "r1", "outcome": "rolled-back", "message": "", "owner": "x"}'
        )
    return {
        "metadata": {"resourceVersion": str(rv), "annotations": annotations},
        "spec": {"holderIdentity": OWNER, "leaseDurationSeconds": 30, "renewTime": now},
    }


def _script(monkeypatch: pytest.MonkeyPatch, failures: int | None) -> list[str]:
    """Watches that fail ``failures`` times, then one that brings the outcome (None: always
    fail); every read finds the owner live, without an outcome."""
    watched: list[str] = []

    def watch(_api: Any, _ns: str, rv: str, _s: float) -> Iterator[tuple[str, dict[str, Any]]]:
        watched.append(rv)
        if failures is None or len(watched) <= failures:
            raise ConnectionRefusedError("connection refused")
        yield "MODIFIED", _lease(int(rv) + 1, outcome=True)

    monkeypatch.setattr(handover, "watch_lease", watch)
    monkeypatch.setattr(handover, "read_lease", lambda _api, _ns: _lease(len(watched) + 10))
    return watched


def test_the_retry_is_half_a_second_as_it_was() -> None:
    assert Poll.every(0.5) == WATCH_RETRY
    assert [WATCH_RETRY.interval(t) for t in (0.0, 0.4, 5.0, 600.0)] == [0.5] * 4


def test_each_failed_watch_waits_the_polls_interval_then_reads_and_watches_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    watched = _script(monkeypatch, failures=3)
    clock, said = RecordingClock(100.0), []
    handed = HandOver(REQUEST, OWNER, "5")
    got = wait_outcome(
        None, "ns", handed, 60, said.append, sleep=clock.sleep, monotonic=clock.monotonic
    )
    assert got is not None and got["outcome"] == "rolled-back"
    assert clock.slept == [0.5, 0.5, 0.5]
    assert len(said) == 3 and all("watching the Lease" in m for m in said)
    # each new watch starts from the version the read after the failure found
    assert watched == ["5", "11", "12", "13"]


def test_a_poll_of_another_schedule_is_followed(monkeypatch: pytest.MonkeyPatch) -> None:
    _script(monkeypatch, failures=4)
    clock = RecordingClock(100.0)
    poll = Poll(fast_s=0.1, fast_for_s=0.25, slow_s=1.0)
    wait_outcome(
        None,
        "ns",
        HandOver(REQUEST, OWNER, "5"),
        60,
        poll=poll,
        sleep=clock.sleep,
        monotonic=clock.monotonic,
    )
    assert clock.slept == [0.1, 0.1, 0.1, 1.0]


def test_the_wait_ends_at_its_timeout_on_the_clock_passed_in(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _script(monkeypatch, failures=None)
    clock = RecordingClock(100.0)
    with pytest.raises(ExternalError, match=f"the owner {OWNER} did not report the rollback"):
        wait_outcome(
            None,
            "ns",
            HandOver(REQUEST, OWNER, "5"),
            2.0,
            sleep=clock.sleep,
            monotonic=clock.monotonic,
        )
    # a look every 0.5 s until the first one past the 2 s bound
    assert clock.slept == [0.5] * 5 and clock.t - 100.0 == 2.5
