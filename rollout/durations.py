"""Go durations (``time.ParseDuration``): the one parser for every duration rollout reads.

The kubelet's config (``v1.Duration`` fields) and the plan (``strategy.drain.timeout``,
``gate.window``, ``gate.soak``, ...) use the same text: a sequence of decimal numbers, each with
an optional fraction and a unit, ``ns``, ``us`` (or ``µs``), ``ms``, ``s``, ``m``, ``h``; an
optional sign; ``0`` alone needs no unit. So ``1m30s``, ``500ms``, ``2h``, ``1.5h`` and ``-1s``
parse, and ``90``, ``1d``, ``1.5.5s`` and ``s`` do not (as in Go).
"""

from __future__ import annotations

import re

_UNITS = {
    "ns": 1e-9,
    "us": 1e-6,
    "µs": 1e-6,  # U+00B5 micro sign
    "μs": 1e-6,  # U+03BC Greek mu
    "ms": 1e-3,
    "s": 1.0,
    "m": 60.0,
    "h": 3600.0,
}
# "ms" before "m" and "s": the alternation takes the first that matches
_ELEMENT = re.compile(r"(\d+\.?\d*|\.\d+)(ns|us|µs|μs|ms|s|m|h)")


def parse_go_duration(text: str) -> float:
    """Seconds in ``text`` read as Go's ``time.ParseDuration`` reads it.

    Raises:
        ValueError: ``text`` is not a Go duration (message in Go's wording).
    """
    s = text
    sign = 1.0
    if s[:1] in ("+", "-"):
        sign = -1.0 if s[0] == "-" else 1.0
        s = s[1:]
    if s == "0":
        return 0.0
    if not s:
        raise ValueError(f'time: invalid duration "{text}"')
    total = 0.0
    pos = 0
    while pos < len(s):
        m = _ELEMENT.match(s, pos)
        if not m:
            missing = not re.match(r"\d*\.?\d*[^\d.]", s[pos:])
            what = "missing unit in" if missing else "invalid"
            raise ValueError(f'time: {what} duration "{text}"')
        total += float(m.group(1)) * _UNITS[m.group(2)]
        pos = m.end()
    return sign * total


def is_go_duration(text: str) -> bool:
    """Whether the kubelet would decode ``text`` into a ``v1.Duration``."""
    try:
        parse_go_duration(text)
    except ValueError:
        return False
    return True
