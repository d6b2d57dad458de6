"""In the lab: ``rollout bench --standin`` runs the CPU stand-in on a lab node twice, bound to the
GPU's NUMA node and to the other one, over ssh, and says the results are simulated.

The node's simulated hardware is two NUMA nodes of one CPU each (CPU 0 and CPU 1, which every
machine this runs on has), so each binding is a real ``sched_setaffinity`` (or ``numactl``
where the node has it and it binds) on a real CPU. What the test checks comes from the node: the
stand-in's own ``Cpus_allowed_list`` and the one its shell recorded, against the NUMA node's
cpulist as the node's facts read it from its sysfs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from rollout.ansible.hosts import read_inventory
from rollout.ansible.runner import AnsibleRunner
from rollout.bench.results import BENCH_METRICS
from rollout.lab.cluster import Lab
from rollout.lab.hardware import NodeShape
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab

TWO_NUMA_ONE_CPU_EACH = NodeShape(
    sockets=2, cores_per_socket=1, threads_per_core=1, gpus_per_numa=1
)


def test_bench_standin_runs_on_the_node_bound_to_each_numa_node(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    nodes = lab_nodes(1, shape=TWO_NUMA_ONE_CPU_EACH)
    node = nodes.names[0]
    env = ck.env(lab, tmp_path / "state")
    evidence, metrics = tmp_path / "evidence.json", tmp_path / "bench.prom"
    args = ["bench", "-i", str(nodes.inventory), "--node", node, "--standin"]
    args += ["--env", "ROLLOUT_STANDIN_MB=8", "--env", "ROLLOUT_STANDIN_STEPS=50"]
    r = ck.cli([*args, "-o", "json", "--out", str(evidence), "--metrics-out", str(metrics)], env)
    assert r.returncode == 0, r.stderr + r.stdout
    res = json.loads(r.stdout)

    # the node's own account of its NUMA nodes and GPUs (its sysfs, through the facts module)
    inv = read_inventory(nodes.inventory)
    facts = AnsibleRunner(tmp_path / "runner").gather_facts(
        inv.path, inv.hosts, tmp_path / "facts", inv.hostvars
    )[inv.hosts[0]]
    cpulist = {int(n["id"]): n["cpus"] for n in facts["numaNodes"]}
    gpu = sorted(facts["gpus"], key=lambda g: g["id"])[0]
    assert cpulist == {0: "0", 1: "1"}

    assert res["node"] == node and res["status"] == "pass", res
    assert res["simulated"] is True and any("stand-in" in w for w in res["simulatedWhy"])
    assert res["mechanism"] in ("numactl", "cpu-affinity") and res["mechanismWhy"]
    (m,) = res["models"]
    assert m["gpu"] == gpu["id"] and m["gpuNumaNode"] == gpu["numaNode"]
    assert m["gpuModel"] == f"pci {gpu['vendor'][2:]}:{gpu['device'][2:]}"
    assert m["remoteNumaNode"] == 1 - gpu["numaNode"]
    for binding, numa in (("local", m["gpuNumaNode"]), ("remote", m["remoteNumaNode"])):
        run = m[binding]
        assert run["numaNode"] == numa and run["bindingHeld"], run
        # the stand-in's own Cpus_allowed_list and its shell's are the NUMA node's cpulist
        assert run["commandCpus"] == run["observedCpus"] == cpulist[numa]
        assert run["p50Ms"] > 0 and run["p99Ms"] >= run["p50Ms"] and run["h2dGbps"] > 0
        assert run["loadS"] > 0 and run["samples"] == 50
    assert m["ratio"]["p50Ms"] == pytest.approx(m["local"]["p50Ms"] / m["remote"]["p50Ms"], 1e-3)

    doc = json.loads(evidence.read_text())
    assert [b["node"] for b in doc["bench"]] == [node]
    assert doc["bench"][0]["models"] == res["models"]

    text = metrics.read_text()
    names = {ln.split("{")[0] for ln in text.splitlines() if ln and not ln.startswith("#")}
    assert names == set(BENCH_METRICS)
    local = m["local"]
    want = (
        f'rollout_bench_latency_p50_seconds{{binding="local",change="",gpu_model="{m["gpuModel"]}",'
        f'mechanism="{res["mechanism"]}",node="{node}",numa_node="{local["numaNode"]}",'
        f'simulated="true"}}'
    )
    line = next(ln for ln in text.splitlines() if ln.startswith(want))
    assert float(line.split()[-1]) == pytest.approx(local["p50Ms"] / 1000)

    # text output names the binding and says simulated
    r = ck.cli([*args, "--mechanism", "cpu-affinity"], env)
    assert r.returncode == 0, r.stderr
    assert "SIMULATED" in r.stdout and "cpu-affinity" in r.stdout
    assert re.search(r"local/remote\s+\d", r.stdout), r.stdout
