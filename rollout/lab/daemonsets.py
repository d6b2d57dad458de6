"""A real-kubelet lab node's GPU allocation path follows its labels, as two DaemonSets with node
selectors would make it: the device plugin on a node labelled ``<device-plugin label>=true``, the
DRA kubelet plugin (``sigs.k8s.io/dra-example-driver``'s, driver ``gpu.example.com``) on a node
labelled ``<dra label>=true`` (NVIDIA's GPU Operator: ``nvidia.com/gpu.deploy.device-plugin`` and
``nvidia.com/dra-kubelet-plugin``; the keys are settings, :data:`DEFAULT_LABELS`).

Why: a migration between the paths switches those labels and waits for what the DaemonSet
controller and the kubelet then do; the lab must do the same thing to the same signals, with the
real kubelet seeing a plugin come and go. A small agent runs inside each real-kubelet node next to
the fake runtime (started by :mod:`rollout.lab.realnode` at the unit's first start, it survives
kubelet restarts as a DaemonSet's pods do). It watches its own Node with the node's credentials
(as the DaemonSet controller's informer does) and, for each component whose selection changed
since it last looked (every component at its first look), writes that component's lifecycle file:

* the device plugin's (:data:`rollout.lab.realnode.PLUGIN_STATE_FILE`), which the fake plugin
  itself follows (``stopped``; ``running N``);
* the DRA driver's (:data:`DRIVER_STATE_FILE`), which this agent follows: it starts
  ``dra-example-kubeletplugin`` with the node's own kubeconfig, a CDI root under the lab's state
  dir and as many devices as the node has GPUs, stops it with SIGTERM, restarts it on a new
  generation, and starts it again if it exits while it should run (a kubelet restarting a
  DaemonSet pod's container).

The DaemonSet objects themselves (:func:`daemonset_objects`, created by
``Machines.path_daemonsets``) exist too, with ``nodeSelector`` on the same labels: a migration's
preflight refuses labels that select no DaemonSet, and the DaemonSet controller runs their pods
(``pause`` on the fake runtime, which runs no process) where the labels select; the agent is what
a pod's container would be.

Edge, not level, on the labels: ``rollout lab fault driver-stop`` / ``plugin-stop`` write the same
files and hold until the next fault or label change, as a crashed plugin pod would stay down
(CrashLoopBackOff) in a cluster. The pure parts (:func:`label_actions`, :func:`driver_argv`) are
unit-tested; the agent loop runs in the lab tests.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout.errors import LabError
from rollout.lab import devicefaults, realnode

DEVICE_PLUGIN = "device-plugin"
DRA_DRIVER = "dra-driver"
COMPONENTS = (DEVICE_PLUGIN, DRA_DRIVER)
#: the node labels the two DaemonSets select on (NVIDIA's GPU Operator's keys)
DEFAULT_LABELS = {
    DEVICE_PLUGIN: "nvidia.com/gpu.deploy.device-plugin",
    DRA_DRIVER: "nvidia.com/dra-kubelet-plugin",
}
#: the DRA driver the lab runs, its binary, and the DeviceClass its chart creates
DRIVER = realnode.DRIVER
DRIVER_BINARY = "dra-example-kubeletplugin"
DEVICE_CLASS = "gpu.example.com"
DRIVER_STATE_FILE = realnode.DRIVER_STATE_FILE
DRIVER_PID_FILE = realnode.DRIVER_PID_FILE
DRIVER_LOG = "/var/log/rollout-lab-dradriver.log"
AGENT_LOG = "/var/log/rollout-lab-daemonsets.log"
CDI_ROOT = str(realnode.STATE_DIR / "cdi")
#: the wait before the agent reads its Node again after a failed read or watch
POLL_S = 0.5
#: how often the agent compares the driver's process with its lifecycle file
CONVERGE_S = 0.25
#: how long a stopping driver gets between SIGTERM and SIGKILL (the pod's grace period is 30 s;
#: the driver exits at once on SIGTERM)
STOP_GRACE_S = 10.0
#: a driver that exits within this long of its start is started again after a back-off doubling
#: from 1 s to 60 s (the kubelet's CrashLoopBackOff: 10 s to 5 min)
CRASH_S = 10.0


def selected(labels: Mapping[str, str], key: str) -> bool:
    """Whether a DaemonSet with ``nodeSelector: {key: "true"}`` runs on a node with ``labels``."""
    return labels.get(key) == "true"


def label_actions(
    last: Mapping[str, bool] | None, labels: Mapping[str, str], keys: Mapping[str, str]
) -> dict[str, str]:
    """component -> ``start`` / ``stop`` for each component (:data:`COMPONENTS`) whose selection
    by ``labels`` differs from ``last`` (every component when ``last`` is None: the first look)."""
    out = {}
    for comp in COMPONENTS:
        now = selected(labels, keys[comp])
        if last is None or last.get(comp) != now:
            out[comp] = "start" if now else "stop"
    return out


def label_keys(cfg: Mapping[str, Any]) -> dict[str, str]:
    """The label keys of a node's ``node.json`` (``pathLabels``), defaults filled in."""
    got = cfg.get("pathLabels") or {}
    return {c: str(got.get(c) or DEFAULT_LABELS[c]) for c in COMPONENTS}


PATHS = ("device-plugin", "dra")


def initial_labels(keys: Mapping[str, str], path: str = "device-plugin") -> dict[str, str]:
    """The labels a real-kubelet lab node registers with: on the device-plugin path by default,
    as a GPU Operator's node gets ``nvidia.com/gpu.deploy.device-plugin=true``; on the DRA path
    with the DRA label instead."""
    if path not in PATHS:
        raise LabError(f"unknown allocation path {path!r}; valid: {', '.join(PATHS)}")
    if path == "dra":
        return {keys[DEVICE_PLUGIN]: "false", keys[DRA_DRIVER]: "true"}
    return {keys[DEVICE_PLUGIN]: "true"}


def initial_files(path: str = "device-plugin") -> dict[str, str]:
    """The lifecycle files a node starts with on ``path``: on the DRA path the device plugin
    never registers (its capacity would linger 5 min) and the driver starts with the node."""
    if path == "dra":
        return {realnode.PLUGIN_STATE_FILE: "stopped\n", DRIVER_STATE_FILE: "running 1\n"}
    return {}


def state_of(text: str) -> tuple[bool, int]:
    """(running, generation) of a lifecycle file; absent or empty: the driver is not running."""
    words = text.split()
    if not words or words[0] != "running":
        return False, 0
    gen = int(words[1]) if len(words) > 1 and words[1].isdigit() else 0
    return True, gen


def driver_argv(bin_dir: Path, cfg: Mapping[str, Any], num_devices: int) -> list[str]:
    """The DRA kubelet plugin's command line on a node (``node.json`` ``cfg``): the node's own
    kubeconfig (the Node authorizer lets ``system:node:<node>`` write its node's ResourceSlices),
    the kubelet's plugin directories under the node's root dir, one device per GPU."""
    root = str(cfg.get("rootDir") or "/var/lib/kubelet").rstrip("/")
    return [
        str(bin_dir / DRIVER_BINARY),
        f"--node-name={cfg['nodeName']}",
        f"--kubeconfig={cfg['kubeconfig']}",
        f"--cdi-root={CDI_ROOT}",
        f"--num-devices={num_devices}",
        f"--kubelet-registrar-directory-path={root}/plugins_registry",
        f"--kubelet-plugins-directory-path={root}/plugins",
    ]


def device_class(extended_resource: str | None = None) -> dict[str, Any]:
    """The DeviceClass the example driver's chart creates (``templates/deviceclass.yaml``): every
    device of :data:`DRIVER`, and ``spec.extendedResourceName`` when given (the chart's
    ``deviceClass.extendedResourceName``, empty by default; KEP-5004)."""
    spec: dict[str, Any] = {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]}
    if extended_resource:
        spec["extendedResourceName"] = extended_resource
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DEVICE_CLASS},
        "spec": spec,
    }


NAMESPACE = "gpu-operator"
#: the DaemonSets' names, as NVIDIA's GPU Operator names them
DAEMONSET_NAMES = {
    DEVICE_PLUGIN: "nvidia-device-plugin-daemonset",
    DRA_DRIVER: "nvidia-dra-driver-gpu-kubelet-plugin",
}


def daemonset_objects(keys: Mapping[str, str]) -> list[dict[str, Any]]:
    """The two DaemonSets of a GPU Operator, as the API server holds them: each selects nodes
    on its path label (``keys``: component -> label key) with ``nodeSelector: {key: "true"}``,
    the selection :func:`selected` applies. Their pods run ``pause`` on the fake runtime: the
    DaemonSet controller creates and deletes them as the labels switch, and the lab's agent
    starts and stops the component itself on the same label."""
    out = []
    for comp in COMPONENTS:
        name = DAEMONSET_NAMES[comp]
        sel = {"app": name}
        out.append(
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "metadata": {"name": name, "namespace": NAMESPACE, "labels": dict(sel)},
                "spec": {
                    "selector": {"matchLabels": sel},
                    "template": {
                        "metadata": {"labels": sel},
                        "spec": {
                            "nodeSelector": {keys[comp]: "true"},
                            "terminationGracePeriodSeconds": 0,
                            "containers": [{"name": comp, "image": "registry.k8s.io/pause"}],
                        },
                    },
                },
            }
        )
    return out


# ------------------------------------------------------------------------------- build
def find_driver_bin_dir() -> Path:
    """``$ROLLOUT_LAB_DRA_BIN``, else the version-keyed dir ``tools/build-lab-dra-driver.sh``
    fills (``${ROLLOUT_LAB_CACHE:-~/.cache/rollout-lab}/dra-example-driver-<ver>/bin``)."""
    from rollout import assets

    if os.environ.get("ROLLOUT_LAB_DRA_BIN"):
        return Path(os.environ["ROLLOUT_LAB_DRA_BIN"])
    gomod = (assets.lab_tools() / "drabin" / "go.mod").read_text()
    ver = next(
        (
            line.split()[1]
            for line in gomod.splitlines()
            if line.strip().startswith("sigs.k8s.io/dra-example-driver ")
        ),
        "",
    )
    cache = Path(os.environ.get("ROLLOUT_LAB_CACHE") or Path.home() / ".cache" / "rollout-lab")
    return cache / f"dra-example-driver-{ver}" / "bin"


def build_driver(progress: Any = lambda _m: None) -> Path:
    """Build (or reuse) the DRA driver; its bin dir."""
    from rollout import assets

    have = find_driver_bin_dir()
    if os.access(have / DRIVER_BINARY, os.X_OK):
        return have
    script = assets.lab_tools() / "build-lab-dra-driver.sh"
    progress(f"DRA driver: {script.name} (builds once per version, ~5 min cold)")
    proc = subprocess.run(["bash", str(script)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise LabError(f"{script} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    bin_dir = Path(proc.stdout.strip().splitlines()[-1])
    if not os.access(bin_dir / DRIVER_BINARY, os.X_OK):
        raise LabError(f"{bin_dir}: no {DRIVER_BINARY} after the build")
    return bin_dir


# ------------------------------------------------------------------------------- agent
def _write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except FileNotFoundError:
        return ""


def _log(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} daemonsets: {msg}", flush=True)


def apply_action(path: Path, action: str) -> str | None:
    """Write ``action`` into the lifecycle file at ``path`` (:func:`devicefaults.next_state`);
    the new content, or None when there was nothing to do."""
    new = devicefaults.next_state(_read(path), action)
    if new is not None:
        _write(path, new + "\n")
    return new


class Driver:
    """The DRA kubelet plugin process of this node, following :data:`DRIVER_STATE_FILE`."""

    def __init__(self, argv: list[str]) -> None:
        self.argv = argv
        self.pid, self.gen = 0, -1
        self.started, self.backoff, self.not_before = 0.0, 0.0, 0.0
        self.proc: subprocess.Popen[bytes] | None = None  # ours; None for one adopted
        with contextlib.suppress(OSError, ValueError):
            pid, gen = _read(Path(DRIVER_PID_FILE)).split()
            if self._is_driver(int(pid)):
                self.pid, self.gen = int(pid), int(gen)

    def _is_driver(self, pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/exe").resolve() == Path(self.argv[0]).resolve()
        except OSError:
            return False

    def alive(self) -> bool:
        if not self.pid:
            return False
        if self.proc is not None and self.proc.pid == self.pid:
            return self.proc.poll() is None  # reaps it once it exited
        return self._is_driver(self.pid)

    def start(self, gen: int) -> None:
        with open(DRIVER_LOG, "ab") as log:
            p = subprocess.Popen(
                self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        self.proc, self.pid, self.gen, self.started = p, p.pid, gen, time.monotonic()
        _write(Path(DRIVER_PID_FILE), f"{p.pid} {gen}\n")
        _log(f"{DRIVER_BINARY} started (pid {p.pid}, generation {gen})")

    def stop(self) -> None:
        if not self.alive():
            self.pid = 0
            with contextlib.suppress(FileNotFoundError):
                os.unlink(DRIVER_PID_FILE)  # it exited on its own: a fault waits for this
            return
        pid = self.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.alive() and time.monotonic() < deadline:
            time.sleep(0.05)
        if self.alive():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            while self.alive():
                time.sleep(0.05)
        self.pid = 0
        with contextlib.suppress(FileNotFoundError):
            os.unlink(DRIVER_PID_FILE)
        _log(f"{DRIVER_BINARY} stopped (pid {pid})")

    def converge(self) -> None:
        running, gen = state_of(_read(Path(DRIVER_STATE_FILE)))
        if not running:
            self.stop()
        elif not self.alive():
            now = time.monotonic()
            if self.pid:  # it exited on its own: again after a back-off, as a kubelet would
                ran = now - self.started
                self.backoff = 0.0 if ran > CRASH_S else min(max(1.0, 2 * self.backoff), 60.0)
                self.not_before = now + self.backoff
                _log(
                    f"{DRIVER_BINARY} (pid {self.pid}) exited after {ran:.1f}s; again in "
                    f"{self.backoff:.0f}s"
                )
                self.pid = 0
            if now >= self.not_before or gen != self.gen:
                self.start(gen)
        elif gen != self.gen:
            self.stop()
            self.start(gen)


def _client(cfg: Mapping[str, Any]) -> Any:
    from rollout.lab.kubelet.apiclient import APIClient, Endpoint

    return APIClient(
        Endpoint(
            ca=str(cfg["apiserverCA"]),
            cert=str(cfg["clientCert"]),
            key=str(cfg["clientKey"]),
            url=str(cfg["apiserverURL"]),
            server_hostname="127.0.0.1",
        ),
        timeout=5.0,
    )


class Follower:
    """Applies the Node's labels to the lifecycle files, on each change of a selection."""

    def __init__(self, keys: Mapping[str, str], files: Mapping[str, Path]) -> None:
        self.keys, self.files = keys, files
        self.last: dict[str, bool] | None = None
        self.lock = threading.Lock()

    def labels(self, labels: Mapping[str, str]) -> None:
        with self.lock:
            for comp, action in label_actions(self.last, labels, self.keys).items():
                new = apply_action(self.files[comp], action)
                key = self.keys[comp]
                _log(f"{comp}: {action} ({key}={labels.get(key, '')!r}): {new}")
            self.last = {c: selected(labels, self.keys[c]) for c in COMPONENTS}


def follow(api: Any, name: str, follower: Follower) -> None:
    """Follow Node ``name``'s labels: a read, then a watch from its resourceVersion (as the
    DaemonSet controller's informer does), again after any error or the watch's end."""
    while True:
        try:
            node = api.get(f"/api/v1/nodes/{name}")
            follower.labels((node.get("metadata") or {}).get("labels") or {})
            params = {
                "fieldSelector": f"metadata.name={name}",
                "resourceVersion": str(node["metadata"]["resourceVersion"]),
            }
            for ev in api.watch("/api/v1/nodes", params, 300):
                if ev.get("type") in ("ADDED", "MODIFIED"):
                    meta = (ev.get("object") or {}).get("metadata") or {}
                    follower.labels(meta.get("labels") or {})
                elif ev.get("type") == "ERROR":
                    break
        except Exception:  # not registered yet, API server restarting: keep what runs
            pass
        time.sleep(POLL_S)


def run(cfg: Mapping[str, Any], dra_bin: Path) -> None:
    """The agent (never returns): a thread follows the Node's labels; this one keeps the
    driver's process as its lifecycle file says."""
    keys = label_keys(cfg)
    gpus = len(_read(Path(realnode.GPU_FILE)).split())
    driver = Driver(driver_argv(dra_bin, cfg, gpus))
    files = {
        DEVICE_PLUGIN: Path(realnode.PLUGIN_STATE_FILE),
        DRA_DRIVER: Path(DRIVER_STATE_FILE),
    }
    name = str(cfg["nodeName"])
    _log(f"following Node {name}'s labels {keys[DEVICE_PLUGIN]}, {keys[DRA_DRIVER]}")
    threading.Thread(
        target=follow, args=(_client(cfg), name, Follower(keys, files)), daemon=True
    ).start()
    while True:
        driver.converge()
        time.sleep(CONVERGE_S)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rollout.lab.daemonsets", description=__doc__)
    ap.add_argument("--node-config", required=True, type=Path)
    ap.add_argument("--dra-bin-dir", required=True, type=Path)
    a = ap.parse_args(argv)
    cfg = json.loads(a.node_config.read_text())
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    run(cfg, a.dra_bin_dir)
    return 0  # pragma: no cover


if __name__ == "__main__":
    raise SystemExit(main())
