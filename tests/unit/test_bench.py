"""``rollout bench``: the output contract, the choice of GPU and NUMA nodes, the binding mechanism
(and a real bound run of the node module on this machine), the record, its Prometheus text, the
shipped Grafana panels and the report's bench section."""

from __future__ import annotations

import importlib.util
import json
import os
from datetime import UTC, datetime
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from click.testing import CliRunner
from prometheus_client.parser import text_string_to_metric_families

from rollout import assets
from rollout.bench import on_node
from rollout.bench.results import (
    BENCH_METRICS,
    BenchError,
    Target,
    build_result,
    judge_run,
    metrics_text,
    parse_output,
    plan_targets,
)
from rollout.change.record.journal import Journal, Kind
from rollout.cli import cli
from rollout.errors import InputError
from rollout.evidence.checks import merge_collection
from rollout.evidence.report import build_report, load_report, render
from rollout.models import Phase
from tests.unit.test_monitoring_assets import metric_names

GOOD = {"p50_ms": 1.5, "p99_ms": 4.0, "h2d_gbps": 20.5, "load_s": 3.25}


def _module() -> ModuleType:
    path = assets.playbooks() / "roles" / "rollout_kubelet" / "library" / "rollout_bench.py"
    spec = importlib.util.spec_from_file_location("rollout_bench_module", path)
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# ---------------------------------------------------------------- the output contract


def test_the_last_output_line_is_the_result_and_earlier_lines_are_log() -> None:
    out = "loading model...\nwarm-up done\n" + json.dumps({**GOOD, "samples": 10}) + "\n\n"
    doc = parse_output(out, "local run")
    assert doc["p99_ms"] == 4.0 and doc["samples"] == 10


@pytest.mark.parametrize(
    ("stdout", "says"),
    [
        ("", "printed nothing"),
        ("p50=1\n", "not JSON"),
        ("[1, 2]", "must be a JSON object"),
        (json.dumps({**GOOD, "p95_ms": 2}), "unknown field(s) p95_ms"),
        (json.dumps({k: v for k, v in GOOD.items() if k != "load_s"}), "field load_s is missing"),
        (json.dumps({**GOOD, "h2d_gbps": -1}), "field h2d_gbps must be a finite number >= 0"),
        (json.dumps({**GOOD, "p50_ms": "fast"}), "field p50_ms must be a finite number"),
        (json.dumps({**GOOD, "load_s": True}), "field load_s must be a finite number"),
        ('{"p50_ms": NaN, "p99_ms": 1, "h2d_gbps": 1, "load_s": 1}', "field p50_ms must be"),
        (json.dumps({**GOOD, "p99_ms": 1.0}), "p99_ms (1.0) is below p50_ms (1.5)"),
        (json.dumps({**GOOD, "samples": 0}), "field samples must be an integer >= 1"),
        (json.dumps({**GOOD, "simulated": "yes"}), "field simulated must be a bool"),
    ],
)
def test_a_broken_contract_is_refused_naming_the_run_and_the_field(stdout: str, says: str) -> None:
    with pytest.raises(BenchError) as e:
        parse_output(stdout, "node n1, remote run")
    assert str(e.value).startswith("node n1, remote run: ") and says in str(e.value)


# ---------------------------------------------------------------- which GPU, which NUMA nodes


def facts(gpus: list[dict[str, Any]], numa: int = 2) -> dict[str, Any]:
    return {
        "numaNodes": [{"id": n, "cpus": f"{n * 4}-{n * 4 + 3}"} for n in range(numa)],
        "gpus": gpus,
    }


def gpu(addr: str, numa: int | None, device: str = "0x2330") -> dict[str, Any]:
    return {"id": addr, "vendor": "0x10de", "device": device, "numaNode": numa}


def test_one_target_per_gpu_model_remote_is_the_lowest_other_numa_node() -> None:
    f = facts([gpu("0000:98:00.0", 1), gpu("0000:18:00.0", 1), gpu("0000:c8:00.0", 0, "0x2335")])
    targets = plan_targets(f, {}, "n1")
    assert targets == [
        Target("pci 10de:2330", "0000:18:00.0", 0, 1, 0, "4-7", "0-3"),
        Target("pci 10de:2335", "0000:c8:00.0", 2, 0, 1, "0-3", "4-7"),
    ]
    runs = targets[1].runs(1)
    assert [(r["name"], r["numa"], r["cpus"]) for r in runs] == [
        ("t1-local", 0, "0-3"),
        ("t1-remote", 1, "4-7"),
    ]
    assert runs[0]["env"]["CUDA_VISIBLE_DEVICES"] == "2"
    assert runs[0]["env"]["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert runs[1]["env"]["ROLLOUT_BENCH_BINDING"] == "remote"


def test_the_product_label_names_the_model_of_a_one_model_node() -> None:
    f = facts([gpu("0000:18:00.0", 0), gpu("0000:28:00.0", 1)])
    (t,) = plan_targets(f, {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}, "n1")
    assert (t.model, t.gpu, t.local, t.remote) == ("NVIDIA-H100-80GB-HBM3", "0000:18:00.0", 0, 1)


def test_gpu_and_remote_options_choose_and_are_checked() -> None:
    f = facts([gpu("0000:18:00.0", 0), gpu("0000:28:00.0", 1)], numa=3)
    (t,) = plan_targets(f, {}, "n1", gpu="0000:28:00.0", remote=2)
    assert (t.gpu, t.cuda_index, t.local, t.remote, t.remote_cpus) == (
        "0000:28:00.0", 1, 1, 2, "8-11",
    )  # fmt: skip
    with pytest.raises(InputError) as e:
        plan_targets(f, {}, "n1", gpu="0000:99:00.0")
    assert e.value.location.field == "--gpu" and "0000:18:00.0, 0000:28:00.0" in str(e.value)
    with pytest.raises(InputError) as e:
        plan_targets(f, {}, "n1", remote=7)
    assert e.value.location.field == "--remote-numa"


@pytest.mark.parametrize(
    ("f", "says"),
    [
        (facts([gpu("0000:18:00.0", 0)], numa=1), "no other NUMA node with CPUs"),
        (facts([gpu("0000:18:00.0", None)]), "no GPU with a NUMA node"),
        (facts([]), "no GPU with a NUMA node"),
    ],
)
def test_a_node_that_cannot_compare_bindings_is_refused(f: dict[str, Any], says: str) -> None:
    with pytest.raises(BenchError, match=says):
        plan_targets(f, {}, "n1")


# ---------------------------------------------------------------- the binding mechanism


def _never() -> str | None:
    raise AssertionError("probed without numactl")


@pytest.mark.parametrize(
    ("requested", "numactl", "probe", "want"),
    [
        ("auto", None, _never, ("cpu-affinity", "numactl is not on the node's PATH")),
        ("auto", "/usr/bin/numactl", lambda: None, ("numactl", "numactl binds every node")),
        (
            "auto",
            "/usr/bin/numactl",
            lambda: "numactl --membind=1 true exited 1: invalid",
            (
                "cpu-affinity",
                "numactl cannot bind here: numactl --membind=1 true exited 1: invalid",
            ),
        ),
        ("cpu-affinity", "/usr/bin/numactl", _never, ("cpu-affinity", "asked for")),
        ("numactl", "/usr/bin/numactl", lambda: None, ("numactl", "asked for")),
    ],
)
def test_the_mechanism_is_chosen_and_says_why(
    requested: str, numactl: str | None, probe: Any, want: tuple[str, str]
) -> None:
    assert _module().choose_mechanism(requested, numactl, probe) == want


@pytest.mark.parametrize(
    ("numactl", "probe", "says"),
    [(None, _never, "not on the node's PATH"), ("/bin/numactl", lambda: "no node 1", "no node 1")],
)
def test_numactl_asked_for_and_unusable_is_an_error(numactl: Any, probe: Any, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        _module().choose_mechanism("numactl", numactl, probe)


def test_numactl_wraps_the_recording_shell() -> None:
    argv = _module().bound_argv("numactl", "/usr/bin/numactl", 1, "./b.sh")
    assert argv[:3] == ["/usr/bin/numactl", "--cpunodebind=1", "--membind=1"]
    assert argv[3:5] == ["/bin/sh", "-c"] and argv[-1] == "./b.sh"
    assert _module().bound_argv("cpu-affinity", None, 1, "./b.sh")[0] == "/bin/sh"


def test_the_module_really_binds_each_run_and_records_what_it_had() -> None:
    """The node module on this machine: each run gets one CPU by sched_setaffinity; the shell's
    record and the stand-in's own Cpus_allowed_list both say that CPU."""
    cpus = sorted(os.sched_getaffinity(0))
    one, other = cpus[0], cpus[-1]
    got = _module().direct(
        {
            "standin": on_node.standin_source(),
            "runs": [
                {"name": "a", "numa": 0, "cpus": str(one), "env": {"ROLLOUT_STANDIN_MB": "2"}},
                {"name": "b", "numa": 1, "cpus": str(other), "env": {"ROLLOUT_STANDIN_MB": "2"}},
            ],
            "mechanism": "cpu-affinity",
            "timeout_s": 60,
        }
    )
    assert got["mechanism"] == "cpu-affinity" and got["rollout_step"] == "bench", got
    for run, cpu in zip(got["runs"], (one, other), strict=True):
        assert run["rc"] == 0, run
        assert run["observed"]["cpus"] == str(cpu)
        assert json.loads(run["stdout"].splitlines()[-1])["cpus_allowed"] == str(cpu)


def test_a_failing_command_is_reported_with_its_output() -> None:
    got = _module().direct(
        {
            "command": "echo broken >&2; exit 3",
            "runs": [{"name": "a", "numa": 0, "cpus": str(min(os.sched_getaffinity(0)))}],
            "mechanism": "cpu-affinity",
        }
    )
    (run,) = got["runs"]
    with pytest.raises(BenchError, match=r"local: the command exited 3: broken"):
        judge_run(run, "cpu-affinity", run["observed"]["cpus"], 0, "local")


# ---------------------------------------------------------------- judging and the record


def run_out(cpus: str, mems: str = "0", **extra: Any) -> dict[str, Any]:
    return {
        "name": "x",
        "rc": 0,
        "stdout": json.dumps({**GOOD, **extra}),
        "observed": {"cpus": cpus, "mems": mems},
        "elapsedS": 1.0,
    }


def test_a_run_outside_its_numa_node_does_not_hold_its_binding() -> None:
    held = judge_run(run_out("0-1"), "cpu-affinity", "0-3", 0, "w")
    assert held["bindingHeld"] and not held["memoryBound"] and held["p50Ms"] == 1.5
    wide = judge_run(run_out("0-7"), "cpu-affinity", "0-3", 0, "w")
    assert not wide["bindingHeld"]
    assert wide["problems"] == ["allowed CPUs 0-7 are not within NUMA node 0's 0-3"]
    seen = judge_run(run_out("0-3", cpus_allowed="4"), "cpu-affinity", "0-3", 0, "w")
    assert seen["problems"] == ["the command saw CPUs 4, its shell 0-3"]
    mems = judge_run(run_out("4-7", mems="0-1"), "numactl", "4-7", 1, "w")
    assert mems["memoryBound"] and mems["problems"] == ["allowed memory nodes '0-1', not 1"]


def record(
    local: dict[str, Any], remote: dict[str, Any], labels: dict[str, str] | None = None
) -> dict[str, Any]:
    t = Target("pci 10de:2330", "0000:18:00.0", 0, 0, 1, "0-3", "4-7")
    return build_result(
        node="n1",
        host="h1",
        at="2026-12-04T21:00:00+00:00",
        command="./b.sh",
        standin=False,
        labels=labels or {},
        targets=[t],
        module_result={
            "mechanism": "numactl",
            "mechanismWhy": "numactl binds every node",
            "runs": [{**local, "name": "t0-local"}, {**remote, "name": "t0-remote"}],
        },
        change="c1",
    )


def test_the_record_has_both_bindings_and_their_ratio() -> None:
    r = record(
        run_out("0-3", "0"),
        {**run_out("4-7", "1"), "stdout": json.dumps({**GOOD, "p50_ms": 3.0, "p99_ms": 8.0})},
    )
    assert r["status"] == "pass" and not r["simulated"] and r["change"] == "c1"
    (m,) = r["models"]
    assert m["ratio"] == {"p50Ms": 0.5, "p99Ms": 0.5, "h2dGbps": 1.0, "loadS": 1.0}
    assert (m["local"]["numaNode"], m["remote"]["numaNode"]) == (0, 1)


def test_simulated_says_why_lab_node_or_command() -> None:
    lab = record(run_out("0-3"), run_out("4-7", "1"), {"rollout.dev/lab": "pt1"})
    assert lab["simulated"] and lab["simulatedWhy"] == [
        "lab node (rollout.dev/lab=pt1): its GPUs are simulated"
    ]
    said = record(run_out("0-3", simulated=True), run_out("4-7", "1"))
    assert said["simulatedWhy"] == ["the command's output says simulated"]


def test_a_missing_run_fails_the_record() -> None:
    with pytest.raises(BenchError, match=r"remote run .* no result"):
        build_result(
            node="n1", host="h1", at="2026-12-04T21:00:00+00:00", command="x", standin=True,
            labels={}, targets=[Target("m", "g", 0, 0, 1, "0", "1")],
            module_result={
                "mechanism": "cpu-affinity", "runs": [{**run_out("0"), "name": "t0-local"}],
            },
        )  # fmt: skip


# ---------------------------------------------------------------- metrics and the panels


def test_metrics_text_is_valid_exposition_with_base_units() -> None:
    r = record(run_out("0-3", "0"), run_out("4-7", "1"), {"rollout.dev/lab": "pt1"})
    families = {f.name: f for f in text_string_to_metric_families(metrics_text([r]))}
    assert {s.name for f in families.values() for s in f.samples} == set(BENCH_METRICS)
    p50 = {s.labels["binding"]: s for s in families["rollout_bench_latency_p50_seconds"].samples}
    assert p50["local"].value == pytest.approx(1.5e-3)
    assert p50["local"].labels == {
        "node": "n1", "gpu_model": "pci 10de:2330", "binding": "local", "numa_node": "0",
        "mechanism": "numactl", "simulated": "true", "change": "c1",
    }  # fmt: skip
    (h2d,) = [
        s
        for s in families["rollout_bench_h2d_bandwidth_bytes_per_second"].samples
        if s.labels["binding"] == "remote"
    ]
    assert h2d.value == pytest.approx(20.5e9)
    ratios = {
        s.labels["metric"]: s.value for s in families["rollout_bench_local_remote_ratio"].samples
    }
    assert ratios == {"p50Ms": 1.0, "p99Ms": 1.0, "h2dGbps": 1.0, "loadS": 1.0}


def test_the_grafana_panels_query_only_what_the_exporter_writes() -> None:
    from importlib.resources import files

    doc = json.loads(files("rollout").joinpath("data", "grafana", "bench-panels.json").read_text())
    exprs = [t["expr"] for p in doc["panels"] for t in p["targets"]]
    used: set[str] = set()
    for e in exprs:
        names = metric_names(e) - {"time"}
        assert names, e
        used |= names
    r = record(run_out("0-3", "0"), run_out("4-7", "1"))
    written = {s.name for f in text_string_to_metric_families(metrics_text([r])) for s in f.samples}
    assert used <= written and used == set(BENCH_METRICS)


# ---------------------------------------------------------------- evidence and the report


def test_the_report_shows_the_journaled_bench_simulated(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, "20261204T210000Z-abcdef")
    now = datetime(2026, 12, 4, 21, 0, tzinfo=UTC)
    r = record(run_out("0-3", "0"), run_out("4-7", "1"), {"rollout.dev/lab": "pt1"})
    j.append(Kind.BENCH, Phase.DONE, now=now, data=r)
    rep = build_report(j.entries())
    assert rep.as_dict()["bench"] == [r]
    md = render(rep, "markdown")
    assert "## Performance (rollout bench)" in md and "**SIMULATED**" in md
    assert "| pci 10de:2330 | local | 0 | 0-3 | yes | 1.5 | 4 | 20.5 | 3.25 | true |" in md
    assert "| pci 10de:2330 | local/remote | | | | 1 | 1 | 1 | 1 | true |" in md
    html = render(rep, "html")
    assert '<strong class="simulated">SIMULATED</strong>' in html
    assert "<td>pci 10de:2330</td><td>remote</td><td>1</td><td>4-7</td>" in html


def test_a_failed_bench_is_in_the_report_and_evidence_keeps_bench(tmp_path: Path) -> None:
    j = Journal.create(tmp_path, "20261204T210000Z-abcdef")
    on_node.journal_bench(j, "n2", None, "node n2: field p50_ms is missing", "./b.sh")
    r = record(run_out("0-3", "0"), run_out("4-7", "1"))
    target = j.dir / "evidence.json"
    on_node.add_to_evidence(target, r)
    on_node.add_to_evidence(target, {**r, "at": "later"})  # the same node: replaced
    doc = json.loads(target.read_text())
    assert [b["at"] for b in doc["bench"]] == ["later"]
    # a later `rollout evidence` collection keeps the bench records
    merged = merge_collection(doc, {"label": "after", "at": "x", "nodes": {}})
    assert merged["bench"] == doc["bench"] and len(merged["collections"]) == 1
    rep = load_report(j)
    assert {b["node"]: b["status"] for b in rep.bench} == {"n1": "pass", "n2": "error"}
    assert (e := j.entries()[-1]).step == Kind.BENCH and e.phase is Phase.FAILED
    assert "n2**: error: node n2: field p50_ms is missing" in render(rep, "markdown")


# ---------------------------------------------------------------- the command line


@pytest.mark.parametrize(
    ("args", "field"),
    [
        (["--standin", "--command", "x"], "--command"),
        ([], "--command"),
        (["--command", "  "], "--command"),
        (["--standin", "--env", "NOEQUALS"], "--env"),
        (["--standin", "--env", "1X=2"], "--env"),
        (["--command", "x", "--image", "r/b:1"], "--image"),  # host mode reads no image
        (["--command", "x", "--mode", "pod"], "--image"),
        (["--standin", "--mode", "pod", "--image", "r/b:1"], "--standin"),
        (
            ["--command", "x", "--mode", "pod", "--image", "r/b:1", "--pod-memory", "lots"],
            "--pod-memory",
        ),
        (
            ["--command", "x", "--mode", "pod", "--image", "r/b:1", "--pod-annotation", "a"],
            "--pod-annotation",
        ),
        (
            ["--command", "x", "--mode", "pod", "--image", "r/b:1", "--gpu-resource", "gpu"],
            "--gpu-resource",
        ),
    ],
)
def test_bad_input_exits_2_naming_the_field(args: list[str], field: str) -> None:
    r = CliRunner().invoke(cli, ["bench", *args])
    assert r.exit_code == 2, r.output
    assert field in r.output
