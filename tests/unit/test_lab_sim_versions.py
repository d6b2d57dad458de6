"""The simulated kubelet plays the version in node.json: the 1.37 kubelet's flag refusal and its
memory_manager_state layout (V3), and older versions as they were."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.kubelet import memory_state as mck
from rollout.kubelet.checkpoints import MEMORY_STATE_FILE, data_checksum
from rollout.lab.kubelet.startup import ManagerState, StartupError, check_startup, kubelet_minor

TOPOLOGY = {"numaNodes": [{"id": 0, "cpus": "0-3", "memoryBytes": 1 << 30}]}
CONFIG = {"cpuManagerPolicy": "none"}
FLAGS = {"containerd": "/var/snap/microk8s/current/args/kubelet:10"}


def cfg(version: str) -> dict[str, object]:
    return {"kubeletVersion": version, "topology": TOPOLOGY, "distribution": "microk8s"}


def test_a_137_sim_kubelet_refuses_a_removed_cadvisor_flag_and_136_does_not() -> None:
    assert kubelet_minor(cfg("v1.37.2")) == 37
    with pytest.raises(StartupError, match="unknown flag: --containerd"):
        check_startup(cfg("v1.37.2"), CONFIG, FLAGS)
    check_startup(cfg("v1.36.3"), CONFIG, FLAGS)  # 1.36 still registers it (deprecated)


def test_a_137_sim_kubelet_writes_memory_state_v3_and_136_reads_it(tmp_path: Path) -> None:
    ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet", 37).restore()
    doc = json.loads((tmp_path / MEMORY_STATE_FILE).read_text())
    assert ck_data(doc) == {"policyName": "None", "machineState": {}}
    # a 1.36 kubelet (rollback) reads the inline fields; a 1.37 one reads data
    ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet", 36).restore()
    ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet", 37).restore()


def test_a_137_sim_kubelet_refuses_a_corrupt_v3_file_as_the_kubelet(tmp_path: Path) -> None:
    ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet", 37).restore()
    path = tmp_path / MEMORY_STATE_FILE
    doc = json.loads(path.read_text())
    doc["dataChecksum"] += 1
    path.write_text(json.dumps(doc))
    with pytest.raises(StartupError) as e:
        ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet", 37).restore()
    assert str(e.value) == (
        "could not restore state from checkpoint: could not load v3 checkpoint: checkpoint is "
        "corrupted, please drain this node and delete the memory manager checkpoint file "
        '"/var/lib/kubelet/memory_manager_state" before restarting Kubelet'
    )
    # the 1.36 kubelet has no V3 code: it reads the (intact) inline fields and starts
    ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet", 36).restore()


def test_a_136_sim_kubelet_writes_the_v2_layout(tmp_path: Path) -> None:
    ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet", 36).restore()
    doc = json.loads((tmp_path / MEMORY_STATE_FILE).read_text())
    assert "data" not in doc and "dataChecksum" not in doc
    assert mck.parse_memory(json.dumps(doc)).version == 2


def ck_data(doc: dict[str, object]) -> object:
    data = doc["data"]
    assert isinstance(data, str)
    assert data_checksum(data) == doc["dataChecksum"]
    return json.loads(data)
