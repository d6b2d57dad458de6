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
admission preview predicted rejected
(``rollout.kubelet.admission.node_preview.predicted_rejections``), each owner is
marked "expected: predicted by the preview" or "not predicted: investigate": a surprise is worth
more attention than an expected rejection. Without a preview (``rollout watch``) they are listed
unmarked.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable

from rollout.change.plan.gate_section import GateConfig
from rollout.samples import NodeCounts, group_counts
from rollout.verdicts import Finding, Outcome, SignalState, Verdict


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
