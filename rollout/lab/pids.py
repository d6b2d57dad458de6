"""Signalling the lab's own processes: each PID is checked to still be the program the lab
started (``/proc/<pid>/exe`` or its command line) before it is signalled."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path

from rollout.lab import nodes as n


def exe_is(pid: int, want: Path) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")) == want
    except OSError:
        return False


def cmd_has(pid: int, needle: str) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _gone(pid: int) -> bool:
    child = n.CHILDREN.pop(pid, None)
    if child is not None:
        if child.poll() is None:
            n.CHILDREN[pid] = child
            return False
        return True
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def terminate(pids: Sequence[int], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``: only PIDs the caller has verified are ours."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in pids:
        while not _gone(p) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _gone(p):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
