"""The lab's nodes as the :class:`~rollout.lab.cluster.Lab` manages them: adding (create, seed,
start, wait for Ready), removing, status, and the per-node faults and helpers (stop/start sshd or
the kubelet unit, run a command in the node, write an inventory).

:class:`LabNodes` is the part of :class:`~rollout.lab.cluster.Lab` that owns the node records
(``lab.machines``); it is given the lab's name and directory, the control plane (None until one
is started or attached) and the lab's ``save``, and reaches nothing else of the Lab.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.errors import LabError
from rollout.lab import daemonsets, nodefiles, realnode
from rollout.lab import nodes as n
from rollout.lab.builds import check_kubelet
from rollout.lab.hardware import NodeShape
from rollout.lab.inventory import inventory_text
from rollout.lab.seeds import DISTRIBUTIONS

if TYPE_CHECKING:
    from rollout.lab.controlplane import ControlPlane

Progress = Callable[[str], None]
#: the taint a kubelet with ``--cloud-provider=external`` registers its Node with
UNINITIALIZED_TAINT = "node.cloudprovider.kubernetes.io/uninitialized"
#: the taint a Node carries until the node lifecycle controller has seen it Ready
NOT_READY_TAINT = "node.kubernetes.io/not-ready"


@dataclass(frozen=True)
class NodeRecord:
    """A started node and its processes."""

    node: nodefiles.LabNode
    procs: n.NodeProcs


class LabNodes:
    """The nodes of a lab (:attr:`rollout.lab.cluster.Lab.machines`).

    Args:
        name: the lab's name.
        directory: the lab's directory.
        control: the lab's control plane (None: none started or attached).
        save: writes the lab's state file (after nodes are added or removed).
    """

    def __init__(
        self,
        name: str,
        directory: Path,
        control: Callable[[], ControlPlane | None],
        save: Callable[[], None],
    ) -> None:
        self.name, self.dir = name, directory
        self._control, self._save = control, save
        self.nodes: dict[str, NodeRecord] = {}

    @property
    def cp(self) -> ControlPlane | None:
        return self._control()

    def require_cp(self) -> ControlPlane:
        cp = self._control()
        if cp is None:
            raise LabError(f"lab {self.name} has no running control plane (is it up?)")
        return cp

    @property
    def socket_path(self) -> Path:
        return self.dir / "apiserver.sock"

    @property
    def ssh_key(self) -> Path:
        return self.dir / "ssh" / "client_key"

    @property
    def shim(self) -> Path:
        return self.dir / "bin" / "systemctl"

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
        path_labels: Mapping[str, str] | None = None,
        path: str = "device-plugin",
    ) -> list[nodefiles.LabNode]:
        """Create, seed and start nodes (round-robin over ``distributions``); wait for Ready.
        ``kubelet``: ``sim`` (the simulated kubelet) or ``real`` (:mod:`rollout.lab.realnode`);
        ``kubelet_version``: a minor of :data:`realnode.KUBELET_VERSIONS`, checked against the
        control plane's version by the skew policy before anything starts (the simulated kubelet
        plays that version's flags, config checks and checkpoint files). ``path_labels``: the
        node-label keys a real-kubelet node's device plugin and DRA driver follow
        (:mod:`rollout.lab.daemonsets`: component -> key; default NVIDIA's); ``path``: the
        allocation path they start on (``device-plugin`` or ``dra``: its labels, and the Node
        waited for until its GPUs are advertised, or listed in the driver's ResourceSlices)."""
        daemonsets.initial_labels(daemonsets.label_keys({}), path)  # an unknown path: refused
        cp = self.require_cp()
        version = str(cp.version().get("gitVersion", ""))
        wanted = check_kubelet(kubelet, kubelet_version, version)
        for d in distributions:
            if d not in DISTRIBUTIONS:
                raise LabError(f"unknown distribution {d!r}; valid: {', '.join(DISTRIBUTIONS)}")
        dup = [x for x in names if x in self.nodes]
        if dup:
            raise LabError(f"node names already in this lab: {', '.join(dup)}")
        kubelet_bin = realnode.build(progress, wanted) if kubelet == "real" else None
        dra_bin = daemonsets.build_driver(progress) if kubelet == "real" else None
        created: list[nodefiles.LabNode] = []
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
                    nodefiles.write_node_files(
                        node,
                        node_dir,
                        self._credentials(node),
                        self.socket_path,
                        wanted or version,
                        kubelet_bin,
                        dra_bin,
                        path_labels,
                        path,
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
                self._initialize_external_cloud_nodes(created)
                self.wait_untainted([x.name for x in created], timeout=timeout)
                if kubelet == "real":
                    self.wait_agents([x.name for x in created], timeout=timeout)
                    self.device_class(keep=True)
                    if path == "dra":
                        self.wait_dra_gpus([x.name for x in created], timeout=timeout)
                    else:
                        self.wait_gpus([x.name for x in created], timeout=timeout)
                progress(f"{len(created)} node(s) Ready")
        except BaseException:
            self.remove_nodes([x.name for x in created])
            raise
        return created

    def _initialize_external_cloud_nodes(self, nodes: Sequence[nodefiles.LabNode]) -> None:
        """Do for real-kubelet nodes what a cloud-controller-manager does for a kubelet started
        with ``--cloud-provider=external`` (the EKS distributions' flags): the real kubelet
        registers its Node with the taint :data:`UNINITIALIZED_TAINT` (NoSchedule) and the
        cloud's node controller removes it once it has initialized the Node (on EKS, AWS's cloud
        controller manager). The lab has no cloud controller, so without this nothing would ever
        be scheduled on those nodes. The simulated kubelet never adds the taint."""
        cp = self.require_cp()
        for node in nodes:
            if node.kubelet != "real":
                continue
            code, obj = cp.request("GET", f"/api/v1/nodes/{node.name}")
            if code != 200:
                continue
            taints = obj.get("spec", {}).get("taints") or []
            keep = [t for t in taints if t.get("key") != UNINITIALIZED_TAINT]
            if len(keep) == len(taints):
                continue
            code, out = cp.request(
                "PATCH",
                f"/api/v1/nodes/{node.name}",
                {"spec": {"taints": keep or None}},
                content_type="application/merge-patch+json",
            )
            if code != 200:
                raise LabError(f"could not remove {UNINITIALIZED_TAINT} from {node.name}: {out}")

    def _credentials(self, node: nodefiles.LabNode) -> nodefiles.NodeCredentials:
        cp = self.require_cp()
        server = f"https://127.0.0.1:{cp.apiserver_port}"
        kc = cp.node_kubeconfig(node.name, embed=True, server=server)
        crt, key = cp.pki_dir / f"node-{node.name}.crt", cp.pki_dir / f"node-{node.name}.key"
        scrt, skey = cp.kubelet_serving_cert(node.name, node.ip)
        return nodefiles.NodeCredentials(
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
                    "sshd": n.tcp_open(rec.node.ip, 22) if alive else False,
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

    def wait_gpus(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Wait until every named real-kubelet Node advertises all its GPUs (allocatable
        ``nvidia.com/gpu`` = the devices of its ``gpus.txt``): the fake device plugin registers
        a moment after the kubelet is Ready, and preflight refuses a node advertising fewer GPUs
        than it has."""
        cp = self.require_cp()
        deadline = time.monotonic() + timeout
        while True:
            short = {}
            for x in names:
                want = len((self.node_root(x) / realnode.GPU_FILE.lstrip("/")).read_text().split())
                code, obj = cp.request("GET", f"/api/v1/nodes/{x}")
                alloc = (obj.get("status", {}).get("allocatable") or {}) if code == 200 else {}
                got = str(alloc.get("nvidia.com/gpu", "0"))
                if got != str(want):
                    short[x] = f"{got} of {want}"
            if not short:
                return
            if time.monotonic() > deadline:
                raise LabError(f"nodes not advertising their GPUs after {timeout:.0f}s: {short}")
            time.sleep(0.25)

    def wait_agents(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Wait until each named real node's agent (:mod:`rollout.lab.daemonsets`) has read its
        Node's labels once: a fault injected before that would be undone by its first look."""
        deadline = time.monotonic() + timeout
        for x in names:
            log = self.node_root(x) / daemonsets.AGENT_LOG.lstrip("/")
            while f"{daemonsets.DRA_DRIVER}: " not in (log.read_text() if log.exists() else ""):
                if time.monotonic() > deadline:
                    raise LabError(f"node {x}: the lab's DaemonSet agent never read its Node")
                time.sleep(0.1)

    def wait_dra_gpus(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Wait until the lab DRA driver's ResourceSlices list every GPU of each named node."""
        from rollout.lab.devicefaults import DeviceFaults

        faults = DeviceFaults(self.require_cp, self.node_root)
        for x in names:
            want = len((self.node_root(x) / realnode.GPU_FILE.lstrip("/")).read_text().split())
            faults.wait_slices(x, want, timeout)

    def device_class(
        self, extended_resource: str | None = None, *, keep: bool = False
    ) -> dict[str, Any]:
        """Create or replace the lab DRA driver's DeviceClass (:func:`daemonsets.device_class`),
        mapping ``extended_resource`` when given; ``keep``: leave an existing one as it is (the
        chart's install creates it once). The object as the API server has it."""
        cp = self.require_cp()
        base = "/apis/resource.k8s.io/v1/deviceclasses"
        want = daemonsets.device_class(extended_resource)
        code, have = cp.request("GET", f"{base}/{daemonsets.DEVICE_CLASS}")
        if code == 404:
            code, have = cp.request("POST", base, want)
            if code != 201:
                raise LabError(f"create DeviceClass {daemonsets.DEVICE_CLASS}: HTTP {code} {have}")
        elif code == 200 and not keep:
            want["metadata"]["resourceVersion"] = have["metadata"]["resourceVersion"]
            code, have = cp.request("PUT", f"{base}/{daemonsets.DEVICE_CLASS}", want)
            if code != 200:
                raise LabError(f"update DeviceClass {daemonsets.DEVICE_CLASS}: HTTP {code} {have}")
        elif code != 200:
            raise LabError(f"read DeviceClass {daemonsets.DEVICE_CLASS}: HTTP {code} {have}")
        return dict(have)

    def path_daemonsets(self, path_labels: Mapping[str, str] | None = None) -> list[str]:
        """Create (or leave as they are) the two DaemonSets a GPU Operator runs the paths with
        (:func:`daemonsets.daemonset_objects`: the device plugin's and the DRA kubelet
        plugin's, in :data:`daemonsets.NAMESPACE`, each selecting ``<its label>=true``), so
        the API server holds what a migration's preflight looks for. Their pods are real pods
        on the fake runtime; the lab's agent, not those pods, starts and stops each component
        on the same label (:mod:`rollout.lab.daemonsets`). Their ``namespace/name``."""
        cp = self.require_cp()
        keys = daemonsets.label_keys({"pathLabels": dict(path_labels or {})})
        code, have = cp.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": daemonsets.NAMESPACE}}
        )
        if code not in (201, 409):
            raise LabError(f"create namespace {daemonsets.NAMESPACE}: HTTP {code} {have}")
        out = []
        base = f"/apis/apps/v1/namespaces/{daemonsets.NAMESPACE}/daemonsets"
        for obj in daemonsets.daemonset_objects(keys):
            code, have = cp.request("POST", base, obj)
            if code not in (201, 409):
                raise LabError(f"create DaemonSet {obj['metadata']['name']}: HTTP {code} {have}")
            out.append(f"{daemonsets.NAMESPACE}/{obj['metadata']['name']}")
        return out

    def wait_untainted(self, names: Sequence[str], timeout: float = 60.0) -> None:
        """Wait until no named Node carries ``node.kubernetes.io/not-ready``: a Node is Ready
        before the node lifecycle controller lifts that NoSchedule taint (its monitor period, and
        longer on a loaded machine), and until then the scheduler places nothing on it, so a test
        that spreads pods right after ``add_nodes`` would see them all on the nodes untainted
        first."""
        cp = self.require_cp()
        deadline = time.monotonic() + timeout
        while True:
            tainted = []
            for x in names:
                code, obj = cp.request("GET", f"/api/v1/nodes/{x}")
                taints = (obj.get("spec", {}).get("taints") or []) if code == 200 else []
                if any(t.get("key") == NOT_READY_TAINT for t in taints):
                    tainted.append(x)
            if not tainted:
                return
            if time.monotonic() > deadline:
                raise LabError(
                    f"nodes still tainted {NOT_READY_TAINT} after {timeout:.0f}s: {tainted}"
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
        while n.tcp_open(rec.node.ip, 22) and time.monotonic() < deadline:
            time.sleep(0.05)

    def start_sshd(self, node: str) -> None:
        """Start the node's sshd again."""
        rec = self._rec(node)
        if n.tcp_open(rec.node.ip, 22):
            return
        pid = n.start_sshd(rec.procs.holder_pid, Path(rec.procs.dir))
        self.nodes[node] = replace(rec, procs=replace(rec.procs, sshd_pid=pid))
        deadline = time.monotonic() + 10
        while not n.tcp_open(rec.node.ip, 22):
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

    def write_inventory(self, nodes: Sequence[str], path: Path) -> Path:
        """Write an inventory for ``nodes`` (first quarter in ``canary``)."""
        path.write_text(inventory_text([self._rec(x).node for x in nodes], self.ssh_key))
        return path
