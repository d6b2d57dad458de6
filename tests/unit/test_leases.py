"""The Lease's pure rules: when it is free, who holds it, what a request looks like. (Taking,
renewing, watching and handing over against a real API server: tests/lab/test_owner_lab.py.)"""

from __future__ import annotations

import os
import socket
from datetime import UTC, datetime, timedelta

from rollout.kube.lease_objects import (
    RollbackRequest,
    expired,
    holder_is_dead_here,
    lease_duration,
    live_holder,
)

NOW = datetime(2026, 12, 1, 4, 0, tzinfo=UTC)


def _lease(holder: str, renewed: datetime, duration: int = 30) -> dict[str, object]:
    return {
        "metadata": {"annotations": {"rollout.dev/change-id": "c1"}, "resourceVersion": "7"},
        "spec": {
            "holderIdentity": holder,
            "leaseDurationSeconds": duration,
            "renewTime": renewed.strftime("%Y-%m-%dT%H:%M:%S.%fZ"),
        },
    }


def test_a_live_lease_names_its_holder_even_for_the_same_change() -> None:
    # the bug this replaces: "same change id" counted as free, so rollback ran beside apply
    lease = _lease("alice@elsewhere pid 12", NOW - timedelta(seconds=5))
    assert live_holder(lease, NOW) == "alice@elsewhere pid 12"


def test_an_expired_or_empty_lease_is_free() -> None:
    assert live_holder(None, NOW) is None
    assert live_holder(_lease("", NOW), NOW) is None
    old = _lease("alice@elsewhere pid 12", NOW - timedelta(seconds=31))
    assert expired(old, NOW) and live_holder(old, NOW) is None
    assert not expired(_lease("a", NOW - timedelta(seconds=29)), NOW)


def test_a_holder_on_this_host_that_no_longer_exists_is_dead() -> None:
    host = socket.gethostname()
    assert not holder_is_dead_here(f"me@{host} pid {os.getpid()}")
    dead = 2**22 + 12345  # above pid_max's default: no such process
    assert holder_is_dead_here(f"me@{host} pid {dead}")
    assert not holder_is_dead_here(f"me@another-host-{host} pid {dead}")
    assert live_holder(_lease(f"me@{host} pid {dead}", NOW), NOW) is None


def test_requests_round_trip_and_bad_annotations_are_ignored() -> None:
    req = RollbackRequest("abc", "alert f00d (X)", ("n1", "n2"))
    assert RollbackRequest.parse(req.to_json()) == req
    assert RollbackRequest.parse(RollbackRequest("a", "b").to_json()) == RollbackRequest("a", "b")
    forced = RollbackRequest("abc", "ops", None, force=True)
    assert RollbackRequest.parse(forced.to_json()) == forced  # --force travels to the owner
    assert "force" not in RollbackRequest("a", "b").to_json()  # unforced: the same JSON as before
    assert RollbackRequest.parse("not json") is None
    assert RollbackRequest.parse('{"by": "x"}') is None
    assert RollbackRequest.parse(None) is None


def test_lease_duration_from_the_environment() -> None:
    assert lease_duration({}) == 30
    assert lease_duration({"ROLLOUT_LEASE_DURATION_S": "6"}) == 6
    assert lease_duration({"ROLLOUT_LEASE_DURATION_S": "1"}) == 3
    assert lease_duration({"ROLLOUT_LEASE_DURATION_S": "x"}) == 30
