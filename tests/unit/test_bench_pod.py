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
from tests.unit.fakes_change import RecordingClock

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


# --- a bench pod left behind by a killed tool ---------------------------------------------------


def _pod(name: str, owner: str | None, node: str = "gpu-1", **labels: str) -> dict[str, Any]:
    m = bench_manifest(POD, node, "b", {}, None, 1.0, owner=owner or "")
    m["metadata"]["name"] = name
    m["metadata"]["labels"].update(labels)
    return m


class Pods:
    """:class:`rollout.kube.probing.ProbePods` as far as the sweep uses it: a pod is gone
    ``lag`` looks after its delete."""

    namespace = "rollout-probes"

    def __init__(self, pods: list[dict[str, Any]], lag: int = 0) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods}
        self.deleted: list[str] = []
        self.looks: dict[str, int] = {}
        self.lag = lag
        self.selectors: list[str] = []

    def labelled(self, selector: str) -> list[dict[str, Any]]:
        self.selectors.append(selector)
        return list(self.pods.values())

    def delete(self, name: str) -> None:
        self.deleted.append(name)

    def status(self, name: str) -> dict[str, Any] | None:
        if name not in self.deleted:
            return {"phase": "Running"}
        self.looks[name] = self.looks.get(name, 0) + 1
        return {"phase": "Running"} if self.looks[name] <= self.lag else None


def test_the_manifest_names_the_process_that_created_it() -> None:
    from rollout.bench.in_pod import OWNER_ANNOTATION, owner_of

    m = bench_manifest(POD, "gpu-1", "b", {}, None, 1.0, owner="ops@h pid 12")
    assert m["metadata"]["annotations"] == {"a": "b", OWNER_ANNOTATION: "ops@h pid 12"}
    assert owner_of(m) == "ops@h pid 12"
    assert owner_of(bench_manifest(POD, "gpu-1", "b", {}, None, 1.0)) == ""


def test_only_bench_pods_of_a_process_gone_are_leftovers() -> None:
    from rollout.bench.in_pod import leftovers

    dead = {"ops@here pid 7"}
    pods = [
        _pod("rollout-bench-a", "ops@here pid 7"),  # its tool was killed: a leftover
        _pod("rollout-bench-b", "ops@here pid 8"),  # its tool still runs
        _pod("rollout-bench-c", None),  # made before the annotation, or by hand: unknown
        _pod("someone-else", "ops@here pid 7"),  # not the tool's name
        _pod("rollout-bench-d", "ops@here pid 7", **{"app.kubernetes.io/managed-by": "helm"}),
        _pod("rollout-bench-e", "ops@here pid 7", **{"rollout.io/bench": "false"}),
    ]
    stale, kept = leftovers(pods, lambda owner: owner in dead)
    assert [p["metadata"]["name"] for p in stale] == ["rollout-bench-a"]
    assert [p["metadata"]["name"] for p in kept] == ["rollout-bench-b", "rollout-bench-c"]


def test_the_default_judge_is_a_process_of_this_host_that_no_longer_exists() -> None:
    import os
    import socket
    import subprocess
    import sys

    from rollout.bench.in_pod import leftovers

    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    here = socket.gethostname()
    pods = [
        _pod("rollout-bench-gone", f"ops@{here} pid {gone.stdout.strip()}"),
        _pod("rollout-bench-me", f"ops@{here} pid {os.getpid()}"),
        _pod("rollout-bench-there", f"ops@not-{here} pid {gone.stdout.strip()}"),
    ]
    stale, kept = leftovers(pods)
    assert [p["metadata"]["name"] for p in stale] == ["rollout-bench-gone"]
    assert {p["metadata"]["name"] for p in kept} == {"rollout-bench-me", "rollout-bench-there"}


def test_the_sweep_deletes_leftovers_waits_until_gone_and_names_other_pods_on_the_node() -> None:
    from rollout.bench.in_pod import SELECTOR, sweep

    pods = Pods(
        [
            _pod("rollout-bench-a", "x pid 1"),
            _pod("rollout-bench-z", "x pid 1", node="gpu-9"),  # a leftover elsewhere: deleted
            _pod("rollout-bench-b", "x pid 2"),
            _pod("rollout-bench-c", "x pid 2", node="gpu-9"),  # alive, another node: silent
        ],
        lag=2,
    )
    said: list[str] = []
    clock = RecordingClock()
    deleted = sweep(
        pods, "gpu-1", said.append, lambda o: o == "x pid 1", clock.sleep, clock.monotonic
    )
    assert pods.selectors == [SELECTOR]
    assert deleted == ["rollout-bench-a", "rollout-bench-z"]
    # deleted both first, then each waited for (deleted again: grace 0 is idempotent)
    assert pods.deleted[:2] == ["rollout-bench-a", "rollout-bench-z"]
    assert set(pods.deleted) == {"rollout-bench-a", "rollout-bench-z"}
    assert clock.slept == [0.5] * 4  # each gone on its third look, half a second apart
    assert said[0] == (
        "deleting bench pod rollout-probes/rollout-bench-a on gpu-1: left by x pid 1, which no "
        "longer runs"
    )
    assert said[2].startswith("warning: bench pod rollout-probes/rollout-bench-b on gpu-1 ")
    assert "(created by x pid 2)" in said[2] and len(said) == 3
    assert "rollout-bench-b" not in pods.deleted and "rollout-bench-c" not in pods.deleted


def test_a_deleted_bench_pod_is_looked_at_every_half_second_for_two_minutes() -> None:
    from rollout.bench import in_pod
    from rollout.errors import ExternalError

    clock, pods = RecordingClock(), Pods([_pod("rollout-bench-a", None)], lag=10**6)
    with pytest.raises(ExternalError, match="still present 120s after delete"):
        in_pod._delete(pods, "rollout-bench-a", sleep=clock.sleep, monotonic=clock.monotonic)  # type: ignore[arg-type]
    assert clock.slept == [0.5] * 240 and pods.looks["rollout-bench-a"] == 241


def test_sigterm_inside_deletes_first_then_acts_as_before() -> None:
    import os
    import signal

    from rollout.bench.in_pod import deleted_on_term

    calls: list[str] = []

    def before(signum: int, frame: object) -> None:
        calls.append(f"previous {signum}")

    old = signal.signal(signal.SIGTERM, before)
    try:
        with deleted_on_term(lambda: calls.append("delete")):
            os.kill(os.getpid(), signal.SIGTERM)
            assert calls == ["delete", f"previous {signal.SIGTERM}"]
        assert signal.getsignal(signal.SIGTERM) is before  # restored on the way out
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls[-1] == f"previous {signal.SIGTERM}" and calls.count("delete") == 1

        def boom() -> None:
            raise OSError("API server away")

        with deleted_on_term(boom):  # a failed delete does not keep the signal from acting
            os.kill(os.getpid(), signal.SIGTERM)
        assert calls.count(f"previous {signal.SIGTERM}") == 3
    finally:
        signal.signal(signal.SIGTERM, old)


def test_sigterm_with_the_default_action_still_kills_after_the_delete(tmp_path: Path) -> None:
    import subprocess
    import sys

    marker = tmp_path / "deleted"
    code = (
        "import os, signal, pathlib\n"
        "from rollout.bench.in_pod import deleted_on_term\n"
        f"with deleted_on_term(lambda: pathlib.Path({str(marker)!r}).write_text('x')):\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "    print('survived')\n"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal_term() and "survived" not in r.stdout, (r.returncode, r.stderr)
    assert marker.read_text() == "x"


def signal_term() -> int:
    import signal

    return int(signal.SIGTERM)
