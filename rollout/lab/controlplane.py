"""The lab's real control plane: etcd, kube-apiserver, kube-controller-manager, kube-scheduler.

The binaries come from ``tools/build-lab-binaries.sh`` (built from the Go module proxy). This
module starts them as child processes with :class:`subprocess.Popen`, on free ports, with logs
under the work dir, and stops them by PID (only the processes it started).
The API server runs with ``--authorization-mode=Node,RBAC`` and the default admission plugins
plus ``NodeRestriction``, like a kubeadm cluster.

Why apart from :mod:`rollout.lab.access`: this module owns the processes (their flags, start,
readiness, restart, stop); that one owns where the API server is and who may talk to it (the lab
CA, certs, kubeconfigs, TLS), including why the nodes cannot be on loopback and how they reach
the API server. Which binaries, at which versions, is :mod:`rollout.lab.binaries`.
"""

from __future__ import annotations

import ipaddress
import json
import os
import random
import signal
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from rollout.lab.access import ControlPlaneAccess
from rollout.lab.binaries import missing_binaries
from rollout.lab.pki import PKI

# what callers of rollout.lab.controlplane import from here, though it now lives beside it
__all__ = [
    "ControlPlane",
    "ControlPlaneError",
    "free_port",
]

SERVICE_CIDR = "10.0.0.0/24"
SA_ISSUER = "https://kubernetes.default.svc.cluster.local"


class ControlPlaneError(RuntimeError):
    """The control plane failed to start or to become ready."""


def _ephemeral_low(path: Path = Path("/proc/sys/net/ipv4/ip_local_port_range")) -> int:
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A free TCP port on 127.0.0.1 for a lab server to listen on.

    Picked below the kernel's ephemeral range (``ip_local_port_range``): a port ``bind(0)``
    returns comes from that range, which every outgoing connection (ssh to the nodes, the API
    clients) also draws from, so between the pick and the server's own bind another process's
    connection could take it (``bind: address already in use``, seen in the lab tests). Falls
    back to ``bind(0)`` when no port below the range is free."""
    low = _ephemeral_low()
    candidates = list(range(max(1024, low - 12000), low))
    random.shuffle(candidates)
    for port in candidates[:64]:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        got: int = s.getsockname()[1]
        return got


class ControlPlane(ControlPlaneAccess):
    """etcd + kube-apiserver + kube-controller-manager + kube-scheduler on local addresses.

    ``start()`` returns once the API server's ``/readyz`` is ok and the controller-manager and
    scheduler answer ``/healthz``. ``stop()`` stops only the processes this object started.
    """

    def __init__(
        self,
        workdir: Path,
        bin_dir: Path,
        *,
        node_network_ip: str | None = None,
        start_timeout: float = 90.0,
        kcm_extra_args: Sequence[str] = (),
    ) -> None:
        self.workdir = Path(workdir).resolve()
        #: flags appended to the controller-manager's (a later flag wins over an earlier one)
        self.kcm_extra_args = tuple(kcm_extra_args)
        self.bin_dir = Path(bin_dir).resolve()
        self.start_timeout = start_timeout
        self._node_network_ip: str | None = None
        self._procs: dict[str, subprocess.Popen[bytes]] = {}
        self._logs: dict[str, IO[bytes]] = {}
        self._pki: PKI | None = None
        self.etcd_port = free_port()
        self.etcd_peer_port = free_port()
        self.apiserver_port = free_port()
        self.kcm_port = free_port()
        self.scheduler_port = free_port()
        if node_network_ip is not None:
            self.allow_node_network(node_network_ip)

    # ----------------------------------------------------------------- addresses and credentials
    def allow_node_network(self, host_ip: str) -> None:
        """Serve the API on ``host_ip`` (host-side lab address, e.g. a bridge/veth end) instead of
        127.0.0.1, so kubelets in node network namespaces can reach it. Call before :meth:`start`.

        ``host_ip`` must already be assigned to an interface of the host network namespace.
        """
        ip = ipaddress.ip_address(host_ip)
        if ip.is_unspecified or ip.is_multicast:
            raise ValueError(f"not a usable host address: {host_ip}")
        if self._procs:
            raise ControlPlaneError("allow_node_network() must be called before start()")
        self._node_network_ip = str(ip)

    # ----------------------------------------------------------------------------- lifecycle
    def _prepare(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        (self.workdir / "logs").mkdir(exist_ok=True)
        missing = missing_binaries(self.bin_dir)
        if missing:
            raise ControlPlaneError(f"missing binaries in {self.bin_dir}: {', '.join(missing)}")
        self._issue_certs()

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.workdir / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - kept open
        log.write(f"\n=== {time.strftime('%H:%M:%S')} start {name}\n".encode())
        log.flush()
        self._logs[name] = log
        self._procs[name] = subprocess.Popen(
            [str(self.bin_dir / name), *args],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.workdir,
            start_new_session=True,  # a Ctrl-C in the terminal does not hit it; we stop it by PID
        )
        self._write_pidfile()

    @property
    def pidfile(self) -> Path:
        return self.workdir / "pids.json"

    def _write_pidfile(self) -> None:
        self.pidfile.write_text(json.dumps(self.pids, indent=1) + "\n")

    @staticmethod
    def kill_stale(workdir: Path, bin_dir: Path) -> list[int]:
        """Kill processes left by an earlier run in ``workdir`` (e.g. after the test process was
        SIGKILLed): only PIDs from its ``pids.json`` whose executable lives in ``bin_dir``."""
        killed: list[int] = []
        try:
            pids = json.loads((Path(workdir) / "pids.json").read_text())
        except (OSError, ValueError):
            return killed
        bin_dir = Path(bin_dir).resolve()
        for name, pid in pids.items():
            try:
                exe = Path(os.readlink(f"/proc/{int(pid)}/exe"))
            except OSError:
                continue
            if exe == bin_dir / name:
                os.kill(int(pid), signal.SIGKILL)
                killed.append(int(pid))
        return killed

    def _etcd_args(self) -> list[str]:
        client = f"http://127.0.0.1:{self.etcd_port}"
        peer = f"http://127.0.0.1:{self.etcd_peer_port}"
        return [
            "--name=lab",
            f"--data-dir={self.workdir / 'etcd'}",
            f"--listen-client-urls={client}",
            f"--advertise-client-urls={client}",
            f"--listen-peer-urls={peer}",
            f"--initial-advertise-peer-urls={peer}",
            f"--initial-cluster=lab={peer}",
            "--unsafe-no-fsync=true",  # throw-away lab data: skip fsync, much faster on CI disks
            "--log-level=warn",
        ]

    def _apiserver_args(self) -> list[str]:
        p = self.pki_dir
        host = self.apiserver_host
        args = [
            f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
            f"--bind-address={host}",
            f"--advertise-address={host}",
            f"--secure-port={self.apiserver_port}",
            f"--cert-dir={self.workdir / 'apiserver-certs'}",
            f"--tls-cert-file={p / 'apiserver.crt'}",
            f"--tls-private-key-file={p / 'apiserver.key'}",
            f"--client-ca-file={p / 'ca.crt'}",
            f"--kubelet-client-certificate={p / 'apiserver-kubelet-client.crt'}",
            f"--kubelet-client-key={p / 'apiserver-kubelet-client.key'}",
            f"--kubelet-certificate-authority={p / 'ca.crt'}",
            "--kubelet-preferred-address-types=InternalIP,Hostname,ExternalIP",
            f"--service-account-key-file={p / 'sa.pub'}",
            f"--service-account-signing-key-file={p / 'sa.key'}",
            f"--service-account-issuer={SA_ISSUER}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--authorization-mode=Node,RBAC",
            "--enable-admission-plugins=NodeRestriction",
            "--allow-privileged=true",
            "--profiling=false",
            # Without it a SIGTERM waits for the open watches (KCM, scheduler, kubelets) until
            # --request-timeout (60 s); with it the apiserver ends them and exits in about 1 s.
            "--shutdown-watch-termination-grace-period=2s",
            "--v=1",
        ]
        if ipaddress.ip_address(host).is_loopback:
            # ValidateEndpointIP rejects loopback: the `kubernetes` endpoint can't be written.
            args.append("--endpoint-reconciler-type=none")
        return args

    def _kcm_args(self) -> list[str]:
        kc = self.workdir / "kubeconfigs" / "kube-controller-manager.kubeconfig"
        p = self.pki_dir
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.kcm_port}",
            f"--cert-dir={self.workdir / 'kcm-certs'}",
            "--leader-elect=false",
            "--node-monitor-period=1s",
            "--node-monitor-grace-period=10s",
            f"--service-account-private-key-file={p / 'sa.key'}",
            f"--root-ca-file={p / 'ca.crt'}",
            "--use-service-account-credentials=true",
            f"--cluster-signing-cert-file={p / 'ca.crt'}",
            f"--cluster-signing-key-file={p / 'ca.key'}",
            f"--service-cluster-ip-range={SERVICE_CIDR}",
            "--v=1",
            *self.kcm_extra_args,
        ]

    def _scheduler_args(self) -> list[str]:
        kc = self.workdir / "kubeconfigs" / "kube-scheduler.kubeconfig"
        return [
            f"--kubeconfig={kc}",
            f"--authentication-kubeconfig={kc}",
            f"--authorization-kubeconfig={kc}",
            "--bind-address=127.0.0.1",
            f"--secure-port={self.scheduler_port}",
            f"--cert-dir={self.workdir / 'scheduler-certs'}",
            "--leader-elect=false",
            "--v=1",
        ]

    def start(self) -> None:
        """Start everything; return when the API server is ready (``/readyz``) and the
        controller-manager and scheduler are healthy. On failure, stop what was started.

        A server that finds its port taken (another process bound it after :func:`free_port`
        picked it) is started again on new ports, twice at most."""
        if self._procs:
            raise ControlPlaneError("control plane already started")
        for attempt in range(3):
            try:
                self._start_once()
                return
            except ControlPlaneError as e:
                if "address already in use" not in str(e) or attempt == 2:
                    raise
                self.etcd_port, self.etcd_peer_port = free_port(), free_port()
                self.apiserver_port, self.kcm_port = free_port(), free_port()
                self.scheduler_port = free_port()

    def _start_once(self) -> None:
        self.kill_stale(self.workdir, self.bin_dir)
        try:
            self._prepare()
            deadline = time.monotonic() + self.start_timeout
            self._spawn("etcd", self._etcd_args())
            self._wait("etcd", f"http://127.0.0.1:{self.etcd_port}/health", deadline, tls=False)
            self._spawn("kube-apiserver", self._apiserver_args())
            self.wait_apiserver_ready(deadline)
            self._spawn("kube-controller-manager", self._kcm_args())
            self._spawn("kube-scheduler", self._scheduler_args())
            self._wait(
                "kube-controller-manager",
                f"https://127.0.0.1:{self.kcm_port}/healthz",
                deadline,
                tls=True,
            )
            self._wait(
                "kube-scheduler",
                f"https://127.0.0.1:{self.scheduler_port}/healthz",
                deadline,
                tls=True,
            )
        except BaseException:
            self.stop()
            raise

    def restart_apiserver(self, downtime: float = 0.0) -> None:
        """Fault injection: stop kube-apiserver (SIGTERM; it exits in about 1 s, SIGKILL after
        10 s), optionally stay down ``downtime`` seconds, start it again on the same port
        and wait for ``/readyz``."""
        self._stop_one("kube-apiserver")
        if downtime > 0:
            time.sleep(downtime)
        self._spawn("kube-apiserver", self._apiserver_args())
        self.wait_apiserver_ready(time.monotonic() + self.start_timeout)

    def stop(self) -> None:
        """Stop the processes this object started (newest first). Safe to call twice."""
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            self._stop_one(name)
        for name in list(self._procs):
            self._stop_one(name)

    def _stop_one(self, name: str, timeout: float = 10.0) -> None:
        proc = self._procs.pop(name, None)
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        log = self._logs.pop(name, None)
        if log is not None:
            log.close()
        if proc is not None and self.workdir.exists():
            self._write_pidfile()

    @property
    def pids(self) -> dict[str, int]:
        """PIDs of the running processes started by this object."""
        return {n: p.pid for n, p in self._procs.items() if p.poll() is None}

    def __enter__(self) -> ControlPlane:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------------------- HTTP
    def request(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        cert: tuple[Path, Path] | None = None,
        timeout: float = 10.0,
        content_type: str = "application/json",
    ) -> tuple[int, Any]:
        """Plain HTTPS request to the API server as admin (or ``cert``). Returns
        ``(status, decoded JSON or text)``; HTTP errors are returned, not raised."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.apiserver_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.ssl_context(cert)) as r:
                status, raw = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, raw = e.code, e.read()
        try:
            return status, json.loads(raw)
        except ValueError:
            return status, raw.decode(errors="replace")

    def version(self) -> dict[str, Any]:
        status, body = self.request("GET", "/version")
        if status != 200 or not isinstance(body, dict):
            raise ControlPlaneError(f"/version: {status} {body}")
        return body

    def wait_apiserver_ready(self, deadline: float | None = None) -> None:
        if deadline is None:
            deadline = time.monotonic() + self.start_timeout
        self._wait(
            "kube-apiserver",
            self.apiserver_url + "/readyz",
            deadline,
            tls=True,
            ctx=self.ssl_context(),
        )

    def _wait(
        self,
        name: str,
        url: str,
        deadline: float,
        *,
        tls: bool,
        ctx: ssl.SSLContext | None = None,
    ) -> None:
        if tls and ctx is None:
            # controller-manager/scheduler serve a self-signed cert from their --cert-dir on
            # 127.0.0.1; /healthz is always allowed there, so no verification is needed.
            ctx = ssl.create_default_context()
            ctx.check_hostname = False
            ctx.verify_mode = ssl.CERT_NONE
        last = ""
        while True:
            proc = self._procs.get(name)
            if proc is None or proc.poll() is not None:
                raise ControlPlaneError(
                    f"{name} exited (rc={proc.returncode if proc else None}); "
                    f"log tail:\n{self.log_tail(name)}"
                )
            try:
                with urllib.request.urlopen(url, timeout=2, context=ctx) as r:
                    if r.status == 200:
                        return
                    last = f"HTTP {r.status}"
            except urllib.error.HTTPError as e:
                last = f"HTTP {e.code}: {e.read()[:500]!r}"
            except (OSError, ssl.SSLError) as e:
                last = str(e)
            if time.monotonic() > deadline:
                raise ControlPlaneError(
                    f"{name} not ready at {url}: {last}; log tail:\n{self.log_tail(name)}"
                )
            time.sleep(0.2)

    def log_tail(self, name: str, lines: int = 30) -> str:
        path = self.workdir / "logs" / f"{name}.log"
        try:
            return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return "(no log)"
