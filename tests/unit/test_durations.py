"""One Go-duration parser for every duration rollout reads (plan strategy, gate, kubelet config)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rollout.change.plan.gate_section import parse_gate_config
from rollout.change.plan.strategy import parse_strategy
from rollout.durations import is_go_duration, parse_go_duration
from rollout.errors import InputError, Location


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("1m30s", 90.0),
        ("500ms", 0.5),
        ("2h", 7200.0),
        ("1.5h", 5400.0),
        ("1h2m3.5s", 3723.5),
        (".5s", 0.5),
        ("1.s", 1.0),
        ("-1s", -1.0),
        ("+2m", 120.0),
        ("0", 0.0),
        ("300us", 300e-6),
        ("300µs", 300e-6),
        ("300μs", 300e-6),
        ("10ns", 10e-9),
    ],
)
def test_go_grammar_accepts(text: str, seconds: float) -> None:
    assert parse_go_duration(text) == pytest.approx(seconds)
    assert is_go_duration(text)


@pytest.mark.parametrize("text", ["", "90", "1d", "s", ".s", "1.5.5s", "1m30", "-", "1 s", "1S"])
def test_go_grammar_refuses(text: str) -> None:
    with pytest.raises(ValueError, match=r"time: .*duration"):
        parse_go_duration(text)
    assert not is_go_duration(text)


@given(st.integers(0, 99), st.integers(0, 59), st.integers(0, 59), st.integers(0, 999))
def test_composite_durations_sum(h: int, m: int, s: int, ms: int) -> None:
    text = f"{h}h{m}m{s}s{ms}ms"
    assert parse_go_duration(text) == pytest.approx(h * 3600 + m * 60 + s + ms / 1000)


def _where(field: str) -> Location:
    return Location("plan.yaml", field, 7)


@pytest.mark.parametrize("text", ["1m30s", "500ms", "2h"])
def test_plan_and_gate_read_the_same_grammar(text: str) -> None:
    """``strategy.drain.timeout: 1m30s`` was refused while ``gate.soak: 1m30s`` was accepted, and
    ``500ms`` the other way round: both now read Go's grammar."""
    want = parse_go_duration(text)
    strategy = parse_strategy({"drain": {"timeout": text, "backoffCap": text}}, _where)
    assert strategy.drain.timeout_s == pytest.approx(want)
    assert strategy.drain.backoff_cap_s == pytest.approx(want)
    gate = parse_gate_config({"soak": text, "window": text, "interval": text})
    assert (gate.soak, gate.window, gate.interval) == pytest.approx((want, want, want))


@pytest.mark.parametrize("text", ["1d", "90", "1m30"])
def test_plan_and_gate_refuse_the_same_text(text: str) -> None:
    with pytest.raises(InputError) as e:
        parse_strategy({"drain": {"timeout": text}}, _where)
    assert e.value.location == _where("strategy.drain.timeout")
    with pytest.raises(InputError, match="duration"):
        parse_gate_config({"soak": text}, file="plan.yaml")
