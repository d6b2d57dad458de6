"""Change windows: when forward steps (apply, the next batch) may run.

Why a module of its own, and pure: the promise to the people who approve a change is that nothing
moves outside the window except a rollback. That promise is only as good as the time arithmetic
behind it (a window that crosses midnight, a time zone on the day its clocks change), so the logic
takes the clock as a parameter and is table-tested; the CLI and the orchestrator only ask it.

The plan's ``windows:`` section, a list (no windows at all: always open)::

    windows:
      - name: weeknights          # optional, shown in messages
        days: [mon, tue, wed, thu] # the days the window OPENS on; also "mon-fri", "daily"
        start: "22:00"
        end: "04:00"               # end <= start: the window closes the next day
        timeZone: Europe/Berlin    # IANA name (zoneinfo); default UTC

Local wall times are turned into instants with :mod:`zoneinfo`. A start that does not exist (the
hour skipped when clocks go forward) is taken at the same offset as before the change, i.e. one
hour later on the wall clock; a start that happens twice (clocks go back) is the first one. So a
window's length in real time grows or shrinks by the hour on those two days, like the wall clock.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from rollout.errors import InputError, Location

DAY_NAMES = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
WINDOW_KEYS = ("name", "days", "start", "end", "timeZone")
_TIME = re.compile(r"^([01]?\d|2[0-3]):([0-5]\d)$")
_LONG = {
    "monday": "mon",
    "tuesday": "tue",
    "wednesday": "wed",
    "thursday": "thu",
    "friday": "fri",
    "saturday": "sat",
    "sunday": "sun",
}


@dataclass(frozen=True)
class Window:
    """One recurring change window.

    Attributes:
        days: weekdays (0 = Monday) on which the window opens.
        start: local opening time.
        end: local closing time; ``end <= start`` closes on the following day (equal: 24 hours).
        tz: IANA time zone name.
        name: label for messages ("" when unnamed).
    """

    days: frozenset[int]
    start: time
    end: time
    tz: str = "UTC"
    name: str = ""

    @property
    def crosses_midnight(self) -> bool:
        return self.end <= self.start

    @property
    def days_text(self) -> str:
        """``mon,tue`` or ``daily``."""
        if len(self.days) == 7:
            return "daily"
        return ",".join(DAY_NAMES[d] for d in sorted(self.days))

    def describe(self) -> str:
        """``weeknights (mon,tue 22:00-04:00 Europe/Berlin)``."""
        text = f"{self.days_text} {self.start:%H:%M}-{self.end:%H:%M} {self.tz}"
        return f"{self.name} ({text})" if self.name else text

    def interval(self, opening_day: date) -> tuple[datetime, datetime]:
        """The ``[open, close)`` instants of the occurrence that opens on ``opening_day``."""
        zone = ZoneInfo(self.tz)
        opens = datetime.combine(opening_day, self.start, tzinfo=zone)
        end_day = opening_day + timedelta(days=1) if self.crosses_midnight else opening_day
        closes = datetime.combine(end_day, self.end, tzinfo=zone)
        return opens, closes

    def occurrences(
        self, now: datetime, days_back: int, days_ahead: int
    ) -> list[tuple[datetime, datetime]]:
        """Occurrences opening from ``days_back`` days before to ``days_ahead`` after ``now``'s
        local date, in order."""
        today = now.astimezone(ZoneInfo(self.tz)).date()
        out = []
        for offset in range(-days_back, days_ahead + 1):
            day = today + timedelta(days=offset)
            if day.weekday() in self.days:
                out.append(self.interval(day))
        return out


@dataclass(frozen=True)
class Decision:
    """Whether a forward step may run now, and why.

    Attributes:
        allowed: the step may run.
        reason: a sentence for the operator (and the journal).
        forced: allowed only because of ``--force-window``.
        force_reason: the operator's reason for forcing ("" when not forced).
        next_opening: when the next window opens (None when open or no windows).
        closes: when the window that is open now closes (None when closed or no windows).
    """

    allowed: bool
    reason: str
    forced: bool = False
    force_reason: str = ""
    next_opening: datetime | None = None
    closes: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (what the journal records)."""
        return {
            "allowed": self.allowed,
            "reason": self.reason,
            "forced": self.forced,
            "forceReason": self.force_reason,
            "nextOpening": self.next_opening.isoformat() if self.next_opening else None,
            "closes": self.closes.isoformat() if self.closes else None,
        }


def _parse_days(value: Any, where: Location) -> frozenset[int]:
    if value is None:
        return frozenset(range(7))
    items: list[str]
    if isinstance(value, str):
        if value.strip().lower() in ("daily", "*", "every day"):
            return frozenset(range(7))
        items = [v for v in re.split(r"[,\s]+", value.strip()) if v]
    elif isinstance(value, list):
        items = [str(v) for v in value]
    else:
        raise InputError("must be a list of days (mon..sun) or a range such as mon-fri", where)
    days: set[int] = set()
    for item in items:
        parts = item.lower().split("-")
        if len(parts) > 2 or not item:
            raise InputError(f"not a day or day range: {item!r}", where)
        idx = []
        for p in parts:
            p = _LONG.get(p, p)
            if p not in DAY_NAMES:
                from rollout.errors import suggest

                raise InputError(f"unknown day {p!r}{suggest(p, DAY_NAMES)}; use mon..sun", where)
            idx.append(DAY_NAMES.index(p))
        if len(idx) == 1:
            days.add(idx[0])
        else:  # a range, wrapping over the week end (fri-mon)
            d = idx[0]
            days.add(d)
            while d != idx[1]:
                d = (d + 1) % 7
                days.add(d)
    if not days:
        raise InputError("must name at least one day", where)
    return frozenset(days)


def _parse_time(value: Any, where: Location) -> time:
    # YAML 1.1 reads an unquoted 22:00 as a base-60 integer (1320): accept it.
    if isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 24 * 60:
        return time(value // 60, value % 60)
    m = _TIME.match(value.strip()) if isinstance(value, str) else None
    if not m:
        raise InputError(f"not a time of day: {value!r} (use HH:MM, 24-hour)", where)
    return time(int(m.group(1)), int(m.group(2)))


def parse_windows(
    raw: Sequence[Any] | None,
    *,
    file: str | None = None,
    line_of: Callable[[str], int | None] | None = None,
) -> tuple[Window, ...]:
    """Parse and validate the plan's ``windows:`` list.

    Args:
        raw: ``Plan.windows`` (None or empty: no windows, always open).
        file: the plan file, for messages.
        line_of: maps a dotted field (``windows[0].start``) to its line (``Plan.line_of``).

    Raises:
        InputError: naming file, field and line.
    """

    def loc(f: str) -> Location:
        return Location(file, f, line_of(f) if line_of else None)

    out = []
    for i, item in enumerate(raw or ()):
        base = f"windows[{i}]"
        if not isinstance(item, Mapping):
            raise InputError("must be a mapping with start, end (and days, timeZone)", loc(base))
        for key in item:
            if key not in WINDOW_KEYS:
                from rollout.errors import suggest

                raise InputError(
                    f"unknown field{suggest(str(key), WINDOW_KEYS)}", loc(f"{base}.{key}")
                )
        for key in ("start", "end"):
            if key not in item:
                raise InputError(f"missing field {key!r}", loc(base))
        tz = str(item.get("timeZone", "UTC"))
        try:
            ZoneInfo(tz)
        except (ZoneInfoNotFoundError, ValueError) as e:
            raise InputError(
                f"unknown time zone {tz!r} (use an IANA name such as Europe/Berlin)",
                loc(f"{base}.timeZone"),
            ) from e
        out.append(
            Window(
                days=_parse_days(item.get("days"), loc(f"{base}.days")),
                start=_parse_time(item["start"], loc(f"{base}.start")),
                end=_parse_time(item["end"], loc(f"{base}.end")),
                tz=tz,
                name=str(item.get("name") or ""),
            )
        )
    return tuple(out)


def _require_aware(now: datetime) -> None:
    if now.tzinfo is None or now.utcoffset() is None:
        raise ValueError("now must be timezone-aware")


def open_window(windows: Sequence[Window], now: datetime) -> tuple[Window, datetime] | None:
    """The window open at ``now`` with its closing instant (the latest closing if several)."""
    _require_aware(now)
    best: tuple[Window, datetime] | None = None
    for w in windows:
        for opens, closes in w.occurrences(now, days_back=1, days_ahead=0):
            if opens <= now < closes and (best is None or closes > best[1]):
                best = (w, closes)
    return best


def is_open(windows: Sequence[Window], now: datetime) -> bool:
    """Whether forward steps may run at ``now`` (always, when no windows are configured)."""
    return not windows or open_window(windows, now) is not None


def next_opening(windows: Sequence[Window], now: datetime) -> datetime:
    """``now`` when a window is open (or none is configured), else the next opening instant.

    The result is in the time zone of the window that opens.
    """
    _require_aware(now)
    if is_open(windows, now):
        return now
    starts = [
        opens
        for w in windows
        for opens, _ in w.occurrences(now, days_back=0, days_ahead=8)
        if opens > now
    ]
    return min(starts)


def forward_allowed(windows: Sequence[Window], now: datetime, force_reason: str | None) -> Decision:
    """May a forward step (apply, the next batch) run at ``now``?

    Rollback never asks: it is always allowed.

    Args:
        windows: the plan's windows (empty: always open).
        now: the current time, timezone-aware.
        force_reason: ``--force-window REASON``; a non-empty reason allows the step anyway.
    """
    _require_aware(now)
    if not windows:
        return Decision(True, "no change windows configured")
    current = open_window(windows, now)
    if current is not None:
        w, closes = current
        return Decision(
            True,
            f"inside change window {w.describe()}, closes {_fmt(closes)}",
            closes=closes,
        )
    nxt = next_opening(windows, now)
    listed = "; ".join(w.describe() for w in windows)
    if force_reason and force_reason.strip():
        return Decision(
            True,
            f"outside every change window ({listed}); forced: {force_reason.strip()}",
            forced=True,
            force_reason=force_reason.strip(),
            next_opening=nxt,
        )
    return Decision(
        False,
        f"outside every change window ({listed}); the next one opens {_fmt(nxt)}; "
        "rollback is always allowed; --force-window REASON overrides",
        next_opening=nxt,
    )


def guard(windows: Sequence[Window], force_reason: str | None) -> Callable[[datetime], Decision]:
    """``forward_allowed`` with the windows and reason bound: what the orchestrator calls before
    each forward batch with the clock's ``now()``."""

    def check(now: datetime) -> Decision:
        return forward_allowed(windows, now, force_reason)

    return check


def _fmt(t: datetime) -> str:
    utc = t.astimezone(ZoneInfo("UTC"))
    return f"{t:%a %Y-%m-%d %H:%M %Z} ({utc:%Y-%m-%d %H:%M} UTC)"
