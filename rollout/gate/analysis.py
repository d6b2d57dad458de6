"""The gate's verdict: samples in, Successful / Failed / Inconclusive / Error out, with a reason.

Why pure: whether a canary rolls back is the most consequential decision the tool makes, and the
verdict-aggregation bugs other tools shipped (argo-rollouts #4479: "Successful" when every
measurement errored; flagger #1035: no data stalls or passes) are bugs of logic, not of I/O. So
the decision is a function of plain data and of ``now``, table-tested in
``tests/unit/test_analysis.py``.

The rules, in the order they are applied:

1. A signal that has never delivered data, or failed ``consecutiveErrorLimit`` times in a row, is
   **Error** (hold; fail closed: a missing signal never counts as healthy). Fewer errors in a row
   are tolerated and the signal's last good data is used.
2. A node (or the group) whose rejection rate exceeds the absolute ``threshold`` *and* the
   baseline's rate plus ``margin`` is **Failed**. While admissions are still fewer than the
   minimum, the rate is computed against the minimum (the best case), so a clear failure is called
   at once and a single early rejection is not over-weighted.
3. Fewer admissions than ``minAdmissions`` in the group, or a node with none at all, is
   **Inconclusive** (hold; never pass on no data).
4. Otherwise **Successful**.

Across nodes and signals the worst wins: Failed > Error > Inconclusive > Successful.

A Failed reason names the owners of the rejected pods. Given the (node, owner) pairs preflight's
admission preview predicted rejected (``rollout.change.previewing.predicted_rejections``), each
owner is
marked "expected: predicted by the preview" or "not predicted: investigate": a surprise is worth
more attention than an expected rejection. Without a preview (``rollout watch``) they are listed
unmarked.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from rollout.durations import parse_go_duration
from rollout.errors import InputError, Location
from rollout.gate.performance import BenchPolicy, fraction_of, parse_bench_policy
from rollout.samples import NodeCounts, group_counts
from rollout.verdicts import Finding, Outcome, SignalState, Verdict


class Baseline(StrEnum):
    """What the canary's rejection rate is compared with."""

    CONTROL_GROUP = "control-group"  # unchanged, equivalent nodes over the same window
    BEFORE = "before"  # the same nodes over a window before the change
    NONE = "none"  # only the absolute threshold


class OnFailure(StrEnum):
    """What a Failed verdict rolls back: the node pool (every node of the change on the new
    config, the default), or only the nodes with rejections (the gate then keeps watching the
    others until the soak ends, and a rejection there rolls that node back too)."""

    ROLLBACK_AFFECTED = "rollback-affected"
    ROLLBACK_GROUP = "rollback-group"


@dataclass(frozen=True)
class PrometheusSource:
    """An optional PromQL query that returns admissions rejected per node (a vector by ``node``)."""

    url: str
    query: str


@dataclass(frozen=True)
class GateConfig:
    """The plan's ``gate:`` section (schema in docs/gate.md)."""

    window: float = 60.0
    soak: float = 60.0
    interval: float = 2.0
    threshold: float = 0.05
    margin: float = 0.0
    min_admissions: int = 5
    baseline: Baseline = Baseline.CONTROL_GROUP
    control_group: str | None = None
    consecutive_error_limit: int = 4
    probes: bool = True
    prometheus: PrometheusSource | None = None
    on_failure: OnFailure = OnFailure.ROLLBACK_GROUP
    recovery: float = 60.0
    require_evidence: bool = False
    bench: BenchPolicy | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "window": self.window,
            "soak": self.soak,
            "interval": self.interval,
            "threshold": self.threshold,
            "margin": self.margin,
            "minAdmissions": self.min_admissions,
            "baseline": str(self.baseline),
            "controlGroup": self.control_group,
            "consecutiveErrorLimit": self.consecutive_error_limit,
            "probes": self.probes,
            "prometheus": (
                {"url": self.prometheus.url, "query": self.prometheus.query}
                if self.prometheus
                else None
            ),
            "onFailure": str(self.on_failure),
            "recovery": self.recovery,
            "requireEvidence": self.require_evidence,
            "bench": self.bench.as_dict() if self.bench is not None else None,
        }


_KEYS = {
    "window",
    "soak",
    "interval",
    "threshold",
    "margin",
    "minAdmissions",
    "baseline",
    "controlGroup",
    "consecutiveErrorLimit",
    "probes",
    "prometheus",
    "onFailure",
    "recovery",
    "requireEvidence",
    "bench",
}


def parse_gate_config(
    raw: Mapping[str, Any] | None,
    *,
    file: str | None = None,
    line_of: Callable[[str], int | None] | None = None,
) -> GateConfig:
    """Parse and validate the plan's ``gate:`` mapping.

    Args:
        raw: the mapping (``Plan.gate``); None or empty gives the defaults.
        file: the plan file, for messages.
        line_of: maps a dotted field path (``gate.window``) to its 1-based line, when known.

    Returns:
        The validated configuration.

    Raises:
        InputError: naming the file, the field and its line.
    """

    def bad(key: str, message: str) -> InputError:
        path = f"gate.{key}"
        return InputError(message, Location(file, path, line_of(path) if line_of else None))

    if raw is None:
        return GateConfig()
    if not isinstance(raw, Mapping):
        raise InputError(
            "must be a mapping", Location(file, "gate", line_of("gate") if line_of else None)
        )
    unknown = sorted(set(raw) - _KEYS)
    if unknown:
        raise bad(unknown[0], f"unknown field; known fields: {', '.join(sorted(_KEYS))}")

    def duration(key: str, default: float) -> float:
        v = raw.get(key, default)
        if isinstance(v, bool):
            raise bad(key, f"must be a duration like 60s or 2m, not {v!r}")
        if isinstance(v, int | float):
            seconds = float(v)
        else:
            try:
                seconds = parse_go_duration(str(v).strip())
            except ValueError:
                raise bad(key, f"must be a duration like 60s, 1m30s or 500ms, not {v!r}") from None
        if seconds <= 0:
            raise bad(key, f"must be positive, not {v!r}")
        return seconds

    def fraction(key: str, default: float) -> float:
        v = raw.get(key, default)
        try:
            f = fraction_of(v)
        except ValueError:
            raise bad(key, f"must be a fraction (0.05) or a percentage ('5%'), not {v!r}") from None
        if not 0 <= f <= 1:
            raise bad(key, f"must be between 0 and 1 (0% and 100%), not {v!r}")
        return f

    def integer(key: str, default: int, minimum: int) -> int:
        v = raw.get(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
            raise bad(key, f"must be an integer of at least {minimum}, not {v!r}")
        return v

    def choice(key: str, enum: type[StrEnum], default: StrEnum) -> Any:
        v = raw.get(key, str(default))
        try:
            return enum(v)
        except ValueError:
            allowed = ", ".join(str(e) for e in enum)
            raise bad(key, f"must be one of {allowed}, not {v!r}") from None

    probes = raw.get("probes", True)
    if not isinstance(probes, bool):
        raise bad("probes", f"must be true or false, not {probes!r}")
    required = raw.get("requireEvidence", False)
    if not isinstance(required, bool):
        raise bad("requireEvidence", f"must be true or false, not {required!r}")
    control = raw.get("controlGroup")
    if control is not None and not isinstance(control, str):
        raise bad("controlGroup", f"must be an inventory group name, not {control!r}")
    prom = raw.get("prometheus")
    source = None
    if prom is not None:
        if not isinstance(prom, Mapping) or set(prom) - {"url", "query"}:
            raise bad("prometheus", "must be a mapping with 'url' and 'query'")
        url, query = prom.get("url"), prom.get("query")
        if not isinstance(url, str) or not url.startswith(("http://", "https://")):
            raise bad("prometheus.url", f"must be an http(s) URL, not {url!r}")
        if not isinstance(query, str) or not query.strip():
            raise bad("prometheus.query", "must be a non-empty PromQL expression")
        source = PrometheusSource(url.rstrip("/"), query)
    cfg = GateConfig(
        window=duration("window", 60.0),
        soak=duration("soak", 60.0),
        interval=duration("interval", 2.0),
        threshold=fraction("threshold", 0.05),
        margin=fraction("margin", 0.0),
        min_admissions=integer("minAdmissions", 5, 1),
        baseline=choice("baseline", Baseline, Baseline.CONTROL_GROUP),
        control_group=control,
        consecutive_error_limit=integer("consecutiveErrorLimit", 4, 1),
        probes=probes,
        prometheus=source,
        on_failure=choice("onFailure", OnFailure, OnFailure.ROLLBACK_GROUP),
        recovery=duration("recovery", 60.0),
        require_evidence=required,
        bench=None if raw.get("bench") is None else parse_bench_policy(raw["bench"], file, line_of),
    )
    if cfg.interval > cfg.soak:
        raise bad("interval", f"must not be longer than gate.soak ({cfg.soak:g}s)")
    return cfg


def _pct(x: float) -> str:
    p = x * 100
    return f"{p:.0f}%" if abs(p - round(p)) < 0.05 else f"{p:.1f}%"


def _and(names: Iterable[str]) -> str:
    items = list(names)
    if len(items) <= 1:
        return "".join(items)
    return ", ".join(items[:-1]) + " and " + items[-1]


def _by_reason(c: NodeCounts) -> str:
    return ", ".join(f"{r}: {n}" for r, n in sorted(c.rejections.items()))


EXPECTED = "expected: predicted by the preview"
SURPRISE = "not predicted: investigate"

Predicted = Collection[tuple[str, str]]


def _owners(s: SignalState, failed: Iterable[str], predicted: Predicted | None) -> str:
    """``; owners: ...`` for the rejected pods' owners on the failed nodes, each marked expected
    or not when the preview's (node, owner) pairs are given; empty when no owner is known."""
    nodes = list(failed)
    if predicted is None:
        owners = sorted({o for n in nodes for o in s.counts[n].owners})
        return f"; owners: {', '.join(owners)}" if owners else ""
    marked = [
        f"{o} on {n} ({EXPECTED if (n, o) in predicted else SURPRISE})"
        for n in nodes
        for o in s.counts[n].owners
    ]
    return f"; owners: {', '.join(marked)}" if marked else ""


def _evaluate_signal(cfg: GateConfig, s: SignalState, predicted: Predicted | None) -> Finding:
    if not s.has_data or s.consecutive_errors >= cfg.consecutive_error_limit:
        why = s.last_error or "no reading yet"
        if s.has_data:
            text = (
                f"{s.consecutive_errors} reads in a row failed "
                f"(limit {cfg.consecutive_error_limit}), last: {why}"
            )
        else:
            text = f"no data yet ({why})"
        return Finding(s.name, Outcome.ERROR, f"{s.name}: {text}")
    nodes = sorted(s.counts)
    if not nodes:
        return Finding(s.name, Outcome.ERROR, f"{s.name}: no canary node to watch")
    group = group_counts(s.counts)
    if s.rejections_only:
        base = s.baseline.rejected if s.baseline is not None else 0
        bad = [n for n in nodes if s.counts[n].rejected > base]
        if bad:
            sub = group_counts({n: s.counts[n] for n in bad})
            return Finding(
                s.name,
                Outcome.FAILED,
                f"{s.name}: {sub.rejected} admissions rejected on {_and(bad)} "
                f"[{_by_reason(sub)}], baseline {base}{_owners(s, bad, predicted)}",
                tuple(bad),
            )
        return Finding(s.name, Outcome.SUCCESSFUL, f"{s.name}: no rejection on {_and(nodes)}")
    base_rate = s.baseline.rate if s.baseline is not None and s.baseline.admissions else 0.0
    limit = max(cfg.threshold, base_rate + cfg.margin)
    per_node_min = math.ceil(cfg.min_admissions / len(nodes))

    def fails(c: NodeCounts, minimum: int) -> bool:
        return c.rejected > 0 and c.rejected / max(c.admissions, minimum) > limit

    failed = [n for n in nodes if fails(s.counts[n], per_node_min)]
    if not failed and fails(group, cfg.min_admissions):
        failed = [n for n in nodes if s.counts[n].rejected]
    if s.baseline is None:
        base_text = "no baseline"
    elif not s.baseline.admissions:
        base_text = "baseline: no admissions"
    else:
        base_text = f"baseline {_pct(base_rate)} ({s.baseline.rejected} of {s.baseline.admissions})"
    if failed:
        sub = group_counts({n: s.counts[n] for n in failed})
        reason = (
            f"{sub.rejected} of {sub.admissions} admissions rejected ({_pct(sub.rate)}) on "
            f"{_and(failed)} [{_by_reason(sub)}], threshold {_pct(cfg.threshold)}, "
            f"{base_text}{_owners(s, failed, predicted)}"
        )
        if set(failed) != set(nodes):
            reason += f"; group: {group.rejected} of {group.admissions} ({_pct(group.rate)})"
        return Finding(s.name, Outcome.FAILED, f"{s.name}: {reason}", tuple(failed))
    idle = [n for n in nodes if s.counts[n].admissions == 0]
    if group.admissions < cfg.min_admissions or idle:
        missing = f"; no admission at all on {_and(idle)}" if idle else ""
        return Finding(
            s.name,
            Outcome.INCONCLUSIVE,
            f"{s.name}: {group.admissions} admissions in the last {cfg.window:g}s, "
            f"at least {cfg.min_admissions} needed{missing}",
            tuple(idle),
        )
    return Finding(
        s.name,
        Outcome.SUCCESSFUL,
        f"{s.name}: {group.rejected} of {group.admissions} admissions rejected "
        f"({_pct(group.rate)}) on {_and(nodes)}, threshold {_pct(cfg.threshold)}, {base_text}",
    )


def evaluate(
    cfg: GateConfig,
    signals: Iterable[SignalState],
    now: float,
    predicted: Predicted | None = None,
) -> Verdict:
    """Decide the verdict from every signal's state; the worst finding wins.

    Args:
        cfg: the gate configuration.
        signals: one state per configured signal (an empty list is an Error: no signal, no pass).
        now: the evaluation time (recorded, never read from a clock here).
        predicted: (node, owner) pairs the admission preview predicted rejected; a Failed
            reason then marks each rejected pod's owner expected or not. None: no preview ran.

    Returns:
        The verdict, with every signal's finding and the inputs a journal record needs.
    """
    states = list(signals)
    findings = tuple(_evaluate_signal(cfg, s, predicted) for s in states)
    if not findings:
        findings = (Finding("gate", Outcome.ERROR, "gate: no signal configured"),)
    worst = max(f.outcome.severity for f in findings)
    top = [f for f in findings if f.outcome.severity == worst]
    outcome = top[0].outcome
    reason = "; ".join(f.reason for f in top)
    failed: tuple[str, ...] = ()
    waiting = ""
    if outcome is Outcome.FAILED:
        failed = tuple(sorted({n for f in top for n in f.nodes}))
    elif outcome is Outcome.INCONCLUSIVE:
        waiting = (
            f"at least {cfg.min_admissions} admissions on the canary nodes within {cfg.window:g}s"
            + (" (probe pods are on)" if cfg.probes else " (probe pods are off)")
        )
    elif outcome is Outcome.ERROR:
        waiting = "the failing signal to deliver data again: " + ", ".join(f.signal for f in top)
    inputs = {
        "config": cfg.as_dict(),
        "signals": {
            s.name: {
                "nodes": {
                    n: {
                        "admissions": c.admissions,
                        "rejections": dict(c.rejections),
                        "owners": list(c.owners),
                    }
                    for n, c in sorted(s.counts.items())
                },
                "baseline": (
                    {"admissions": s.baseline.admissions, "rejections": dict(s.baseline.rejections)}
                    if s.baseline is not None
                    else None
                ),
                "consecutiveErrors": s.consecutive_errors,
                "lastError": s.last_error,
                "hasData": s.has_data,
            }
            for s in states
        },
    }
    return Verdict(outcome, reason, now, failed, waiting, findings, inputs)
