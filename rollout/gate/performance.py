"""The benchmark in the gate's decision (the plan's ``gate.bench``): bench records in, verdicts out.

Why pure: "a P99 regression rolls the canary back" and "aligned placement beats the mismatched
run, so the next stage may tighten" are decisions over numbers, and a decision over numbers is
table-tested (``tests/unit/test_performance.py``). The runs themselves (``rollout bench``'s
machinery, on the canary before the change and once its pods are recreated) are
:mod:`rollout.bench.canary_gate`; the records are :func:`rollout.bench.results.build_result`'s.

Two verdicts, each four-valued (Successful / Failed / Inconclusive / Error), the worst finding
wins, as in :mod:`rollout.gate.analysis`:

* **regression** (:func:`judge_regression`), per canary node and GPU model, the run bound to
  the GPU's own NUMA node (``local``; with ``mode: pod`` the pod's run as the kubelet placed it,
  ``placed``) after the change against the same run before it: P99
  latency up by more than ``maxP99Regression``, or host-to-device bandwidth down by more than
  ``maxBandwidthRegression``, is **Failed** (the canary is rolled back like any Failed verdict).
* **aligned advantage** (:func:`judge_tightening`), per canary node and GPU model after the
  change: the local run's P99 is at least ``alignedMargin`` below the remote (deliberately
  mismatched) run's, *and* its bandwidth at least ``alignedMargin`` above. Successful allows the
  plan's next stage (a tighter policy) to start; Failed (measured, no advantage) holds it.
  A pod record has no mismatched run (the kubelet never places one): Inconclusive, it holds.

In both: a node whose bench could not run is **Error**; a run that did not hold its binding, a
GPU model missing from one side, a zero baseline, or simulated numbers without
``acceptSimulated`` are **Inconclusive**. Neither holds ever passes: inconclusive data holds.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollout.change.plan.gate_section import BenchPolicy
from rollout.verdicts import Finding, Outcome, Verdict

REGRESSION = "bench-regression"
ALIGNED = "aligned-advantage"


def _pct(x: float) -> str:
    return f"{x * 100:+.1f}%"


def _usable(
    policy: BenchPolicy, signal: str, node: str, rec: Mapping[str, Any] | str | None, label: str
) -> Finding | None:
    """A holding finding when the node's ``label`` record cannot decide, else None."""
    if rec is None:
        return Finding(signal, Outcome.ERROR, f"{node}: no {label} bench", (node,))
    if isinstance(rec, str):
        return Finding(signal, Outcome.ERROR, f"{node}: {label} bench failed: {rec}", (node,))
    if rec.get("status") != "pass":
        problems = "; ".join(str(p) for p in rec.get("problems") or ()) or "status not pass"
        return Finding(
            signal,
            Outcome.INCONCLUSIVE,
            f"{node}: {label} bench did not hold its binding: {problems}",
            (node,),
        )
    if rec.get("simulated") and not policy.accept_simulated:
        why = "; ".join(str(w) for w in rec.get("simulatedWhy") or ()) or "simulated"
        return Finding(
            signal,
            Outcome.INCONCLUSIVE,
            f"{node}: {label} bench is simulated ({why}); simulated numbers decide nothing "
            "without gate.bench.acceptSimulated",
            (node,),
        )
    return None


def _run(model: Mapping[str, Any]) -> Mapping[str, Any]:
    """The run a regression compares: the pod's (``placed``, mode pod), else the local one."""
    placed = model.get("placed")
    return placed if isinstance(placed, Mapping) else model["local"]


def _models(rec: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    return {str(m["gpuModel"]): m for m in rec.get("models") or ()}


def _combine(signal: str, findings: Sequence[Finding], now: float, what: str) -> Verdict:
    if not findings:
        findings = [Finding(signal, Outcome.ERROR, "no canary node was benched")]
    worst = max(f.outcome.severity for f in findings)
    top = [f for f in findings if f.outcome.severity == worst]
    outcome = top[0].outcome
    reason = f"{signal}: " + "; ".join(f.reason for f in top)
    failed = tuple(sorted({n for f in top for n in f.nodes})) if outcome is Outcome.FAILED else ()
    waiting = ""
    if outcome in (Outcome.INCONCLUSIVE, Outcome.ERROR):
        waiting = f"a {what} bench that can decide: " + "; ".join(f.reason for f in top)
    return Verdict(outcome, reason, now, failed, waiting, tuple(findings))


def judge_regression(
    policy: BenchPolicy,
    before: Mapping[str, Mapping[str, Any] | str],
    after: Mapping[str, Mapping[str, Any] | str],
    nodes: Sequence[str],
    now: float = 0.0,
) -> Verdict:
    """The regression verdict over the canary ``nodes``: each node's bench record (or the error
    that stopped it, a string) before the change and after it; the local run of each GPU model
    compared."""
    findings: list[Finding] = []
    for node in nodes:
        b, a = before.get(node), after.get(node)
        held = _usable(policy, REGRESSION, node, b, "before") or _usable(
            policy, REGRESSION, node, a, "after"
        )
        if held is not None:
            findings.append(held)
            continue
        assert isinstance(b, Mapping) and isinstance(a, Mapping)
        old, new = _models(b), _models(a)
        for model in sorted(set(old) | set(new)):
            if model not in old or model not in new:
                side = "before" if model not in old else "after"
                findings.append(
                    Finding(
                        REGRESSION,
                        Outcome.INCONCLUSIVE,
                        f"{node}, {model}: no {side} run to compare",
                        (node,),
                    )
                )
                continue
            lo, ln = _run(old[model]), _run(new[model])
            p99_b, p99_a = float(lo["p99Ms"]), float(ln["p99Ms"])
            bw_b, bw_a = float(lo["h2dGbps"]), float(ln["h2dGbps"])
            where = f"{node}, {model}"
            if p99_b <= 0 or bw_b <= 0:
                findings.append(
                    Finding(
                        REGRESSION,
                        Outcome.INCONCLUSIVE,
                        f"{where}: the before run measured P99 {p99_b:g} ms, bandwidth "
                        f"{bw_b:g} GB/s: nothing to compare with",
                        (node,),
                    )
                )
                continue
            p99_up, bw_down = p99_a / p99_b - 1, 1 - bw_a / bw_b
            numbers = (
                f"P99 {p99_b:.3g} -> {p99_a:.3g} ms ({_pct(p99_up)}, limit "
                f"+{policy.max_p99_regression * 100:g}%), bandwidth {bw_b:.3g} -> {bw_a:.3g} "
                f"GB/s ({_pct(-bw_down)}, limit -{policy.max_bandwidth_regression * 100:g}%)"
            )
            regressed = p99_up > policy.max_p99_regression or (
                bw_down > policy.max_bandwidth_regression
            )
            outcome = Outcome.FAILED if regressed else Outcome.SUCCESSFUL
            findings.append(Finding(REGRESSION, outcome, f"{where}: {numbers}", (node,)))
    return _combine(REGRESSION, findings, now, "before and after")


def judge_tightening(
    policy: BenchPolicy,
    after: Mapping[str, Mapping[str, Any] | str],
    nodes: Sequence[str],
    now: float = 0.0,
) -> Verdict:
    """Whether aligned placement measurably beats the mismatched run on every canary node and
    GPU model after the change (Successful: a tighter policy may follow; Failed: it may not)."""
    findings: list[Finding] = []
    m = policy.aligned_margin
    for node in nodes:
        a = after.get(node)
        held = _usable(policy, ALIGNED, node, a, "after")
        if held is not None:
            findings.append(held)
            continue
        assert isinstance(a, Mapping)
        for model, rec in sorted(_models(a).items()):
            if "remote" not in rec:
                findings.append(
                    Finding(
                        ALIGNED,
                        Outcome.INCONCLUSIVE,
                        f"{node}, {model}: the pod run measured the kubelet's placement only; "
                        "the aligned advantage needs a deliberately mismatched run (mode: host)",
                        (node,),
                    )
                )
                continue
            local, remote = rec["local"], rec["remote"]
            p99_l, p99_r = float(local["p99Ms"]), float(remote["p99Ms"])
            bw_l, bw_r = float(local["h2dGbps"]), float(remote["h2dGbps"])
            where = f"{node}, {model}"
            if p99_r <= 0 or bw_r <= 0:
                findings.append(
                    Finding(
                        ALIGNED,
                        Outcome.INCONCLUSIVE,
                        f"{where}: the mismatched run measured P99 {p99_r:g} ms, bandwidth "
                        f"{bw_r:g} GB/s: nothing to compare with",
                        (node,),
                    )
                )
                continue
            p99_gain, bw_gain = 1 - p99_l / p99_r, bw_l / bw_r - 1
            numbers = (
                f"aligned P99 {p99_l:.3g} ms vs mismatched {p99_r:.3g} ms "
                f"({_pct(-p99_gain)}), bandwidth {bw_l:.3g} vs {bw_r:.3g} GB/s "
                f"({_pct(bw_gain)}); margin {m * 100:g}%"
            )
            beats = p99_gain >= m and bw_gain >= m
            outcome = Outcome.SUCCESSFUL if beats else Outcome.FAILED
            text = numbers if beats else f"no aligned advantage: {numbers}"
            findings.append(Finding(ALIGNED, outcome, f"{where}: {text}", (node,)))
    return _combine(ALIGNED, findings, now, "after")


def decision_record(
    policy: BenchPolicy, regression: Verdict, tightening: Verdict, nodes: Sequence[str]
) -> dict[str, Any]:
    """The ``bench-verdict`` journal entry's data: both verdicts, the policy and the nodes."""
    return {
        "nodes": list(nodes),
        "policy": policy.as_dict(),
        "regression": regression.as_dict(),
        "tightening": tightening.as_dict(),
        "allowsTightening": tightening.status is Outcome.SUCCESSFUL,
    }
