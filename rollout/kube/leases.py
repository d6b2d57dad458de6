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
  ``rollout serve`` webhook: :func:`hand_over`) reaches it within milliseconds; it stops forward
  work, rolls back the nodes named, and writes ``rollout.dev/rollback-outcome`` before releasing,
  which the requester is watching for (:func:`wait_outcome`);
* a Lease is free when nobody holds it, when it expired (renewTime + duration is past), or when
  its holder is a process on this host that no longer exists (a crashed ``apply`` resumed at once).
"""

from __future__ import annotations

import getpass
import json
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes.client.exceptions import ApiException

from rollout.errors import ExternalError, LockHeldError
from rollout.interrupt import Interrupt, StopReason
from rollout.kube.client import Api, call, describe

NAME = "rollout-lock"
CHANGE_ANNOTATION = "rollout.dev/change-id"
REQUEST_ANNOTATION = "rollout.dev/rollback-request"
OUTCOME_ANNOTATION = "rollout.dev/rollback-outcome"
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
    """``user@host pid N``: who holds the lock, in words an operator can act on."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


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


# ---------------------------------------------------------------------------------------------
# Raw Lease objects (dicts as the API server returns them)


def _annotations(lease: dict[str, Any]) -> dict[str, str]:
    return dict((lease.get("metadata") or {}).get("annotations") or {})


def _holder(lease: dict[str, Any]) -> str:
    return str((lease.get("spec") or {}).get("holderIdentity") or "")


def _rv(lease: dict[str, Any]) -> str:
    return str((lease.get("metadata") or {}).get("resourceVersion") or "")


def _renewed(lease: dict[str, Any]) -> datetime | None:
    spec = lease.get("spec") or {}
    raw = spec.get("renewTime") or spec.get("acquireTime")
    if not raw:
        return None
    t = datetime.fromisoformat(str(raw).replace("Z", "+00:00"))
    return t if t.tzinfo else t.replace(tzinfo=UTC)


def expired(lease: dict[str, Any], now: datetime, default_s: int = DEFAULT_DURATION_S) -> bool:
    """Whether the holder stopped renewing more than the lease duration ago (pure)."""
    renewed = _renewed(lease)
    duration = int((lease.get("spec") or {}).get("leaseDurationSeconds") or default_s)
    return renewed is None or renewed + timedelta(seconds=duration) < now


def live_holder(lease: dict[str, Any] | None, now: datetime) -> str | None:
    """The holder of a Lease that is held and live, else None (free to take)."""
    if lease is None:
        return None
    holder = _holder(lease)
    if not holder or expired(lease, now) or holder_is_dead_here(holder):
        return None
    return holder


def _micro(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def read_lease(api: Api, namespace: str) -> dict[str, Any] | None:
    """The Lease as the API server returns it, or None when there is none.

    Raises:
        ExternalError: the API server failed.
    """
    try:
        resp: Any = call(
            "read Lease",
            api.coordination.read_namespaced_lease,
            NAME,
            namespace,
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT_S,
            retry_s=REQUEST_TIMEOUT_S,
        )
    except ApiException as e:
        if e.status == 404:
            return None
        raise ExternalError(f"read Lease {namespace}/{NAME}: {describe(e)}") from e
    out: dict[str, Any] = json.loads(resp.data)
    return out


def _write(api: Api, namespace: str, body: dict[str, Any], create: bool) -> dict[str, Any]:
    """Create or replace (compare-and-swap on ``metadata.resourceVersion``); ApiException 409
    when someone wrote the Lease in between."""
    # raw JSON bodies (dicts) in and out; the client's types know only its models
    resp: Any
    if create:
        resp = api.coordination.create_namespaced_lease(
            namespace,
            body,  # type: ignore[arg-type]
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
    else:
        resp = api.coordination.replace_namespaced_lease(
            NAME,
            namespace,
            body,  # type: ignore[arg-type]
            _preload_content=False,
            _request_timeout=REQUEST_TIMEOUT_S,
        )
    out: dict[str, Any] = json.loads(resp.data)
    return out


def _delete(api: Api, namespace: str, rv: str) -> None:
    body = {"preconditions": {"resourceVersion": rv}}
    api.coordination.delete_namespaced_lease(
        NAME,
        namespace,
        body=body,  # type: ignore[arg-type]
        _request_timeout=REQUEST_TIMEOUT_S,
    )


def _watch(
    api: Api, namespace: str, rv: str, seconds: float, stop: threading.Event | None = None
) -> Any:
    """Events of the Lease after ``rv`` for about ``seconds`` (a generator of (type, object))."""
    from kubernetes import watch

    w: Any = watch.Watch()  # type: ignore[no-untyped-call]
    timeout = max(1, int(seconds))
    for ev in w.stream(
        api.coordination.list_namespaced_lease,
        namespace,
        field_selector=f"metadata.name={NAME}",
        resource_version=rv,
        timeout_seconds=timeout,
        _request_timeout=timeout + REQUEST_TIMEOUT_S,
    ):
        yield str(ev.get("type")), dict(ev.get("raw_object") or {})
        if stop is not None and stop.is_set():
            w.stop()
            return


# ---------------------------------------------------------------------------------------------
# The owner's side


class LeaseLock:
    """The owner's Lease: taken for one change, renewed by compare-and-swap, watched for requests.

    ``interrupt`` is set when a rollback request arrives or the Lease is lost; the orchestrator
    stops forward work on it.
    """

    def __init__(
        self, api: Api, namespace: str = "kube-system", duration_s: int | None = None
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
        self._last_ok = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

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
            now = datetime.now(UTC)
            lease = read_lease(self.api, self.namespace)
            if lease is not None:
                self._check_free(lease, now, change_id)
            body = self._body(change_id, now, lease)
            try:
                written = _write(self.api, self.namespace, body, create=lease is None)
            except ApiException as e:
                if e.status == 409:
                    continue  # someone else wrote it meanwhile: read again
                raise ExternalError(f"write Lease {self.namespace}/{NAME}: {describe(e)}") from e
            except Exception as e:
                raise ExternalError(f"write Lease {self.namespace}/{NAME}: {describe(e)}") from e
            self.change_id = change_id
            self._lease = written
            self._last_ok = time.monotonic()
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
        theirs = _annotations(lease).get(CHANGE_ANNOTATION)
        renewed = _renewed(lease)
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
        if old is not None:
            meta["resourceVersion"] = _rv(old)
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
        next_renew = time.monotonic() + every
        while not self._stop.is_set() and self.lost is None:
            left = next_renew - time.monotonic()
            if left > 0:
                with self._mu:
                    rv = _rv(self._lease or {})
                try:
                    for kind, obj in _watch(self.api, self.namespace, rv, left, self._stop):
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
                        if self.lost or self._stop.is_set() or time.monotonic() >= next_renew:
                            break
                except Exception:  # the API server is away: renewal decides when it is lost
                    self._stop.wait(min(0.5, max(left, 0.05)))
                if self.lost or self._stop.is_set():
                    return
                if time.monotonic() < next_renew:
                    continue
            if self._renew():
                next_renew = time.monotonic() + every
            else:
                next_renew = time.monotonic() + min(1.0, every)
                if time.monotonic() - self._last_ok > self.duration_s:
                    self._lose(
                        f"could not renew the Lease for {self.duration_s}s "
                        "(the API server did not answer); another process may own it now"
                    )

    def _seen(self, lease: dict[str, Any]) -> None:
        """A newer version of the Lease: still ours? a rollback request on it?"""
        if _holder(lease) != self.identity or (
            _annotations(lease).get(CHANGE_ANNOTATION) != self.change_id
        ):
            self._lose(f"the Lease now names holder {_holder(lease) or 'nobody'}")
            return
        with self._mu:
            self._lease = lease
        req = RollbackRequest.parse(_annotations(lease).get(REQUEST_ANNOTATION))
        if req is not None and req != self.request:
            if self.request is None:
                self.request_seen_at = time.monotonic()
            self.request = req
            self.interrupt.request(
                StopReason(by=req.by, nodes=req.nodes, request_id=req.id, force=req.force)
            )

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
                written = _write(self.api, self.namespace, body, create=False)
            except ApiException as e:
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
            self._last_ok = time.monotonic()
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
            if lease is None or _holder(lease) != self.identity:
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
                _write(self.api, self.namespace, lease, create=False)
                return
            except ApiException as e:
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
            if lease is None or _holder(lease) != self.identity:
                return
            try:
                _delete(self.api, self.namespace, _rv(lease))
                return
            except ApiException as e:
                if e.status == 404:
                    return
                if e.status != 409:
                    raise ExternalError(
                        f"release Lease {self.namespace}/{NAME}: {describe(e)}"
                    ) from e


# ---------------------------------------------------------------------------------------------
# The requester's side


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
        now = datetime.now(UTC)
        lease = read_lease(api, namespace)
        holder = live_holder(lease, now)
        if lease is None or holder is None:
            return None
        theirs = _annotations(lease).get(CHANGE_ANNOTATION)
        if theirs != change_id:
            raise LockHeldError(
                f"the cluster lock (Lease {namespace}/{NAME}) is held by {holder} for change "
                f"{theirs or 'unknown'}, not {change_id}; nothing was changed"
            )
        annotations = _annotations(lease)
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
                return HandOver(req, holder, _rv(lease))
        else:
            req = RollbackRequest(secrets.token_hex(6), by, tuple(nodes) if nodes else None, force)
        annotations[REQUEST_ANNOTATION] = req.to_json()
        lease["metadata"]["annotations"] = annotations
        try:
            written = _write(api, namespace, lease, create=False)
        except ApiException as e:
            if e.status in (404, 409):
                continue
            raise ExternalError(f"write Lease {namespace}/{NAME}: {describe(e)}") from e
        return HandOver(req, holder, _rv(written))
    raise LockHeldError(f"Lease {namespace}/{NAME} kept changing under us; try again")


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
) -> dict[str, Any] | None:
    """Wait until the owner reports the outcome of ``handed`` on the Lease.

    Returns:
        The outcome (``request``, ``outcome``, ``message``, ``owner``), or None when the owner
        released or lost the Lease without reporting it (it ended before acting on the request,
        or died): the Lease is then free and the caller may do the rollback itself.

    Raises:
        ExternalError: ``timeout_s`` passed first.
    """
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    rv = handed.rv
    while True:
        try:
            for kind, obj in _watch(api, namespace, rv, 5.0):
                if kind == "DELETED":
                    return None
                if kind not in ("ADDED", "MODIFIED"):
                    break
                rv = _rv(obj) or rv
                found = _outcome_of(_annotations(obj))
                if found and found.get("request") == handed.request.id:
                    return found
        except Exception as e:  # the API server is away: read below, or wait
            if on_wait is not None:
                on_wait(f"watching the Lease: {describe(e)}")
            time.sleep(0.5)
        lease = read_lease(api, namespace)
        if lease is None:
            return None
        found = _outcome_of(_annotations(lease))
        if found and found.get("request") == handed.request.id:
            return found
        if live_holder(lease, datetime.now(UTC)) != handed.owner:
            return None
        rv = _rv(lease)
        if deadline is not None and time.monotonic() > deadline:
            raise ExternalError(
                f"the owner {handed.owner} did not report the rollback within {timeout_s:.0f}s"
            )
