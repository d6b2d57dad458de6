"""The lab's device faults as files the fake device plugin polls: the devices file with a
health per device, the state file with the plugin's lifecycle, and the wait for the Node's
allocatable to follow (a fake control plane stands in for the kubelet's status updates)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from rollout.errors import LabError
from rollout.lab import realnode
from rollout.lab.devicefaults import (
    DeviceFaults,
    next_state,
    parse_devices,
    render_devices,
    set_health,
    set_numa,
)

FILE = "GPU-0=0\nGPU-1=0\nGPU-2=1\nGPU-3=1\n"


def test_set_health_marks_one_or_every_device_and_names_what_changed() -> None:
    text, changed = set_health(FILE, "GPU-3", healthy=False)
    assert text == "GPU-0=0\nGPU-1=0\nGPU-2=1\nGPU-3=1:Unhealthy\n" and changed == ["GPU-3"]
    assert parse_devices(text)["GPU-3"] == (1, False)
    again, changed = set_health(text, "GPU-3", healthy=False)
    assert again == text and changed == []
    every, changed = set_health(text, None, healthy=False)
    assert changed == ["GPU-0", "GPU-1", "GPU-2"]
    back, changed = set_health(every, None, healthy=True)
    assert back == FILE and len(changed) == 4
    assert render_devices(parse_devices(FILE)) == FILE
    with pytest.raises(LabError, match="no device 'GPU-9' on the node; it has GPU-0, GPU-1"):
        set_health(FILE, "GPU-9", healthy=False)


@pytest.mark.parametrize(
    ("current", "action", "new"),
    [
        ("", "stop", "stopped"),
        ("running 3\n", "stop", "stopped"),
        ("stopped\n", "stop", None),
        ("stopped\n", "start", "running 1"),
        ("", "start", None),
        ("", "restart", "running 1"),
        ("running 3\n", "restart", "running 4"),
    ],
)
def test_plugin_state_transitions(current: str, action: str, new: str | None) -> None:
    assert next_state(current, action) == new


class FakeKubelet(DeviceFaults):
    """A node root on disk and a control plane whose Node follows the devices file (as the real
    kubelet's status update would), or never follows (``follows=False``)."""

    def __init__(self, root: Path, follows: bool = True) -> None:
        super().__init__(lambda: self, lambda _node: root)
        self.root, self.follows = root, follows
        (root / realnode.GPU_FILE.lstrip("/")).parent.mkdir(parents=True)
        (root / realnode.GPU_FILE.lstrip("/")).write_text(FILE)
        (root / realnode.PLUGIN_STATE_FILE.lstrip("/")).parent.mkdir(parents=True)
        (root / "var/log").mkdir(parents=True)

    def request(self, method: str, path: str) -> tuple[int, dict[str, Any]]:
        devices = parse_devices((self.root / realnode.GPU_FILE.lstrip("/")).read_text())
        state = self.root / realnode.PLUGIN_STATE_FILE.lstrip("/")
        stopped = state.is_file() and state.read_text().strip() == "stopped"
        healthy = 0 if stopped else sum(ok for _, ok in devices.values())
        if not self.follows:
            healthy = len(devices)
        alloc = {"nvidia.com/gpu": str(healthy)}
        return 200, {"status": {"capacity": {"nvidia.com/gpu": "4"}, "allocatable": alloc}}


def test_device_unhealthy_returns_once_allocatable_drops(tmp_path: Path) -> None:
    lab = FakeKubelet(tmp_path)
    got = lab.device_health("n1", "GPU-3", healthy=False)
    assert got == {"changed": ["GPU-3"], "capacity": 4, "allocatable": 3}
    assert "GPU-3=1:Unhealthy" in (tmp_path / realnode.GPU_FILE.lstrip("/")).read_text()
    assert lab.device_health("n1", None, healthy=True)["allocatable"] == 4


def test_a_kubelet_that_never_follows_is_named_after_the_timeout(tmp_path: Path) -> None:
    lab = FakeKubelet(tmp_path, follows=False)
    with pytest.raises(LabError, match=re.escape("node n1: allocatable nvidia.com/gpu = 3: not")):
        lab.device_health("n1", "GPU-0", healthy=False, timeout=0.3)


def test_plugin_stop_writes_the_state_and_waits_for_allocatable_zero(tmp_path: Path) -> None:
    lab = FakeKubelet(tmp_path)
    got = lab.plugin("n1", "stop")
    assert got == {"state": "stopped", "changed": True, "capacity": 4, "allocatable": 0}
    # start waits for the plugin's next registration line in its log
    log = tmp_path / "var/log/rollout-lab-fakedeviceplugin.log"
    log.write_text("fakedeviceplugin: registered nvidia.com/gpu with 4 device(s)\n")
    with pytest.raises(LabError, match="the device plugin registering again"):
        lab.plugin("n1", "start", timeout=0.3)


def test_device_faults_on_a_simulated_node_are_refused(tmp_path: Path) -> None:
    sim = FakeKubelet(tmp_path)
    sim.node_root = lambda _node: tmp_path / "sim"  # a node without the fake device plugin
    with pytest.raises(LabError, match="device faults need a real-kubelet node"):
        sim.plugin("n1", "stop")


def test_set_numa_moves_one_or_every_device_and_keeps_health() -> None:
    text, changed = set_numa("GPU-0=0\nGPU-1=0\nGPU-2=1:Unhealthy\nGPU-3=1\n", None, 0)
    assert text == "GPU-0=0\nGPU-1=0\nGPU-2=0:Unhealthy\nGPU-3=0\n"
    assert changed == ["GPU-2", "GPU-3"]
    one, changed = set_numa(FILE, "GPU-0", 1)
    assert one == "GPU-0=1\nGPU-1=0\nGPU-2=1\nGPU-3=1\n" and changed == ["GPU-0"]
    with pytest.raises(LabError, match="no device 'GPU-9'"):
        set_numa(FILE, "GPU-9", 0)
    with pytest.raises(LabError, match="NUMA node must be 0 or more"):
        set_numa(FILE, None, -1)


def test_device_numa_waits_for_the_plugin_to_send_the_new_list(tmp_path: Path) -> None:
    lab = FakeKubelet(tmp_path)
    log = tmp_path / "var/log/rollout-lab-fakedeviceplugin.log"
    log.write_text("fakedeviceplugin: 4 device(s), 4 healthy: sent to the kubelet\n")
    with pytest.raises(LabError, match="the device plugin sending the new NUMA nodes"):
        lab.device_numa("n1", None, 0, timeout=0.3)
    # nothing to change: no wait, nothing sent
    got = lab.device_numa("n1", None, 0, timeout=0.3)
    assert got == {"changed": [], "numa": dict.fromkeys(["GPU-0", "GPU-1", "GPU-2", "GPU-3"], 0)}
