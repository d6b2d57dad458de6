"""The lab kubelet keeps GPU assignments in the device manager's real checkpoint file."""

from __future__ import annotations

from pathlib import Path

from rollout.kubelet.device_checkpoint import DEVICE_CHECKPOINT_FILE, parse_device
from rollout.lab.kubelet import admission as adm
from rollout.lab.kubelet.startup import ManagerState

TOPOLOGY = {
    "numaNodes": [
        {"id": 0, "cpus": "0-3", "memoryBytes": 1 << 30, "gpus": ["GPU-0", "GPU-1"]},
        {"id": 1, "cpus": "4-7", "memoryBytes": 1 << 30, "gpus": ["GPU-2", "GPU-3"]},
    ]
}
CONFIG = {"cpuManagerPolicy": "static", "reservedSystemCPUs": "0"}


def test_assignments_are_written_with_numa_keys_and_restored(tmp_path: Path) -> None:
    state = ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet")
    state.restore()
    state.allocations["uid-a"] = adm.Allocation(
        cpus={"cuda": frozenset({4, 5})}, gpus={"cuda": ("GPU-2", "GPU-3")}
    )
    state.allocations["uid-b"] = adm.Allocation(gpus={"main": ("GPU-0",)})
    state.persist()

    cp = parse_device((tmp_path / DEVICE_CHECKPOINT_FILE).read_text())  # checksum verified
    got = {(e.pod_uid, e.container): dict(e.device_ids or {}) for e in cp.entries or ()}
    assert got == {("uid-a", "cuda"): {1: ("GPU-2", "GPU-3")}, ("uid-b", "main"): {0: ("GPU-0",)}}
    assert dict(cp.registered or {}) == {"nvidia.com/gpu": ("GPU-0", "GPU-1", "GPU-2", "GPU-3")}

    again = ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet")
    again.restore()
    assert again.allocations["uid-a"].gpus == {"cuda": ("GPU-2", "GPU-3")}
    assert again.allocations["uid-a"].cpus == {"cuda": frozenset({4, 5})}
    assert again.allocations["uid-b"].gpus == {"main": ("GPU-0",)}


def test_a_corrupt_device_checkpoint_starts_empty_like_the_kubelet(tmp_path: Path) -> None:
    path = tmp_path / DEVICE_CHECKPOINT_FILE
    path.parent.mkdir(parents=True)
    path.write_text('{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":1}')
    state = ManagerState(CONFIG, TOPOLOGY, tmp_path, "/var/lib/kubelet")
    state.restore()  # no StartupError: the device manager only logs it
    assert state.allocations == {}
