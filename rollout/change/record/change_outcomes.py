"""How a change ends, as a value: the outcome the journal's change-level ``done`` records, and the
exit code a command that ends with it returns (``docs/exit-codes.md``).

Why a module of its own: the outcome used to travel as about 45 string literals in 16 files, and
the exit code was whatever exception happened to be raised on the way out. The journal stores the
enum's value, so a journal written before the enum reads the same.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum


class ChangeOutcome(StrEnum):
    """The change's outcome after its last change-level journal entry."""

    RUNNING = "running"
    """Started and not ended: forward work in flight, or a crash left it (``rollout resume``)."""
    COMPLETED = "completed"
    """Every batch applied and every gate passed."""
    HELD = "held"
    """Stopped on purpose with the applied nodes on the new config: after the canary
    (``apply --canary``), when the change window closed, or while the gate holds."""
    STOPPED = "stopped"
    """A node failed, a node's files changed under us, or the Lease was lost: nothing new started,
    the nodes in flight restored."""
    ROLLED_BACK = "rolled-back"
    """The gate failed, or a rollback was requested or run: the nodes named are restored."""
    ROLLBACK_FAILED = "rollback-failed"
    """A rollback ran and at least one node could not be restored (the journal says which)."""
    RESUMED = "resumed"
    """``rollout resume`` settled every node a crash left mid-step."""
    RESUME_FAILED = "resume-failed"
    """``rollout resume`` could not settle a node."""
    HANDED_OVER = "handed-over"
    """Not a journal outcome: a rollback request was handed to the change's live owner and the
    requester did not wait for its report (``rollout rollback --no-wait``, the webhook)."""


class StopCause(StrEnum):
    """Why a change ended as it did, where the outcome alone does not say: the change-level end
    records it as ``cause``, and a ``stopped`` change's exit code is its cause's
    (:data:`CAUSE_EXIT`). A journal written before causes were recorded has none."""

    NODE_FAILED = "node-failed"
    """A step on a node failed; the node was restored."""
    FILES_CHANGED = "files-changed"
    """Only nodes whose files changed after preflight failed: nothing written, cordons undone."""
    LEASE_LOST = "lease-lost"
    """The owner lost the Lease: it started nothing new."""
    GATE_FAILED = "gate-failed"
    """The gate failed; the nodes it named were restored."""
    REQUESTED = "requested"
    """A rollback handed to the change's owner (``rollout rollback``, the alert trigger)."""
    ROLLBACK = "rollback"
    """A rollback ran as the change's own command: ``rollout rollback``, or ``rollout resume``
    finishing an interrupted one. Its end exits by :data:`ROLLBACK_EXIT`."""
    RESUME = "resume"
    """``rollout resume`` ended the change."""


CAUSE_EXIT: Mapping[StopCause | None, int] = {
    StopCause.FILES_CHANGED: 3,
    StopCause.LEASE_LOST: 4,
}
"""The exit code of a ``stopped`` change by its cause; any other cause (or none) is 5."""

ENDED_BY_ROLLBACK = frozenset({ChangeOutcome.ROLLED_BACK, ChangeOutcome.ROLLBACK_FAILED})
"""The outcomes a requester waiting on the Lease is told about (``LeaseLock.report``)."""

BY_CAUSE = None
"""An exit code decided by the cause, not the outcome: the error's own code."""

FORWARD_EXIT: Mapping[ChangeOutcome, int | None] = {
    ChangeOutcome.RUNNING: 0,
    ChangeOutcome.COMPLETED: 0,
    ChangeOutcome.HELD: 0,
    ChangeOutcome.RESUMED: 0,
    ChangeOutcome.HANDED_OVER: 0,
    ChangeOutcome.ROLLED_BACK: 5,
    ChangeOutcome.ROLLBACK_FAILED: 5,
    ChangeOutcome.RESUME_FAILED: 5,
    ChangeOutcome.STOPPED: BY_CAUSE,
}
"""Exit code of ``apply`` and ``promote`` (and of ``resume`` going on with them) by the outcome
they end with. ``held``
while the gate holds (Inconclusive or Error) is 8 (:data:`GATE_HOLDS_EXIT`); ``stopped`` is 3
(a node's files changed: ``NodeFilesChangedError``), 4 (the Lease was lost) or 5 (a node
failed)."""

ROLLBACK_EXIT: Mapping[ChangeOutcome, int | None] = {
    **FORWARD_EXIT,
    ChangeOutcome.ROLLED_BACK: 0,  # what ``rollout rollback`` was asked for
}
"""Exit code of ``rollout rollback`` by the outcome it ends with (its own or the one the change's
owner reports), and of ``rollout resume`` finishing an interrupted rollback."""

GATE_HOLDS_EXIT = 8
"""Exit code of ``rollout watch`` and ``rollout apply`` when the gate holds."""


def exit_code(outcome: ChangeOutcome | str, rollback: bool = False) -> int | None:
    """The exit code for ``outcome`` (:data:`FORWARD_EXIT`, or :data:`ROLLBACK_EXIT` for the
    rollback command); None: by cause. An outcome this version does not know is 1."""
    table = ROLLBACK_EXIT if rollback else FORWARD_EXIT
    try:
        return table[ChangeOutcome(outcome)]
    except ValueError:
        return 1


def ended_exit(
    outcome: ChangeOutcome | str, cause: StopCause | None, rollback: bool = False
) -> int:
    """The exit code of a command that ended with ``outcome`` for ``cause``: :func:`exit_code`
    (by :data:`ROLLBACK_EXIT` when ``rollback`` or the cause is a rollback's), with "by cause"
    resolved by :data:`CAUSE_EXIT`."""
    code = exit_code(outcome, rollback or cause is StopCause.ROLLBACK)
    return CAUSE_EXIT.get(cause, 5) if code is BY_CAUSE else code
