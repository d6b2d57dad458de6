"""The Lease object itself: its names, its rules, and its raw reads and compare-and-swap writes.

Why apart: the Lease has two users with opposite roles. The owner of a change
(:mod:`rollout.kube.leases`) takes, renews and releases it; a requester
(:mod:`rollout.kube.handover`) writes a rollback request on it and waits for the outcome. Both
read and write the same object the same way; this module is that shared ground, so neither side
imports the other. The rules (when a Lease is free, who holds it, what a request looks like) are
pure functions over the Lease as the API server returns it (a dict), unit-tested on plain data.
"""

from __future__ import annotations

import json
import os
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rollout.errors import ExternalError, LockHeldError
from rollout.identity import process_identity
from rollout.kube.client import Api, call, describe
from rollout.kube.rest import AnswerError
from rollout.retrying import Poll, wait_until

NAME = "rollout-lock"
CHANGE_ANNOTATION = "rollout.dev/change-id"
REQUEST_ANNOTATION = "rollout.dev/rollback-request"
OUTCOME_ANNOTATION = "rollout.dev/rollback-outcome"
RECORD_REQUEST_ANNOTATION = "rollout.dev/record-request"
"""Entries other processes ask the owner to write into the change's record (a JSON list of
:class:`RecordRequest`)."""
RECORD_DONE_ANNOTATION = "rollout.dev/record-done"
"""The ids of the last :data:`RECORDS_KEPT` requests the owner wrote (a JSON list)."""
HELD_FOR_ANNOTATION = "rollout.dev/held-for"
"""``record`` on a Lease taken only to write one entry into the change's record (``rollout watch``
or ``rollout serve`` while nobody owns the change): it is let go within moments, so a rollback
or a new owner waits for it instead of handing a request to it (:func:`past_record_writer`)."""
HELD_FOR_RECORD = "record"
RECORDS_KEPT = 32
RECORD_HOLD_S = 15.0
"""How long a rollback or a new owner waits for a Lease held only to write a record."""
RECORD_HOLD_POLL = Poll(fast_s=0.05, fast_for_s=1.0, slow_s=0.2)
"""How often it looks meanwhile (such a writer holds the Lease for well under a second)."""
DEFAULT_DURATION_S = 30
"""The Lease's duration (``$ROLLOUT_LEASE_DURATION_S`` overrides it): an owner that cannot renew
for this long stops, and a crashed owner's Lease is free after it."""
REQUEST_TIMEOUT_S = 10.0
"""The HTTP timeout of each Lease read and write."""


def lease_duration(env: dict[str, str] | None = None) -> int:
    """``$ROLLOUT_LEASE_DURATION_S`` (at least 3), else :data:`DEFAULT_DURATION_S`."""
    raw = (os.environ if env is None else env).get("ROLLOUT_LEASE_DURATION_S", "")
    return max(3, int(raw)) if raw.isdigit() else DEFAULT_DURATION_S


def holder_identity() -> str:
    """``user@host pid N``: who holds the lock, in words an operator can act on (the journal names
    each entry's writer the same way: ``rollout.identity``)."""
    return process_identity()


def holder_is_dead_here(holder: str) -> bool:
    """Whether ``holder`` names a process on this host that no longer exists (pure but for the
    host name and ``kill(pid, 0)``)."""
    who, _, pid = holder.rpartition(" pid ")
    host = who.partition("@")[2]
    if not pid.isdigit() or host != socket.gethostname():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False


@dataclass(frozen=True)
class RollbackRequest:
    """A rollback handed to the owner through the Lease.

    Attributes:
        id: random id; the outcome names it.
        by: who asked (``user@host pid N`` or ``alert <fingerprint>``).
        nodes: the nodes to roll back (None: every node of the change).
        force: ``rollout rollback --force``: the owner's restore overwrites node files edited
            after the change wrote them, as the command would have done itself.
    """

    id: str
    by: str
    nodes: tuple[str, ...] | None = None
    force: bool = False

    def to_json(self) -> str:
        obj: dict[str, Any] = {
            "id": self.id,
            "by": self.by,
            "nodes": list(self.nodes) if self.nodes else None,
        }
        if self.force:
            obj["force"] = True
        return json.dumps(obj, sort_keys=True)

    @classmethod
    def parse(cls, raw: str | None) -> RollbackRequest | None:
        """The request in an annotation value, or None (absent or not ours to read)."""
        if not raw:
            return None
        try:
            obj = json.loads(raw)
            nodes = obj.get("nodes")
            return cls(
                str(obj["id"]),
                str(obj["by"]),
                tuple(nodes) if nodes else None,
                obj.get("force") is True,
            )
        except (ValueError, KeyError, TypeError, AttributeError):
            return None


@dataclass(frozen=True)
class RecordRequest:
    """An entry handed to the change's owner through the Lease, to write into the change's record
    (one writer per change: ``rollout.change.commands.owner_records``).

    Attributes:
        id: random id; the owner lists it under :data:`RECORD_DONE_ANNOTATION` once written.
        by: who asked (``user@host pid N``).
        step: the entry's step (``verdict``, ``trigger``, ``recovery``); its phase is ``done``.
        data: the entry's data.
    """

    id: str
    by: str
    step: str
    data: Mapping[str, Any]

    def to_obj(self) -> dict[str, Any]:
        return {"id": self.id, "by": self.by, "step": self.step, "data": dict(self.data)}


def record_requests(annotations: Mapping[str, str]) -> list[RecordRequest]:
    """The record requests pending on a Lease (unreadable ones are skipped)."""
    out: list[RecordRequest] = []
    try:
        raw = json.loads(annotations.get(RECORD_REQUEST_ANNOTATION) or "[]")
    except ValueError:
        return out
    for obj in raw if isinstance(raw, list) else []:
        try:
            data = obj["data"]
            if isinstance(data, dict):
                out.append(RecordRequest(str(obj["id"]), str(obj["by"]), str(obj["step"]), data))
        except (KeyError, TypeError):
            continue
    return out


def records_done(annotations: Mapping[str, str]) -> list[str]:
    """The ids of the record requests the owner wrote (the last :data:`RECORDS_KEPT`)."""
    try:
        raw = json.loads(annotations.get(RECORD_DONE_ANNOTATION) or "[]")
    except ValueError:
        return []
    return [str(i) for i in raw] if isinstance(raw, list) else []


def with_records(
    annotations: dict[str, str], pending: list[RecordRequest], done: list[str]
) -> dict[str, str]:
    """``annotations`` with the pending requests and the done ids set (an empty list: removed)."""
    out = dict(annotations)
    out.pop(RECORD_REQUEST_ANNOTATION, None)
    if pending:
        out[RECORD_REQUEST_ANNOTATION] = json.dumps(
            [r.to_obj() for r in pending], sort_keys=True, separators=(",", ":")
        )
    if done:
        out[RECORD_DONE_ANNOTATION] = json.dumps(done[-RECORDS_KEPT:], separators=(",", ":"))
    return out


def held_for_record(lease: dict[str, Any] | None, now: datetime) -> bool:
    """Whether a live holder took the Lease only to write a record (see
    :data:`HELD_FOR_ANNOTATION`)."""
    return (
        live_holder(lease, now) is not None
        and annotations_of(lease or {}).get(HELD_FOR_ANNOTATION) == HELD_FOR_RECORD
    )


def past_record_writer(
    api: Api,
    namespace: str,
    lease: dict[str, Any] | None,
    *,
    me: str | None = None,
    within_s: float = RECORD_HOLD_S,
    poll: Poll = RECORD_HOLD_POLL,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> dict[str, Any] | None:
    """``lease`` when it is not held only to write a record (or by ``me``); else the Lease as it
    is once that writer let it go, read every ``poll`` interval.

    Raises:
        LockHeldError: still held for a record after ``within_s``.
        ExternalError: the API server failed.
    """
    now = datetime.now(UTC)
    if not held_for_record(lease, now) or (me is not None and holder_of(lease or {}) == me):
        return lease
    seen: list[dict[str, Any] | None] = [lease]

    def gone() -> bool:
        seen[0] = read_lease(api, namespace)
        return not held_for_record(seen[0], datetime.now(UTC))

    if not wait_until(gone, within_s, poll, sleep, monotonic):
        raise LockHeldError(
            f"the cluster lock (Lease {namespace}/{NAME}) is held by {holder_of(seen[0] or {})} "
            f"to write the change's record for over {within_s:.0f}s; try again"
        )
    return seen[0]


# ---------------------------------------------------------------------------------------------
# Raw Lease objects (dicts as the API server returns them)


def annotations_of(lease: dict[str, Any]) -> dict[str, str]:
    return dict((lease.get("metadata") or {}).get("annotations") or {})


def holder_of(lease: dict[str, Any]) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def rv_of(lease: dict[str, Any]) -> str:
    return str((lease.get("metadata") or {}).get("resourceVersion") or "")


def renewed_at(lease: dict[str, Any]) -> datetime | None:
    spec = lease.get("spec") or {}
    raw = spec.get("renewTime") or spec.get("acquireTime")
    if not raw:
        return None
    t = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def expired(lease: dict[str, Any], now: datetime, default_s: int = DEFAULT_DURATION_S) -> bool:
    """Whether the holder stopped renewing more than the lease duration ago (pure)."""
    renewed = renewed_at(lease)
    duration = int((lease.get("spec") or {}).get("leaseDurationSeconds") or default_s)
    return renewed is None or renewed + timedelta(seconds=duration) < now


def live_holder(lease: dict[str, Any] | None, now: datetime) -> str | None:
    """The holder of a Lease that is held and live, else None (free to take)."""
    if lease is None:
        return None
    holder = holder_of(lease)
    if not holder or expired(lease, now) or holder_is_dead_here(holder):
        return None
    return holder


def read_lease(api: Api, namespace: str) -> dict[str, Any] | None:
    """The Lease as the API server returns it, or None when there is none.

    Raises:
        ExternalError: the API server failed.
    """
    try:
        out: dict[str, Any] = call(
            "read Lease",
            api.coordination.read_namespaced_lease,
            NAME,
            namespace,
            _request_timeout=REQUEST_TIMEOUT_S,
            retry_s=REQUEST_TIMEOUT_S,
        )
    except AnswerError as e:
        if e.status == 404:
            return None
        raise ExternalError(f"read Lease {namespace}/{NAME}: {describe(e)}") from e
    return out


def write_lease(api: Api, namespace: str, body: dict[str, Any], create: bool) -> dict[str, Any]:
    """Create or replace (compare-and-swap on ``metadata.resourceVersion``); AnswerError 409
    when someone wrote the Lease in between."""
    out: dict[str, Any]
    if create:
        out = api.coordination.create_namespaced_lease(
            namespace, body, _request_timeout=REQUEST_TIMEOUT_S
        )
    else:
        out = api.coordination.replace_namespaced_lease(
            NAME, namespace, body, _request_timeout=REQUEST_TIMEOUT_S
        )
    return out


def delete_lease(api: Api, namespace: str, rv: str) -> None:
    body = {"preconditions": {"resourceVersion": rv}}
    api.coordination.delete_namespaced_lease(
        NAME, namespace, body, _request_timeout=REQUEST_TIMEOUT_S
    )


def watch_lease(
    api: Api, namespace: str, rv: str, seconds: float, stop: threading.Event | None = None
) -> Any:
    """Events of the Lease after ``rv`` for about ``seconds`` (a generator of (type, object))."""
    timeout = max(1, int(seconds))
    events = api.coordination.watch_namespaced_lease(
        namespace, f"metadata.name={NAME}", rv, timeout, timeout + REQUEST_TIMEOUT_S
    )
    try:
        for ev in events:
            yield str(ev.get("type")), dict(ev.get("object") or {})
            if stop is not None and stop.is_set():
                return
    finally:
        events.close()
