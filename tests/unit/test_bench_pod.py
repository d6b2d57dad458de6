"""The bench pod (:mod:`rollout.bench.in_pod`), pure parts: its manifest (Guaranteed,
integer CPUs, one GPU, bound to the node, in the tool's namespace) and the record read from its
log and the kubelet's account of it. The run itself is ``tests/lab/test_bench_pod_lab.py``."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from rollout.bench.in_pod import EXIT_MARK, bench_manifest, read_result
from rollout.bench.results import BenchError, metrics_text
from rollout.change.plan.gate_section import PodBench
from rollout.change.record.journal import Journal, Kind
from rollout.evidence.report import build_report, render
from rollout.models import Phase

POD = PodBench(image="r/bench:1", cpus=4, memory="8Gi", annotations={"a": "b"})
OUT = {"p50_ms": 1.0, "p99_ms": 2.0, "h2d_gbps": 20.0, "load_s": 3.0, "cpus_allowed": "4-7"}
NODE = {
    "numa": {"0": "0-31", "1": "32-63"},
    "deviceNuma": {"GPU-a": 0},
    "deviceSource": "podresources",
    "pods": [
        {
            "namespace": "rollout-probes",
            "name": "p",
            "devices": {"nvidia.com/gpu": ["GPU-a"]},
            "cpus": "4-7",
            "cpuSource": "podresources",
            "podResourcesListed": True,
        }
    ],
}


def test_the_manifest_is_guaranteed_bound_to_the_node_with_one_gpu() -> None:
    m = bench_manifest(POD, "gpu-1", "./bench.sh --x", {"K": "v"}, "20261206T101010Z-abcdef", 1.0)
    assert m["metadata"]["namespace"] == "rollout-probes"
    assert m["metadata"]["labels"]["rollout.io/bench"] == "true"
    assert m["metadata"]["annotations"] == {"a": "b"}
    spec = m["spec"]
    assert spec["nodeName"] == "gpu-1" and spec["restartPolicy"] == "Never"
    assert spec["activeDeadlineSeconds"] == 600 + 300 + 600  # ends even if the tool died
    (c,) = spec["containers"]
    want = {"cpu": "4", "memory": "8Gi", "nvidia.com/gpu": "1"}
    assert c["resources"] == {"requests": want, "limits": want}  # Guaranteed, whole CPUs
    assert c["command"][:2] == ["/bin/sh", "-c"] and c["command"][2].startswith("./bench.sh --x\n")
    assert EXIT_MARK in c["command"][2]
    assert c["env"] == [{"name": "K", "value": "v"}]


def _log(rc: int = 0, doc: dict[str, Any] | None = None) -> str:
    return f"warming up\n{json.dumps(doc or OUT)}\n{EXIT_MARK}{rc}\n"


def test_the_record_names_the_kubelets_cpus_and_gpu_and_checks_the_commands_view() -> None:
    run = read_result(_log(), NODE, "p", "rollout-probes", "nvidia.com/gpu")
    assert run["bindingHeld"] and not run["problems"]
    assert (run["cpus"], run["devices"], run["numaNode"]) == ("4-7", ["GPU-a"], 0)
    assert run["cpuNumaNodes"] == [0] and run["aligned"] is True and run["p99Ms"] == 2.0
    assert run["said"] == ["warming up"]
    seen_other = read_result(
        _log(doc={**OUT, "cpus_allowed": "8-11"}), NODE, "p", "rollout-probes", "nvidia.com/gpu"
    )
    assert seen_other["problems"] == ["the command saw CPUs 8-11, the kubelet gave 4-7"]
    unlisted = read_result(_log(), {**NODE, "pods": []}, "p", "rollout-probes", "nvidia.com/gpu")
    assert unlisted["problems"] == ["the kubelet's account does not name the pod"]


@pytest.mark.parametrize(
    ("log", "words"),
    [
        (_log(rc=3), "the command exited 3"),
        ("still running\n", "the command did not finish"),
        (f"no json\n{EXIT_MARK}0\n", "the last output line is not JSON"),
    ],
)
def test_a_failed_or_unfinished_command_fails_the_bench(log: str, words: str) -> None:
    with pytest.raises(BenchError, match=words):
        read_result(log, NODE, "p", "rollout-probes", "nvidia.com/gpu")


def test_metrics_of_a_pod_record_carry_the_placed_run() -> None:
    run = read_result(_log(), NODE, "p", "rollout-probes", "nvidia.com/gpu")
    rec = {
        "node": "gpu-1",
        "at": "2026-12-06T10:00:00+00:00",
        "mechanism": "kubelet",
        "models": [{"gpuModel": "H100", "placed": run}],
    }
    text = metrics_text([rec])
    assert 'binding="placed"' in text and "rollout_bench_latency_p99_seconds" in text


def test_the_report_shows_a_pod_record_with_the_kubelets_cpus_and_gpu(tmp_path: Path) -> None:
    run = read_result(_log(), NODE, "p", "rollout-probes", "nvidia.com/gpu")
    rec = {
        "node": "gpu-1",
        "at": "2026-12-06T10:00:00+00:00",
        "command": "./bench.sh",
        "mode": "pod",
        "pod": {"name": "rollout-bench-gpu-1-x"},
        "mechanism": "kubelet",
        "mechanismWhy": "placed by the kubelet's CPU, topology and device managers",
        "status": "pass",
        "problems": [],
        "simulated": False,
        "simulatedWhy": [],
        "models": [{"gpuModel": "H100", "placed": run}],
    }
    j = Journal.create(tmp_path, "20261206T100000Z-abcdef")
    j.append(Kind.BENCH, Phase.DONE, now=datetime(2026, 12, 6, 10, tzinfo=UTC), data=rec)
    rep = build_report(j.entries())
    md = render(rep, "markdown")
    assert (
        "| H100 | placed by the kubelet (pod rollout-bench-gpu-1-x; GPU GPU-a) | 0 | 4-7 | no "
        "| 1 | 2 | 20 | 3 | false |"
    ) in md
    assert "<td>placed by the kubelet (pod rollout-bench-gpu-1-x; GPU GPU-a)</td>" in render(
        rep, "html"
    )
