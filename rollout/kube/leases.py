"""The cluster lock: a coordination.k8s.io Lease named ``rollout-lock``.

Why a Lease in the cluster, not a file on the operator's laptop: two operators (or a cron job and
an operator) must not change nodes at the same time, wherever they run. The Lease names its holder
(``user@host pid``) and carries the change id as an annotation; it is renewed while the change runs,
so a crashed holder's lock expires on its own. A change may always take back its own lock, which is
what ``resume`` and ``rollback`` do; a second, different change is refused with the holder named.
"""

from __future__ import annotations

import getpass
import os
import socket
import threading
from datetime import UTC, datetime, timedelta
from typing import Any

from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rollout.errors import ExternalError, LockHeldError
from rollout.kube.client import Api, call, describe

NAME = "rollout-lock"
CHANGE_ANNOTATION = "rollout.dev/change-id"


def holder_identity() -> str:
    """``user@host pid N``: who holds the lock, in words an operator can act on."""
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = str(os.getuid())
    return f"{user}@{socket.gethostname()} pid {os.getpid()}"


class LeaseLock:
    """Implements the orchestrator's ``Lock`` Protocol with a Lease, renewed by a thread."""

    def __init__(self, api: Api, namespace: str = "kube-system", duration_s: int = 30) -> None:
        self.api = api
        self.namespace = namespace
        self.duration_s = duration_s
        self.identity = holder_identity()
        self.change_id: str | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def check(self) -> None:
        """Preflight: refuse early when another change holds a live Lease (nothing is written).

        Raises:
            LockHeldError: the holder and its change named.
        """
        try:
            lease: Any = call(
                "read Lease", self.api.coordination.read_namespaced_lease, NAME, self.namespace
            )
        except ApiException as e:
            if e.status == 404:
                return
            raise ExternalError(f"read Lease {self.namespace}/{NAME}: {describe(e)}") from e
        self._check_free(lease, "", datetime.now(UTC))

    def acquire(self, change_id: str) -> None:
        """Take the Lease for ``change_id`` and start renewing it.

        Raises:
            LockHeldError: a live Lease for another change exists (its holder named).
        """
        for _ in range(3):
            now = datetime.now(UTC)
            try:
                lease: Any = call(
                    "read Lease", self.api.coordination.read_namespaced_lease, NAME, self.namespace
                )
            except ApiException as e:
                if e.status != 404:
                    raise ExternalError(f"read Lease {self.namespace}/{NAME}: {describe(e)}") from e
                lease = None
            if lease is not None:
                self._check_free(lease, change_id, now)
            body = self._body(change_id, now, lease)
            try:
                if lease is None:
                    call(
                        "create Lease",
                        self.api.coordination.create_namespaced_lease,
                        self.namespace,
                        body,
                    )
                else:
                    call(
                        "update Lease",
                        self.api.coordination.replace_namespaced_lease,
                        NAME,
                        self.namespace,
                        body,
                    )
            except ApiException as e:
                if e.status == 409:
                    continue  # someone else wrote it meanwhile: read again
                raise ExternalError(f"write Lease {self.namespace}/{NAME}: {describe(e)}") from e
            self.change_id = change_id
            self._start_renewing()
            return
        raise LockHeldError(
            f"Lease {self.namespace}/{NAME} changed under us three times; try again"
        )

    def _check_free(self, lease: Any, change_id: str, now: datetime) -> None:
        spec = lease.spec
        holder = spec.holder_identity if spec else None
        theirs = (lease.metadata.annotations or {}).get(CHANGE_ANNOTATION)
        if not holder or theirs == change_id:
            return
        renewed = spec.renew_time or spec.acquire_time
        duration = spec.lease_duration_seconds or self.duration_s
        if renewed is not None:
            if renewed.tzinfo is None:
                renewed = renewed.replace(tzinfo=UTC)
            if renewed + timedelta(seconds=duration) < now:
                return  # expired: the holder died without releasing
        age = f", renewed {int((now - renewed).total_seconds())}s ago" if renewed else ""
        raise LockHeldError(
            f"another change holds the cluster lock (Lease {self.namespace}/{NAME}): "
            f"holder {holder}, change {theirs or 'unknown'}{age}"
        )

    def _body(self, change_id: str, now: datetime, old: Any) -> client.V1Lease:
        meta = client.V1ObjectMeta(
            name=NAME,
            namespace=self.namespace,
            annotations={CHANGE_ANNOTATION: change_id},
            resource_version=old.metadata.resource_version if old else None,
        )
        return client.V1Lease(
            metadata=meta,
            spec=client.V1LeaseSpec(
                holder_identity=self.identity,
                lease_duration_seconds=self.duration_s,
                acquire_time=now,
                renew_time=now,
            ),
        )

    def _start_renewing(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._renew_loop, name="lease-renew", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.duration_s / 3):
            try:
                call(
                    "renew Lease",
                    self.api.coordination.patch_namespaced_lease,
                    NAME,
                    self.namespace,
                    {"spec": {"renewTime": _micro(datetime.now(UTC))}},
                    retry_s=self.duration_s / 3,
                )
            except (ApiException, ExternalError):
                continue  # the next tick tries again; expiry is the safety net

    def release(self) -> None:
        """Stop renewing and clear the holder (only if the Lease is still ours)."""
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
        if self.change_id is None:
            return
        try:
            lease: Any = call(
                "read Lease", self.api.coordination.read_namespaced_lease, NAME, self.namespace
            )
            if (lease.metadata.annotations or {}).get(CHANGE_ANNOTATION) == self.change_id:
                call(
                    "delete Lease",
                    self.api.coordination.delete_namespaced_lease,
                    NAME,
                    self.namespace,
                )
        except ApiException as e:
            if e.status != 404:
                raise ExternalError(f"release Lease {self.namespace}/{NAME}: {describe(e)}") from e
        self.change_id = None


def _micro(t: datetime) -> str:
    return t.strftime("%Y-%m-%dT%H:%M:%S.%fZ")
