"""The Lab: the real control plane, the API relay and the SSH nodes, as one object.

A lab lives in a directory (``${ROLLOUT_LAB_DIR:-~/.cache/rollout-lab/labs/<name>}``) with a state
file, ``lab.json``, that records every PID, namespace and port it created, so ``rollout lab
down/status/fault`` work from another process than the one that ran ``lab up``. Teardown acts only
on what the state file names (and checks each PID is still the program it started before
signalling it).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from rollout import assets
from rollout.errors import LabError
from rollout.lab import monitoring as mon
from rollout.lab import nodes as n
from rollout.lab import realnode
from rollout.lab.controlplane import (
    K8S_VERSION,
    ControlPlane,
    ControlPlaneError,
    find_bin_dir,
    missing_binaries,
)
from rollout.lab.hardware import NodeShape
from rollout.lab.network import lab_namespaces
from rollout.lab.seeds import DISTRIBUTIONS

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
)


def default_lab_dir(name: str) -> Path:
    """``$ROLLOUT_LAB_DIR`` or ``~/.cache/rollout-lab/labs/<name>``."""
    env = os.environ.get("ROLLOUT_LAB_DIR")
    return Path(env) if env else Path.home() / ".cache" / "rollout-lab" / "labs" / name


def _run_build(script_name: str, progress: Progress) -> Path:
    """Run one of the shipped build scripts, passing its lines to ``progress``; returns the bin
    dir it prints last."""
    script = assets.lab_tools() / script_name
    proc = subprocess.Popen(
        ["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    last = ""
    assert proc.stdout is not None
    for line in proc.stdout:
        last = line.strip()
        progress(last)
    if proc.wait() != 0:
        raise LabError(f"{script} failed (exit {proc.returncode}); see the lines above")
    return Path(last)


def build_binaries(progress: Progress) -> Path:
    """Build or reuse the control-plane binaries; returns the bin dir."""
    d = find_bin_dir()
    if not missing_binaries(d):
        return d
    progress(f"building control-plane binaries into {d} (first time only; takes a while)")
    return _run_build("build-lab-binaries.sh", progress)


def build_monitoring_binaries(progress: Progress) -> Path:
    """Build or reuse prometheus, promtool and alertmanager; returns their bin dir."""
    d = mon.find_monitoring_bin_dir()
    if not mon.missing_monitoring_binaries(d):
        return d
    progress(f"building Prometheus and Alertmanager into {d} (first time only; takes a while)")
    return _run_build("build-monitoring-binaries.sh", progress)


def check_kubelet(kubelet: str, kubelet_version: str | None, control_plane: str) -> str | None:
    """The full kubelet version a ``real`` lab node runs (``None`` for the sim); raises
    :class:`LabError` for an unknown kind, an unknown version, a version for the simulation (it
    has none) or one the version skew policy forbids (:func:`realnode.kubelet_version`)."""
    if kubelet not in realnode.KINDS:
        raise LabError(f"unknown kubelet {kubelet!r}; valid: {', '.join(realnode.KINDS)}")
    if kubelet != "real":
        if kubelet_version:
            raise LabError(
                "--kubelet-version needs --kubelet real: the simulated kubelet has no version"
            )
        return None
    return realnode.kubelet_version(kubelet_version, control_plane)


def canary_count(total: int) -> int:
    """The first quarter of the nodes, at least one."""
    return max(1, math.floor(total / 4)) if total else 0


def inventory_text(nodes: Sequence[n.LabNode], key: Path, header: str = "") -> str:
    """An Ansible INI inventory: groups ``canary`` (first quarter) and ``nodes`` (all)."""
    lines = [
        "# Written by `rollout lab`. Works with plain ansible-playbook:",
        "#   ansible-playbook -i THIS_FILE playbook.yml",
    ]
    if header:
        lines.append(f"# {header}")
    lines.append("[canary]")
    lines += [x.name for x in nodes[: canary_count(len(nodes))]]
    lines += ["", "[nodes]"]
    lines += [f"{x.name} ansible_host={x.ip} rollout_distribution={x.distribution}" for x in nodes]
    args = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    lines += [
        "",
        "[all:vars]",
        "ansible_user=root",
        "ansible_port=22",
        f"ansible_ssh_private_key_file={key}",
        f"ansible_ssh_common_args='{args}'",
        "ansible_python_interpreter=/usr/bin/python3",
        "",
    ]
    return "\n".join(lines)


# The change the lab's plans make: static CPU manager reserving one core's two threads (CPUs 0
# and 32 on the default node shape), Topology Manager single-numa-node at pod scope.
LAB_INTENT = (
    "kubelet:",
    "  cpuManagerPolicy: static",
    '  reservedSystemCPUs: "0,32"',
    "  topologyManagerPolicy: single-numa-node",
    "  topologyManagerScope: pod",
)


def plan_text(nodes: Sequence[n.LabNode], name: str) -> str:
    """A ready canary plan for the lab's nodes."""
    dists = sorted({x.distribution for x in nodes})
    out = [
        "# A canary plan for this lab, written by `rollout lab up`.",
        "# Static CPU manager reserving one core's two threads (CPUs 0 and 32), Topology Manager",
        "# single-numa-node at pod scope; the canary group first.",
        "apiVersion: rollout.dev/v1alpha1",
        "kind: RolloutPlan",
        "metadata:",
        f"  name: lab-{name}-canary",
    ]
    if len(dists) == 1:
        out.append(f"distribution: {dists[0]}")
    out += [
        *LAB_INTENT,
        "strategy:",
        "  canaryGroup: canary",
        "  maxUnavailable: 1",
        "# The rejection-rate gate, sized for a demo: a one-minute soak; a canary with too little",
        "# traffic gets probe pods; more than 5% of admissions rejected rolls the canary back.",
        "gate:",
        "  soak: 60s",
        "  window: 60s",
        "  interval: 2s",
        "  threshold: 5%",
        "  minAdmissions: 3",
        "  baseline: none",
        "  probes: true",
        "  onFailure: rollback-affected",
    ]
    if len(dists) > 1:
        out.append("nodes:")
        for x in nodes:
            out += [f"  {x.name}:", f"    distribution: {x.distribution}"]
    return "\n".join(out) + "\n"


@dataclass(frozen=True)
class NodeRecord:
    """A started node and its processes."""

    node: n.LabNode
    procs: n.NodeProcs


def _exe_is(pid: int, want: Path) -> bool:
    try:
        return Path(os.readlink(f"/proc/{pid}/exe")) == want
    except OSError:
        return False


def _cmd_has(pid: int, needle: str) -> bool:
    try:
        return needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
    except OSError:
        return False


def _gone(pid: int) -> bool:
    child = n._children.pop(pid, None)
    if child is not None:
        if child.poll() is None:
            n._children[pid] = child
            return False
        return True
    try:
        return "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return True


def _term(pids: Sequence[int], timeout: float = 10.0) -> None:
    """SIGTERM, then SIGKILL after ``timeout``: only PIDs the caller has verified are ours."""
    for p in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for p in pids:
        while not _gone(p) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not _gone(p):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)


class Lab:
    """A local cluster: control plane + relay + nodes, described by ``<dir>/lab.json``."""

    def __init__(self, name: str = "default", directory: Path | None = None) -> None:
        self.name = name
        self.dir = Path(directory or default_lab_dir(name)).resolve()
        self.cp: ControlPlane | None = None
        self.bin_dir: Path | None = None
        self.nodes: dict[str, NodeRecord] = {}
        self.relay_pid = 0
        self.monitoring: mon.MonitoringState | None = None
        self._state: dict[str, Any] = {}

    # ------------------------------------------------------------------ paths
    @property
    def state_file(self) -> Path:
        return self.dir / "lab.json"

    @property
    def socket_path(self) -> Path:
        return self.dir / "apiserver.sock"

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

    @property
    def ssh_key(self) -> Path:
        return self.dir / "ssh" / "client_key"

    @property
    def shim(self) -> Path:
        return self.dir / "bin" / "systemctl"

    # ------------------------------------------------------------------ control plane
    def start_control_plane(self, progress: Progress = lambda _m: None) -> None:
        """Start etcd, kube-apiserver, controller-manager, scheduler and the host relay."""
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
        self.cp = ControlPlane(cpdir, self.bin_dir)
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
        self.shim.parent.mkdir(parents=True, exist_ok=True)
        self.shim.write_text(
            f"#!{sys.executable}\n"
            '"""systemctl for a rollout lab node (see rollout/lab/shim.py)."""\n'
            f"import sys\nsys.path.insert(0, {str(assets.import_root())!r})\n"
            "from rollout.lab.shim import main\nmain()\n"
        )
        self.shim.chmod(0o755)

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
                    f"unix:{self.socket_path}",
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
        n._children[p.pid] = p
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
        from rollout.change.journal import state_dir as default_state_dir

        cp = self._require_cp()
        if self.monitoring is not None:
            raise LabError(f"lab {self.name} already runs monitoring")
        build_monitoring_binaries(progress)
        started: list[int] = []
        crt, key = cp.admin_cert
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
                progress=progress,
            )
        except BaseException:
            _term(started)
            raise
        self._save()
        return self.monitoring

    def stop_monitoring(self) -> None:
        """Stop the monitoring processes this lab started (each PID checked first)."""
        if self.monitoring is not None:
            _term(mon.ours(self.monitoring))
        self.monitoring = None
        if self.state_file.exists():
            self._save()

    # ------------------------------------------------------------------ nodes
    def add_nodes(
        self,
        names: Sequence[str],
        distributions: Sequence[str] = ("kubeadm",),
        *,
        shape: NodeShape | None = None,
        wait_ready: bool = True,
        timeout: float = 60.0,
        progress: Progress = lambda _m: None,
        kubelet: str = "sim",
        kubelet_version: str | None = None,
    ) -> list[n.LabNode]:
        """Create, seed and start nodes (round-robin over ``distributions``); wait for Ready.
        ``kubelet``: ``sim`` (the simulated kubelet) or ``real`` (:mod:`rollout.lab.realnode`);
        ``kubelet_version`` (real only): a minor of :data:`realnode.KUBELET_VERSIONS`, checked
        against the control plane's version by the skew policy before anything starts."""
        cp = self._require_cp()
        version = str(cp.version().get("gitVersion", ""))
        wanted = check_kubelet(kubelet, kubelet_version, version)
        for d in distributions:
            if d not in DISTRIBUTIONS:
                raise LabError(f"unknown distribution {d!r}; valid: {', '.join(DISTRIBUTIONS)}")
        dup = [x for x in names if x in self.nodes]
        if dup:
            raise LabError(f"node names already in this lab: {', '.join(dup)}")
        kubelet_bin = realnode.build(progress, wanted) if kubelet == "real" else None
        created: list[n.LabNode] = []
        try:
            for k, name in enumerate(names):
                node = n.create_network(
                    name, distributions[k % len(distributions)], self.name, shape
                )
                node = replace(node, kubelet=kubelet)
                node_dir = self.dir / "nodes" / name
                try:
                    n.remove_node_dir(node_dir)
                    node_dir.mkdir(parents=True)
                    n.write_node_files(
                        node,
                        node_dir,
                        self._credentials(node),
                        self.socket_path,
                        version,
                        kubelet_bin,
                    )
                except BaseException:
                    n.stop_node(node.netns)
                    raise
                procs = n.start_node(
                    node,
                    node_dir,
                    shim=self.shim,
                    host_key=self.dir / "ssh" / "host_key",
                    authorized_keys=self.dir / "ssh" / "authorized_keys",
                    socket_path=self.socket_path,
                    apiserver_port=cp.apiserver_port,
                )
                self.nodes[name] = NodeRecord(node, procs)
                created.append(node)
                self._save()
                self.start_kubelet(name)
                progress(
                    f"node {name} ({node.distribution}, {node.ip}): sshd and "
                    f"{node.unit}.service started"
                )
            if wait_ready:
                self.wait_ready([x.name for x in created], timeout=timeout)
                progress(f"{len(created)} node(s) Ready")
        except BaseException:
            self.remove_nodes([x.name for x in created])
            raise
        return created

    def _credentials(self, node: n.LabNode) -> n.NodeCredentials:
        cp = self._require_cp()
        server = f"https://127.0.0.1:{cp.apiserver_port}"
        kc = cp.node_kubeconfig(node.name, embed=True, server=server)
        crt, key = cp.pki_dir / f"node-{node.name}.crt", cp.pki_dir / f"node-{node.name}.key"
        scrt, skey = cp.kubelet_serving_cert(node.name, node.ip)
        return n.NodeCredentials(
            ca_pem=cp.ca_cert.read_text(),
            client_cert_pem=crt.read_text(),
            client_key_pem=key.read_text(),
            serving_cert_pem=scrt.read_text(),
            serving_key_pem=skey.read_text(),
            kubeconfig=kc.read_text(),
            apiserver_port=cp.apiserver_port,
        )

    def remove_nodes(self, names: Sequence[str], *, delete_objects: bool = True) -> None:
        """Stop nodes, delete their namespaces, files and (by default) their Node objects."""
        for name in names:
            rec = self.nodes.pop(name, None)
            if rec is None:
                continue
            n.stop_node(rec.node.netns)
            n.remove_node_dir(Path(rec.procs.dir))
            if delete_objects and self.cp is not None:
                with contextlib.suppress(OSError):
                    self.cp.request("DELETE", f"/api/v1/nodes/{name}")
            self._save()

    def node_status(self) -> list[dict[str, Any]]:
        """Per node: Ready (from the API), sshd reachable, kubelet unit state."""
        ready: dict[str, str] = {}
        if self.cp is not None:
            try:
                code, body = self.cp.request("GET", "/api/v1/nodes", timeout=5)
                if code == 200:
                    for item in body.get("items", []):
                        conds = item.get("status", {}).get("conditions", [])
                        st = next((c["status"] for c in conds if c["type"] == "Ready"), "Unknown")
                        ready[item["metadata"]["name"]] = st
            except OSError:
                pass
        out = []
        for name, rec in self.nodes.items():
            alive = Path(f"/proc/{rec.procs.holder_pid}").exists()
            unit = "unknown"
            if alive:
                r = n.node_exec(rec.procs.holder_pid, "systemctl", "is-active", rec.node.unit)
                unit = r.stdout.strip() or "unknown"
            out.append(
                {
                    "name": name,
                    "distribution": rec.node.distribution,
                    "ip": rec.node.ip,
                    "ready": ready.get(name, "Missing"),
                    "sshd": n._tcp_open(rec.node.ip, 22) if alive else False,
                    "kubelet": unit,
                    "unit": rec.node.unit,
                }
            )
        return out

    def wait_ready(self, names: Sequence[str], timeout: float = 60.0, want: str = "True") -> None:
        """Wait until every named Node's Ready condition is ``want``."""
        deadline = time.monotonic() + timeout
        while True:
            st = {s["name"]: s["ready"] for s in self.node_status() if s["name"] in names}
            if all(st.get(x) == want for x in names):
                return
            if time.monotonic() > deadline:
                tails = []
                for x in names:
                    rec = self.nodes.get(x)
                    if rec is not None:
                        log = self.node_root(x) / "var/log/kubelet.log"
                        with contextlib.suppress(OSError):
                            tails.append(
                                f"--- {x} kubelet.log\n" + log.read_text(errors="replace")[-1500:]
                            )
                raise LabError(
                    f"nodes not Ready={want} after {timeout:.0f}s: {st}\n" + "\n".join(tails)
                )
            time.sleep(0.25)

    # ------------------------------------------------------------------ faults and helpers
    def _rec(self, node: str) -> NodeRecord:
        try:
            return self.nodes[node]
        except KeyError:
            raise LabError(f"no node {node!r} in lab {self.name}") from None

    def node_root(self, node: str) -> Path:
        """Host path of the node's filesystem as the node sees it (``/proc/<holder>/root``)."""
        return self._rec(node).procs.root

    def node_exec(self, node: str, *args: str) -> subprocess.CompletedProcess[str]:
        """Run a command inside the node (without SSH)."""
        return n.node_exec(self._rec(node).procs.holder_pid, *args)

    def stop_sshd(self, node: str) -> None:
        """Fault: stop the node's sshd (Ansible then sees the host as unreachable)."""
        rec = self._rec(node)
        n.stop_sshd(rec.node.netns)
        deadline = time.monotonic() + 10
        while n._tcp_open(rec.node.ip, 22) and time.monotonic() < deadline:
            time.sleep(0.05)

    def start_sshd(self, node: str) -> None:
        """Start the node's sshd again."""
        rec = self._rec(node)
        if n._tcp_open(rec.node.ip, 22):
            return
        pid = n.start_sshd(rec.procs.holder_pid, Path(rec.procs.dir))
        self.nodes[node] = replace(rec, procs=replace(rec.procs, sshd_pid=pid))
        deadline = time.monotonic() + 10
        while not n._tcp_open(rec.node.ip, 22):
            if time.monotonic() > deadline:
                raise LabError(f"sshd on {node} did not come back")
            time.sleep(0.05)
        self._save()

    def _systemctl(self, node: str, verb: str) -> None:
        rec = self._rec(node)
        r = n.node_exec(rec.procs.holder_pid, "systemctl", verb, rec.node.unit)
        if r.returncode != 0:
            raise LabError(f"systemctl {verb} {rec.node.unit} on {node}: {r.stderr.strip()}")

    def stop_kubelet(self, node: str) -> None:
        """Fault: stop the node's kubelet unit (the Node goes NotReady after the grace period)."""
        self._systemctl(node, "stop")

    def start_kubelet(self, node: str) -> None:
        """Start the node's kubelet unit."""
        self._systemctl(node, "start")

    def restart_apiserver(self, downtime: float = 0.0) -> None:
        """Fault: restart kube-apiserver on the same port."""
        cp = self._require_cp()
        if self._attached:
            pid = int(self._state.get("controlplane", {}).get("kube-apiserver", 0))
            assert self.bin_dir is not None
            if pid and _exe_is(pid, self.bin_dir / "kube-apiserver"):
                _term([pid])
            time.sleep(downtime)
            cp._spawn("kube-apiserver", cp._apiserver_args())
            cp.wait_apiserver_ready()
        else:
            cp.restart_apiserver(downtime)
        self._save()

    def write_inventory(self, nodes: Sequence[str], path: Path) -> Path:
        """Write an inventory for ``nodes`` (first quarter in ``canary``)."""
        path.write_text(inventory_text([self._rec(x).node for x in nodes], self.ssh_key))
        return path

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
    ) -> None:
        """Start everything and write ``inventory.ini`` and ``plan.yaml`` (and, with
        ``monitoring``, Prometheus, Alertmanager and ``rollout serve``). An unknown kubelet or
        kubelet version is refused before anything starts."""
        check_kubelet(kubelet, kubelet_version, K8S_VERSION)
        self.start_control_plane(progress)
        try:
            if monitoring:
                self.start_monitoring(state_dir, progress)
            names = [f"{self.name}-node{i}" for i in range(1, count + 1)]
            made = self.add_nodes(
                names,
                distributions,
                shape=shape,
                progress=progress,
                timeout=timeout,
                kubelet=kubelet,
                kubelet_version=kubelet_version,
            )
            self.inventory.write_text(
                inventory_text(made, self.ssh_key, f"lab {self.name} in {self.dir}")
            )
            self.plan.write_text(plan_text(made, self.name))
        except BaseException:
            self.down(keep=True)  # its logs say why it failed
            raise

    def down(self, keep: bool = False) -> None:
        """Stop every node and process this lab started; delete its namespaces, then remove the
        lab's state (etcd data, certificates, keys, node files, logs) so the next ``up`` of the
        same name starts empty. ``keep`` keeps all of it but the state file (the next ``up``
        reuses it and says so)."""
        if self.monitoring is not None:
            _term(mon.ours(self.monitoring))
            self.monitoring = None
        self.remove_nodes(list(self.nodes), delete_objects=False)
        # namespaces of nodes that never made it into the state file (a `lab up` killed while
        # starting a node): their names say they are this lab's
        for netns in lab_namespaces(self.name):
            n.stop_node(netns)
        if self.relay_pid and _cmd_has(self.relay_pid, "rollout.lab.relay"):
            _term([self.relay_pid])
        self.relay_pid = 0
        if self.cp is not None and not self._attached:
            self.cp.stop()
        elif self.bin_dir is not None:
            pids = self._state.get("controlplane", {})
            order = ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd")
            for name in order:
                pid = int(pids.get(name, 0))
                if pid and _exe_is(pid, self.bin_dir / name):
                    _term([pid])
        self.cp = None
        self.socket_path.unlink(missing_ok=True)
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

    def _require_cp(self) -> ControlPlane:
        if self.cp is None:
            raise LabError(f"lab {self.name} has no running control plane (is it up?)")
        return self.cp

    def _save(self) -> None:
        cp = self.cp
        state = {
            "name": self.name,
            "dir": str(self.dir),
            "binDir": str(self.bin_dir or ""),
            "relayPid": self.relay_pid,
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
            else (
                cp.pids
                if not self._attached
                else {**self._state.get("controlplane", {}), **cp.pids}
            ),
            "kubeconfig": str(self.kubeconfig),
            "monitoring": self.monitoring.to_dict() if self.monitoring else None,
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
                for r in self.nodes.values()
            ],
        }
        self._state = state
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
        return lab
