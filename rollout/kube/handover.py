"""The requester's side of a hand-over: write a rollback request, or an entry of the change's
record, on the owner's Lease, and wait for the owner's answer there.

Why apart from :mod:`rollout.kube.leases`: that module is the owner, one process holding the
Lease for the whole change; this is whoever asks it to roll back (``rollout rollback``,
``rollout watch``, a ``rollout serve`` webhook), for as long as one request takes. The requester
never touches the change's nodes while an owner is live: it writes the
``rollout.dev/rollback-request`` annotation (compare-and-swap, joining a pending request) and
watches for the owner's ``rollout.dev/rollback-outcome``. Nor does it write the change's record
while an owner is live: an entry (``rollout watch``'s verdict, a webhook's trigger) goes on the
Lease as a ``rollout.dev/record-request`` (:func:`hand_over_record`), and the owner lists its id
under ``rollout.dev/record-done`` once written (:func:`wait_recorded`;
``rollout.change.commands.owner_records`` is the caller).
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, TypeVar

from rollout.errors import ExternalError, LockHeldError
from rollout.kube.client import Api, describe
from rollout.kube.lease_objects import (
    CHANGE_ANNOTATION,
    NAME,
    OUTCOME_ANNOTATION,
    REQUEST_ANNOTATION,
    RecordRequest,
    RollbackRequest,
    annotations_of,
    live_holder,
    past_record_writer,
    read_lease,
    record_requests,
    records_done,
    rv_of,
    watch_lease,
    with_records,
    write_lease,
)
from rollout.kube.rest import AnswerError
from rollout.retrying import Poll

WATCH_RETRY = Poll.every(0.5)
"""After a watch of the Lease failed (the API server away): how long the requester waits before it
reads the Lease again and watches anew (``tests/unit/test_handover_schedule.py``)."""


@dataclass(frozen=True)
class HandOver:
    """A request written on the owner's Lease.

    Attributes:
        request: the request (possibly joined with another requester's: same id, nodes merged).
        owner: the owner's identity.
        rv: the Lease's resourceVersion after the write (watch from there).
    """

    request: RollbackRequest
    owner: str
    rv: str


def hand_over(
    api: Api,
    namespace: str,
    change_id: str,
    nodes: Sequence[str] | None,
    by: str,
    force: bool = False,
) -> HandOver | None:
    """Hand a rollback of ``change_id`` to its live owner through the Lease.

    A pending request is joined (same id, node sets merged; None means every node), so any
    number of requesters give one rollback. ``force`` (``rollout rollback --force``) travels
    with a new request; a joined request keeps the pending one's ``force`` (the returned
    request says which; the caller tells its user when it differs from what they asked).

    Returns:
        The hand-over, or None when no live process owns the Lease (the caller takes it and
        rolls back itself).

    Raises:
        LockHeldError: a live owner holds the Lease for another change.
        ExternalError: the API server failed.
    """
    for _ in range(10):
        # a Lease held only to write one record is let go within moments: never hand a
        # rollback to such a holder, wait for it
        lease = past_record_writer(api, namespace, read_lease(api, namespace))
        now = datetime.now(UTC)
        holder = live_holder(lease, now)
        if lease is None or holder is None:
            return None
        theirs = annotations_of(lease).get(CHANGE_ANNOTATION)
        if theirs != change_id:
            raise LockHeldError(
                f"the cluster lock (Lease {namespace}/{NAME}) is held by {holder} for change "
                f"{theirs or 'unknown'}, not {change_id}; nothing was changed"
            )
        annotations = annotations_of(lease)
        pending = RollbackRequest.parse(annotations.get(REQUEST_ANNOTATION))
        done = _outcome_of(annotations)
        if pending is not None and (done is None or done.get("request") != pending.id):
            merged = None if pending.nodes is None or not nodes else (*pending.nodes, *nodes)
            req = RollbackRequest(
                pending.id,
                pending.by,
                tuple(dict.fromkeys(merged)) if merged else None,
                pending.force,
            )
            if req == pending:
                return HandOver(req, holder, rv_of(lease))
        else:
            req = RollbackRequest(secrets.token_hex(6), by, tuple(nodes) if nodes else None, force)
        annotations[REQUEST_ANNOTATION] = req.to_json()
        lease["metadata"]["annotations"] = annotations
        written = _write_over_read(api, namespace, lease)
        if written is None:
            continue
        return HandOver(req, holder, rv_of(written))
    raise LockHeldError(f"Lease {namespace}/{NAME} kept changing under us; try again")


def _write_over_read(api: Api, namespace: str, lease: dict[str, Any]) -> dict[str, Any] | None:
    """``lease`` written over the version it was read at (its resourceVersion); None when the
    Lease changed or went meanwhile (409, 404: the caller reads it again)."""
    try:
        return write_lease(api, namespace, lease, create=False)
    except AnswerError as e:
        if e.status in (404, 409):
            return None
        raise ExternalError(f"write Lease {namespace}/{NAME}: {describe(e)}") from e


def _outcome_of(annotations: dict[str, str]) -> dict[str, Any] | None:
    try:
        value = json.loads(annotations.get(OUTCOME_ANNOTATION) or "null")
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def wait_outcome(
    api: Api,
    namespace: str,
    handed: HandOver,
    timeout_s: float | None = None,
    on_wait: Callable[[str], None] | None = None,
    *,
    poll: Poll = WATCH_RETRY,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> dict[str, Any] | None:
    """Wait until the owner reports the outcome of ``handed`` on the Lease.

    A watch that fails (the API server away) is told to ``on_wait``; the Lease is read again
    after ``poll``'s interval (``sleep``, ``monotonic``: the clock).

    Returns:
        The outcome (``request``, ``outcome``, ``message``, ``owner``), or None when the owner
        released or lost the Lease without reporting it (it ended before acting on the request,
        or died): the Lease is then free and the caller may do the rollback itself.

    Raises:
        ExternalError: ``timeout_s`` passed first.
    """

    def found(lease: dict[str, Any]) -> dict[str, Any] | None:
        outcome = _outcome_of(annotations_of(lease))
        return outcome if outcome and outcome.get("request") == handed.request.id else None

    return _watch_for(
        api,
        namespace,
        handed.owner,
        handed.rv,
        found,
        timeout_s,
        "report the rollback",
        on_wait,
        poll,
        sleep,
        monotonic,
    )


T = TypeVar("T")


def _watch_for(
    api: Api,
    namespace: str,
    owner: str,
    rv: str,
    found: Callable[[dict[str, Any]], T | None],
    timeout_s: float | None,
    what: str,
    on_wait: Callable[[str], None] | None,
    poll: Poll,
    sleep: Callable[[float], None],
    monotonic: Callable[[], float],
) -> T | None:
    """Watch the Lease from ``rv`` until ``found`` finds what the requester waits for on it (its
    value), or ``owner`` no longer holds it live (None); between watches the Lease is read.

    Raises:
        ExternalError: ``timeout_s`` passed first.
    """
    started = monotonic()
    deadline = None if timeout_s is None else started + timeout_s
    while True:
        try:
            for kind, obj in watch_lease(api, namespace, rv, 5.0):
                if kind == "DELETED":
                    return None
                if kind not in ("ADDED", "MODIFIED"):
                    break
                rv = rv_of(obj) or rv
                got = found(obj)
                if got is not None:
                    return got
        except Exception as e:  # the API server is away: read below, or wait
            if on_wait is not None:
                on_wait(f"watching the Lease: {describe(e)}")
            sleep(poll.interval(monotonic() - started))
        lease = read_lease(api, namespace)
        if lease is None:
            return None
        got = found(lease)
        if got is not None:
            return got
        if live_holder(lease, datetime.now(UTC)) != owner:
            return None
        rv = rv_of(lease)
        if deadline is not None and monotonic() > deadline:
            raise ExternalError(f"the owner {owner} did not {what} within {timeout_s:.0f}s")


@dataclass(frozen=True)
class RecordHandOver:
    """An entry handed to the change's owner through its Lease.

    Attributes:
        request: the entry asked for. owner: the owner's identity. rv: the Lease's
        resourceVersion after the write (watch from there).
    """

    request: RecordRequest
    owner: str
    rv: str


def hand_over_record(
    api: Api, namespace: str, change_id: str, request: RecordRequest
) -> RecordHandOver | None:
    """Hand an entry of ``change_id``'s record to its live owner through the Lease (added to the
    pending requests, compare-and-swap), for it to write into the record it alone writes.

    Returns:
        The hand-over, or None when no live process owns the Lease (the caller takes it for the
        write).

    Raises:
        LockHeldError: a live owner holds the Lease for another change (nobody may write this
            change's record meanwhile).
        ExternalError: the API server failed.
    """
    for _ in range(10):
        lease = read_lease(api, namespace)
        holder = live_holder(lease, datetime.now(UTC))
        if lease is None or holder is None:
            return None
        annotations = annotations_of(lease)
        theirs = annotations.get(CHANGE_ANNOTATION)
        if theirs != change_id:
            raise LockHeldError(
                f"the cluster lock (Lease {namespace}/{NAME}) is held by {holder} for change "
                f"{theirs or 'unknown'}, not {change_id}: its record is not written meanwhile"
            )
        pending = [r for r in record_requests(annotations) if r.id != request.id]
        lease["metadata"]["annotations"] = with_records(
            annotations, [*pending, request], records_done(annotations)
        )
        written = _write_over_read(api, namespace, lease)
        if written is None:
            continue
        return RecordHandOver(request, holder, rv_of(written))
    raise LockHeldError(f"Lease {namespace}/{NAME} kept changing under us; try again")


def wait_recorded(
    api: Api,
    namespace: str,
    handed: RecordHandOver,
    timeout_s: float,
    *,
    poll: Poll = WATCH_RETRY,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> bool:
    """Wait until the owner lists ``handed`` as written (True), or lets the Lease go or loses it
    without having listed it (False: the caller looks again, and writes it itself when nobody
    owns the change; the owner may have written it just before, which the entry's ``handed`` id
    tells).

    Raises:
        ExternalError: ``timeout_s`` passed first (an owner that does not take handed entries,
            e.g. an older rollout).
    """

    def listed(lease: dict[str, Any]) -> bool | None:
        return True if handed.request.id in records_done(annotations_of(lease)) else None

    got = _watch_for(
        api,
        namespace,
        handed.owner,
        handed.rv,
        listed,
        timeout_s,
        "write the handed entry",
        None,
        poll,
        sleep,
        monotonic,
    )
    return got is True
