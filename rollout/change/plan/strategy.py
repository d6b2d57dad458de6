"""The plan's ``strategy`` section: the canary group, ``maxUnavailable`` (a count, or a
percentage that :meth:`Strategy.for_nodes` resolves against the change's node count), the drain
policy and the batch sizes after the canary (pure).

Why pure: a bad value must be refused with its file, field and line before anything is touched;
parsing plain data keeps every rule a table-driven unit test.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from rollout.change.plan.drain_rules import DrainPolicy
from rollout.durations import parse_go_duration
from rollout.errors import InputError, Location

STRATEGY_KEYS = ("canaryGroup", "maxUnavailable", "drain", "batches")
DRAIN_KEYS = ("timeout", "backoffCap", "disableEviction", "gracePeriod")


@dataclass(frozen=True)
class Strategy:
    """The plan's ``strategy`` section.

    Attributes:
        canary_group: the inventory group holding the canary nodes.
        max_unavailable: how many nodes are changed at once.
        drain: drain policy.
        batches: optional sizes of the batches after the canary (default: ``max_unavailable``).
        max_unavailable_percent: ``maxUnavailable`` as the plan wrote a percentage (None: a
            count); :meth:`for_nodes` resolves it against the change's node count (until then
            ``max_unavailable`` is the percentage of one node, at least 1).
    """

    canary_group: str = "canary"
    max_unavailable: int = 1
    drain: DrainPolicy = field(default_factory=DrainPolicy)
    batches: tuple[int, ...] = ()
    max_unavailable_percent: float | None = field(default=None, compare=False)

    def for_nodes(self, node_count: int) -> Strategy:
        """The strategy for a change of ``node_count`` nodes: a percentage ``maxUnavailable``
        resolved (rounded down, at least 1); a count as written."""
        if self.max_unavailable_percent is None:
            return self
        return replace(self, max_unavailable=_percent_of(self.max_unavailable_percent, node_count))


def parse_duration(value: Any, where: Location) -> float:
    """Seconds from a number or a Go duration (``"30s"``, ``"1m30s"``, ``"500ms"``, ``"2h"``).

    Raises:
        InputError: not a duration (location named).
    """
    if isinstance(value, bool):
        raise InputError(f"not a duration: {value!r}", where)
    if isinstance(value, int | float):
        seconds = float(value)
    else:
        try:
            seconds = parse_go_duration(str(value).strip())
        except ValueError:
            raise InputError(
                f"not a duration: {value!r} (Go's grammar: e.g. 30s, 1m30s, 500ms, 2h)", where
            ) from None
    if seconds <= 0:
        raise InputError(f"must be positive, got {value!r}", where)
    return seconds


def parse_strategy(
    raw: Mapping[str, Any],
    location: Callable[[str], Location],
    node_count: int | None = None,
) -> Strategy:
    """Parse the plan's ``strategy`` section.

    Args:
        raw: the raw section (may be empty: defaults apply).
        location: maps a dotted field (``strategy.drain.timeout``) to a file/line location.
        node_count: total number of nodes, to resolve a percentage ``maxUnavailable``.

    Raises:
        InputError: unknown field or bad value, with file, field and line.
    """
    for k in raw:
        if k not in STRATEGY_KEYS:
            raise InputError(
                f"unknown field; valid: {', '.join(STRATEGY_KEYS)}", location(f"strategy.{k}")
            )
    group = raw.get("canaryGroup", "canary")
    if not isinstance(group, str) or not group:
        raise InputError("must be a non-empty string", location("strategy.canaryGroup"))
    mu, percent = _max_unavailable(raw.get("maxUnavailable", 1), location, node_count)
    drain_raw = raw.get("drain") or {}
    if not isinstance(drain_raw, Mapping):
        raise InputError("must be a mapping", location("strategy.drain"))
    for k in drain_raw:
        if k not in DRAIN_KEYS:
            raise InputError(
                f"unknown field; valid: {', '.join(DRAIN_KEYS)}", location(f"strategy.drain.{k}")
            )
    d = DrainPolicy()
    timeout = d.timeout_s
    if "timeout" in drain_raw:
        timeout = parse_duration(drain_raw["timeout"], location("strategy.drain.timeout"))
    cap = d.backoff_cap_s
    if "backoffCap" in drain_raw:
        cap = parse_duration(drain_raw["backoffCap"], location("strategy.drain.backoffCap"))
    disable = drain_raw.get("disableEviction", False)
    if not isinstance(disable, bool):
        raise InputError("must be true or false", location("strategy.drain.disableEviction"))
    grace = drain_raw.get("gracePeriod")
    if grace is not None:
        grace = int(parse_duration(grace, location("strategy.drain.gracePeriod")))
    batches_raw = raw.get("batches") or []
    if not isinstance(batches_raw, list) or not all(
        isinstance(b, int) and not isinstance(b, bool) and b > 0 for b in batches_raw
    ):
        raise InputError("must be a list of positive batch sizes", location("strategy.batches"))
    return Strategy(
        canary_group=group,
        max_unavailable=mu,
        drain=DrainPolicy(
            timeout_s=timeout,
            backoff_initial_s=min(d.backoff_initial_s, cap),
            backoff_cap_s=cap,
            disable_eviction=disable,
            grace_period_s=grace,
        ),
        batches=tuple(batches_raw),
        max_unavailable_percent=percent,
    )


def _percent_of(pct: float, node_count: int | None) -> int:
    return max(1, int((node_count or 1) * pct / 100))


def _max_unavailable(
    value: Any, location: Callable[[str], Location], node_count: int | None
) -> tuple[int, float | None]:
    """``maxUnavailable`` as a count, and the percentage it was written as (None: a count)."""
    where = location("strategy.maxUnavailable")
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise InputError(f"must be at least 1, got {value}", where)
        return value, None
    if isinstance(value, str) and value.endswith("%"):
        try:
            pct = float(value[:-1])
        except ValueError as e:
            raise InputError(f"not a percentage: {value!r}", where) from e
        if not 0 < pct <= 100:
            raise InputError(f"must be between 0% and 100%, got {value}", where)
        return _percent_of(pct, node_count), pct
    raise InputError(f"must be a positive integer or a percentage, got {value!r}", where)
