"""Lab nodes: a network namespace, a mount + UTS namespace, a real sshd, and seeded files.

Why namespaces and not loopback aliases: the API server's node proxy refuses loopback node
addresses ("address not allowed", ``IsProxyableIP``), and ``kubectl get --raw
/api/v1/nodes/N/proxy/configz`` must work. So each node gets its own network namespace joined to
the host by a veth pair with a private /30 from the lab range ``10.213.<i>.0/30`` (host side ``.1``,
node side ``.2``). Those addresses exist only inside namespaces the lab creates.

Each node has one *holder* process (``sleep infinity``) that owns the node's namespaces::

    ip netns exec NS unshare --mount --uts --propagation private -- sh -c \
      'mount overlays on /etc /var /usr/lib/systemd; bind the fake sysfs and the systemctl shim;
       hostname NODE; exec sleep infinity'

Everything else enters those namespaces with ``nsenter -t HOLDER``: the real ``sshd`` (listening on
the node IP, port 22), the in-namespace API relay (``127.0.0.1:<port>`` inside the node, see
:mod:`rollout.lab.relay`) and, through the ``systemctl`` shim, the lab kubelet. So stopping sshd
(a fault) keeps the node's files and kubelet, as on a real machine whose sshd died.

The node's files are overlays over the host's directories: reads fall through to the host, writes
land in ``<node dir>/upper/...`` and never touch the host. ``/proc/<holder>/root`` is the node's
view of its whole filesystem (:attr:`NodeProcs.root`). What is seeded into those upper dirs, and
the node's identity (:class:`LabNode`), live in :mod:`rollout.lab.nodefiles`.

Teardown kills exactly the processes inside the node's network namespace (``ip netns pids``: only
processes the lab started can be there), then deletes the namespace, which deletes the veth pair;
the mount namespace vanishes with its last process.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rollout.errors import LabError
from rollout.lab.hardware import NodeShape
from rollout.lab.network import (
    NET_PREFIX,
    delete_network,
    netns_pids,
    run,
    used_indexes,
)
from rollout.lab.nodefiles import (
    OVERLAYS,
    LabNode,
)

# the node's identity and files live in rollout.lab.nodefiles
__all__ = [
    "NodeProcs",
]


@dataclass(frozen=True)
class NodeProcs:
    """What is running for a node (recorded in the lab state file)."""

    holder_pid: int
    sshd_pid: int
    relay_pid: int
    dir: str

    @property
    def root(self) -> Path:
        """The node's filesystem as the node sees it."""
        return Path(f"/proc/{self.holder_pid}/root")


def _holder_script(node: LabNode, node_dir: Path, shim: Path) -> str:
    lines = ["set -e"]
    for o in OVERLAYS:
        key = o.strip("/").replace("/", "-")
        lines.append(
            f"mount -t overlay rollout-lab-{key} -o lowerdir={o},"
            f"upperdir={node_dir}/upper/{key},workdir={node_dir}/work/{key} {o}"
        )
    lines.append(f"mount --bind {node_dir}/sys/node /sys/devices/system/node")
    if Path("/sys/bus/pci/devices").is_dir():
        lines.append(f"mount --bind {node_dir}/sys/pci /sys/bus/pci/devices")
    lines.append(f"mount --bind {shim} /usr/bin/systemctl")
    bashrc = Path.home() / ".bashrc"
    if bashrc.is_file():
        # sshd's bash sources the user's ~/.bashrc before every command. The lab's nodes share this
        # workstation's home, whose profile (here pyenv's init: ~0.1 s of CPU per ssh session)
        # belongs to no node; a node's root has the distribution's commented-out default, so the
        # node sees an empty one (every ssh of the tool, Ansible and a test's loop alike).
        lines.append(f"mount --bind {node_dir}/bashrc {bashrc}")
    if node.kubelet == "real":
        from rollout.lab.realhw import holder_binds

        lines += holder_binds(node_dir)
    lines.append(f"hostname {node.name}")
    lines.append(f"touch {node_dir}/holder.ready")
    lines.append("exec sleep infinity")
    return "\n".join(lines)


def sshd_config(node: LabNode, node_dir: Path, host_key: Path, authorized_keys: Path) -> str:
    """sshd configuration for a node (key auth for root only, no PAM)."""
    return (
        f"ListenAddress {node.ip}\nPort {node.ssh_port}\nHostKey {host_key}\n"
        f"PidFile {node_dir}/sshd.pid\nAuthorizedKeysFile {authorized_keys}\n"
        "PermitRootLogin prohibit-password\nPasswordAuthentication no\n"
        "KbdInteractiveAuthentication no\nUsePAM no\nStrictModes no\nUseDNS no\n"
        "PrintMotd no\nMaxStartups 100\nMaxSessions 100\n"
        "Subsystem sftp /usr/lib/openssh/sftp-server\n"
    )


# Popen objects of the processes this process started, kept so they are reaped (not left as
# zombies or reported as "still running" when garbage-collected).
CHILDREN: dict[int, subprocess.Popen[bytes]] = {}


def reap() -> None:
    """Collect the exit status of our finished children."""
    for pid, p in list(CHILDREN.items()):
        if p.poll() is not None:
            del CHILDREN[pid]


def _spawn(args: list[str], log: Path) -> int:
    reap()
    with open(log, "ab") as f:
        p = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    CHILDREN[p.pid] = p
    return p.pid


def _wait_for(pred: object, what: str, timeout: float, log: Path | None = None) -> None:
    assert callable(pred)
    deadline = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-2000:] if log and log.exists() else ""
            raise LabError(f"timed out after {timeout:.0f}s waiting for {what}\n{tail}")
        time.sleep(0.02)


def tcp_open(ip: str, port: int) -> bool:
    try:
        with socket.create_connection((ip, port), timeout=0.5):
            return True
    except OSError:
        return False


LOCK_FILE = Path("/tmp/rollout-lab-network.lock")


def create_network(
    name: str, distribution: str, lab: str, shape: NodeShape | None = None
) -> LabNode:
    """Pick a free index in the lab range and create the node's network namespace, veth pair and
    /30 addresses. A lock file serialises this between labs running at the same time (tests and
    a demo lab, say), so two labs never pick the same index."""
    with open(LOCK_FILE, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        used = used_indexes()
        free = [i for i in range(1, 255) if i not in used]
        if not free:
            raise LabError(f"no free addresses left in the lab range {NET_PREFIX}.0.0/16")
        node = LabNode(name, free[0], distribution, lab, shape or NodeShape())
        run("ip", "netns", "add", node.netns)
        try:
            run("ip", "link", "add", node.veth_host, "type", "veth", "peer", "name",
                 node.veth_node)  # fmt: skip
        except LabError:
            run("ip", "netns", "del", node.netns, check=False)
            raise
        try:
            run("ip", "link", "set", node.veth_node, "netns", node.netns)
            run("ip", "addr", "add", f"{node.host_ip}/30", "dev", node.veth_host)
            run("ip", "link", "set", node.veth_host, "up")
            run("ip", "-n", node.netns, "addr", "add", f"{node.ip}/30", "dev", node.veth_node)
            run("ip", "-n", node.netns, "link", "set", node.veth_node, "up")
            run("ip", "-n", node.netns, "link", "set", "lo", "up")
        except LabError:
            # the pair was created by us just above: safe to delete by name
            run("ip", "link", "del", node.veth_host, check=False)
            run("ip", "netns", "del", node.netns, check=False)
            raise
    return node


def start_node(
    node: LabNode,
    node_dir: Path,
    *,
    shim: Path,
    host_key: Path,
    authorized_keys: Path,
    socket_path: Path,
    apiserver_port: int,
    timeout: float = 20.0,
) -> NodeProcs:
    """Create the node's namespaces and start holder, relay and sshd (not the kubelet)."""
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege-separation dir
    try:
        (node_dir / "holder.ready").unlink(missing_ok=True)
        (node_dir / "bashrc").write_text("")  # what the node's root sources (_holder_script)
        # `ip netns exec` remounts /sys for the namespace, which hides /sys/fs/cgroup; the real
        # kubelet needs the cgroup mounts, so a real-kubelet node enters the netns with nsenter
        enter_net = (
            ["nsenter", f"--net=/run/netns/{node.netns}"]
            if node.kubelet == "real"
            else ["ip", "netns", "exec", node.netns]
        )
        holder = _spawn(
            [
                *enter_net,
                "unshare",
                "--mount",
                "--uts",
                "--propagation",
                "private",
                "--",
                "sh",
                "-c",
                _holder_script(node, node_dir, shim),
            ],
            node_dir / "holder.log",
        )
        _wait_for(
            (node_dir / "holder.ready").exists,
            f"node {node.name} namespaces",
            timeout,
            node_dir / "holder.log",
        )
        enter = ["nsenter", "-t", str(holder), "-m", "-u", "-n", "--"]
        relay = _spawn(
            [
                *enter,
                sys.executable,
                "-m",
                "rollout.lab.relay",
                "--listen",
                f"tcp:127.0.0.1:{apiserver_port}",
                "--connect",
                f"unix:{socket_path}",
            ],
            node_dir / "relay.log",
        )
        (node_dir / "sshd_config").write_text(
            sshd_config(node, node_dir, host_key, authorized_keys)
        )
        sshd = start_sshd(holder, node_dir)
        _wait_for(
            lambda: tcp_open(node.ip, node.ssh_port),
            f"sshd on {node.ip}:22",
            timeout,
            node_dir / "sshd.log",
        )
    except BaseException:
        stop_node(node.netns)
        raise
    return NodeProcs(holder, sshd, relay, str(node_dir))


def start_sshd(holder_pid: int, node_dir: Path) -> int:
    """Start the node's sshd inside its namespaces; returns its PID."""
    return _spawn(
        [
            "nsenter",
            "-t",
            str(holder_pid),
            "-m",
            "-u",
            "-n",
            "--",
            "/usr/sbin/sshd",
            "-D",
            "-e",
            "-f",
            str(node_dir / "sshd_config"),
        ],
        node_dir / "sshd.log",
    )


def stop_sshd(netns: str) -> None:
    """Fault: stop the node's listening sshd (open sessions are cut too, as on a real node)."""
    for pid in netns_pids(netns):
        if _cmdline(pid)[:1] == ["/usr/sbin/sshd"] or (
            _cmdline(pid) and _cmdline(pid)[0].startswith("sshd")
        ):
            _kill(pid, signal.SIGTERM)


def node_exec(
    holder_pid: int, *args: str, timeout: float = 30.0
) -> subprocess.CompletedProcess[str]:
    """Run a command inside the node's namespaces (what ``ssh node CMD`` would do)."""
    return subprocess.run(
        ["nsenter", "-t", str(holder_pid), "-m", "-u", "-n", "--", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")[:-1]
    except OSError:
        return []


def _kill(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)


def stop_node(netns: str, timeout: float = 10.0) -> None:
    """Kill every process in the node's network namespace (only lab processes can be there:
    the namespace was created by the lab), then delete the namespace and the veth pair."""
    if Path(f"/run/netns/{netns}").exists():
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in netns_pids(netns):
                _kill(pid, sig)
            deadline = time.monotonic() + timeout / 2
            while netns_pids(netns) and time.monotonic() < deadline:
                reap()
                time.sleep(0.05)
            if not netns_pids(netns):
                break
    delete_network(netns)
    reap()


def remove_node_dir(node_dir: Path) -> None:
    """Delete the node's files (after :func:`stop_node`)."""
    shutil.rmtree(node_dir, ignore_errors=True)


def procs_to_dict(p: NodeProcs) -> dict[str, object]:
    """For the state file."""
    return asdict(p)
