"""Change windows: table-driven across days, midnight, time zones and DST changes."""

from __future__ import annotations

from datetime import datetime
from zoneinfo import ZoneInfo

import pytest

from rollout.change.plan.schema import parse_plan
from rollout.change.plan.windows import forward_allowed, guard, is_open, next_opening, parse_windows
from rollout.errors import InputError

UTC = ZoneInfo("UTC")
BERLIN = ZoneInfo("Europe/Berlin")
NY = ZoneInfo("America/New_York")

WEEKNIGHTS = [{"days": "mon-thu", "start": "22:00", "end": "04:00", "timeZone": "Europe/Berlin"}]
SAT_MORNING = [{"days": ["sat"], "start": "06:00", "end": "10:00"}]  # UTC
NY_NIGHT = [{"days": "daily", "start": "01:00", "end": "03:00", "timeZone": "America/New_York"}]
BERLIN_EARLY = [{"days": ["sun"], "start": "02:30", "end": "05:00", "timeZone": "Europe/Berlin"}]


def at(tz: ZoneInfo, *args: int) -> datetime:
    return datetime(*args, tzinfo=tz)  # type: ignore[misc]


# 2026-03-02 is a Monday. Europe/Berlin: CET (+1) until 2026-03-29 02:00 -> CEST (+2);
# back to CET on 2026-10-25 03:00. America/New_York: EDT from 2026-03-08 02:00, EST 2026-11-01.
IS_OPEN = [
    # (case, windows, now, open?)
    ("monday night, inside", WEEKNIGHTS, at(BERLIN, 2026, 3, 2, 23, 0), True),
    ("monday, before start", WEEKNIGHTS, at(BERLIN, 2026, 3, 2, 21, 59), False),
    ("exactly at start", WEEKNIGHTS, at(BERLIN, 2026, 3, 2, 22, 0), True),
    ("after midnight, tuesday", WEEKNIGHTS, at(BERLIN, 2026, 3, 3, 3, 59), True),
    ("exactly at end", WEEKNIGHTS, at(BERLIN, 2026, 3, 3, 4, 0), False),
    ("thursday night into friday", WEEKNIGHTS, at(BERLIN, 2026, 3, 6, 1, 0), True),
    ("friday night: no window opens", WEEKNIGHTS, at(BERLIN, 2026, 3, 6, 23, 0), False),
    ("monday early: sunday had no window", WEEKNIGHTS, at(BERLIN, 2026, 3, 2, 1, 0), False),
    ("same instant given in UTC", WEEKNIGHTS, at(UTC, 2026, 3, 2, 22, 30), True),  # 23:30 CET
    ("UTC instant before Berlin start", WEEKNIGHTS, at(UTC, 2026, 3, 2, 20, 30), False),
    ("saturday utc inside", SAT_MORNING, at(UTC, 2026, 3, 7, 9, 59), True),
    ("saturday seen from tokyo", SAT_MORNING, at(ZoneInfo("Asia/Tokyo"), 2026, 3, 7, 16), True),
    ("sunday utc", SAT_MORNING, at(UTC, 2026, 3, 8, 7, 0), False),
    ("no windows: always open", [], at(UTC, 2026, 3, 8, 7, 0), True),
    # DST, spring forward in New York: 02:00 EST -> 03:00 EDT on 2026-03-08; window 01:00-03:00
    ("NY spring day, 01:30 EST", NY_NIGHT, at(NY, 2026, 3, 8, 1, 30), True),
    ("NY spring day, 06:59 UTC = 01:59 EST", NY_NIGHT, at(UTC, 2026, 3, 8, 6, 59), True),
    ("NY spring day, 07:00 UTC = 03:00 EDT", NY_NIGHT, at(UTC, 2026, 3, 8, 7, 0), False),
    # DST, fall back in New York: 01:00-02:00 happens twice on 2026-11-01; window lasts 3 h
    ("NY fall day, second 01:30 (EST)", NY_NIGHT, at(UTC, 2026, 11, 1, 6, 30), True),
    ("NY fall day, 02:30 EST", NY_NIGHT, at(UTC, 2026, 11, 1, 7, 30), True),
    ("NY fall day, 03:00 EST", NY_NIGHT, at(UTC, 2026, 11, 1, 8, 0), False),
    # a start inside the skipped hour (02:30 on 2026-03-29 Berlin) opens at 03:30 CEST
    ("Berlin skipped start, 03:29 CEST", BERLIN_EARLY, at(UTC, 2026, 3, 29, 1, 29), False),
    ("Berlin skipped start, 03:30 CEST", BERLIN_EARLY, at(UTC, 2026, 3, 29, 1, 30), True),
]


@pytest.mark.parametrize(("case", "raw", "now", "expected"), IS_OPEN, ids=[r[0] for r in IS_OPEN])
def test_is_open(case: str, raw: list[dict[str, str]], now: datetime, expected: bool) -> None:
    assert is_open(parse_windows(raw), now) is expected


NEXT = [
    (
        "friday night -> monday 22:00",
        WEEKNIGHTS,
        at(BERLIN, 2026, 3, 6, 23),
        at(BERLIN, 2026, 3, 9, 22),
    ),
    ("monday noon -> tonight", WEEKNIGHTS, at(BERLIN, 2026, 3, 2, 12), at(BERLIN, 2026, 3, 2, 22)),
    (
        "saturday after -> next saturday",
        SAT_MORNING,
        at(UTC, 2026, 3, 7, 10),
        at(UTC, 2026, 3, 14, 6),
    ),
    ("open now -> now", SAT_MORNING, at(UTC, 2026, 3, 7, 7), at(UTC, 2026, 3, 7, 7)),
    # the week Berlin changes to summer time: Monday 22:00 CEST is 20:00 UTC, not 21:00
    ("across spring forward", WEEKNIGHTS, at(BERLIN, 2026, 3, 27, 12), at(UTC, 2026, 3, 30, 20)),
    ("across fall back", WEEKNIGHTS, at(BERLIN, 2026, 10, 23, 12), at(UTC, 2026, 10, 26, 21)),
    (
        "two windows: the earlier wins",
        WEEKNIGHTS + SAT_MORNING,
        at(BERLIN, 2026, 3, 6, 23),
        at(UTC, 2026, 3, 7, 6),
    ),
]


@pytest.mark.parametrize(("case", "raw", "now", "expected"), NEXT, ids=[r[0] for r in NEXT])
def test_next_opening(
    case: str, raw: list[dict[str, str]], now: datetime, expected: datetime
) -> None:
    got = next_opening(parse_windows(raw), now)
    assert got == expected
    assert got >= now


def test_forward_refused_names_next_opening_and_force_is_recorded() -> None:
    ws = parse_windows(WEEKNIGHTS)
    now = at(BERLIN, 2026, 3, 6, 23)
    refused = forward_allowed(ws, now, None)
    assert not refused.allowed and not refused.forced
    assert refused.next_opening == at(BERLIN, 2026, 3, 9, 22)
    assert "Mon 2026-03-09 22:00 CET" in refused.reason
    assert "--force-window" in refused.reason
    assert not forward_allowed(ws, now, "   ").allowed  # a blank reason is no reason
    forced = forward_allowed(ws, now, "incident 4711")
    assert forced.allowed and forced.forced and forced.force_reason == "incident 4711"
    assert forced.as_dict()["forceReason"] == "incident 4711"
    inside = guard(ws, None)(at(BERLIN, 2026, 3, 2, 23))
    assert inside.allowed and not inside.forced
    assert inside.closes == at(BERLIN, 2026, 3, 3, 4)


def test_naive_clock_is_a_programming_error() -> None:
    with pytest.raises(ValueError):
        is_open(parse_windows(SAT_MORNING), datetime(2026, 3, 7, 7))


def test_plan_windows_parse_with_yaml_times_and_lines() -> None:
    text = (
        "kind: RolloutPlan\n"
        "windows:\n"
        "  - name: weekend\n"
        "    days: fri-mon\n"  # wraps over the week end
        "    start: 23:00\n"  # unquoted: YAML 1.1 base-60 integer
        "    end: '01:00'\n"
    )
    plan = parse_plan(text, "plan.yaml")
    (w,) = plan.windows
    assert sorted(w.days) == [0, 4, 5, 6]
    assert (w.start.hour, w.end.hour) == (23, 1) and w.crosses_midnight
    assert w.describe() == "weekend (mon,fri,sat,sun 23:00-01:00 UTC)"


BAD = [
    ("start: 25:00\n    end: '01:00'", "windows[0].start", 4, "not a time of day"),
    ("start: '22:00'", "windows[0]", 3, "missing field 'end'"),
    (
        "start: '1:00'\n    end: '2:00'\n    timeZone: Mars/Olympus",
        "windows[0].timeZone",
        6,
        "unknown time zone",
    ),
    (
        "start: '1:00'\n    end: '2:00'\n    dayz: [mon]",
        "windows[0].dayz",
        6,
        'did you mean "days"',
    ),
    (
        "start: '1:00'\n    end: '2:00'\n    days: [mon, tuesdy]",
        "windows[0].days",
        6,
        "unknown day",
    ),
]


@pytest.mark.parametrize(("body", "field", "line", "message"), BAD, ids=[b[1] + b[3] for b in BAD])
def test_bad_windows_name_file_field_line(body: str, field: str, line: int, message: str) -> None:
    text = "kind: RolloutPlan\nwindows:\n  - name: x\n    " + body + "\n"
    with pytest.raises(InputError) as e:
        parse_plan(text, "plan.yaml")  # the plan's own parse names the window's field
    assert e.value.location.field == field
    assert e.value.location.line == line
    assert e.value.location.file == "plan.yaml"
    assert message in str(e.value)
