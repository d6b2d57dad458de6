"""The lab's node "DaemonSets" (``rollout.lab.daemonsets``): which component a node's labels select,
what a label change starts or stops, the driver's command line and DeviceClass, and the build's
version pin, without starting anything."""

from __future__ import annotations

import re
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from rollout.errors import LabError
from rollout.lab import daemonsets as ds

ROOT = Path(__file__).resolve().parents[2]
KEYS = dict(ds.DEFAULT_LABELS)
DP, DRA = KEYS[ds.DEVICE_PLUGIN], KEYS[ds.DRA_DRIVER]


def test_the_default_keys_are_nvidias_operator_labels() -> None:
    assert DP == "nvidia.com/gpu.deploy.device-plugin"
    assert DRA == "nvidia.com/dra-kubelet-plugin"
    assert ds.label_keys({}) == KEYS
    custom = {"pathLabels": {ds.DRA_DRIVER: "example.com/dra"}}
    assert ds.label_keys(custom) == {ds.DEVICE_PLUGIN: DP, ds.DRA_DRIVER: "example.com/dra"}


@pytest.mark.parametrize(
    ("value", "runs"), [("true", True), ("false", False), ("", False), ("True", False)]
)
def test_a_nodeselector_matches_only_the_exact_value(value: str, runs: bool) -> None:
    assert ds.selected({DRA: value}, DRA) is runs
    assert ds.selected({}, DRA) is False


def test_the_first_look_applies_every_components_selection() -> None:
    assert ds.label_actions(None, {DP: "true"}, KEYS) == {
        ds.DEVICE_PLUGIN: "start",
        ds.DRA_DRIVER: "stop",
    }
    assert ds.label_actions(None, {}, KEYS) == {ds.DEVICE_PLUGIN: "stop", ds.DRA_DRIVER: "stop"}


def test_later_looks_act_only_on_a_changed_selection() -> None:
    last = {ds.DEVICE_PLUGIN: True, ds.DRA_DRIVER: False}
    # unchanged (an unrelated label or a value that still does not select): nothing, so a
    # fault that stopped a component holds until the next change
    assert ds.label_actions(last, {DP: "true", "other": "x"}, KEYS) == {}
    assert ds.label_actions(last, {DP: "true", DRA: "false"}, KEYS) == {}
    # the migration's switch: both change in one look
    assert ds.label_actions(last, {DP: "false", DRA: "true"}, KEYS) == {
        ds.DEVICE_PLUGIN: "stop",
        ds.DRA_DRIVER: "start",
    }
    # a removed label is an unselected node
    assert ds.label_actions({ds.DEVICE_PLUGIN: False, ds.DRA_DRIVER: True}, {}, KEYS) == {
        ds.DRA_DRIVER: "stop"
    }


def test_initial_labels_put_a_node_on_the_device_plugin_path() -> None:
    assert ds.initial_labels(KEYS) == {DP: "true"}
    assert ds.label_actions(None, ds.initial_labels(KEYS), KEYS)[ds.DEVICE_PLUGIN] == "start"


@pytest.mark.parametrize(
    ("text", "state"),
    [
        ("", (False, 0)),
        ("stopped\n", (False, 0)),
        ("running 3\n", (True, 3)),
        ("running", (True, 0)),
    ],
)
def test_the_driver_state_file(text: str, state: tuple[bool, int]) -> None:
    assert ds.state_of(text) == state


def test_apply_action_writes_the_lifecycle_file(tmp_path: Path) -> None:
    f = tmp_path / "dradriver.state"
    assert ds.apply_action(f, "stop") == "stopped"
    assert f.read_text() == "stopped\n"
    assert ds.apply_action(f, "stop") is None
    assert ds.apply_action(f, "start") == "running 1"
    assert ds.apply_action(f, "start") is None
    assert ds.apply_action(f, "restart") == "running 2"
    assert ds.state_of(f.read_text()) == (True, 2)


def test_driver_argv_uses_the_nodes_kubeconfig_root_dir_and_gpu_count() -> None:
    cfg = {
        "nodeName": "n1",
        "kubeconfig": "/etc/kubernetes/kubelet.conf",
        "rootDir": "/var/lib/kubelet/",
    }
    argv = ds.driver_argv(Path("/bin-dir"), cfg, 8)
    assert argv == [
        "/bin-dir/dra-example-kubeletplugin",
        "--node-name=n1",
        "--kubeconfig=/etc/kubernetes/kubelet.conf",
        "--cdi-root=/var/lib/rollout-lab/cdi",
        "--num-devices=8",
        "--kubelet-registrar-directory-path=/var/lib/kubelet/plugins_registry",
        "--kubelet-plugins-directory-path=/var/lib/kubelet/plugins",
    ]


def test_the_device_class_is_the_charts() -> None:
    dc = ds.device_class()
    assert dc["metadata"]["name"] == "gpu.example.com"
    assert dc["spec"] == {
        "selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]
    }
    assert ds.device_class("nvidia.com/gpu")["spec"]["extendedResourceName"] == "nvidia.com/gpu"


def test_the_driver_version_is_pinned_exactly_in_its_own_module(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gomod = (ROOT / "tools" / "drabin" / "go.mod").read_text()
    assert re.search(r"^\s+sigs\.k8s\.io/dra-example-driver v0\.4\.0\b", gomod, re.M)
    assert "tool sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin" in gomod
    # the kubelet's wrapper module does not carry it (its dependencies must not move)
    assert "dra-example-driver" not in (ROOT / "tools" / "labnodebin" / "go.mod").read_text()
    monkeypatch.delenv("ROLLOUT_LAB_DRA_BIN", raising=False)
    monkeypatch.setenv("ROLLOUT_LAB_CACHE", str(tmp_path))
    assert ds.find_driver_bin_dir() == tmp_path / "dra-example-driver-v0.4.0" / "bin"
    monkeypatch.setenv("ROLLOUT_LAB_DRA_BIN", "/prebuilt")
    assert ds.find_driver_bin_dir() == Path("/prebuilt")


def test_a_node_may_start_on_the_dra_path_and_an_unknown_path_is_refused() -> None:
    assert ds.initial_labels(KEYS, "dra") == {DP: "false", DRA: "true"}
    assert ds.label_actions(None, ds.initial_labels(KEYS, "dra"), KEYS) == {
        ds.DEVICE_PLUGIN: "stop",
        ds.DRA_DRIVER: "start",
    }
    # the plugin never registers (no capacity left behind); the driver starts with the node
    assert ds.initial_files("dra") == {
        "/var/lib/rollout-lab/fakedeviceplugin.state": "stopped\n",
        "/var/lib/rollout-lab/dradriver.state": "running 1\n",
    }
    assert ds.initial_files() == {}
    with pytest.raises(LabError, match="unknown allocation path 'both'"):
        ds.initial_labels(KEYS, "both")


@pytest.fixture
def files(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in ("DRIVER_PID_FILE", "DRIVER_LOG", "DRIVER_STATE_FILE"):
        monkeypatch.setattr(ds, name, str(tmp_path / name.lower()))
    return tmp_path


def _wait(pred: Callable[[], bool]) -> None:
    deadline = time.monotonic() + 10
    while not pred():
        assert time.monotonic() < deadline
        time.sleep(0.05)


def test_the_driver_process_follows_its_lifecycle_file(files: Path) -> None:
    state = Path(ds.DRIVER_STATE_FILE)
    driver = ds.Driver([shutil.which("sleep") or "/bin/sleep", "60"])
    try:
        driver.converge()  # no file: not running
        assert not driver.alive()
        state.write_text("running 1\n")
        driver.converge()
        first = driver.pid
        assert driver.alive() and Path(ds.DRIVER_PID_FILE).read_text() == f"{first} 1\n"
        driver.converge()
        assert driver.pid == first  # same generation: left alone
        # an agent started again adopts the running driver from its pid file
        assert ds.Driver(driver.argv).pid == first
        state.write_text("running 2\n")  # driver-restart
        driver.converge()
        assert driver.pid != first and driver.gen == 2
        state.write_text("stopped\n")
        driver.converge()
        assert not driver.alive() and not Path(ds.DRIVER_PID_FILE).exists()
    finally:
        state.write_text("stopped\n")
        driver.converge()


def test_a_driver_that_exits_is_started_again_after_a_back_off(files: Path) -> None:
    Path(ds.DRIVER_STATE_FILE).write_text("running 1\n")
    driver = ds.Driver([shutil.which("true") or "/bin/true"])
    driver.converge()
    _wait(lambda: not driver.alive())
    driver.converge()  # exited at once: not again before 1 s
    assert driver.pid == 0 and driver.backoff == 1.0
    _wait(lambda: (driver.converge(), driver.pid != 0)[1])
    _wait(lambda: not driver.alive())
    driver.converge()
    assert driver.backoff == 2.0
    Path(ds.DRIVER_STATE_FILE).write_text("stopped\n")
    driver.converge()
    assert not Path(ds.DRIVER_PID_FILE).exists()
