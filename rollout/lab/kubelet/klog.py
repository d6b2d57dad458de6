"""klog's text format, so the lab kubelet's log reads (and greps) like the kubelet's journal.

``Lmmdd hh:mm:ss.uuuuuu threadid file:line] "msg" key="value" ...`` with structured values quoted
the way klog quotes them (Go ``strconv.Quote``: inner double quotes become ``\\"``).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
from typing import Any


def quote(value: Any) -> str:
    """A klog structured value: strings and errors quoted like Go's ``%q``; numbers bare."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return str(value)
    return json.dumps(str(value), ensure_ascii=False)


def format_line(severity: str, where: str, msg: str, now: dt.datetime, pid: int, **kv: Any) -> str:
    head = f"{severity}{now:%m%d %H:%M:%S.%f} {pid:7d} {where}] {quote(msg)}"
    tail = "".join(f" {k}={quote(v)}" for k, v in kv.items())
    return head + tail


def unquote(text: str) -> str:
    """Undo klog's quoting of a logged value (for readers of the log, e.g. tests)."""
    return text.replace('\\"', '"').replace("\\\\", "\\")


def log(severity: str, where: str, msg: str, **kv: Any) -> None:
    line = format_line(severity, where, msg, dt.datetime.now(), os.getpid(), **kv)
    sys.stderr.write(line + "\n")
    sys.stderr.flush()
