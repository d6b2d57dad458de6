"""Which change holds the cluster Lease now (read only; ``rollout serve`` asks it per alert).

Why apart from :mod:`rollout.kube.leases`: that module takes, renews and releases the lock; this
only reads it, so an alert never writes to the Lease. A Lease whose renewal is older than its
duration is expired: its holder died, and nobody is live for that change.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from rollout.errors import ExternalError
from rollout.kube.client import Api, call, describe
from rollout.kube.lease_objects import CHANGE_ANNOTATION, NAME, annotations_of, renewed_at
from rollout.kube.rest import AnswerError


def live_lease_change(
    api: Api, namespace: str = "kube-system", now: datetime | None = None
) -> str | None:
    """The change id of the live ``rollout-lock`` Lease, or None (absent, released, expired).

    Raises:
        ExternalError: the Lease cannot be read (other than 404).
    """
    try:
        lease: Any = call("read Lease", api.coordination.read_namespaced_lease, NAME, namespace)
    except AnswerError as e:
        if e.status == 404:
            return None
        raise ExternalError(f"read Lease {namespace}/{NAME}: {describe(e)}") from e
    spec = lease.get("spec") or {}
    if not spec.get("holderIdentity"):
        return None
    renewed = renewed_at(lease)
    duration = spec.get("leaseDurationSeconds")
    if (
        renewed is not None
        and duration
        and renewed + timedelta(seconds=int(duration)) < (now or datetime.now(UTC))
    ):
        return None
    change = annotations_of(lease).get(CHANGE_ANNOTATION)
    return str(change) if change else None
