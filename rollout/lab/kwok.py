"""kwok in the lab: fake Nodes beside the SSH nodes, on the lab's real control plane.

``rollout lab up --kwok-nodes N`` creates N Node objects (labelled like the lab's SSH nodes, plus
``rollout.dev/kwok``, tainted ``kwok.x-k8s.io/node=fake:NoSchedule``) and one Deployment per
Node in the namespace :data:`NAMESPACE`, each with ``pods_per_node`` replicas pinned to its Node
(``spec.nodeName``, so the scheduler is not involved, and a toleration of the taint; nothing else
tolerates it, so no other pod lands there). One ``kwok`` process, started by the lab with the
admin kubeconfig, plays their kubelet: it makes the Nodes Ready, renews their Leases and moves
their pods to Running (the Stages in ``rollout/data/kwok/stages.yaml``). The Nodes are not in the
inventory; they vanish with the control plane's etcd at ``lab down``.

The manifests and arguments are pure functions (:func:`node_manifest`, :func:`deployment_manifest`,
:func:`kwok_args`); :class:`KwokNodes` starts, waits for and stops the process.
"""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from rollout.errors import LabError

# Must match tools/kwokbin/go.mod (a test checks it).
KWOK_VERSION = "v0.8.0"
NAMESPACE = "rollout-kwok"
#: the label that marks a kwok Node (value: the lab's name); kwok manages only these
KWOK_LABEL = "rollout.dev/kwok"
TAINT_KEY = "kwok.x-k8s.io/node"
#: the shortest Lease kwok is given (:func:`lease_seconds`); it renews every quarter of it
#: (8 s, 4% jitter)
LEASE_SECONDS = 32
#: kwok Nodes per second of Lease: more Nodes get a longer Lease, so that kwok renews at most
#: about 160 Leases a second (5,000 Nodes with 32 s Leases, 625 renewals a second on 2 cores,
#: kept 748 to 1,690 of them NotReady for 13 minutes, measured 2026-12-05)
NODES_PER_LEASE_SECOND = 40
#: pod IPs kwok hands out (bookkeeping in the pods' status only, bound to no interface)
POD_CIDR = "10.64.0.0/16"
#: the InternalIP kwok writes into the Nodes and pods: loopback, so nothing that dials a
#: kwok Node (the API server's node proxy, a Prometheus scrape) leaves the host
NODE_IP = "127.0.0.1"
GPUS_PER_NODE = 8
#: the controller-manager's client QPS in a lab with kwok Nodes: its default, 20, creates the
#: kwok pods at about 16 a second (5,000 in 314 s, measured)
KCM_ARGS = ("--kube-api-qps=200", "--kube-api-burst=400")

Progress = Callable[[str], None]
Request = Callable[[str, str, Any], tuple[int, Any]]


def find_kwok_bin_dir() -> Path:
    """``$ROLLOUT_LAB_KWOK_BIN``, else the version-keyed dir ``tools/build-lab-kwok.sh`` fills
    (``${ROLLOUT_LAB_CACHE:-~/.cache/rollout-lab}/kwok-<ver>/bin``)."""
    if os.environ.get("ROLLOUT_LAB_KWOK_BIN"):
        return Path(os.environ["ROLLOUT_LAB_KWOK_BIN"])
    cache = Path(os.environ.get("ROLLOUT_LAB_CACHE") or Path.home() / ".cache" / "rollout-lab")
    return cache / f"kwok-{KWOK_VERSION}" / "bin"


def check_counts(nodes: int, pods_per_node: int) -> None:
    """Refuse a negative number of kwok Nodes or pods per Node (:class:`LabError`)."""
    if nodes < 0:
        raise LabError(f"--kwok-nodes must be 0 or more, not {nodes}")
    if pods_per_node < 0:
        raise LabError(f"--kwok-pods-per-node must be 0 or more, not {pods_per_node}")


def node_names(lab: str, count: int) -> list[str]:
    return [f"{lab}-kwok{i}" for i in range(1, count + 1)]


def node_manifest(lab: str, name: str) -> dict[str, Any]:
    """A kwok Node: the lab's labels (those of an SSH node but the distribution), the kwok label
    and taint, and allocatable CPUs, memory, pods and GPUs of the lab's default node shape."""
    resources_ = {
        "cpu": "64",
        "memory": "1Ti",
        "pods": "110",
        "nvidia.com/gpu": str(GPUS_PER_NODE),
    }
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "labels": {
                "kubernetes.io/hostname": name,
                "kubernetes.io/os": "linux",
                "kubernetes.io/arch": "amd64",
                "node.kubernetes.io/instance-type": "lab.gpu-8x",
                "nvidia.com/gpu.present": "true",
                "nvidia.com/gpu.count": str(GPUS_PER_NODE),
                "rollout.dev/lab": lab,
                KWOK_LABEL: lab,
                "type": "kwok",
            },
            "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
        },
        "spec": {"taints": [{"key": TAINT_KEY, "value": "fake", "effect": "NoSchedule"}]},
        "status": {"allocatable": dict(resources_), "capacity": dict(resources_)},
    }


def deployment_manifest(lab: str, node: str, replicas: int) -> dict[str, Any]:
    """The Deployment whose ``replicas`` pods run on kwok Node ``node`` (and nowhere else)."""
    labels = {"app": node, KWOK_LABEL: lab}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": node, "namespace": NAMESPACE, "labels": labels},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"app": node}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeName": node,
                    "nodeSelector": {KWOK_LABEL: lab},
                    "tolerations": [
                        {"key": TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
                    ],
                    "automountServiceAccountToken": False,
                    "containers": [
                        {
                            "name": "app",
                            "image": "registry.invalid/rollout-lab/kwok-app:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                        }
                    ],
                },
            },
        },
    }


def lease_seconds(count: int) -> int:
    """The Lease duration kwok gives ``count`` Nodes: :data:`LEASE_SECONDS`, longer past
    1,280 Nodes (one second per :data:`NODES_PER_LEASE_SECOND` Nodes: 125 s for 5,000)."""
    return max(LEASE_SECONDS, -(-count // NODES_PER_LEASE_SECOND))


def kcm_args(count: int) -> tuple[str, ...]:
    """The controller-manager's flags in a lab with ``count`` kwok Nodes (none without):
    :data:`KCM_ARGS` and a ``--node-monitor-grace-period`` of a whole kwok Lease instead of the
    lab's 10 s, so that three renewals (each a quarter of it, 4% jitter) fit in it and one late
    renewal never turns a Node NotReady (with 500 kwok Nodes on 2 busy cores a Lease renewed
    every 8 s was once late enough under 10 s)."""
    if count <= 0:
        return ()
    return (*KCM_ARGS, f"--node-monitor-grace-period={lease_seconds(count)}s")


def kwok_args(lab: str, kubeconfig: Path, stages: Path, count: int) -> list[str]:
    """kwok's command line: only this lab's kwok Nodes, the shipped Stages, Leases as long as
    ``count`` Nodes need (:func:`lease_seconds`), no server."""
    return [
        f"--kubeconfig={kubeconfig}",
        f"--manage-nodes-with-label-selector={KWOK_LABEL}={lab}",
        f"--config={stages}",
        f"--node-lease-duration-seconds={lease_seconds(count)}",
        f"--node-ip={NODE_IP}",
        f"--cidr={POD_CIDR}",
        # at INFO it logs a line per Lease renewal (every 8 s per Node)
        "--v=WARN",
    ]


def stages_text() -> str:
    return (resources.files("rollout") / "data" / "kwok" / "stages.yaml").read_text()


def ready_count(nodes: Iterable[Mapping[str, Any]]) -> int:
    """How many of ``nodes`` (Node objects) have the condition Ready=True."""
    return sum(
        1
        for nd in nodes
        if any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (nd.get("status") or {}).get("conditions") or []
        )
    )


@dataclass
class KwokState:
    """What ``lab.json`` records of the lab's kwok."""

    pid: int
    bin_dir: str
    nodes: int
    pods_per_node: int

    def to_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid,
            "binDir": self.bin_dir,
            "nodes": self.nodes,
            "podsPerNode": self.pods_per_node,
        }

    @classmethod
    def from_dict(cls, d: Mapping[str, Any] | None) -> KwokState | None:
        if not d:
            return None
        return cls(int(d["pid"]), str(d["binDir"]), int(d["nodes"]), int(d["podsPerNode"]))


def _list_all(request: Request, path: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = []
    cont = ""
    sep = "&" if "?" in path else "?"
    while True:
        status, body = request("GET", f"{path}{sep}limit=500{cont}", None)
        if status != 200 or not isinstance(body, dict):
            raise LabError(f"GET {path}: {status} {str(body)[:300]}")
        items.extend(body.get("items") or [])
        token = (body.get("metadata") or {}).get("continue")
        if not token:
            return items
        cont = f"&continue={token}"


def _create_all(request: Request, path_and_bodies: list[tuple[str, dict[str, Any]]]) -> None:
    def one(pb: tuple[str, dict[str, Any]]) -> None:
        path, body = pb
        status, got = request("POST", path, body)
        if status not in (201, 409):  # 409: kept from `lab down --keep`
            raise LabError(f"POST {path} {body['metadata']['name']}: {status} {str(got)[:300]}")

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(one, path_and_bodies))


def create_objects(request: Request, lab: str, count: int, pods_per_node: int) -> None:
    """The namespace, ``count`` kwok Nodes and a Deployment of ``pods_per_node`` on each."""
    status, got = request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}, "kind": "Namespace"}
    )
    if status not in (201, 409):
        raise LabError(f"creating namespace {NAMESPACE}: {status} {str(got)[:300]}")
    names = node_names(lab, count)
    _create_all(request, [("/api/v1/nodes", node_manifest(lab, n)) for n in names])
    _create_all(
        request,
        [
            (
                f"/apis/apps/v1/namespaces/{NAMESPACE}/deployments",
                deployment_manifest(lab, n, pods_per_node),
            )
            for n in names
        ],
    )


def wait_ready(
    request: Request,
    lab: str,
    count: int,
    pods_per_node: int,
    *,
    alive: Callable[[], bool],
    timeout: float,
    progress: Progress,
) -> None:
    """Until ``count`` kwok Nodes are Ready and ``count * pods_per_node`` of their pods Running;
    :class:`LabError` when kwok exits or ``timeout`` passes first."""
    deadline = time.monotonic() + timeout
    want_pods = count * pods_per_node
    ready = running = -1
    last_note = 0.0
    while True:
        if not alive():
            raise LabError("kwok exited; see its log in LAB_DIR/kwok/kwok.log")
        nodes = _list_all(request, f"/api/v1/nodes?labelSelector={KWOK_LABEL}%3D{lab}")
        ready = ready_count(nodes)
        running = (
            len(
                _list_all(
                    request,
                    f"/api/v1/namespaces/{NAMESPACE}/pods?fieldSelector=status.phase%3DRunning",
                )
            )
            if ready == count
            else 0
        )
        if ready == count and running >= want_pods:
            return
        now = time.monotonic()
        if now > deadline:
            raise LabError(
                f"kwok: {ready}/{count} Nodes Ready, {running}/{want_pods} pods Running after "
                f"{timeout:.0f}s"
            )
        if now - last_note > 15:
            progress(f"kwok: {ready}/{count} Nodes Ready, {running}/{want_pods} pods Running")
            last_note = now
        time.sleep(1.0)


def start(
    lab_dir: Path, bin_dir: Path, lab: str, kubeconfig: Path, count: int
) -> subprocess.Popen[bytes]:
    """Start kwok for lab ``lab``'s ``count`` Nodes (log and Stages under ``lab_dir/kwok``)."""
    exe = bin_dir / "kwok"
    if not os.access(exe, os.X_OK):
        raise LabError(f"no kwok binary at {exe} (tools/build-lab-kwok.sh builds it)")
    d = lab_dir / "kwok"
    d.mkdir(parents=True, exist_ok=True)
    stages = d / "stages.yaml"
    stages.write_text(stages_text())
    with open(d / "kwok.log", "ab") as log:
        return subprocess.Popen(
            [str(exe), *kwok_args(lab, kubeconfig, stages, count)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=d,
            start_new_session=True,
        )
