"""The cluster lock and the change's owner: a coordination.k8s.io Lease named ``rollout-lock``.

Why a Lease in the cluster, not a file on the operator's laptop: two operators (or a cron job and
an operator) must not change nodes at the same time, wherever they run. The Lease names its holder
(``user@host pid N``) and carries the change id as an annotation.

**One owner per change.** The process holding the Lease owns the change; nobody else touches its
nodes while the Lease is live, not even for the same change id. Everything that writes the Lease
is a compare-and-swap on its ``resourceVersion``:

* the owner renews it every ``duration/3`` (an update that fails on a conflict unless the Lease
  still names this holder and change); renewal failing for longer than the lease duration, or the
  Lease deleted or taken, means the Lease is **lost**: the owner's :class:`Interrupt` is set, it
  starts nothing new, restores the nodes in flight and exits saying so;
* between renewals the owner **watches** the Lease, so a rollback request written on it (the
  ``rollout.dev/rollback-request`` annotation, by ``rollout rollback``, ``rollout watch`` or a
  ``rollout serve`` webhook: :func:`rollout.kube.handover.hand_over`) reaches it within
  milliseconds; it stops forward work, rolls back the nodes named, and writes
  ``rollout.dev/rollback-outcome`` before releasing, which the requester is watching for
  (:func:`rollout.kube.handover.wait_outcome`); an entry of the change's record another process
  writes on it (``rollout.dev/record-request``: ``rollout watch``'s verdict, a webhook's trigger)
  the owner writes into its journal, the one writer of the change's record, and lists as done
  (``rollout.dev/record-done``; :meth:`LeaseLock.serve_records`);
* a Lease is free when nobody holds it, when it expired (renewTime + duration is past), or when
  its holder is a process on this host that no longer exists (a crashed ``apply`` resumed at once).

This module is the owner's side only. The requester's side is :mod:`rollout.kube.handover`; the
Lease object both sides read and write (names, rules, raw compare-and-swap calls) is
:mod:`rollout.kube.lease_objects`.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from rollout.errors import ExternalError, LockHeldError
from rollout.interrupt import Interrupt, StopReason
from rollout.kube.client import Api, describe
from rollout.kube.lease_objects import (
    CHANGE_ANNOTATION,
    HELD_FOR_ANNOTATION,
    NAME,
    OUTCOME_ANNOTATION,
    REQUEST_ANNOTATION,
    RecordRequest,
    RollbackRequest,
    annotations_of,
    delete_lease,
    holder_identity,
    holder_of,
    lease_duration,
    live_holder,
    past_record_writer,
    read_lease,
    record_requests,
    records_done,
    renewed_at,
    rv_of,
    watch_lease,
    with_records,
    write_lease,
)
from rollout.kube.rest import AnswerError
from rollout.retrying import Poll

# what callers of rollout.kube.leases import from here, though it now lives beside it
__all__ = [
    "LeaseLock",
]

WATCH_AGAIN = Poll.every(0.5)
"""After the watch failed (the API server away), how soon the owner watches again (never past
the next renewal, never sooner than :data:`SOONEST_S`)."""
RENEW_AGAIN = Poll.every(1.0)
"""After a renewal failed, how soon it is tried again (never later than the renewal period):
the Lease is lost once renewal has failed for longer than its duration."""
SOONEST_S = 0.05


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class LeaseLock:
    """The owner's Lease: taken for one change, renewed by compare-and-swap, watched for requests.

    ``interrupt`` is set when a rollback request arrives or the Lease is lost; the orchestrator
    stops forward work on it. Entries other processes hand over (:meth:`serve_records`) are
    written by the owner's thread as they arrive.

    ``held_for``: ``record`` when the Lease is taken only to write one entry
    (``rollout.kube.lease_objects.HELD_FOR_ANNOTATION``).
    """

    def __init__(
        self,
        api: Api,
        namespace: str = "kube-system",
        duration_s: int | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        held_for: str | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.duration_s = duration_s or lease_duration()
        self.identity = holder_identity()
        self.change_id: str | None = None
        self.interrupt = Interrupt()
        self.request: RollbackRequest | None = None
        self.lost: str | None = None
        self.request_seen_at: float | None = None
        self._lease: dict[str, Any] | None = None
        self._mu = threading.Lock()
        self._clock = monotonic
        self._last_ok = monotonic()
        self._stop = threading.Event()
        # how the owner's thread waits (the stop flag ends the wait): the tests' clock sleeps
        self._wait: Callable[[float], object] = self._stop.wait
        self._thread: threading.Thread | None = None
        self.held_for = held_for
        self._write: Callable[[RecordRequest], None] | None = None
        self._writing = threading.Lock()  # one handed entry at a time; serve_records waits
        self._written: dict[str, None] = {}  # ids of the handed entries written, oldest first

    def check(self) -> None:
        """Preflight: refuse early when a live Lease exists (nothing is written).

        Raises:
            LockHeldError: the holder and its change named.
        """
        lease = read_lease(self.api, self.namespace)
        if lease is not None:
            self._check_free(lease, datetime.now(UTC))

    def acquire(self, change_id: str) -> None:
        """Take the Lease for ``change_id`` (compare-and-swap) and start renewing and watching it.

        Raises:
            LockHeldError: a live Lease exists, whatever its change (holder and change named).
        """
        for _ in range(3):
            # a Lease held only to write one record is let go within moments: wait for it
            lease = past_record_writer(
                self.api, self.namespace, read_lease(self.api, self.namespace), me=self.identity
            )
            now = datetime.now(UTC)
            if lease is not None:
                self._check_free(lease, now, change_id)
            body = self._body(change_id, now, lease)
            try:
                written = write_lease(self.api, self.namespace, body, create=lease is None)
            except AnswerError as e:
                if e.status == 409:
                    continue  # someone else wrote it meanwhile: read again
                raise ExternalError(f"write Lease {self.namespace}/{NAME}: {describe(e)}") from e
            except Exception as e:
                raise ExternalError(f"write Lease {self.namespace}/{NAME}: {describe(e)}") from e
            self.change_id = change_id
            self._lease = written
            self._last_ok = self._clock()
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="lease-owner", daemon=True)
            self._thread.start()
            return
        raise LockHeldError(
            f"Lease {self.namespace}/{NAME} changed under us three times; try again"
        )

    def _check_free(self, lease: dict[str, Any], now: datetime, change_id: str = "") -> None:
        holder = live_holder(lease, now)
        if holder is None or holder == self.identity:
            return
        theirs = annotations_of(lease).get(CHANGE_ANNOTATION)
        renewed = renewed_at(lease)
        age = f", renewed {int((now - renewed).total_seconds())}s ago" if renewed else ""
        who = "process" if change_id and theirs == change_id else "change"
        raise LockHeldError(
            f"another {who} holds the cluster lock (Lease {self.namespace}/{NAME}): "
            f"holder {holder}, change {theirs or 'unknown'}{age}; to roll that change back, "
            f"`rollout rollback --change {theirs or 'ID'}` hands the request to its owner"
        )

    def _body(self, change_id: str, now: datetime, old: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "name": NAME,
            "namespace": self.namespace,
            "annotations": {CHANGE_ANNOTATION: change_id},  # a stale request does not carry over
        }
        if self.held_for is not None:
            meta["annotations"][HELD_FOR_ANNOTATION] = self.held_for
        if old is not None:
            meta["resourceVersion"] = rv_of(old)
        return {
            "apiVersion": "coordination.k8s.io/v1",
            "kind": "Lease",
            "metadata": meta,
            "spec": {
                "holderIdentity": self.identity,
                "leaseDurationSeconds": self.duration_s,
                "acquireTime": _micro(now),
                "renewTime": _micro(now),
            },
        }

    # -- the owner's thread: watch between renewals ---------------------------------------

    def _run(self) -> None:
        every = self.duration_s / 3
        clock = self._clock
        next_renew = clock() + every
        while not self._stop.is_set() and self.lost is None:
            left = next_renew - clock()
            if left > 0:
                with self._mu:
                    rv = rv_of(self._lease or {})
                try:
                    for kind, obj in watch_lease(self.api, self.namespace, rv, left, self._stop):
                        if self._stop.is_set():
                            break  # released (its delete is what woke the watch)
                        if kind == "DELETED":
                            self._lose("the Lease was deleted by someone else")
                        elif kind in ("ADDED", "MODIFIED"):
                            self._seen(obj)
                        elif kind == "ERROR":  # e.g. 410 Gone: read it afresh, watch from there
                            fresh = read_lease(self.api, self.namespace)
                            if fresh is None:
                                self._lose("the Lease was deleted by someone else")
                            else:
                                self._seen(fresh)
                            break
                        if self.lost or self._stop.is_set() or clock() >= next_renew:
                            break
                except Exception:  # the API server is away: renewal decides when it is lost
                    self._wait(min(WATCH_AGAIN.interval(0.0), max(left, SOONEST_S)))
                if self.lost or self._stop.is_set():
                    return
                if clock() < next_renew:
                    continue
            if self._renew():
                next_renew = clock() + every
            else:
                failing = clock() - self._last_ok
                next_renew = clock() + min(RENEW_AGAIN.interval(failing), every)
                if failing > self.duration_s:
                    self._lose(
                        f"could not renew the Lease for {self.duration_s}s "
                        "(the API server did not answer); another process may own it now"
                    )

    def _seen(self, lease: dict[str, Any]) -> None:
        """A newer version of the Lease: still ours? a rollback request on it?"""
        if holder_of(lease) != self.identity or (
            annotations_of(lease).get(CHANGE_ANNOTATION) != self.change_id
        ):
            self._lose(f"the Lease now names holder {holder_of(lease) or 'nobody'}")
            return
        with self._mu:
            self._lease = lease
        req = RollbackRequest.parse(annotations_of(lease).get(REQUEST_ANNOTATION))
        if req is not None and req != self.request:
            if self.request is None:
                self.request_seen_at = self._clock()
            self.request = req
            self.interrupt.request(
                StopReason(by=req.by, nodes=req.nodes, request_id=req.id, force=req.force)
            )
        self._take_records(lease)

    # -- entries handed over by other processes -------------------------------------------

    def serve_records(self, write: Callable[[RecordRequest], None] | None) -> None:
        """Write the entries other processes hand over (``rollout watch``'s verdicts,
        ``rollout serve``'s triggers) with ``write``, from now on; None: no longer (waits for
        one being written). The owner's change session sets it once its journal is mirrored and
        clears it before it detaches the mirror, so a handed entry is written into the change's
        record by this process, the Lease holder, or left on the Lease for the requester to see
        unwritten (``rollout.kube.handover.wait_recorded``)."""
        with self._writing:
            self._write = write
        if write is not None:  # requests that came before the session could take them
            with self._mu:
                lease = self._lease
            if lease is not None:
                self._take_records(lease)

    def _take_records(self, lease: dict[str, Any]) -> None:
        """Write the pending handed entries not written yet, then list them as done."""
        pending = record_requests(annotations_of(lease))
        if not pending:
            return
        with self._writing:
            if self._write is None or self.lost is not None:
                return
            for req in pending:
                if req.id in self._written:
                    continue
                try:
                    self._write(req)
                except Exception:  # left unwritten on the Lease: the requester says so
                    break
                self._written[req.id] = None
            while len(self._written) > 256:
                del self._written[next(iter(self._written))]
            done = [r.id for r in pending if r.id in self._written]
        if done:
            self._mark_done(done)

    def _mark_done(self, ids: list[str]) -> None:
        """Move ``ids`` from the Lease's pending record requests to its done list (CAS)."""
        for _ in range(5):
            try:
                lease = read_lease(self.api, self.namespace)
            except ExternalError:
                return  # listed by the next look at the Lease
            if lease is None or holder_of(lease) != self.identity:
                return
            annotations = annotations_of(lease)
            pending = [r for r in record_requests(annotations) if r.id not in ids]
            before = records_done(annotations)
            done = before + [i for i in ids if i not in before]
            if done == before and len(pending) == len(record_requests(annotations)):
                return
            lease.setdefault("metadata", {})["annotations"] = with_records(
                annotations, pending, done
            )
            try:
                written = write_lease(self.api, self.namespace, lease, create=False)
            except AnswerError as e:
                if e.status == 409:
                    continue
                return
            except Exception:
                return
            with self._mu:
                self._lease = written
            return

    def _lose(self, why: str) -> None:
        if self._stop.is_set():
            return  # released: our own delete, or a renewal racing it
        if self.lost is None:
            self.lost = why
            self.interrupt.request(StopReason(by=why, lost=True))

    def _renew(self) -> bool:
        """One compare-and-swap renewal; True when it was written."""
        for _ in range(2):
            with self._mu:
                body = json.loads(json.dumps(self._lease or {}))
            body.setdefault("spec", {})["renewTime"] = _micro(datetime.now(UTC))
            try:
                written = write_lease(self.api, self.namespace, body, create=False)
            except AnswerError as e:
                if e.status == 404:
                    self._lose("the Lease was deleted by someone else")
                    return False
                if e.status != 409:
                    return False
                try:  # someone wrote it (a request, or a new holder): look at it, then retry
                    fresh = read_lease(self.api, self.namespace)
                except ExternalError:
                    return False
                if fresh is None:
                    self._lose("the Lease was deleted by someone else")
                    return False
                self._seen(fresh)
                if self.lost:
                    return False
                continue
            except Exception:
                return False
            self._last_ok = self._clock()
            self._seen(written)
            return self.lost is None
        return False

    def report(self, outcome: str, message: str) -> None:
        """Write the outcome of the handed-over rollback on the Lease (the requester waits on it).

        Does nothing when no request was handed over or the Lease is lost.
        """
        if self.request is None or self.lost is not None:
            return
        for _ in range(3):
            lease = read_lease(self.api, self.namespace)
            if lease is None or holder_of(lease) != self.identity:
                return
            value = {
                "request": self.request.id,
                "outcome": outcome,
                "message": message,
                "owner": self.identity,
            }
            lease.setdefault("metadata", {}).setdefault("annotations", {})[OUTCOME_ANNOTATION] = (
                json.dumps(value, sort_keys=True)
            )
            try:
                write_lease(self.api, self.namespace, lease, create=False)
                return
            except AnswerError as e:
                if e.status != 409:
                    return
            except Exception:
                return

    def release(self) -> None:
        """Stop renewing and delete the Lease if it is still ours (compare-and-swap)."""
        self._stop.set()
        try:
            if self.change_id is not None:
                self._delete_if_ours()
        finally:
            self.change_id = None
            if self._thread:
                # the thread sits in a watch until its next renewal; our delete wakes it at once
                # (it renews only by compare-and-swap, never re-creates, so deleting the Lease
                # first is safe); it then sees the stop flag and ends
                self._thread.join(timeout=1.0)

    def _delete_if_ours(self) -> None:
        for _ in range(3):
            lease = read_lease(self.api, self.namespace)
            if lease is None or holder_of(lease) != self.identity:
                return
            try:
                delete_lease(self.api, self.namespace, rv_of(lease))
                return
            except AnswerError as e:
                if e.status == 404:
                    return
                if e.status != 409:
                    raise ExternalError(
                        f"release Lease {self.namespace}/{NAME}: {describe(e)}"
                    ) from e
