"""Entries written into a change's record by a process that does not run the change: ``rollout
watch``'s verdicts and triggers, ``rollout serve``'s triggers.

Why: a change has exactly one owner, the process holding its Lease, and one writer of its record.
The journal's ``flock`` keeps appends on one machine whole, but the record lives in the cluster too
(``rollout.change.record.cluster_mirror``): a second process mirroring its own copy while the owner
mirrors its own would overwrite the owner's entries there. So such a process never appends on its
own while the change has an owner: it hands the entry to the owner through the Lease
(``rollout.kube.handover.hand_over_record``) and waits until the owner lists it as written; when
nobody owns the change, it takes the Lease for the write (a :class:`ChangeSession` that only writes
the record, marked ``held-for: record`` so a rollback or a new owner waits the moment out instead
of handing it a request), appends, and lets it go. Every entry names its writer (and, handed, who
asked), so this is checked entry by entry (``tests/lab/test_owner_records_lab.py``;
``tests/unit/test_owner_records.py``).
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rollout.change.commands.change_options import ChangeOptions
from rollout.change.commands.session import ONE_OWNER_HERE, ChangeSession
from rollout.change.record.journal import Journal
from rollout.change.record.opening import existing_journal, to_stderr
from rollout.errors import ExternalError, LockHeldError
from rollout.identity import process_identity
from rollout.models import Phase
from rollout.retrying import Poll

if TYPE_CHECKING:
    from rollout.kube.client import Api

RECORD_TIMEOUT_S = 30.0
"""How long a handed entry may take to be written (the owner writes it within moments)."""
LOOK_AGAIN = Poll(fast_s=0.05, fast_for_s=2.0, slow_s=0.25)
"""How often to look at the Lease again when this process's own rollback is taking it."""


class OwnerRecords:
    """Writes entries into ``change_id``'s record as its one writer allows (see the module doc).

    Called as ``record(step, data)``: the ``Recorder`` the gate journals verdicts through, and
    ``rollout serve``'s trigger recorder (with the change id bound).

    Args:
        api: the API connection. namespace: the Lease's (``--lock-namespace``).
        say: warnings (the cluster mirror's, a fetched record).
        timeout_s: how long one entry may take, handed or not.
    """

    def __init__(
        self,
        api: Api,
        namespace: str,
        change_id: str,
        say: Callable[[str], None] = to_stderr,
        *,
        timeout_s: float = RECORD_TIMEOUT_S,
        sleep: Callable[[float], None] = time.sleep,
        monotonic: Callable[[], float] = time.monotonic,
    ) -> None:
        self.api, self.namespace, self.change_id = api, namespace, change_id
        self.say, self.timeout_s = say, timeout_s
        self.sleep, self.monotonic = sleep, monotonic

    def __call__(self, step: str, data: Mapping[str, Any]) -> str:
        """Write one entry (phase ``done``) into the change's record.

        Returns:
            ``handed`` (the owner wrote it) or ``written`` (this process, under the Lease).

        Raises:
            LockHeldError: the Lease is held for another change (nobody may write this one's
                record meanwhile).
            ExternalError: the entry was not written within ``timeout_s`` (an owner that does not
                take handed entries, e.g. an older rollout; the API server away).
        """
        from rollout.kube.handover import hand_over_record, wait_recorded
        from rollout.kube.lease_objects import RecordRequest

        req = RecordRequest(secrets.token_hex(6), process_identity(), str(step), dict(data))
        started = self.monotonic()
        while True:
            left = self.timeout_s - (self.monotonic() - started)
            if left <= 0:
                raise ExternalError(
                    f"the {step} entry of change {self.change_id} was not written within "
                    f"{self.timeout_s:.0f}s (its owner did not take it, or the Lease stayed busy)"
                )
            handed = hand_over_record(self.api, self.namespace, self.change_id, req)
            if handed is not None:
                ok = wait_recorded(
                    self.api,
                    self.namespace,
                    handed,
                    left,
                    sleep=self.sleep,
                    monotonic=self.monotonic,
                )
                if ok:
                    return "handed"
                continue  # the owner let go first: nobody, or a new owner, has the change now
            if self._write_here(req):
                return "written"
            self.sleep(LOOK_AGAIN.interval(self.monotonic() - started))

    def _write_here(self, req: Any) -> bool:
        """Take the Lease for this one entry and write it; False when that is not possible now
        (another process took the Lease meanwhile, or a rollback in this process is taking it):
        the caller looks at the Lease again."""
        from rollout.kube.lease_objects import HELD_FOR_RECORD
        from rollout.kube.leases import LeaseLock

        if not ONE_OWNER_HERE.acquire(blocking=False):
            return False
        try:
            lock = LeaseLock(self.api, self.namespace, held_for=HELD_FOR_RECORD)
            opts = ChangeOptions(lock_namespace=self.namespace)

            def opened(change_id: str) -> Journal:
                # read once the Lease is held: an owner that let it go a moment before wrote its
                # last entries into the cluster record
                return existing_journal(change_id, self.api, self.namespace, self.say)

            try:
                with ChangeSession(
                    self.api, lock, opts, None, say=self.say, opener=(self.change_id, opened)
                ) as session:
                    journal = session.journal
                    if any(e.handed and e.handed.id == req.id for e in journal.entries()):
                        return True  # the owner wrote it, then let go before it said so
                    journal.append(req.step, Phase.DONE, now=datetime.now(UTC), data=req.data)
            except LockHeldError:
                return False
            return True
        finally:
            ONE_OWNER_HERE.release()
