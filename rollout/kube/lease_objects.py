"""The Lease object itself: its names, its rules, and its raw reads and compare-and-swap writes.

Why apart: the Lease has two users with opposite roles. The owner of a change
(:mod:`rollout.kube.leases`) takes, renews and releases it; a requester
(:mod:`rollout.kube.handover`) writes a rollback request on it and waits for the outcome. Both
read and write the same object the same way; this module is that shared ground, so neither side
imports the other. The rules (when a Lease is free, who holds it, what a request looks like) are
pure functions over the Lease as the API server returns it (a dict), unit-tested on plain data.
"""

from __future__ import annotations

import getpass
import json
import os
import socket
import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from rollout.errors import ExternalError
from rollout.kube.client import Api, call, describe
from rollout.kube.rest import AnswerError

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
