"""The Lab: the real control plane, the API relay and the SSH nodes, as one object.

A lab lives in a directory (``${ROLLOUT_LAB_DIR:-~/.cache/rollout-lab/labs/<name>}``) with a state
file, ``lab.json`` (:mod:`rollout.lab.labstate`), that records every PID, namespace and port it
created, so ``rollout lab down/status/fault`` work from another process than the one that ran
``lab up``. Teardown acts only on what the state file names (and checks each PID is still the
program it started before signalling it, :mod:`rollout.lab.pids`).

The nodes' part of the Lab is :class:`rollout.lab.labnodes.LabNodes`; the inventory and plan it
writes come from :mod:`rollout.lab.inventory`, the builds from :mod:`rollout.lab.builds`.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rollout import assets
from rollout.errors import LabError
from rollout.lab import daemonsets, labstate
from rollout.lab import kwok as kw
from rollout.lab import monitoring as mon
from rollout.lab import nodes as n
from rollout.lab.binaries import K8S_VERSION
from rollout.lab.builds import (
    build_binaries,
    build_kwok,
    build_monitoring_binaries,
    check_kubelet,
)
from rollout.lab.controlplane import ControlPlane, ControlPlaneError
from rollout.lab.devicefaults import DeviceFaults
from rollout.lab.hardware import NodeShape
from rollout.lab.inventory import inventory_text, plan_text
from rollout.lab.labnodes import LabNodes, NodeRecord
from rollout.lab.network import lab_namespaces
from rollout.lab.pids import cmd_has, exe_is, terminate

__all__ = [
    "LAB_ENTRIES",
    "OWNED_MARK",
    "Lab",
    "default_lab_dir",
]

Progress = Callable[[str], None]

#: in a lab directory `lab up` created (so `lab down` may delete all of it)
OWNED_MARK = ".rollout-lab"
#: what a lab writes into a directory it did not create (removed by `lab down` without --keep)
LAB_ENTRIES = (
    "controlplane",
    "nodes",
    "ssh",
    "bin",
    "inventory.ini",
    "plan.yaml",
    "relay.log",
    "relay.ready",
    "monitoring",
    "kwok",
)


def default_lab_dir(name: str) -> Path:
    """``$ROLLOUT_LAB_DIR`` or ``~/.cache/rollout-lab/labs/<name>``."""
    env = os.environ.get("ROLLOUT_LAB_DIR")
    return Path(env) if env else Path.home() / ".cache" / "rollout-lab" / "labs" / name


class Lab:
    """A local cluster: control plane + relay + nodes, described by ``<dir>/lab.json``.

    Its nodes are :attr:`machines` (adding, removing, per-node faults), their device faults
    :attr:`devices`."""

    def __init__(self, name: str = "default", directory: Path | None = None) -> None:
        self.name = name
        self.dir = Path(directory or default_lab_dir(name)).resolve()
        self.cp: ControlPlane | None = None
        self.bin_dir: Path | None = None
        self.machines = LabNodes(name, self.dir, lambda: self.cp, self._save)
        self.devices = DeviceFaults(self._require_cp, self.machines.node_root)
        self.relay_pid = 0
        self.monitoring: mon.MonitoringState | None = None
        self.kwok: kw.KwokState | None = None
        self._recorded_cp: dict[str, int] = {}  # control plane PIDs lab.json named (attached)

    # ------------------------------------------------------------------ paths
    @property
    def state_file(self) -> Path:
        return self.dir / "lab.json"

    @property
    def kubeconfig(self) -> Path:
        return self.dir / "controlplane" / "kubeconfigs" / "admin.kubeconfig"

    @property
    def api(self) -> ControlPlane:
        """The control plane; ``lab.api.request(method, path, body)`` is a plain admin HTTPS
        call (tests that want the kubernetes client build it from :attr:`kubeconfig`)."""
        return self._require_cp()

    @property
    def inventory(self) -> Path:
        return self.dir / "inventory.ini"

    @property
    def plan(self) -> Path:
        return self.dir / "plan.yaml"

    # ------------------------------------------------------------------ control plane
    def start_control_plane(
        self, progress: Progress = lambda _m: None, *, kcm_extra_args: Sequence[str] = ()
    ) -> None:
        """Start etcd, kube-apiserver, controller-manager, scheduler and the host relay
        (``kcm_extra_args``: appended to the controller-manager's flags)."""
        if self.state_file.exists():
            raise LabError(
                f"a lab is already recorded in {self.dir}; run `rollout lab down"
                f" --name {self.name}` first"
            )
        self.bin_dir = build_binaries(progress)
        if not self.dir.exists() or not any(self.dir.iterdir()):
            # ours from the start: `lab down` may delete the whole directory
            self.dir.mkdir(parents=True, exist_ok=True)
            (self.dir / OWNED_MARK).write_text(f"created by `rollout lab up --name {self.name}`\n")
        cpdir = self.dir / "controlplane"
        if (cpdir / "etcd").is_dir():
            progress(
                f"reusing kept state in {self.dir} (etcd data, certificates and keys from "
                f"`rollout lab down --keep`): objects from the last run are still there; "
                f"`rollout lab down --name {self.name}` without --keep removes them"
            )
        ControlPlane.kill_stale(cpdir, self.bin_dir)
        self.cp = ControlPlane(cpdir, self.bin_dir, kcm_extra_args=kcm_extra_args)
        progress("starting etcd, kube-apiserver, kube-controller-manager, kube-scheduler")
        t0 = time.monotonic()
        try:
            self.cp.start()
        except ControlPlaneError as e:
            raise LabError(f"control plane did not start: {e}") from e
        progress(f"control plane ready in {time.monotonic() - t0:.1f}s ({self.cp.apiserver_url})")
        self._prepare_files()
        self.relay_pid = self._start_relay()
        self._save()

    def _prepare_files(self) -> None:
        (self.dir / "ssh").mkdir(parents=True, exist_ok=True)
        for key in ("client_key", "host_key"):
            if not (self.dir / "ssh" / key).exists():
                subprocess.run(
                    [
                        "ssh-keygen",
                        "-q",
                        "-t",
                        "ed25519",
                        "-N",
                        "",
                        "-C",
                        f"rollout-lab-{key}",
                        "-f",
                        str(self.dir / "ssh" / key),
                    ],
                    check=True,
                )
        (self.dir / "ssh" / "authorized_keys").write_bytes(
            (self.dir / "ssh" / "client_key.pub").read_bytes()
        )
        self.machines.shim.parent.mkdir(parents=True, exist_ok=True)
        self.machines.shim.write_text(
            f"#!{sys.executable}\n"
            '"""systemctl for a rollout lab node (see rollout/lab/shim.py)."""\n'
            f"import sys\nsys.path.insert(0, {str(assets.import_root())!r})\n"
            "from rollout.lab.shim import main\nmain()\n"
        )
        self.machines.shim.chmod(0o755)

    def _start_relay(self) -> int:
        assert self.cp is not None
        log = self.dir / "relay.log"
        ready = self.dir / "relay.ready"
        ready.unlink(missing_ok=True)
        with open(log, "ab") as f:
            p = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "rollout.lab.relay",
                    "--listen",
                    f"unix:{self.machines.socket_path}",
                    "--connect",
                    f"tcp:127.0.0.1:{self.cp.apiserver_port}",
                    "--ready-file",
                    str(ready),
                ],
                stdin=subprocess.DEVNULL,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
                cwd=self.dir,
            )
        n.CHILDREN[p.pid] = p
        deadline = time.monotonic() + 10
        while not ready.exists():
            if p.poll() is not None or time.monotonic() > deadline:
                raise LabError(f"API relay did not start; see {log}")
            time.sleep(0.02)
        return p.pid

    # ------------------------------------------------------------------ monitoring
    def start_monitoring(
        self, state_dir: Path | None = None, progress: Progress = lambda _m: None
    ) -> mon.MonitoringState:
        """Start Prometheus, Alertmanager and ``rollout serve`` (see :mod:`rollout.lab.monitoring`).

        ``state_dir``: the journals ``rollout serve`` reads (default: ``$ROLLOUT_STATE_DIR`` or
        ``~/.local/state/rollout``, what ``rollout apply`` in this shell would use).
        """
        from rollout.change.record.journal import state_dir as default_state_dir

        cp = self._require_cp()
        if self.monitoring is not None:
            raise LabError(f"lab {self.name} already runs monitoring")
        build_monitoring_binaries(progress)
        started: list[int] = []
        crt, key = cp.admin_cert
        # rollout serve speaks HTTPS, as in a cluster: a serving certificate from the lab CA
        serve_cert = cp.pki.issue(
            "rollout-serve", "rollout-serve", server=True, dns=["localhost"], ips=["127.0.0.1"]
        )
        try:
            self.monitoring = mon.start(
                self.dir,
                apiserver=f"127.0.0.1:{cp.apiserver_port}",
                ca=cp.ca_cert,
                cert=crt,
                key=key,
                kubeconfig=self.kubeconfig,
                state_dir=Path(state_dir or default_state_dir()).resolve(),
                remember=started.append,
                serve_cert=serve_cert,
                progress=progress,
            )
        except BaseException:
            terminate(started)
            raise
        self._save()
        return self.monitoring

    def stop_monitoring(self) -> None:
        """Stop the monitoring processes this lab started (each PID checked first)."""
        if self.monitoring is not None:
            terminate(mon.ours(self.monitoring))
        self.monitoring = None
        if self.state_file.exists():
            self._save()

    # ------------------------------------------------------------------ kwok
    def start_kwok(
        self,
        count: int,
        pods_per_node: int = 10,
        *,
        progress: Progress = lambda _m: None,
        timeout: float = 600.0,
    ) -> kw.KwokState:
        """Build kwok if missing, create ``count`` kwok Nodes and a Deployment of
        ``pods_per_node`` pods on each, start kwok and wait until the Nodes are Ready and the pods
        Running (see :mod:`rollout.lab.kwok`). The Nodes are not in the inventory."""
        kw.check_counts(count, pods_per_node)
        cp = self._require_cp()
        if self.kwok is not None:
            raise LabError(f"lab {self.name} already runs kwok (pid {self.kwok.pid})")
        bin_dir = build_kwok(progress)

        def request(method: str, path: str, body: object) -> tuple[int, object]:
            return cp.request(method, path, body, timeout=30)

        t0 = time.monotonic()
        progress(f"creating {count} kwok Node(s) with {pods_per_node} pod(s) each")
        kw.create_objects(request, self.name, count, pods_per_node)
        proc = kw.start(self.dir, bin_dir, self.name, self.kubeconfig, count)
        n.CHILDREN[proc.pid] = proc
        self.kwok = kw.KwokState(proc.pid, str(bin_dir), count, pods_per_node)
        self._save()
        kw.wait_ready(
            request,
            self.name,
            count,
            pods_per_node,
            alive=lambda: proc.poll() is None,
            timeout=timeout,
            progress=progress,
        )
        progress(
            f"kwok: {count} Node(s) Ready, {count * pods_per_node} pod(s) Running in "
            f"{time.monotonic() - t0:.1f}s"
        )
        return self.kwok

    def stop_kwok(self) -> None:
        """Stop the kwok process this lab started (its PID checked first). Its Nodes stay in
        the API (they vanish with etcd's data at ``lab down``)."""
        k = self.kwok
        if k is not None and k.pid and exe_is(k.pid, Path(k.bin_dir) / "kwok"):
            terminate([k.pid])
        self.kwok = None
        if self.state_file.exists():
            self._save()

    def restart_apiserver(self, downtime: float = 0.0) -> None:
        """Fault: restart kube-apiserver on the same port."""
        cp = self._require_cp()
        if self._attached:
            pid = int(self._controlplane_pids().get("kube-apiserver", 0))
            assert self.bin_dir is not None
            if pid and exe_is(pid, self.bin_dir / "kube-apiserver"):
                terminate([pid])
            time.sleep(downtime)
            cp._spawn("kube-apiserver", cp._apiserver_args())
            cp.wait_apiserver_ready()
        else:
            cp.restart_apiserver(downtime)
        self._save()

    # ------------------------------------------------------------------ whole lab
    def up(
        self,
        count: int = 4,
        distributions: Sequence[str] = ("kubeadm",),
        *,
        shape: NodeShape | None = None,
        progress: Progress = lambda _m: None,
        timeout: float = 90.0,
        monitoring: bool = False,
        state_dir: Path | None = None,
        kubelet: str = "sim",
        kubelet_version: str | None = None,
        kwok_nodes: int = 0,
        kwok_pods_per_node: int = 10,
        path: str = "device-plugin",
        path_labels: Mapping[str, str] | None = None,
    ) -> None:
        """Start everything and write ``inventory.ini`` and ``plan.yaml`` (and, with
        ``monitoring``, Prometheus, Alertmanager and ``rollout serve``; with ``kwok_nodes``, that
        many kwok Nodes outside the inventory). ``path`` and ``path_labels``: the allocation path
        real-kubelet nodes start on and the label keys it follows (:mod:`rollout.lab.daemonsets`).
        An unknown kubelet or kubelet version, allocation path, or a negative count, is refused
        before anything starts."""
        check_kubelet(kubelet, kubelet_version, K8S_VERSION)
        daemonsets.initial_labels(daemonsets.label_keys({}), path)
        kw.check_counts(kwok_nodes, kwok_pods_per_node)
        self.start_control_plane(progress, kcm_extra_args=kw.kcm_args(kwok_nodes))
        try:
            if monitoring:
                self.start_monitoring(state_dir, progress)
            names = [f"{self.name}-node{i}" for i in range(1, count + 1)]
            made = self.machines.add_nodes(
                names,
                distributions,
                shape=shape,
                progress=progress,
                timeout=timeout,
                kubelet=kubelet,
                kubelet_version=kubelet_version,
                path_labels=path_labels,
                path=path,
            )
            self.inventory.write_text(
                inventory_text(made, self.machines.ssh_key, f"lab {self.name} in {self.dir}")
            )
            self.plan.write_text(plan_text(made, self.name))
            if kwok_nodes:
                # 2,000 kwok Nodes with 4,000 pods took 271 s on 2 cores: 0.3 s a Node, at least
                # the 600 s a smaller lab gets
                self.start_kwok(
                    kwok_nodes,
                    kwok_pods_per_node,
                    progress=progress,
                    timeout=max(600.0, 0.3 * kwok_nodes),
                )
        except BaseException:
            self.down(keep=True)  # its logs say why it failed
            raise

    def down(self, keep: bool = False) -> None:
        """Stop every node and process this lab started; delete its namespaces, then remove the
        lab's state (etcd data, certificates, keys, node files, logs) so the next ``up`` of the
        same name starts empty. ``keep`` keeps all of it but the state file (the next ``up``
        reuses it and says so)."""
        if self.monitoring is not None:
            terminate(mon.ours(self.monitoring))
            self.monitoring = None
        self.stop_kwok()
        self.machines.remove_nodes(list(self.nodes), delete_objects=False)
        # namespaces of nodes that never made it into the state file (a `lab up` killed while
        # starting a node): their names say they are this lab's
        for netns in lab_namespaces(self.name):
            n.stop_node(netns)
        if self.relay_pid and cmd_has(self.relay_pid, "rollout.lab.relay"):
            terminate([self.relay_pid])
        self.relay_pid = 0
        if self.cp is not None and not self._attached:
            self.cp.stop()
        elif self.bin_dir is not None:
            pids = self._controlplane_pids()
            order = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
            for name in order:
                pid = int(pids.get(name, 0))
                if pid and exe_is(pid, self.bin_dir / name):
                    terminate([pid])
        self.cp = None
        self.machines.socket_path.unlink(missing_ok=True)
        self.state_file.unlink(missing_ok=True)
        if not keep:
            self._remove_state()

    def _remove_state(self) -> None:
        """Delete the lab directory when `up` created it; in a directory the user handed over
        that already held other files, delete only what the lab writes there."""
        if not self.dir.is_dir():
            return
        if (self.dir / OWNED_MARK).exists():
            shutil.rmtree(self.dir)
            return
        if self.dir.resolve() in (Path("/"), Path.home().resolve()):
            return  # never clean a root or home directory by entry names
        for entry in LAB_ENTRIES:
            p = self.dir / entry
            if p.is_symlink():
                continue  # the lab writes no links here: not ours to remove
            if p.is_dir():
                shutil.rmtree(p)
            else:
                p.unlink(missing_ok=True)

    # ------------------------------------------------------------------ state
    _attached = False

    def _controlplane_pids(self) -> dict[str, int]:
        """The control plane's PIDs: those ``lab.json`` named when attached, with those this
        process started since (a restarted kube-apiserver) over them."""
        return {**self._recorded_cp, **(self.cp.pids if self.cp is not None else {})}

    def _require_cp(self) -> ControlPlane:
        return self.machines.require_cp()

    @property
    def nodes(self) -> dict[str, NodeRecord]:
        """The lab's nodes by name (:attr:`machines` owns them)."""
        return self.machines.nodes

    def _save(self) -> None:
        state = labstate.state_of(
            name=self.name,
            lab_dir=self.dir,
            bin_dir=self.bin_dir,
            relay_pid=self.relay_pid,
            cp=self.cp,
            kubeconfig=self.kubeconfig,
            monitoring=self.monitoring,
            nodes=self.nodes,
            recorded_controlplane=self._controlplane_pids() if self._attached else None,
            kwok=self.kwok,
        )
        tmp = self.state_file.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=2) + "\n")
        tmp.replace(self.state_file)

    @classmethod
    def attach(cls, name: str = "default", directory: Path | None = None) -> Lab:
        """Load a lab started by another process from its state file."""
        lab = cls(name, directory)
        try:
            state = json.loads(lab.state_file.read_text())
        except FileNotFoundError:
            raise LabError(f"no lab {name!r} in {lab.dir} (run `rollout lab up`)") from None
        except ValueError as e:
            raise LabError(f"{lab.state_file}: not valid JSON: {e}") from e
        lab._attached = True
        got = labstate.load(lab.dir, state)
        lab.relay_pid, lab.bin_dir, lab.monitoring = got.relay_pid, got.bin_dir, got.monitoring
        lab.kwok = got.kwok
        lab.cp = got.cp or lab.cp
        lab.nodes.update(got.nodes)
        lab._recorded_cp = got.controlplane_pids
        return lab
