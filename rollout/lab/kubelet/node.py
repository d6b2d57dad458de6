"""The API objects the kubelet writes, built from plain data: Node, Lease, pod statuses, Events.

Pure builders (the clock is a parameter), so the shapes are testable and the I/O loop in
``__main__`` stays thin. Field choices follow what a v1.36 kubelet writes: ``KubeletReady`` /
"kubelet is posting ready status", allocatable = capacity - kube/system reserved - hard eviction
threshold, ``rejectPod``'s status and event for rejected pods.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Iterable, Mapping
from fractions import Fraction
from typing import Any

from rollout.kubelet import cpuset, quantity

LEASE_NAMESPACE = "kube-node-lease"


def rfc3339(now: float) -> str:
    return dt.datetime.fromtimestamp(int(now), dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def micro(now: float) -> str:
    return dt.datetime.fromtimestamp(now, dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _q(v: Any) -> Fraction:
    return quantity.parse(str(v)).value


def _cpu_text(millis: Fraction) -> str:
    if millis % 1000 == 0:
        return str(int(millis // 1000))
    return f"{int(millis)}m"


def _bytes_text(b: Fraction) -> str:
    n = int(b)
    return f"{n // 1024}Ki" if n % 1024 == 0 else str(n)


def allocatable(capacity: Mapping[str, str], config: Mapping[str, Any]) -> dict[str, str]:
    """The kubelet's node allocatable: capacity minus kubeReserved, systemReserved and (memory)
    the ``memory.available`` hard eviction threshold; pods = ``maxPods``."""
    kube = config.get("kubeReserved") or {}
    system = config.get("systemReserved") or {}
    out = dict(capacity)
    cpu = _q(capacity.get("cpu", 0)) * 1000
    cpu -= (_q(kube.get("cpu", 0)) + _q(system.get("cpu", 0))) * 1000
    out["cpu"] = _cpu_text(max(cpu, Fraction(0)))
    mem = _q(capacity.get("memory", 0)) - _q(kube.get("memory", 0)) - _q(system.get("memory", 0))
    hard = (config.get("evictionHard") or {}).get("memory.available", "100Mi")
    if isinstance(hard, str) and not hard.endswith("%"):
        mem -= _q(hard)
    out["memory"] = _bytes_text(max(mem, Fraction(0)))
    if config.get("maxPods"):
        out["pods"] = str(config["maxPods"])
    return out


def reserved_cpus(config: Mapping[str, Any], topology: Mapping[str, Any]) -> frozenset[int]:
    """CPUs the static policy keeps out of the exclusive pool: ``reservedSystemCPUs``, or
    ceil(kube + system reserved cpu) CPUs taken whole cores first, lowest ids first."""
    text = config.get("reservedSystemCPUs")
    if isinstance(text, str) and text.strip():
        return cpuset.parse(text)
    kube = config.get("kubeReserved") or {}
    system = config.get("systemReserved") or {}
    count = math.ceil(_q(kube.get("cpu", 0)) + _q(system.get("cpu", 0)))
    if count <= 0:
        return frozenset()
    all_cpus = sorted(
        c for n in topology.get("numaNodes") or () for c in cpuset.parse(str(n.get("cpus", "")))
    )
    cores = max(1, len(all_cpus) // max(1, int(topology.get("threadsPerCore", 1) or 1)))
    ordered = sorted(all_cpus, key=lambda c: (c % cores, c))
    return frozenset(ordered[:count])


def reserved_memory(config: Mapping[str, Any]) -> dict[int, int]:
    """``reservedMemory`` (memory only) per NUMA node, in bytes."""
    out: dict[int, int] = {}
    for entry in config.get("reservedMemory") or ():
        limits = entry.get("limits") or {}
        if "memory" in limits:
            n = int(entry.get("numaNode", 0))
            out[n] = out.get(n, 0) + int(_q(limits["memory"]))
    return out


def node_object(node: Mapping[str, Any], config: Mapping[str, Any]) -> dict[str, Any]:
    """The Node the kubelet registers (metadata, empty spec)."""
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": node["nodeName"],
            "labels": dict(node.get("labels") or {}),
            "annotations": {"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
        },
        "spec": {},
    }


def node_status(
    node: Mapping[str, Any],
    config: Mapping[str, Any],
    *,
    now: float,
    ready_since: float,
    boot_id: str,
) -> dict[str, Any]:
    """``status`` of the Node: capacity, allocatable, addresses, endpoint, info, conditions."""
    hb, since = rfc3339(now), rfc3339(ready_since)

    def cond(kind: str, status: str, reason: str, message: str) -> dict[str, str]:
        return {
            "type": kind,
            "status": status,
            "reason": reason,
            "message": message,
            "lastHeartbeatTime": hb,
            "lastTransitionTime": since,
        }

    capacity = {k: str(v) for k, v in (node.get("capacity") or {}).items()}
    topo = node.get("topology") or {}
    return {
        "capacity": capacity,
        "allocatable": allocatable(capacity, config),
        "addresses": [
            {"type": "InternalIP", "address": node["nodeIP"]},
            {"type": "Hostname", "address": node["nodeName"]},
        ],
        "daemonEndpoints": {"kubeletEndpoint": {"Port": int(node.get("kubeletPort", 10250))}},
        "nodeInfo": {
            "machineID": boot_id.replace("-", ""),
            "systemUUID": boot_id,
            "bootID": boot_id,
            "kernelVersion": "6.1.0-lab",
            "osImage": f"rollout lab ({node.get('distribution', '')}, {topo.get('cpuModel', '')})",
            "containerRuntimeVersion": "lab://1.0.0",
            "kubeletVersion": node.get("kubeletVersion") or "v1.36.0",
            "kubeProxyVersion": "",
            "operatingSystem": "linux",
            "architecture": "amd64",
        },
        "conditions": [
            cond(
                "MemoryPressure",
                "False",
                "KubeletHasSufficientMemory",
                "kubelet has sufficient memory available",
            ),
            cond(
                "DiskPressure", "False", "KubeletHasNoDiskPressure", "kubelet has no disk pressure"
            ),
            cond(
                "PIDPressure",
                "False",
                "KubeletHasSufficientPID",
                "kubelet has sufficient PID available",
            ),
            cond("Ready", "True", "KubeletReady", "kubelet is posting ready status"),
        ],
    }


def lease_object(
    node_name: str, node_uid: str | None, *, now: float, duration: int, rv: str | None = None
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": node_name, "namespace": LEASE_NAMESPACE}
    if rv:
        meta["resourceVersion"] = rv
    if node_uid:
        meta["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Node", "name": node_name, "uid": node_uid}
        ]
    return {
        "apiVersion": "coordination.k8s.io/v1",
        "kind": "Lease",
        "metadata": meta,
        "spec": {
            "holderIdentity": node_name,
            "leaseDurationSeconds": duration,
            "renewTime": micro(now),
        },
    }


def qos_class(pod: Mapping[str, Any], guaranteed: bool) -> str:
    if guaranteed:
        return "Guaranteed"
    for kind in ("initContainers", "containers"):
        for c in (pod.get("spec") or {}).get(kind) or ():
            res = c.get("resources") or {}
            if (res.get("requests") or {}).keys() & {"cpu", "memory"} or (
                res.get("limits") or {}
            ).keys() & {"cpu", "memory"}:
                return "Burstable"
    return "BestEffort"


def rejected_status(qos: str, reason: str, status_message: str) -> dict[str, Any]:
    """kubelet ``rejectPod``: phase Failed with the admission reason and message."""
    return {
        "status": {
            "phase": "Failed",
            "reason": reason,
            "message": status_message,
            "qosClass": qos,
        }
    }


def running_status(
    pod: Mapping[str, Any], *, node_ip: str, pod_ip: str, qos: str, now: float
) -> dict[str, Any]:
    """What the kubelet reports once every container has started (no probes: Ready at once)."""
    t = rfc3339(now)
    uid = str((pod.get("metadata") or {}).get("uid", ""))
    spec = pod.get("spec") or {}

    def cstatus(c: Mapping[str, Any], i: int, init: bool) -> dict[str, Any]:
        cid = f"containerd://{(uid.replace('-', '') + f'{i:02d}' * 32)[:64]}"
        if init:
            state: dict[str, Any] = {
                "terminated": {
                    "exitCode": 0,
                    "reason": "Completed",
                    "startedAt": t,
                    "finishedAt": t,
                    "containerID": cid,
                }
            }
        else:
            state = {"running": {"startedAt": t}}
        return {
            "name": c.get("name", ""),
            "image": c.get("image", ""),
            "imageID": "",
            "containerID": cid,
            "ready": not init,
            "started": not init,
            "restartCount": 0,
            "state": state,
        }

    conds = [
        {"type": k, "status": "True", "lastProbeTime": None, "lastTransitionTime": t}
        for k in (
            "PodReadyToStartContainers",
            "Initialized",
            "Ready",
            "ContainersReady",
            "PodScheduled",
        )
    ]
    status: dict[str, Any] = {
        "phase": "Running",
        "conditions": conds,
        "hostIP": node_ip,
        "hostIPs": [{"ip": node_ip}],
        "podIP": pod_ip,
        "podIPs": [{"ip": pod_ip}],
        "startTime": t,
        "qosClass": qos,
        "containerStatuses": [
            cstatus(c, i, False) for i, c in enumerate(spec.get("containers") or ())
        ],
    }
    inits = spec.get("initContainers") or ()
    if inits:
        status["initContainerStatuses"] = [cstatus(c, 50 + i, True) for i, c in enumerate(inits)]
    return {"status": status}


def event_object(
    pod: Mapping[str, Any], node_name: str, *, reason: str, message: str, now: float, kind: str
) -> dict[str, Any]:
    """A core/v1 Event about ``pod`` from component ``kubelet`` on ``node_name``."""
    meta = pod.get("metadata") or {}
    t = rfc3339(now)
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {
            "name": f"{meta.get('name')}.{int(now * 1e9):x}",
            "namespace": meta.get("namespace", "default"),
        },
        "involvedObject": {
            "apiVersion": "v1",
            "kind": "Pod",
            "name": meta.get("name"),
            "namespace": meta.get("namespace", "default"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "reason": reason,
        "message": message,
        "source": {"component": "kubelet", "host": node_name},
        "firstTimestamp": t,
        "lastTimestamp": t,
        "eventTime": None,
        "count": 1,
        "type": kind,
        "reportingComponent": "kubelet",
        "reportingInstance": node_name,
    }


def pod_ip(node_ip: str, used: Iterable[str], pod_cidr: str | None = None) -> str:
    """The next free pod IP in the node's /24 (``podCIDR`` or 10.244.<third octet of nodeIP>.0)."""
    if pod_cidr:
        base = pod_cidr.split("/")[0].rsplit(".", 1)[0]
    else:
        base = f"10.244.{node_ip.split('.')[2]}"
    taken = set(used)
    for i in range(2, 255):
        ip = f"{base}.{i}"
        if ip not in taken:
            return ip
    return f"{base}.254"
