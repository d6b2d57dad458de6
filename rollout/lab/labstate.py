"""The lab's state file, ``<lab dir>/lab.json``: every PID, port and node the lab started, so
that ``rollout lab down/status/fault`` work from another process than the one that ran ``lab up``
(:meth:`~rollout.lab.cluster.Lab.attach`).

Pure over the values it is given: the ``Lab`` hands its parts in and takes a :class:`Recorded`
back, so this module never reaches into the ``Lab`` (it imported ``Lab`` and wrote its privates,
an import circle with ``rollout.lab.cluster``)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rollout.lab import monitoring as mon
from rollout.lab import nodefiles
from rollout.lab import nodes as n
from rollout.lab.controlplane import ControlPlane
from rollout.lab.kwok import KwokState
from rollout.lab.labnodes import NodeRecord


def state_of(
    *,
    name: str,
    lab_dir: Path,
    bin_dir: Path | None,
    relay_pid: int,
    cp: ControlPlane | None,
    kubeconfig: Path,
    monitoring: mon.MonitoringState | None,
    nodes: Mapping[str, NodeRecord],
    recorded_controlplane: Mapping[str, int] | None = None,
    kwok: KwokState | None = None,
) -> dict[str, Any]:
    """What ``lab.json`` records for a lab; ``recorded_controlplane``: the control plane PIDs an
    attached lab read from its file (kept beside the ones it started itself)."""
    return {
        "name": name,
        "dir": str(lab_dir),
        "binDir": str(bin_dir or ""),
        "relayPid": relay_pid,
        "ports": {}
        if cp is None
        else {
            "etcd": cp.etcd_port,
            "etcdPeer": cp.etcd_peer_port,
            "apiserver": cp.apiserver_port,
            "kcm": cp.kcm_port,
            "scheduler": cp.scheduler_port,
        },
        "controlplane": {} if cp is None else {**(recorded_controlplane or {}), **cp.pids},
        "kubeconfig": str(kubeconfig),
        "monitoring": monitoring.to_dict() if monitoring else None,
        "kwok": kwok.to_dict() if kwok else None,
        "nodes": [
            {
                "node": {
                    "name": r.node.name,
                    "index": r.node.index,
                    "distribution": r.node.distribution,
                    "lab": r.node.lab,
                    "kubelet": r.node.kubelet,
                },
                "procs": n.procs_to_dict(r.procs),
            }
            for r in nodes.values()
        ],
    }


@dataclass
class Recorded:
    """What an attached lab reads back from ``lab.json``."""

    relay_pid: int = 0
    bin_dir: Path | None = None
    monitoring: mon.MonitoringState | None = None
    kwok: KwokState | None = None
    cp: ControlPlane | None = None
    nodes: dict[str, NodeRecord] = field(default_factory=dict)
    controlplane_pids: dict[str, int] = field(default_factory=dict)
    """The control plane PIDs the file names (``kube-apiserver``, ``etcd``, ...)."""


def load(lab_dir: Path, state: Mapping[str, Any]) -> Recorded:
    """The recorded ``state`` of the lab in ``lab_dir``, as values."""
    out = Recorded(
        relay_pid=int(state.get("relayPid", 0)),
        bin_dir=Path(state["binDir"]) if state.get("binDir") else None,
        monitoring=mon.load_state(state.get("monitoring")),
        kwok=KwokState.from_dict(state.get("kwok")),
        controlplane_pids={k: int(v) for k, v in (state.get("controlplane") or {}).items()},
    )
    ports = state.get("ports", {})
    if ports and out.bin_dir is not None:
        cp = ControlPlane(lab_dir / "controlplane", out.bin_dir)
        cp.etcd_port, cp.etcd_peer_port = ports["etcd"], ports["etcdPeer"]
        cp.apiserver_port, cp.kcm_port = ports["apiserver"], ports["kcm"]
        cp.scheduler_port = ports["scheduler"]
        out.cp = cp
    for rec in state.get("nodes", []):
        node = nodefiles.LabNode(**rec["node"])
        out.nodes[node.name] = NodeRecord(node, n.NodeProcs(**rec["procs"]))
    return out
