"""Who this process is, in words an operator can act on: ``user@host pid N``.

Why a module of its own, at the bottom: the Lease names its holder with it (``rollout.kube``) and
the journal names each entry's writer with it (``rollout.change.record.journal``), so "one owner
per change" can be checked entry by entry: every entry written while a process held the change's
Lease names that process (``tests/lab/test_owner_records_lab.py``).
"""

from __future__ import annotations

import getpass
import os
import socket

_CACHED: tuple[int, str] | None = None


def process_identity() -> str:
    """``user@host pid N`` of this process (computed once per process id)."""
    global _CACHED
    pid = os.getpid()
    if _CACHED is None or _CACHED[0] != pid:
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = str(os.getuid())
        _CACHED = (pid, f"{user}@{socket.gethostname()} pid {pid}")
    return _CACHED[1]
