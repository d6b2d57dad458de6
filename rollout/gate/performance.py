"""The benchmark in the gate's decision (the plan's ``gate.bench``): bench records in, verdicts out.

Why pure: "a P99 regression rolls the canary back" and "aligned placement beats the mismatched
run, so the next stage may tighten" are decisions over numbers, and a decision over numbers is
table-tested (``tests/unit/test_performance.py``). The runs themselves (``rollout bench``'s
machinery, on the canary before the change and once its pods are recreated) are
:mod:`rollout.evidence.benchgate`; the records are :func:`rollout.evidence.bench.build_result`'s.

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

import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from rollout.durations import parse_go_duration
from rollout.errors import InputError, Location
from rollout.verdicts import Finding, Outcome, Verdict

KEYS = (
    "command",
    "standin",
    "env",
    "mechanism",
    "timeout",
    "maxP99Regression",
    "maxBandwidthRegression",
    "alignedMargin",
    "acceptSimulated",
    "mode",
    "pod",
)
MODES = ("host", "pod")
MECHANISMS = ("auto", "numactl", "cpu-affinity")
REGRESSION = "bench-regression"
ALIGNED = "aligned-advantage"


@dataclass(frozen=True)
class PodBench:
    """The pod's shape (``gate.bench.pod``; ``rollout bench --image`` and friends).

    Attributes:
        image: the benchmark's image (it must have ``/bin/sh``).
        cpus: whole CPUs requested (= limit): exclusive under the static CPU manager.
        memory: memory requested (= limit).
        gpu_resource: the extended resource of one GPU (one unit is requested).
        annotations: the pod's annotations (e.g. to keep a mesh's sidecar out).
        namespace: the tool's namespace for its own pods.
    """

    image: str
    cpus: int = 2
    memory: str = "1Gi"
    gpu_resource: str = "nvidia.com/gpu"
    annotations: Mapping[str, str] = field(default_factory=dict)
    namespace: str = "rollout-probes"

    def as_dict(self) -> dict[str, Any]:
        return {
            "image": self.image,
            "cpus": self.cpus,
            "memory": self.memory,
            "gpuResource": self.gpu_resource,
            "annotations": dict(self.annotations),
            "namespace": self.namespace,
        }


POD_KEYS = ("image", "cpus", "memory", "gpuResource", "annotations", "namespace")


def parse_pod(raw: Any, bad: Callable[[str, str], InputError]) -> PodBench:
    """``gate.bench.pod`` (``bad(key, message)`` names the field).

    Raises:
        InputError: from ``bad``.
    """
    if not isinstance(raw, Mapping):
        raise bad(
            "pod",
            "with mode pod, must be a mapping (image, and optionally cpus, memory, gpuResource)",
        )
    unknown = sorted(str(k) for k in set(raw) - set(POD_KEYS))
    if unknown:
        raise bad(f"pod.{unknown[0]}", f"unknown field; known fields: {', '.join(POD_KEYS)}")
    image = raw.get("image")
    if not isinstance(image, str) or not image.strip():
        raise bad("pod.image", "must name the benchmark's image (it needs /bin/sh)")
    cpus = raw.get("cpus", 2)
    if isinstance(cpus, bool) or not isinstance(cpus, int) or cpus < 1:
        raise bad("pod.cpus", f"must be a whole number of CPUs >= 1, not {cpus!r}")
    memory = raw.get("memory", "1Gi")
    if not isinstance(memory, str) or not re.fullmatch(r"[0-9]+(Ki|Mi|Gi|Ti|k|M|G|T)?", memory):
        raise bad("pod.memory", f"must be a quantity like 1Gi, not {memory!r}")
    res = raw.get("gpuResource", "nvidia.com/gpu")
    if not isinstance(res, str) or "/" not in res:
        raise bad(
            "pod.gpuResource", f"must be an extended resource like nvidia.com/gpu, not {res!r}"
        )
    ann = raw.get("annotations") or {}
    if not isinstance(ann, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in ann.items()
    ):
        raise bad("pod.annotations", "must be a mapping of name: string")
    ns = raw.get("namespace", "rollout-probes")
    if not isinstance(ns, str) or not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", ns):
        raise bad("pod.namespace", f"must be a namespace name, not {ns!r}")
    return PodBench(image.strip(), cpus, memory, res, dict(ann), ns)


@dataclass(frozen=True)
class BenchPolicy:
    """The plan's ``gate.bench`` section (docs/gate.md, docs/bench.md).

    Attributes:
        command: the operator's benchmark command (``rollout bench --command``), or empty with
            ``standin``.
        standin: run the shipped CPU stand-in instead (the lab; its results are simulated).
        env: environment for the command.
        mechanism: how runs are bound (``auto``, ``numactl``, ``cpu-affinity``).
        timeout_s: one run's limit.
        max_p99_regression: the largest P99 increase, after against before, that still passes.
        max_bandwidth_regression: the largest bandwidth drop that still passes.
        aligned_margin: by how much the local run must beat the remote one to allow tightening.
        accept_simulated: simulated results decide (the lab); otherwise they are Inconclusive.
        mode: ``host`` (default: the command on the node, bound with numactl to the GPU's NUMA
            node and to another one) or ``pod`` (in a Guaranteed pod the kubelet placed,
            :mod:`rollout.evidence.benchpod`).
        pod: the pod's shape with ``mode: pod``.
    """

    command: str = ""
    standin: bool = False
    env: Mapping[str, str] = field(default_factory=dict)
    mechanism: str = "auto"
    timeout_s: float = 600.0
    max_p99_regression: float = 0.10
    max_bandwidth_regression: float = 0.10
    aligned_margin: float = 0.05
    accept_simulated: bool = False
    mode: str = "host"
    pod: PodBench | None = None

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            **({"pod": self.pod.as_dict()} if self.pod is not None else {}),
            "command": self.command,
            "standin": self.standin,
            "env": dict(self.env),
            "mechanism": self.mechanism,
            "timeout": self.timeout_s,
            "maxP99Regression": self.max_p99_regression,
            "maxBandwidthRegression": self.max_bandwidth_regression,
            "alignedMargin": self.aligned_margin,
            "acceptSimulated": self.accept_simulated,
        }


def fraction_of(v: Any) -> float:
    """A plan's fraction, as a number (``0.1``) or a percentage string (``'10%'``).

    Raises:
        ValueError: neither (a boolean is neither, though Python calls it a number).
    """
    if isinstance(v, bool):
        raise ValueError(v)
    if isinstance(v, str) and v.strip().endswith("%"):
        return float(v.strip()[:-1]) / 100
    return float(v)


def parse_bench_policy(
    raw: Any, file: str | None = None, line_of: Callable[[str], int | None] | None = None
) -> BenchPolicy:
    """Parse and check ``gate.bench``.

    Raises:
        InputError: naming the file, the field (``gate.bench.maxP99Regression``) and its line.
    """

    def bad(key: str, message: str) -> InputError:
        path = f"gate.bench.{key}" if key else "gate.bench"
        return InputError(message, Location(file, path, line_of(path) if line_of else None))

    if not isinstance(raw, Mapping):
        raise bad("", "must be a mapping (command or standin, and the limits)")
    unknown = sorted(str(k) for k in set(raw) - set(KEYS))
    if unknown:
        raise bad(unknown[0], f"unknown field; known fields: {', '.join(KEYS)}")
    command = raw.get("command", "")
    if not isinstance(command, str):
        raise bad("command", f"must be a command line, not {command!r}")
    standin = raw.get("standin", False)
    if not isinstance(standin, bool):
        raise bad("standin", f"must be true or false, not {standin!r}")
    if standin == bool(command.strip()):
        raise bad("command", "give exactly one of command (a benchmark command line) and standin")
    env = raw.get("env") or {}
    if not isinstance(env, Mapping) or not all(
        isinstance(k, str) and k and isinstance(v, str | int | float) for k, v in env.items()
    ):
        raise bad("env", "must be a mapping of NAME: value")
    mechanism = raw.get("mechanism", "auto")
    if mechanism not in MECHANISMS:
        raise bad("mechanism", f"must be one of {', '.join(MECHANISMS)}, not {mechanism!r}")
    timeout = raw.get("timeout", 600.0)
    try:
        if isinstance(timeout, bool):
            raise ValueError
        seconds = (
            float(timeout)
            if isinstance(timeout, int | float)
            else parse_go_duration(str(timeout).strip())
        )
    except ValueError:
        raise bad("timeout", f"must be a duration like 10m or 90s, not {timeout!r}") from None
    if seconds < 1:
        raise bad("timeout", f"must be at least 1s, not {timeout!r}")

    def fraction(key: str, default: float, below_one: bool = True) -> float:
        v = raw.get(key, default)
        try:
            f = fraction_of(v)
        except ValueError:
            raise bad(key, f"must be a fraction (0.1) or a percentage ('10%'), not {v!r}") from None
        if f < 0 or (below_one and f >= 1):
            upper = " and below 1 (100%)" if below_one else ""
            raise bad(key, f"must be at least 0{upper}, not {v!r}")
        return f

    mode = raw.get("mode", "host")
    if mode not in MODES:
        raise bad("mode", f"must be one of {', '.join(MODES)}, not {mode!r}")
    pod = parse_pod(raw.get("pod"), bad) if mode == "pod" else None
    if mode == "host" and "pod" in raw:
        raise bad("pod", "is read with mode: pod only")
    if mode == "pod" and standin:
        raise bad("standin", "mode pod runs command in the pod's image; the stand-in is host-only")
    accept = raw.get("acceptSimulated", False)
    if not isinstance(accept, bool):
        raise bad("acceptSimulated", f"must be true or false, not {accept!r}")
    return BenchPolicy(
        command=command.strip(),
        standin=standin,
        env={str(k): str(v) for k, v in env.items()},
        mechanism=str(mechanism),
        timeout_s=seconds,
        max_p99_regression=fraction("maxP99Regression", 0.10, below_one=False),  # 200%: tripled
        max_bandwidth_regression=fraction("maxBandwidthRegression", 0.10),
        aligned_margin=fraction("alignedMargin", 0.05),
        accept_simulated=accept,
        mode=str(mode),
        pod=pod,
    )


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
