"""``rollout bench --mode pod`` (and ``gate.bench.mode: pod``): the operator's benchmark in a pod
the kubelet placed, so the CPUs and GPU it measures are the ones the CPU manager and the device
plugin gave it.

Why a pod besides the host run: the host run (:mod:`rollout.bench.on_node`) binds the command
with ``numactl`` to NUMA nodes the tool chose; a workload never runs that way. Here the kubelet
admits a Guaranteed pod (integer CPUs, requests = limits, one unit of the GPU resource) bound to
the node with ``nodeName``, as the probe pods are (:mod:`rollout.kube.probing`), in the tool's own
namespace (``rollout-probes``). The topology manager, the CPU manager and the device plugin
decide its placement; a pod the kubelet rejects (``TopologyAffinityError``) fails the bench in the
kubelet's own words.

How: the pod's one container runs the command with ``/bin/sh -c`` (the image needs a POSIX
shell), then prints ``rollout-bench-exit=<code>`` and sleeps, so the pod still holds its CPUs and
GPU while the tool reads the kubelet's account of them: its podresources API and
``cpu_manager_state`` / the device checkpoint, through the facts module on the node, judged by
the evidence's own :func:`rollout.evidence.checks.build_collection`. The numbers are the last
JSON line of the pod's log, read through the API server's ``pods/log`` (the kubelet serves it).
The pod is deleted in every case (grace 0) and the tool waits until it is gone, so the next run
finds its CPUs and GPU free. The pod is no change to the node (nothing journaled as a node step);
the bench record names it.

A tool killed mid-bench: on SIGTERM it deletes its pod before it dies (SIGINT's
``KeyboardInterrupt`` deletes it on the way out, as any failure does). A pod a tool killed with
SIGKILL left behind holds its CPUs and GPU until its ``activeDeadlineSeconds``; the next bench
deletes it before placing its own: the pod names its creator (``rollout.io/created-by``;
``rollout.io/bench-owner`` from the earlier version: ``user@host pid N``, as the Lease names its
holder), and a pod of the tool is deleted only when that creator is a process of this host that
no longer exists (:mod:`rollout.kube.owned_pods`, shared with the probe pods). A pod of a live
process, of another host, or without the annotation is never deleted (a bench pod is named, when
it is on the node benched).

The record has one run per GPU model, ``placed`` (not ``local``/``remote``): the regression
verdict compares it before and after; the aligned-advantage verdict needs a deliberately
mismatched run, which the kubelet never places, so pod records leave it Inconclusive
(:func:`rollout.gate.performance.judge_tightening`).
"""

from __future__ import annotations

import re
import tempfile
import time
from collections.abc import Callable, Iterable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.bench.results import LAB_LABEL, PRODUCT_LABEL, BenchError, parse_output
from rollout.change.plan.gate_section import PodBench
from rollout.errors import ExternalError, InputError, Location
from rollout.kube import owned_pods
from rollout.kube.lease_objects import holder_identity, holder_is_dead_here
from rollout.kubelet.cpuset import CPUSetError, parse
from rollout.retrying import Poll, wait_until

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.kube.client import Api
    from rollout.kube.probing import ProbePods

__all__ = ["bench_manifest", "leftovers", "read_result", "run"]

EXIT_MARK = "rollout-bench-exit="
CONTAINER = "bench"
BENCH_LABEL = "rollout.io/bench"
MANAGED_BY = "app.kubernetes.io/managed-by"
OWNER_ANNOTATION = owned_pods.CREATED_BY
"""The process that created the pod, ``user@host pid N`` (:func:`leftovers` reads it; and
``rollout.io/bench-owner``, as the earlier version wrote it)."""
owner_of = owned_pods.creator_of
deleted_on_term = owned_pods.deleted_on_term
NAME_PREFIX = "rollout-bench-"
SELECTOR = owned_pods.SELECTOR


def _dns(s: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", s.lower()).strip("-")[:30].strip("-")


HOLD_S = 600
"""How long the pod waits after the command, for the tool to read the kubelet's account (the tool
deletes it sooner); a pod whose tool died ends on its own then, and by ``activeDeadlineSeconds``."""


def script(command: str) -> str:
    """What the container's shell runs: the command, its exit code marked, then a wait while
    the tool reads the kubelet's account (the pod is deleted then)."""
    return f'{command}\nrc=$?\necho "{EXIT_MARK}$rc"\nexec sleep {HOLD_S}\n'


def bench_manifest(
    pod: PodBench,
    node: str,
    command: str,
    env: Mapping[str, str],
    change: str | None,
    now: float,
    timeout_s: float = 600.0,
    owner: str = "",
) -> dict[str, Any]:
    """The Guaranteed bench pod bound to ``node`` (pure); the kubelet ends it after
    ``timeout_s`` plus its start and the hold, whatever happens to the tool. ``owner``: the
    creating process (``user@host pid N``), annotated for :func:`leftovers`."""
    resources = {"cpu": str(pod.cpus), "memory": pod.memory, pod.gpu_resource: "1"}
    suffix = _dns(change or "")[-6:] or format(int(now * 1000) % 0xFFFFFF, "06x")
    labels = {MANAGED_BY: "rollout", BENCH_LABEL: "true"}
    if change:
        labels["rollout.io/change"] = _dns(change)
    annotations = dict(pod.annotations)
    if owner:
        annotations[OWNER_ANNOTATION] = owner
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"{NAME_PREFIX}{_dns(node)}-{suffix}-{int(now * 1000) % 100000:05d}",
            "namespace": pod.namespace,
            "labels": labels,
            "annotations": annotations,
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "activeDeadlineSeconds": int(timeout_s) + 300 + HOLD_S,
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [
                {
                    "name": CONTAINER,
                    "image": pod.image,
                    "command": ["/bin/sh", "-c", script(command)],
                    "env": [{"name": k, "value": str(v)} for k, v in sorted(env.items())],
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


def _cpus(text: str) -> frozenset[int] | None:
    try:
        return parse(text.strip())
    except CPUSetError:
        return None


def read_result(
    log: str, node_data: Mapping[str, Any], pod_name: str, namespace: str, gpu_resource: str
) -> dict[str, Any]:
    """The ``placed`` run from the pod's log and the kubelet's account of the pod (one node of a
    :func:`~rollout.evidence.checks.build_collection`) (pure).

    Raises:
        BenchError: the command failed or broke the output contract.
    """
    where = f"pod {namespace}/{pod_name}"
    lines = log.splitlines()
    marks = [ln for ln in lines if ln.startswith(EXIT_MARK)]
    said = [ln for ln in lines if not ln.startswith(EXIT_MARK)]
    if not marks:
        raise BenchError(f"{where}: the command did not finish: {log.strip()[-400:]}")
    rc = marks[-1][len(EXIT_MARK) :].strip()
    if rc != "0":
        raise BenchError(f"{where}: the command exited {rc}: {chr(10).join(said).strip()[-400:]}")
    doc = parse_output("\n".join(said), where)
    pods = [
        p
        for p in node_data.get("pods") or ()
        if p.get("namespace") == namespace and p.get("name") == pod_name
    ]
    problems = []
    p: Mapping[str, Any] = pods[0] if pods else {}
    if not p:
        problems.append("the kubelet's account does not name the pod")
    devices = list((p.get("devices") or {}).get(gpu_resource) or ())
    cpus = str(p.get("cpus") or "")
    if pods and not devices:
        problems.append(f"the kubelet's account names no {gpu_resource} for the pod")
    if pods and not p.get("podResourcesListed"):
        problems.append(
            "podresources did not list the pod: "
            + str(node_data.get("podResourcesProblem") or "not listed")
        )
    if "cpus_allowed" in doc and cpus and _cpus(doc["cpus_allowed"]) != _cpus(cpus):
        problems.append(f"the command saw CPUs {doc['cpus_allowed']}, the kubelet gave {cpus}")
    numa_of = node_data.get("deviceNuma") or {}
    gpu_numa = sorted({int(numa_of[d]) for d in devices if d in numa_of})
    cpu_numa: list[int] = []
    held = _cpus(cpus) or frozenset()
    for n, cs in sorted((node_data.get("numa") or {}).items()):
        if held & (_cpus(str(cs)) or frozenset()):
            cpu_numa.append(int(n))
    from rollout.bench.results import FIELDS, REQUIRED

    run: dict[str, Any] = {
        "numaNode": gpu_numa[0] if len(gpu_numa) == 1 else None,
        "cpus": cpus,
        "cpuNumaNodes": cpu_numa,
        "devices": devices,
        "deviceNumaNodes": gpu_numa,
        "cpuSource": str(p.get("cpuSource") or node_data.get("cpuSource") or "cpuManagerState"),
        "deviceSource": str(node_data.get("deviceSource") or ""),
        "exclusiveCpus": bool(cpus),
        "aligned": bool(cpus) and bool(gpu_numa) and set(cpu_numa) <= set(gpu_numa),
        "bindingHeld": not problems,
        "problems": problems,
        "simulated": bool(doc.get("simulated", False)),
        "said": [ln for ln in said if ln.strip()][-20:-1],
    }
    run.update({FIELDS[k]: float(doc[k]) for k in REQUIRED})
    if "samples" in doc:
        run["samples"] = doc["samples"]
    if "cpus_allowed" in doc:
        run["commandCpus"] = doc["cpus_allowed"]
    return run


STUCK = (
    "ErrImagePull",
    "ImagePullBackOff",
    "CreateContainerError",
    "CreateContainerConfigError",
    "InvalidImageName",
    "RunContainerError",
)
"""A container waiting for one of these will not start by itself: the bench fails at once."""


def _waiting_reason(st: Mapping[str, Any]) -> str:
    for c in st.get("containerStatuses") or ():
        w = (c.get("state") or {}).get("waiting") or {}
        if w.get("reason") in STUCK:
            return f"{w.get('reason')}: {w.get('message') or ''}"
    return ""


def _kubelet_account(
    api: Api, inv: Inventory, node: str, work: Path, gpu_resource: str
) -> dict[str, Any]:
    """The node's collection now (the kubelet's podresources and checkpoints through the facts
    module, its pods through the API server), as ``rollout evidence`` collects it."""
    from rollout.ansible.hosts import hosts_for
    from rollout.ansible.runner import AnsibleRunner
    from rollout.evidence.checks import build_collection
    from rollout.kube import proxy
    from rollout.kube.collecting import evidence_pods
    from rollout.kube.nodes import node_info

    hosts = hosts_for(inv, [node])
    if not hosts:
        raise InputError(
            f"node {node} is not in the inventory {inv.path}", Location(field="--node")
        )
    host = hosts[0]
    facts = AnsibleRunner(work / "runner").gather_facts(
        inv.path, [host], work / "facts", inv.hostvars
    )
    body = proxy.configz(api, node)
    info = node_info(api, node)
    collection = build_collection(
        "bench",
        datetime.now(UTC).isoformat(timespec="seconds"),
        {node: facts[host]},
        {node: dict(info.allocatable)},
        {node: evidence_pods(api, node)},
        {node: body.get("kubeletconfig", body)},
        gpu_resource,
        capacity={node: dict(info.capacity)},
    )
    return dict(collection["nodes"][node])


def run(
    pod: PodBench,
    command: str,
    env: Mapping[str, str],
    inv: Inventory,
    node: str,
    api: Api,
    timeout_s: float,
    change: str | None = None,
    say: Callable[[str], None] = lambda _m: None,
) -> dict[str, Any]:
    """Run the benchmark in a pod on ``node`` and build the record.

    Raises:
        BenchError: the kubelet rejected the pod, the command failed or broke the contract.
        ExternalError: the API server or the node could not be reached, or the pod was not
            admitted and running within ``timeout_s``.
    """
    from rollout.kube.nodes import node_info

    labels = dict(node_info(api, node).labels)
    model = labels.get(PRODUCT_LABEL) or pod.gpu_resource
    full_env = {**env, "ROLLOUT_BENCH_BINDING": "placed", "ROLLOUT_BENCH_GPU_MODEL": model}
    manifest = bench_manifest(
        pod, node, command, full_env, change, time.time(), timeout_s, holder_identity()
    )
    name = str(manifest["metadata"]["name"])
    from rollout.kube.probing import ProbePods

    pods = ProbePods(api, pod.namespace)
    pods.ensure_namespace()
    sweep(pods, node, say)
    try:
        pods.create(manifest)  # from here until cleanup, SIGTERM deletes it first
        say(f"bench pod {pod.namespace}/{name} on {node}")
        log = _await_log(pods, name, node, timeout_s)
        with tempfile.TemporaryDirectory(prefix="rollout-benchpod-") as tmp:
            data = _kubelet_account(api, inv, node, Path(tmp), pod.gpu_resource)
    finally:
        try:
            _delete(pods, name)
        finally:
            pods.cleanup()
    placed = read_result(log, data, name, pod.namespace, pod.gpu_resource)
    why = []
    if placed["simulated"]:
        why.append("the command's output says simulated")
    if labels.get(LAB_LABEL):
        why.append(f"lab node ({LAB_LABEL}={labels[LAB_LABEL]}): its GPUs are simulated")
    rec = {
        "gpuModel": model,
        "gpu": ",".join(placed["devices"]),
        "gpuNumaNode": placed["numaNode"],
        "placed": placed,
    }
    return {
        "node": node,
        "host": node,
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "change": change,
        "command": command,
        "mode": "pod",
        "pod": {**pod.as_dict(), "name": name},
        "simulated": bool(why),
        "simulatedWhy": why,
        "mechanism": "kubelet",
        "mechanismWhy": "placed by the kubelet's CPU, topology and device managers",
        "status": "fail" if placed["problems"] else "pass",
        "problems": [f"{model} placed: {p}" for p in placed["problems"]],
        "models": [rec],
    }


LOG_POLL = Poll.every(1.0)
"""How often the tool looks at the bench pod for its command's end."""


def _await_log(
    pods: ProbePods,
    name: str,
    node: str,
    timeout_s: float,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> str:
    """The pod's log once its command has finished (its exit mark printed), looked at every
    second for ``timeout_s`` plus two minutes (admission, image pull, start).

    Raises:
        BenchError: the kubelet rejected the pod, or its container cannot start.
        ExternalError: the pod disappeared, or no result within the time.
    """
    log = problem = ""

    def finished() -> bool:
        nonlocal log, problem
        st = pods.status(name)
        if st is None:
            raise ExternalError(f"bench pod {name} on {node} disappeared before it finished")
        if st.get("phase") == "Failed" and not log:
            why = [str(st.get(k)) for k in ("reason", "message") if st.get(k)]
            for c in st.get("containerStatuses") or ():
                t = (c.get("state") or {}).get("terminated") or {}
                if t:
                    why.append(
                        f"container {c.get('name')} exited {t.get('exitCode')}: "
                        f"{t.get('reason') or ''} {t.get('message') or ''}".strip()
                    )
            raise BenchError(f"bench pod {name} on {node} failed: {'; '.join(why) or 'Failed'}")
        stuck = _waiting_reason(st)
        if stuck:
            raise BenchError(f"bench pod {name} on {node}: {stuck}")
        if st.get("phase") in ("Running", "Succeeded", "Failed"):
            try:
                log = pods.log(name, CONTAINER)
            except ExternalError as e:  # the kubelet's log not readable yet: ask again
                problem = str(e)
                return False
            if any(ln.startswith(EXIT_MARK) for ln in log.splitlines()):
                return True
            if st.get("phase") != "Running":
                return True  # ended without the mark: read_result says so
        return False

    if wait_until(finished, timeout_s + 120, LOG_POLL, sleep, monotonic):
        return log
    raise ExternalError(
        f"bench pod {name} on {node}: no result within {timeout_s + 120:g}s: "
        f"{problem or log.strip()[-300:]}"
    )


def _delete(
    pods: ProbePods,
    name: str,
    wait_s: float = owned_pods.GONE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> None:
    """Delete the pod and wait until it is gone (its CPUs and GPU free for the next run).

    Raises:
        ExternalError: still there ``wait_s`` after the delete.
    """
    owned_pods.wait_gone(pods, name, wait_s, sleep, monotonic, "bench pod")


def leftovers(
    listed: Iterable[Mapping[str, Any]], dead: Callable[[str], bool] = holder_is_dead_here
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Of the pods ``listed``, the bench pods a killed tool left behind (to delete) and the
    other bench pods (never deleted): :func:`rollout.kube.owned_pods.leftovers` of the pods
    labelled ``rollout.io/bench=true``. A pod that is not a bench pod is in neither list.
    """
    bench = [
        p
        for p in listed
        if ((p.get("metadata") or {}).get("labels") or {}).get(BENCH_LABEL) == "true"
        and owned_pods.kind_of(p) == "bench pod"
    ]
    return owned_pods.leftovers(bench, dead)


def sweep(
    pods: ProbePods,
    node: str,
    say: Callable[[str], None],
    dead: Callable[[str], bool] = holder_is_dead_here,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> list[str]:
    """Delete the tool's pods a killed tool left in the namespace
    (:func:`rollout.kube.owned_pods.sweep`: bench pods, and probes when they share it) and wait
    until they are gone; name any other bench pod on ``node``. Returns the names deleted.

    Raises:
        ExternalError: the pods could not be listed or deleted, or one stayed.
    """
    names, kept = owned_pods.sweep(pods, say, dead, sleep, monotonic)
    for p in kept:
        meta = p.get("metadata") or {}
        if (p.get("spec") or {}).get("nodeName") == node and owned_pods.kind_of(p) == "bench pod":
            say(
                f"warning: bench pod {pods.namespace}/{meta.get('name')} on {node} "
                f"(created by {owner_of(p) or 'an unnamed process'}) is still there; not this "
                "run's to delete: it holds its CPUs and GPU until it ends"
            )
    return names


def describe(pod: PodBench, command: str) -> str:
    return f"{command} (in a pod: {pod.image}, {pod.cpus} CPUs, 1 {pod.gpu_resource})"
