"""The lab's state file, ``<lab dir>/lab.json``: every PID, port and node the lab started, so
that ``rollout lab down/status/fault`` work from another process than the one that ran ``lab up``
(:meth:`~rollout.lab.cluster.Lab.attach`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.lab import monitoring as mon
from rollout.lab import nodes as n
from rollout.lab.controlplane import ControlPlane
from rollout.lab.labnodes import NodeRecord

if TYPE_CHECKING:
    from rollout.lab.cluster import Lab


def state_of(lab: Lab) -> dict[str, Any]:
    """What ``lab.json`` records for ``lab``."""
    cp = lab.cp
    return {
        "name": lab.name,
        "dir": str(lab.dir),
        "binDir": str(lab.bin_dir or ""),
        "relayPid": lab.relay_pid,
        "ports": {}
        if cp is None
        else {
            "etcd": cp.etcd_port,
            "etcdPeer": cp.etcd_peer_port,
            "apiserver": cp.apiserver_port,
            "kcm": cp.kcm_port,
            "scheduler": cp.scheduler_port,
        },
        "controlplane": {}
        if cp is None
        else (cp.pids if not lab._attached else {**lab._state.get("controlplane", {}), **cp.pids}),
        "kubeconfig": str(lab.kubeconfig),
        "monitoring": lab.monitoring.to_dict() if lab.monitoring else None,
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
            for r in lab.nodes.values()
        ],
    }


def load(lab: Lab, state: dict[str, Any]) -> None:
    """Fill an attached ``lab`` from its recorded ``state``."""
    lab._state = state
    lab.relay_pid = int(state.get("relayPid", 0))
    lab.bin_dir = Path(state["binDir"]) if state.get("binDir") else None
    lab.monitoring = mon.load_state(state.get("monitoring"))
    ports = state.get("ports", {})
    if ports and lab.bin_dir is not None:
        cp = ControlPlane(lab.dir / "controlplane", lab.bin_dir)
        cp.etcd_port, cp.etcd_peer_port = ports["etcd"], ports["etcdPeer"]
        cp.apiserver_port, cp.kcm_port = ports["apiserver"], ports["kcm"]
        cp.scheduler_port = ports["scheduler"]
        lab.cp = cp
    for rec in state.get("nodes", []):
        node = n.LabNode(**rec["node"])
        lab.nodes[node.name] = NodeRecord(node, n.NodeProcs(**rec["procs"]))
