"""The plan's ``gate:`` section as a value: what the gate (``rollout.gate``) evaluates with, parsed
once when the plan is (:func:`rollout.change.plan.schema.parse_plan`).

Why here, below the gate: the plan is parsed in one place and the change engine holds the typed
plan; the gate's own modules only evaluate (``rollout.gate.analysis``, ``rollout.gate.performance``)
and never read the plan's text. The ``gate.bench`` section (the benchmark in the gate's decision,
docs/bench.md) is part of it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rollout.durations import parse_go_duration
from rollout.errors import InputError, Location

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
            :mod:`rollout.bench.in_pod`).
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
