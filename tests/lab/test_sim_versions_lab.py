"""The simulated kubelet playing 1.37 against the lab's control plane: a kubeadm node comes up
Ready reporting v1.37.2 and keeps memory_manager_state in the V3 layout and cpu_manager_state in
V4, and a MicroK8s node seeded with the snap's default args (``--containerd``) does not start, in
the kubelet's words.

Runtime (2-core machine, warm lab binaries): about 15 s.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from rollout.kubelet import checkpoints as ck
from rollout.kubelet import memory_state as mck
from rollout.lab.cluster import Lab
from rollout.lab.kubelet.klog import unquote
from tests.lab.changekit import wait_for

pytestmark = [pytest.mark.lab, pytest.mark.timeout(180)]


def test_a_137_sim_node_runs_with_the_137_checkpoints(lab: Lab) -> None:
    names = ["sv137-kubeadm"]
    lab.machines.add_nodes(names, ["kubeadm"], kubelet="sim", kubelet_version="1.37", timeout=60)
    try:
        code, body = lab.api.request("GET", f"/api/v1/nodes/{names[0]}")
        assert code == 200, body
        assert body["status"]["nodeInfo"]["kubeletVersion"] == "v1.37.2"
        text = (
            lab.machines.node_root(names[0]) / "var/lib/kubelet" / ck.MEMORY_STATE_FILE
        ).read_text()
        doc: dict[str, Any] = json.loads(text)
        assert ck.data_checksum(doc["data"]) == doc["dataChecksum"]
        assert mck.parse_memory(text).version == 3
        # and cpu_manager_state as V4 (kubernetes#139102), its inline part a V2 file for 1.36
        text = (
            lab.machines.node_root(names[0]) / "var/lib/kubelet" / ck.CPU_STATE_FILE
        ).read_text()
        doc = json.loads(text)
        assert ck.data_checksum(doc["data"]) == doc["dataChecksum"]
        cp = ck.parse_cpu(text)
        assert cp.version == 4 and cp.checksum == doc["checksum"] == cp.computed_checksum()
        assert ck.parse_cpu(text, kubelet_minor=36).policy_name == cp.policy_name
    finally:
        lab.machines.remove_nodes(names)


def test_a_137_sim_microk8s_node_refuses_the_snaps_containerd_flag(lab: Lab) -> None:
    names = ["sv137-microk8s"]
    lab.machines.add_nodes(
        names, ["microk8s"], kubelet="sim", kubelet_version="1.37", wait_ready=False, timeout=60
    )
    try:
        log = lab.machines.node_root(names[0]) / "var/log/kubelet.log"
        want = "failed to run Kubelet: failed to parse kubelet flag: unknown flag: --containerd"
        wait_for(
            lambda: log.exists() and want in unquote(log.read_text(errors="replace")),
            20,
            "the 1.37 kubelet's flag error",
        )
    finally:
        lab.machines.remove_nodes(names)
