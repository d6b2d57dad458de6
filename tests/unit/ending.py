"""How the engine's tests read a change's end: the engine returns the change's status, and the
command exits with its outcome's code (``docs/exit-codes.md``), stderr saying
``failure_text``."""

from __future__ import annotations

import re

from rollout.change.engine.orchestrator import failure_text
from rollout.change.record.change_outcomes import ended_exit
from rollout.change.record.replay import ChangeStatus


def ended(status: ChangeStatus, code: int, match: str | None = None) -> str:
    """Assert that a command ending with ``status`` exits ``code`` and says ``match`` (a
    regular expression searched in what it prints on stderr); return what it prints."""
    got = ended_exit(status.outcome, status.cause)
    assert got == code, (got, status.outcome, status.cause, status.message)
    text = failure_text(status)
    if match is not None:
        assert re.search(match, text), text
    return text
