"""``rollout bench``: performance evidence on a canary node, bound to the GPU's NUMA node and
deliberately to another one (:mod:`rollout.bench.on_node`; docs/bench.md)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import click

from rollout.errors import ExternalError, InputError, Location

from .options import inventory_option, kube_options, output_option


def _env(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        key, sep, value = p.partition("=")
        if not sep or not key or not key.replace("_", "").isalnum() or key[0].isdigit():
            raise InputError(f"--env {p!r}: must be NAME=VALUE", Location(field="--env"))
        out[key] = value
    return out


@click.command("bench")
@inventory_option
@click.option(
    "--change",
    "change",
    help="Journal the result with this change and add it to its evidence.json (default node: "
    "the change's first canary node; default inventory: the change's).",
)
@click.option(
    "--node", help="The Node to bench (default: the change's canary, else the first host)."
)
@click.option(
    "--command",
    "command",
    help="The benchmark command line, run with /bin/sh on the node; its last output line is "
    "one JSON object (p50_ms, p99_ms, h2d_gbps, load_s; docs/bench.md).",
)
@click.option(
    "--standin",
    is_flag=True,
    help="Run the shipped CPU stand-in instead of --command (for the lab: it measures CPU and "
    "memory work, no GPU; its results are marked simulated).",
)
@click.option(
    "--mechanism",
    type=click.Choice(["auto", "numactl", "cpu-affinity"]),
    default="auto",
    show_default=True,
    help="How runs are bound: numactl --cpunodebind=N --membind=N, or the NUMA node's CPU list "
    "by sched_setaffinity (memory not bound); auto: numactl when it binds on the node.",
)
@click.option("--gpu", help="Bench only this GPU (PCI address; default: one GPU per GPU model).")
@click.option(
    "--remote-numa",
    type=click.IntRange(min=0),
    help="The NUMA node of the remote run (default: the lowest other NUMA node with CPUs).",
)
@click.option(
    "--timeout",
    "timeout_s",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds one run may take before it is killed.",
)
@click.option(
    "--env",
    "env_pairs",
    multiple=True,
    metavar="NAME=VALUE",
    help="Environment for the command (repeatable).",
)
@click.option(
    "--mode",
    type=click.Choice(["host", "pod"]),
    default="host",
    show_default=True,
    help="host: the command on the node over ssh, bound with numactl to the GPU's NUMA node and "
    "to another one. pod: the command in a Guaranteed pod bound to the node (in "
    "--pod-namespace), placed by the kubelet's CPU, topology and device managers; its result "
    "read from the pod's log, the CPUs and GPU it got from the kubelet's podresources.",
)
@click.option("--image", help="With --mode pod: the benchmark's image (it needs /bin/sh).")
@click.option(
    "--pod-cpus",
    type=click.IntRange(min=1),
    default=2,
    show_default=True,
    help="With --mode pod: whole CPUs requested (= limit; exclusive under the static policy).",
)
@click.option(
    "--pod-memory", default="1Gi", show_default=True, help="With --mode pod: memory (= limit)."
)
@click.option(
    "--gpu-resource",
    default="nvidia.com/gpu",
    show_default=True,
    help="With --mode pod: the GPU's extended resource (one unit is requested).",
)
@click.option(
    "--pod-annotation",
    "pod_annotations",
    multiple=True,
    metavar="NAME=VALUE",
    help="With --mode pod: an annotation of the pod (repeatable).",
)
@click.option(
    "--pod-namespace",
    default="rollout-probes",
    show_default=True,
    help="With --mode pod: the namespace of the tool's own pods (created when missing).",
)
@click.option(
    "--out",
    type=click.Path(dir_okay=False),
    help="Add the result to this evidence file's bench list (default with --change: the "
    "change's evidence.json).",
)
@click.option(
    "--metrics-out",
    type=click.Path(dir_okay=False),
    help="Write the result as Prometheus text to FILE (e.g. node_exporter's textfile directory, "
    "NAME.prom), replaced in one rename.",
)
@click.option(
    "--dry-run",
    is_flag=True,
    help="Read the node's facts and print the runs planned; run nothing, write nothing.",
)
@click.option(
    "--lock-namespace",
    default="kube-system",
    show_default=True,
    help="Namespace of the change's cluster record (a change this machine lacks is read there).",
)
@output_option
@kube_options
def bench_cmd(
    inventory: str | None,
    change: str | None,
    node: str | None,
    command: str | None,
    standin: bool,
    mechanism: str,
    gpu: str | None,
    remote_numa: int | None,
    timeout_s: float,
    env_pairs: tuple[str, ...],
    mode: str,
    image: str | None,
    pod_cpus: int,
    pod_memory: str,
    gpu_resource: str,
    pod_annotations: tuple[str, ...],
    pod_namespace: str,
    out: str | None,
    metrics_out: str | None,
    dry_run: bool,
    lock_namespace: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Run a benchmark command on one node twice (--mode host, the default), bound to its GPU's
    NUMA node and to another NUMA node, and record P50/P99 latency, host-to-device bandwidth and
    load time per GPU model for both bindings and their local/remote ratio. Each run's shell
    records the CPUs and memory nodes it was allowed; a run outside its NUMA node fails the
    bench (exit 1), as does a command that fails or breaks the output contract.

    \b
    Examples:
      rollout bench -i inventory.ini --node gpu-1 --command './infer-bench.sh'
      rollout bench --change 20261130T214802Z-a1b2c3 --command './bench.sh' -o json
      rollout bench -i lab.ini --standin --metrics-out /var/lib/node_exporter/bench.prom
      rollout bench --node gpu-1 --mode pod --image registry/infer-bench:1 --command ./bench.sh

    With --mode pod the command runs once per node in a pod the kubelet placed (docs/bench.md):
    the record names the exclusive CPUs and the GPU the kubelet gave it (podresources) and has
    one run, "placed", instead of the local and remote ones.
    """
    from rollout.ansible.hosts import read_inventory
    from rollout.bench import on_node
    from rollout.bench.results import BenchError
    from rollout.change.record.entries import ChangeBegin
    from rollout.change.record.opening import existing_journal
    from rollout.change.record.replay import replay
    from rollout.kube.client import connect

    if standin == bool(command):
        raise InputError(
            "pass exactly one of --command CMD and --standin", Location(field="--command")
        )
    if command is not None and not command.strip():
        raise InputError("--command is empty", Location(field="--command"))
    env = _env(env_pairs)
    pod = None
    if mode == "pod":
        from rollout.change.plan.gate_section import parse_pod

        if standin:
            raise InputError(
                "--mode pod runs --command in the pod's image; --standin is host-only",
                Location(field="--standin"),
            )
        annotations = {}
        for a in pod_annotations:
            k, sep, v = a.partition("=")
            if not sep or not k:
                raise InputError(
                    f"--pod-annotation {a!r}: must be NAME=VALUE",
                    Location(field="--pod-annotation"),
                )
            annotations[k] = v
        raw = {
            "image": image or "",
            "cpus": pod_cpus,
            "memory": pod_memory,
            "gpuResource": gpu_resource,
            "annotations": annotations,
            "namespace": pod_namespace,
        }
        flag = {
            "pod.image": "--image",
            "pod.memory": "--pod-memory",
            "pod.gpuResource": "--gpu-resource",
            "pod.cpus": "--pod-cpus",
            "pod.namespace": "--pod-namespace",
        }
        pod = parse_pod(
            raw,
            lambda k, m: InputError(m, Location(field=flag.get(k, f"--{k.replace('.', '-')}"))),
        )
    elif image is not None:
        raise InputError("--image is read with --mode pod only", Location(field="--image"))
    api = connect(kubeconfig, context)
    journal = None
    recorded = ChangeBegin()
    if change:
        journal = existing_journal(change, api, lock_namespace)
        recorded = replay(journal.entries()).info
    inv_path = inventory or recorded.inventory
    if not inv_path:
        raise InputError("no inventory: pass -i or set ROLLOUT_INVENTORY", Location(field="-i"))
    inv = read_inventory(Path(str(inv_path)))
    if node is None:
        canary = list(recorded.canary) or list(recorded.nodes)
        node = canary[0] if canary else inv.node_of(inv.hosts[0])
    req = on_node.BenchRequest(
        command=command or "",
        standin=standin,
        mechanism=mechanism,
        timeout_s=timeout_s,
        gpu=gpu,
        remote=remote_numa,
        env=env,
    )
    if pod is not None:
        _bench_pod(pod, command or "", env, inv, node, api, timeout_s, journal, dry_run,
                   out, metrics_out, output)  # fmt: skip
        return
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
        plan = on_node.plan(req, inv, node, api, Path(tmp))
        if dry_run:
            doc = plan.as_dict()
            if output == "json":
                click.echo(json.dumps(doc, indent=2, sort_keys=True))
            else:
                _print_plan(doc)
            return
        try:
            result = on_node.run(req, plan, inv, Path(tmp), journal.change_id if journal else None)
        except (BenchError, ExternalError) as e:
            if journal is not None:
                on_node.journal_bench(journal, node, None, str(e), req.describe())
            raise
    _keep(result, node, journal, out, metrics_out)
    if output == "json":
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        _print_result(result)
    if result["status"] != "pass":
        raise BenchError(f"bench on {node}: " + "; ".join(result["problems"]))


def _print_plan(doc: dict[str, Any]) -> None:
    click.echo(f"bench on {doc['node']} (host {doc['host']}), mechanism {doc['mechanism']}:")
    click.echo(f"  command: {doc['command']}")
    for t in doc["targets"]:
        for b in ("local", "remote"):
            click.echo(
                f"  {t['gpuModel']} (GPU {t['gpu']}, CUDA index {t['cudaIndex']}): {b} run on "
                f"NUMA node {t[b]['numaNode']} (CPUs {t[b]['cpus']})"
            )
    click.echo("dry run: nothing ran")


def _print_result(r: dict[str, Any]) -> None:
    sim = f"SIMULATED: {'; '.join(r['simulatedWhy'])}" if r["simulated"] else "not simulated"
    click.echo(f"bench on {r['node']}: {r['status']} ({sim})")
    click.echo(f"  binding: {r['mechanism']} ({r['mechanismWhy']})")
    head = ("GPU model", "binding", "NUMA", "CPUs", "p50 ms", "p99 ms", "H2D GB/s", "load s")
    rows: list[tuple[str, ...]] = [head]
    for m in r["models"]:
        for b in ("local", "remote"):
            run = m[b]
            rows.append(
                (
                    m["gpuModel"] if b == "local" else "",
                    b,
                    str(run["numaNode"]),
                    run["observedCpus"],
                    f"{run['p50Ms']:g}",
                    f"{run['p99Ms']:g}",
                    f"{run['h2dGbps']:g}",
                    f"{run['loadS']:g}",
                )
            )
        q = m["ratio"]
        cells = [
            f"{q[k]:g}" if q[k] is not None else "-" for k in ("p50Ms", "p99Ms", "h2dGbps", "loadS")
        ]
        rows.append(("", "local/remote", "", "", *cells))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    for row in rows:
        click.echo("  " + "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip())
    for p in r["problems"]:
        click.echo(f"  problem: {p}")


COMMANDS = [bench_cmd]


def _bench_pod(
    pod: Any,
    command: str,
    env: dict[str, str],
    inv: Any,
    node: str,
    api: Any,
    timeout_s: float,
    journal: Any,
    dry_run: bool,
    out: str | None,
    metrics_out: str | None,
    output: str,
) -> None:
    """``--mode pod``: the pod's manifest (``--dry-run``) or its run, recorded as the host
    mode's record is."""
    import time

    from rollout.bench import in_pod, on_node
    from rollout.bench.results import BenchError

    change = journal.change_id if journal else None
    if dry_run:
        m = in_pod.bench_manifest(pod, node, command, env, change, time.time())
        click.echo(json.dumps(m, indent=2, sort_keys=True) if output == "json" else
                   f"pod {m['metadata']['namespace']}/{m['metadata']['name']} on {node}: "
                   f"{in_pod.describe(pod, command)}")  # fmt: skip
        return
    try:
        result = in_pod.run(pod, command, env, inv, node, api, timeout_s, change, _say)
    except (BenchError, ExternalError) as e:
        if journal is not None:
            on_node.journal_bench(journal, node, None, str(e), in_pod.describe(pod, command))
        raise
    _keep(result, node, journal, out, metrics_out)
    if output == "json":
        click.echo(json.dumps(result, indent=2, sort_keys=True))
    else:
        for m in result["models"]:
            r = m["placed"]
            click.echo(
                f"{result['node']} {m['gpuModel']} in pod {result['pod']['name']}: CPUs "
                f"{r['cpus'] or '(shared pool)'} (NUMA {r['cpuNumaNodes']}), GPU "
                f"{', '.join(r['devices'])} (NUMA {r['deviceNumaNodes']}): P50 {r['p50Ms']:.3g} "
                f"ms, P99 {r['p99Ms']:.3g} ms, {r['h2dGbps']:.3g} GB/s, load {r['loadS']:.3g} s"
            )
        for p in result["problems"]:
            click.echo(f"problem: {p}")
    if result["status"] != "pass":
        raise BenchError(f"bench on {node}: " + "; ".join(result["problems"]))


def _keep(
    result: dict[str, Any], node: str, journal: Any, out: str | None, metrics_out: str | None
) -> None:
    """Journal a bench's result on its change, add it to the evidence file (``--out``, else the
    change's) and write its metrics (``--metrics-out``): the same for both modes."""
    from rollout.bench import on_node
    from rollout.evidence.report import EVIDENCE_FILE

    if journal is not None:
        on_node.journal_bench(journal, node, result)
    target = Path(out) if out else (journal.dir / EVIDENCE_FILE if journal else None)
    if target is not None:
        on_node.add_to_evidence(target, result)
    if metrics_out:
        on_node.write_metrics(Path(metrics_out), [result])


def _say(message: str) -> None:
    click.echo(message, err=True)
