"""Device faults on a real-kubelet lab node: a GPU marked unhealthy or healthy again, a GPU
reported on another NUMA node, the device plugin stopped, started or restarted (``rollout lab
fault device-unhealthy NODE [DEVICE]`` ...).

Why in the lab: the evidence and preflight rules about device health are only worth what the
real kubelet does with a plugin's health reports and disconnects; the lab's fake device plugin
(``tools/labnodebin/fakedeviceplugin``) makes both happen on the real kubelet's device manager.
It polls two files of the node, which this module writes from the host (through the node's
root, ``/proc/<holder>/root``):

* the devices file (:data:`rollout.lab.realnode.GPU_FILE`): ``ID=NUMA`` a healthy device,
  ``ID=NUMA:Unhealthy`` an unhealthy one; the plugin sends a change on its ListAndWatch stream
  and the kubelet moves the device out of allocatable (capacity keeps it) and out of the
  checkpoint's ``RegisteredDevices``; rewriting a device's NUMA node makes the plugin report it
  there (its topology in ListAndWatch), while the node's PCI ``numa_node`` keeps the truth: a
  plugin that misreports placement, which the evidence's ``numa-aligned`` check cross-checks;
* the state file (:data:`rollout.lab.realnode.PLUGIN_STATE_FILE`): ``stopped`` stops serving
  (the socket goes, the kubelet marks every device of the resource unhealthy); ``running N`` a
  generation, a new one restarting the plugin (it registers again).

Each fault waits until the Node's status shows the kubelet followed (allocatable of the
resource equal to the healthy devices, 0 when stopped; a new registration for start and
restart; for a NUMA change, the plugin's log line saying it sent the new list to the kubelet),
so a test or a person sees the effect when the command returns.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Protocol

from rollout.errors import LabError
from rollout.lab import realnode

RESOURCE = "nvidia.com/gpu"
UNHEALTHY = "Unhealthy"
PLUGIN_LOG = "var/log/rollout-lab-fakedeviceplugin.log"
#: the plugin's log line at each registration with the kubelet
REGISTERED = "fakedeviceplugin: registered "
#: the plugin's log line each time it sends a changed device list on ListAndWatch
SENT = ": sent to the kubelet"
ACTIONS = ("stop", "start", "restart")


def parse_devices(text: str) -> dict[str, tuple[int, bool]]:
    """device id -> (NUMA node, healthy), in file order, from the devices file."""
    out: dict[str, tuple[int, bool]] = {}
    for part in text.replace(",", "\n").split():
        ident, _, rest = part.partition("=")
        numa, _, health = rest.partition(":")
        out[ident] = (int(numa), health != UNHEALTHY)
    return out


def render_devices(devices: Mapping[str, tuple[int, bool]]) -> str:
    """The devices file for ``devices`` (see :func:`parse_devices`)."""
    return "".join(
        f"{d}={numa}{'' if ok else ':' + UNHEALTHY}\n" for d, (numa, ok) in devices.items()
    )


def set_health(text: str, device: str | None, healthy: bool) -> tuple[str, list[str]]:
    """The devices file with ``device`` (every device when None) healthy or unhealthy, and the
    ids it changed. Raises :class:`LabError` for a device the node does not have."""
    devices = parse_devices(text)
    if device is not None and device not in devices:
        raise LabError(f"no device {device!r} on the node; it has {', '.join(devices) or 'none'}")
    changed = []
    for d, (numa, ok) in list(devices.items()):
        if (device is None or d == device) and ok != healthy:
            devices[d] = (numa, healthy)
            changed.append(d)
    return render_devices(devices), changed


def set_numa(text: str, device: str | None, numa: int) -> tuple[str, list[str]]:
    """The devices file with ``device`` (every device when None) reported on NUMA node ``numa``
    (health kept), and the ids it changed. Raises :class:`LabError` for a device the node does
    not have or a negative NUMA node."""
    if numa < 0:
        raise LabError(f"NUMA node must be 0 or more, not {numa}")
    devices = parse_devices(text)
    if device is not None and device not in devices:
        raise LabError(f"no device {device!r} on the node; it has {', '.join(devices) or 'none'}")
    changed = []
    for d, (old, ok) in list(devices.items()):
        if (device is None or d == device) and old != numa:
            devices[d] = (numa, ok)
            changed.append(d)
    return render_devices(devices), changed


def next_state(current: str, action: str) -> str | None:
    """The state file's new content for ``action`` (stop / start / restart), or None when there
    is nothing to do (stopping a stopped plugin, starting a running one)."""
    if action not in ACTIONS:
        raise LabError(f"unknown plugin action {action!r}; valid: {', '.join(ACTIONS)}")
    stopped = current.strip() == "stopped"
    if action == "stop":
        return None if stopped else "stopped"
    if action == "start" and not stopped:
        return None
    gen = 0
    for word in reversed(current.split()):
        if word.isdigit():
            gen = int(word)
            break
    return f"running {gen + 1}"


def _write(path: Path, text: str) -> None:
    """Replace the file in one rename (the plugin never reads half of it)."""
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _wait(pred: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise LabError(f"{what}: not seen within {timeout:.0f}s")
        time.sleep(0.25)


class APIServer(Protocol):
    """What a fault reads the Node through: the control plane's admin request
    (:meth:`rollout.lab.controlplane.ControlPlane.request`)."""

    def request(self, method: str, path: str) -> tuple[int, Any]: ...


class DeviceFaults:
    """Device faults of a lab's nodes (:attr:`rollout.lab.cluster.Lab.devices`).

    Args:
        api: the control plane, when the fault runs (a lab attached or started).
        node_root: a node's root directory as the host sees it.
    """

    def __init__(self, api: Callable[[], APIServer], node_root: Callable[[str], Path]) -> None:
        self._api = api
        self.node_root = node_root

    def _node_status(self, node: str) -> Mapping[str, Any]:
        code, obj = self._api().request("GET", f"/api/v1/nodes/{node}")
        if code != 200:
            raise LabError(f"read Node {node}: HTTP {code}")
        return dict(obj.get("status") or {})

    def _device_root(self, node: str) -> Path:
        root = self.node_root(node)
        if not (root / realnode.GPU_FILE.lstrip("/")).is_file():
            raise LabError(
                f"node {node}: device faults need a real-kubelet node (rollout lab up --kubelet "
                "real): the simulated kubelet has no device plugin"
            )
        return root

    def _counts(self, node: str) -> tuple[int, int]:
        status = self._node_status(node)
        cap = int(str((status.get("capacity") or {}).get(RESOURCE, 0)))
        alloc = int(str((status.get("allocatable") or {}).get(RESOURCE, 0)))
        return cap, alloc

    def device_health(
        self, node: str, device: str | None, healthy: bool, timeout: float = 60.0
    ) -> dict[str, Any]:
        """Mark ``device`` (every GPU when None) of ``node`` healthy or unhealthy; wait until the
        Node's allocatable shows the healthy count."""
        root = self._device_root(node)
        path = root / realnode.GPU_FILE.lstrip("/")
        text, changed = set_health(path.read_text(), device, healthy)
        _write(path, text)
        want = sum(ok for _, ok in parse_devices(text).values())
        running = _read(root / realnode.PLUGIN_STATE_FILE.lstrip("/")).strip() != "stopped"
        if running:
            _wait(
                lambda: self._counts(node)[1] == want,
                timeout,
                f"node {node}: allocatable {RESOURCE} = {want}",
            )
        cap, alloc = self._counts(node)
        return {"changed": changed, "capacity": cap, "allocatable": alloc}

    def device_numa(
        self, node: str, device: str | None, numa: int, timeout: float = 60.0
    ) -> dict[str, Any]:
        """Make ``node``'s device plugin report ``device`` (every GPU when None) on NUMA node
        ``numa``; wait until the plugin says it sent the new list to the kubelet (the Node's
        status does not show topology). The PCI devices' ``numa_node`` is left as it is."""
        root = self._device_root(node)
        path = root / realnode.GPU_FILE.lstrip("/")
        log = root / PLUGIN_LOG
        sent = _read(log).count(SENT)
        text, changed = set_numa(path.read_text(), device, numa)
        _write(path, text)
        running = _read(root / realnode.PLUGIN_STATE_FILE.lstrip("/")).strip() != "stopped"
        if changed and running:
            _wait(
                lambda: _read(log).count(SENT) > sent,
                timeout,
                f"node {node}: the device plugin sending the new NUMA nodes to the kubelet",
            )
        placed = {d: n for d, (n, _ok) in parse_devices(text).items()}
        return {"changed": changed, "numa": placed}

    def plugin(self, node: str, action: str, timeout: float = 60.0) -> dict[str, Any]:
        """Stop, start or restart ``node``'s device plugin; wait until the kubelet saw it (all
        devices unhealthy when stopped; a new registration when started or restarted)."""
        root = self._device_root(node)
        state = root / realnode.PLUGIN_STATE_FILE.lstrip("/")
        log = root / PLUGIN_LOG
        registered = _read(log).count(REGISTERED)
        new = next_state(_read(state), action)
        if new is not None:
            _write(state, new + "\n")
            if new == "stopped":
                _wait(
                    lambda: self._counts(node)[1] == 0,
                    timeout,
                    f"node {node}: allocatable {RESOURCE} = 0 (plugin stopped)",
                )
            else:
                _wait(
                    lambda: _read(log).count(REGISTERED) > registered,
                    timeout,
                    f"node {node}: the device plugin registering again",
                )
                devices = parse_devices((root / realnode.GPU_FILE.lstrip("/")).read_text())
                want = sum(ok for _, ok in devices.values())
                _wait(
                    lambda: self._counts(node)[1] == want,
                    timeout,
                    f"node {node}: allocatable {RESOURCE} = {want}",
                )
        cap, alloc = self._counts(node)
        now = new or _read(state).strip() or "running"
        return {"state": now, "changed": new is not None, "capacity": cap, "allocatable": alloc}

    def driver_slices(self, node: str) -> list[str]:
        """The device names the lab's DRA driver publishes in ResourceSlices for ``node``."""
        code, obj = self._api().request(
            "GET",
            "/apis/resource.k8s.io/v1/resourceslices?fieldSelector="
            f"spec.nodeName={node},spec.driver={realnode.DRIVER}",
        )
        if code != 200:
            raise LabError(f"list ResourceSlices of node {node}: HTTP {code}")
        return sorted(
            str(d.get("name"))
            for s in obj.get("items") or ()
            for d in (s.get("spec") or {}).get("devices") or ()
        )

    def driver(self, node: str, action: str, timeout: float = 60.0) -> dict[str, Any]:
        """Stop, start or restart ``node``'s DRA driver (:mod:`rollout.lab.daemonsets` runs it);
        wait until its process is gone (stop), or runs again and its ResourceSlices list every
        GPU of the node (start, restart). The slices of a stopped driver stay until the kubelet
        wipes them, 30 s after the driver unregistered: :meth:`wait_slices` waits for that."""
        root = self._device_root(node)
        state = root / realnode.DRIVER_STATE_FILE.lstrip("/")
        pidfile = root / realnode.DRIVER_PID_FILE.lstrip("/")
        new = next_state(_read(state) or "stopped", action)
        if new is not None:
            _write(state, new + "\n")
            if new == "stopped":
                _wait(
                    lambda: not pidfile.exists(),
                    timeout,
                    f"node {node}: the DRA driver {realnode.DRIVER} stopping",
                )
            else:
                gen = new.split()[-1]
                _wait(
                    lambda: _read(pidfile).split()[1:] == [gen],
                    timeout,
                    f"node {node}: the DRA driver {realnode.DRIVER} starting",
                )
                want = len(parse_devices((root / realnode.GPU_FILE.lstrip("/")).read_text()))
                self.wait_slices(node, want, timeout)
        now = new or _read(state).strip()
        return {"state": now, "changed": new is not None, "slices": self.driver_slices(node)}

    def wait_slices(self, node: str, devices: int, timeout: float = 90.0) -> list[str]:
        """Wait until the DRA driver's ResourceSlices for ``node`` list ``devices`` devices (0:
        until the kubelet wiped them); the device names."""
        got: list[str] = []

        def done() -> bool:
            nonlocal got
            got = self.driver_slices(node)
            return len(got) == devices

        _wait(
            done,
            timeout,
            f"node {node}: ResourceSlices of {realnode.DRIVER} listing {devices} device(s)",
        )
        return got
