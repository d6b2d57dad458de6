"""Performance evidence (``rollout bench``), the pure part: which GPU and NUMA nodes a bench
compares, the benchmark command's output contract, the result record and its Prometheus text.

The I/O (facts, the ``rollout_bench`` module on the node, journal, files) is
:mod:`rollout.bench.on_node`. The contract and what is measured are in docs/bench.md.

Output contract: the command's **last non-empty line of standard output** is one JSON object
with the numbers ``p50_ms``, ``p99_ms`` (latency percentiles, milliseconds), ``h2d_gbps``
(host-to-device bandwidth, 10^9 bytes per second) and ``load_s`` (load time, seconds); optional
``samples`` (integer, at least 1), ``simulated`` (boolean) and ``cpus_allowed`` (the CPU list
the process saw); no other key. Earlier lines are the command's log.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout.errors import InputError, Location, RolloutError
from rollout.kubelet.cpuset import CPUSetError, format_cpus, parse

REQUIRED = ("p50_ms", "p99_ms", "h2d_gbps", "load_s")
OPTIONAL = {"samples": int, "simulated": bool, "cpus_allowed": str}
#: The node label GPU feature discovery sets to the GPU's product name.
PRODUCT_LABEL = "nvidia.com/gpu.product"
#: The label every lab node carries: its GPUs are fake sysfs entries.
LAB_LABEL = "rollout.dev/lab"
BINDINGS = ("local", "remote")
#: Per metric of the contract: its name in the result record.
FIELDS = {"p50_ms": "p50Ms", "p99_ms": "p99Ms", "h2d_gbps": "h2dGbps", "load_s": "loadS"}


class BenchError(RolloutError):
    """The benchmark ran but its result is unusable (exit 1): the command failed, broke the
    output contract, or did not run with the binding asked for."""


@dataclass(frozen=True)
class Target:
    """One GPU model's bench on a node: the GPU, its NUMA node and the other one compared."""

    model: str
    gpu: str
    cuda_index: int
    local: int
    remote: int
    local_cpus: str
    remote_cpus: str

    def runs(self, index: int) -> list[dict[str, Any]]:
        """The ``rollout_bench`` module's two runs for this target, local first."""
        env = {
            "CUDA_DEVICE_ORDER": "PCI_BUS_ID",
            "CUDA_VISIBLE_DEVICES": str(self.cuda_index),
            "ROLLOUT_BENCH_GPU": self.gpu,
            "ROLLOUT_BENCH_GPU_MODEL": self.model,
        }
        return [
            {
                "name": f"t{index}-{binding}",
                "numa": numa,
                "cpus": cpus,
                "env": {**env, "ROLLOUT_BENCH_BINDING": binding, "ROLLOUT_BENCH_NUMA": str(numa)},
            }
            for binding, numa, cpus in (
                ("local", self.local, self.local_cpus),
                ("remote", self.remote, self.remote_cpus),
            )
        ]


def gpu_model(gpu: Mapping[str, Any], labels: Mapping[str, str], one_model: bool) -> str:
    """The GPU's model: the node's ``nvidia.com/gpu.product`` label when the node has one kind of
    GPU (the label names one product per node), else its PCI ``vendor:device`` id."""
    if one_model and labels.get(PRODUCT_LABEL):
        return labels[PRODUCT_LABEL]
    vendor = str(gpu.get("vendor") or "").removeprefix("0x")
    device = str(gpu.get("device") or "").removeprefix("0x")
    return f"pci {vendor}:{device}"


def plan_targets(
    facts: Mapping[str, Any],
    labels: Mapping[str, str],
    node: str,
    gpu: str | None = None,
    remote: int | None = None,
) -> list[Target]:
    """One target per GPU model on the node (its first GPU with a NUMA node, by PCI address), or
    only ``gpu`` (a PCI address); the remote NUMA node is ``remote``, else the lowest other NUMA
    node with CPUs.

    Raises:
        InputError: ``gpu`` or ``remote`` names nothing the node's facts hold (field named).
        BenchError: the node has no GPU with a NUMA node, or one NUMA node only.
    """
    gpus = sorted(
        (g for g in facts.get("gpus") or () if isinstance(g, Mapping)), key=lambda g: str(g["id"])
    )
    numa = {int(n["id"]): str(n.get("cpus") or "") for n in facts.get("numaNodes") or ()}
    kinds = {(g.get("vendor"), g.get("device")) for g in gpus}
    if gpu is not None and gpu not in {str(g["id"]) for g in gpus}:
        known = ", ".join(str(g["id"]) for g in gpus) or "none"
        raise InputError(
            f"node {node} has no GPU {gpu} (its GPUs: {known})", Location(field="--gpu")
        )
    if remote is not None and remote not in numa:
        raise InputError(
            f"node {node} has no NUMA node {remote} (its NUMA nodes: "
            f"{', '.join(map(str, sorted(numa))) or 'none'})",
            Location(field="--remote-numa"),
        )
    chosen: dict[str, tuple[int, Mapping[str, Any]]] = {}
    for index, g in enumerate(gpus):
        if gpu is not None and str(g["id"]) != gpu:
            continue
        if g.get("numaNode") is None:
            if gpu is not None:
                raise BenchError(f"node {node}: GPU {gpu} has no NUMA node (numa_node is -1)")
            continue
        chosen.setdefault(gpu_model(g, labels, len(kinds) == 1), (index, g))
    if not chosen:
        raise BenchError(f"node {node} has no GPU with a NUMA node in its facts: nothing to bind")
    out = []
    for model, (index, g) in chosen.items():
        local = int(g["numaNode"])
        other = remote
        if other is None:
            other = next((n for n in sorted(numa) if n != local and numa[n]), None)
        if other is None or other == local:
            raise BenchError(
                f"node {node}: GPU {g['id']} is on NUMA node {local} and the node has no other "
                "NUMA node with CPUs: nothing to compare the local binding with"
            )
        out.append(
            Target(model, str(g["id"]), index, local, other, numa.get(local, ""), numa[other])
        )
    return out


def parse_output(stdout: str, where: str) -> dict[str, Any]:
    """The contract's JSON object from a run's standard output, checked.

    Raises:
        BenchError: naming ``where`` (which run on which node) and the field.
    """
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise BenchError(f"{where}: the command printed nothing (the contract: one JSON object)")
    try:
        doc = json.loads(lines[-1])
    except ValueError as e:
        raise BenchError(
            f"{where}: the last output line is not JSON ({e}): {lines[-1][:200]}"
        ) from e
    if not isinstance(doc, dict):
        raise BenchError(f"{where}: the last output line must be a JSON object")
    unknown = sorted(set(doc) - set(REQUIRED) - set(OPTIONAL))
    if unknown:
        raise BenchError(
            f"{where}: unknown field(s) {', '.join(unknown)} "
            f"(the contract: {', '.join(REQUIRED)}; optional {', '.join(OPTIONAL)})"
        )
    for key in REQUIRED:
        if key not in doc:
            raise BenchError(f"{where}: field {key} is missing")
        v = doc[key]
        if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise BenchError(f"{where}: field {key} must be a finite number >= 0, not {v!r}")
    if doc["p99_ms"] < doc["p50_ms"]:
        raise BenchError(
            f"{where}: field p99_ms ({doc['p99_ms']}) is below p50_ms ({doc['p50_ms']})"
        )
    for key, kind in OPTIONAL.items():
        if key in doc and (type(doc[key]) is not kind or (kind is int and doc[key] < 1)):
            want = "an integer >= 1" if kind is int else f"a {kind.__name__}"
            raise BenchError(f"{where}: field {key} must be {want}, not {doc[key]!r}")
    return doc


def _cpus(text: str) -> frozenset[int] | None:
    try:
        return parse(text.strip())
    except CPUSetError:
        return None


def judge_run(
    run: Mapping[str, Any],
    mechanism: str,
    intended_cpus: str,
    numa: int,
    where: str,
) -> dict[str, Any]:
    """One run's record: its numbers and the binding it had (``bindingHeld``: the CPUs its shell
    was allowed are a non-empty subset of the NUMA node's, the stand-in's own view agrees, and
    with numactl memory is bound to that node only).

    Raises:
        BenchError: the run did not start, failed, timed out, or broke the contract.
    """
    if run.get("error"):
        raise BenchError(f"{where}: {run['error']}" + _said(run))
    if run.get("rc") != 0:
        raise BenchError(f"{where}: the command exited {run.get('rc')}" + _said(run))
    doc = parse_output(str(run.get("stdout") or ""), where)
    observed = run.get("observed") or {}
    seen = _cpus(str(observed.get("cpus") or ""))
    want = _cpus(intended_cpus) or frozenset()
    problems = []
    if not seen:
        problems.append("the run's allowed CPUs were not recorded")
    elif not seen <= want:
        problems.append(
            f"allowed CPUs {format_cpus(seen)} are not within NUMA node {numa}'s "
            f"{format_cpus(want)}"
        )
    if "cpus_allowed" in doc and seen and _cpus(doc["cpus_allowed"]) != seen:
        problems.append(
            f"the command saw CPUs {doc['cpus_allowed']}, its shell {format_cpus(seen)}"
        )
    memory_bound = mechanism == "numactl"
    if memory_bound and _cpus(str(observed.get("mems") or "")) != frozenset({numa}):
        problems.append(f"allowed memory nodes {observed.get('mems')!r}, not {numa}")
    out: dict[str, Any] = {
        "numaNode": numa,
        "cpus": intended_cpus,
        "observedCpus": format_cpus(seen) if seen else "",
        "observedMems": str(observed.get("mems") or ""),
        "memoryBound": memory_bound,
        "bindingHeld": not problems,
        "problems": problems,
        "elapsedS": run.get("elapsedS"),
        "simulated": bool(doc.get("simulated", False)),
    }
    out.update({FIELDS[k]: float(doc[k]) for k in REQUIRED})
    if "samples" in doc:
        out["samples"] = doc["samples"]
    if "cpus_allowed" in doc:
        out["commandCpus"] = doc["cpus_allowed"]
    return out


def _said(run: Mapping[str, Any]) -> str:
    tail = (str(run.get("stderr") or "").strip() or str(run.get("stdout") or "").strip())[-400:]
    return f": {tail}" if tail else ""


def ratio(local: Mapping[str, Any], remote: Mapping[str, Any]) -> dict[str, float | None]:
    """local / remote of each metric (None when the remote value is 0): below 1 for a latency or
    load time means the local binding is faster; above 1 for bandwidth means it moves more."""
    out: dict[str, float | None] = {}
    for name in FIELDS.values():
        r = float(remote[name])
        out[name] = round(float(local[name]) / r, 4) if r else None
    return out


def build_result(
    *,
    node: str,
    host: str,
    at: str,
    command: str,
    standin: bool,
    labels: Mapping[str, str],
    targets: Sequence[Target],
    module_result: Mapping[str, Any],
    change: str | None = None,
) -> dict[str, Any]:
    """The bench record (JSON-ready) from the module's result on ``node``.

    Raises:
        BenchError: a run failed or broke the contract (named).
    """
    mechanism = str(module_result.get("mechanism") or "")
    runs = {str(r.get("name")): r for r in module_result.get("runs") or ()}
    models = []
    for i, t in enumerate(targets):
        rec: dict[str, Any] = {
            "gpuModel": t.model,
            "gpu": t.gpu,
            "cudaIndex": t.cuda_index,
            "gpuNumaNode": t.local,
            "remoteNumaNode": t.remote,
        }
        for binding, numa, cpus in (
            ("local", t.local, t.local_cpus),
            ("remote", t.remote, t.remote_cpus),
        ):
            where = f"node {node}, {t.model}, {binding} run (NUMA node {numa})"
            run = runs.get(f"t{i}-{binding}")
            if run is None:
                raise BenchError(f"{where}: the node returned no result for it")
            rec[binding] = judge_run(run, mechanism, cpus, numa, where)
        rec["ratio"] = ratio(rec["local"], rec["remote"])
        models.append(rec)
    why = []
    if standin:
        why.append("the CPU stand-in ran, not a GPU benchmark")
    if any(m[b]["simulated"] for m in models for b in BINDINGS):
        why.append("the command's output says simulated")
    if labels.get(LAB_LABEL):
        why.append(f"lab node ({LAB_LABEL}={labels[LAB_LABEL]}): its GPUs are simulated")
    problems = [
        f"{m['gpuModel']} {b}: {p}" for m in models for b in BINDINGS for p in m[b]["problems"]
    ]
    return {
        "node": node,
        "host": host,
        "at": at,
        "change": change,
        "command": command,
        "simulated": bool(why),
        "simulatedWhy": why,
        "mechanism": mechanism,
        "mechanismWhy": str(module_result.get("mechanismWhy") or ""),
        "status": "fail" if problems else "pass",
        "problems": problems,
        "models": models,
    }


METRICS = {
    "p50Ms": ("rollout_bench_latency_p50_seconds", "P50 latency of the benchmark, seconds", 1e-3),
    "p99Ms": ("rollout_bench_latency_p99_seconds", "P99 latency of the benchmark, seconds", 1e-3),
    "h2dGbps": (
        "rollout_bench_h2d_bandwidth_bytes_per_second",
        "Host-to-device bandwidth of the benchmark, bytes per second",
        1e9,
    ),
    "loadS": ("rollout_bench_load_seconds", "Load time of the benchmark, seconds", 1.0),
}
RATIO_METRIC = "rollout_bench_local_remote_ratio"
HELD_METRIC = "rollout_bench_binding_held"
TIME_METRIC = "rollout_bench_timestamp_seconds"
#: Every metric :func:`metrics_text` writes (the Grafana panel's queries are checked against it).
BENCH_METRICS = (*(m[0] for m in METRICS.values()), RATIO_METRIC, HELD_METRIC, TIME_METRIC)


def metrics_text(results: Sequence[Mapping[str, Any]]) -> str:
    """Prometheus text exposition of bench results (node_exporter's textfile collector reads it):
    each metric per node, GPU model, binding (local, remote), NUMA node, mechanism and whether
    it is simulated; the local/remote ratio per metric; and when each node was benched."""
    from datetime import datetime

    from prometheus_client import CollectorRegistry, Gauge, generate_latest

    reg = CollectorRegistry()
    labels = ["node", "gpu_model", "binding", "numa_node", "mechanism", "simulated", "change"]
    gauges = {
        key: Gauge(name, help_, labels, registry=reg) for key, (name, help_, _) in METRICS.items()
    }
    held = Gauge(
        HELD_METRIC, "1 when the run had the binding asked for, else 0", labels, registry=reg
    )
    ratio_g = Gauge(
        RATIO_METRIC,
        "Local / remote NUMA binding, per metric (latency: below 1 is faster locally)",
        ["node", "gpu_model", "metric", "simulated", "change"],
        registry=reg,
    )
    when = Gauge(
        TIME_METRIC, "When the node was benched, Unix seconds", ["node", "simulated", "change"],
        registry=reg,
    )  # fmt: skip
    for res in results:
        node, sim = str(res["node"]), str(bool(res.get("simulated"))).lower()
        change = str(res.get("change") or "")
        when.labels(node, sim, change).set(datetime.fromisoformat(str(res["at"])).timestamp())
        for m in res.get("models") or ():
            for binding in (*BINDINGS, "placed"):
                run = m.get(binding)
                if not isinstance(run, Mapping):
                    continue
                mech = str(res.get("mechanism") or "")
                values = (node, m["gpuModel"], binding, str(run.get("numaNode")), mech, sim, change)
                for key, (_, _, scale) in METRICS.items():
                    gauges[key].labels(*values).set(float(run[key]) * scale)
                held.labels(*values).set(1 if run.get("bindingHeld") else 0)
            for key, value in (m.get("ratio") or {}).items():
                if value is not None:
                    ratio_g.labels(node, m["gpuModel"], key, sim, change).set(value)
    return generate_latest(reg).decode()
