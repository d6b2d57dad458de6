"""The real kubelet in a lab node (``rollout lab up --kubelet real``).

A real-kubelet node is an ordinary lab node (network, mount and UTS namespaces, real sshd, the
``systemctl`` shim, the distribution's files in the overlays) whose unit runs this module instead
of the simulated kubelet. At every (re)start of the unit it:

1. makes sure the node's fake container runtime (``fakecri``: the in-memory CRI runtime and image
   services of ``k8s.io/cri-client/pkg/fake``) and fake GPU device plugin (``fakedeviceplugin``,
   device plugin API v1beta1, ``nvidia.com/gpu``, each device on its NUMA node, health and
   lifecycle from files :mod:`rollout.lab.devicefaults` writes) are running;
2. reads the node's files the way the distribution's service does (:func:`kubelet_argv`: the flags
   files of :mod:`rollout.kubelet.distributions`, the config file, the drop-in directory), adds
   the lab's own flags (:data:`LAB_FLAGS`, last, so they win) and ``exec``\\ s the real kubelet.

The lab flags only switch off what cannot work without a container runtime, systemd or cgroup v2
on the lab machine. They are flags, not a config drop-in, so the files the tool under test renders,
lints and writes are exactly the node's files; ``/configz`` shows the flag values for those fields
(``docs/lab-real-kubelet.md`` lists them).

The node's hardware as the kubelet sees it (cadvisor reads ``/sys/devices/system/{cpu,node}``,
``/proc/cpuinfo`` and ``/proc/meminfo``) comes from trees generated here (:func:`hardware_tree`)
and bound over those paths inside the node's mount namespace only (:func:`holder_binds`). The
kernel tunables the kubelet sets at start (``vm.overcommit_memory``, ``kernel.panic``...) are
files bound over their ``/proc/sys`` paths in the same namespace, so its writes land in the node
directory and never on the host.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rollout import assets
from rollout.errors import LabError

# the node's machine (hardware trees, kernel tunables, GPUs) lives in rollout.lab.realhw

KINDS = ("sim", "real")
BINARIES = ("kubelet", "fakecri", "fakedeviceplugin")
CRI_SOCKET = "/var/lib/rollout-lab/cri.sock"
GPU_FILE = "/etc/rollout-lab/gpus.txt"
STATE_DIR = Path("/var/lib/rollout-lab")
#: the fake device plugin's lifecycle file (``rollout.lab.devicefaults``)
PLUGIN_STATE_FILE = str(STATE_DIR / "fakedeviceplugin.state")
#: the lab's DRA driver, its lifecycle file and pid file (``rollout.lab.daemonsets`` runs it)
DRIVER = "gpu.example.com"
DRIVER_STATE_FILE = str(STATE_DIR / "dradriver.state")
DRIVER_PID_FILE = str(STATE_DIR / "dradriver.pid")


def lab_flags(node_ip: str, labels: Mapping[str, str]) -> list[str]:
    """Flags the lab adds after the distribution's own (later flags win in the kubelet)."""
    return [
        f"--container-runtime-endpoint=unix://{CRI_SOCKET}",
        # the lab machine has swap accounting off, cgroup v1 and no systemd: the kubelet would
        # refuse to start or fail to create the QoS cgroups
        "--fail-swap-on=false",
        "--fail-cgroupv1=false",
        "--cgroups-per-qos=false",
        "--enforce-node-allocatable=",
        "--local-storage-capacity-isolation=false",
        # the API server checks the kubelet's serving cert against the lab CA
        "--tls-cert-file=/etc/rollout-lab/pki/kubelet-serving.crt",
        "--tls-private-key-file=/etc/rollout-lab/pki/kubelet-serving.key",
        f"--node-ip={node_ip}",
        "--node-labels=" + ",".join(f"{k}={v}" for k, v in sorted(labels.items())),
    ]


#: The KubeletConfiguration fields :func:`lab_flags` sets (they show in the real kubelet's
#: ``/configz``, and the simulated kubelet does not set them); kept beside the flags they come from.
LAB_FLAG_FIELDS = frozenset(
    {
        "containerRuntimeEndpoint",
        "failSwapOn",
        "failCgroupV1",
        "cgroupsPerQOS",
        "enforceNodeAllocatable",
        "localStorageCapacityIsolation",
        "tlsCertFile",
        "tlsPrivateKeyFile",
    }
)


#: flags the distribution's seeded files still carry but the lab's kubelet no longer knows (it would
#: exit with "unknown flag"); the distributions' own tools stopped writing them for these versions
REMOVED_FLAGS = ("--pod-infra-container-image",)


def current_flags(files: Mapping[str, str]) -> dict[str, str]:
    """The seeded node files with :data:`REMOVED_FLAGS` taken out of every flag, as kubeadm and
    the EKS bootstrap write them for the lab's kubelet version (kubelet 1.35 removed
    ``--pod-infra-container-image``; kubeadm stopped writing it before)."""
    pattern = re.compile(r"\s*(?:" + "|".join(map(re.escape, REMOVED_FLAGS)) + r")[= ][^\s\"']+")
    return {path: pattern.sub("", text) for path, text in files.items()}


# ------------------------------------------------------------------------------- versions
#: The kubelet versions ``rollout lab up --kubelet-version MINOR`` builds and runs: per minor, the
#: patch release the lab pins (each listed by the Go module proxy's ``go list -m -versions
#: k8s.io/kubernetes``). The lab's own minor maps to the control plane's version (a unit test
#: checks).
KUBELET_VERSIONS = {
    "1.34": "v1.34.4",
    "1.35": "v1.35.4",
    "1.36": "v1.36.3",
    "1.37": "v1.37.2",
}
#: The Kubernetes version skew policy: a kubelet may be up to this many minor versions older than
#: kube-apiserver, and never newer.
MAX_KUBELET_SKEW = 3


def _minor(version: str) -> int:
    m = re.fullmatch(r"v?1\.(\d+)(?:\.\d+)?", version.strip())
    if not m:
        raise LabError(f"not a Kubernetes version: {version!r}")
    return int(m.group(1))


def kubelet_version(spec: str | None, control_plane: str, *, simulated: bool = False) -> str:
    """The full kubelet version for ``--kubelet-version SPEC`` (``1.35``, ``v1.35`` or the pinned
    ``v1.35.4``) against a control plane of version ``control_plane``; ``None``: the control
    plane's own version. Raises :class:`LabError`, before anything is built or started, for a
    version the lab does not build or one the skew policy forbids.

    ``simulated``: for the simulated kubelet, which plays a version's node-side behaviour (its
    flags, config checks and checkpoint files) and builds nothing; it may be newer than the
    control plane (so that 1.37 can be played against the lab's own control plane), but not
    more than :data:`MAX_KUBELET_SKEW` minors older."""
    if spec is None or not spec.strip():
        return control_plane
    valid = ", ".join(KUBELET_VERSIONS)
    m = re.fullmatch(r"v?(1\.\d+)(\.\d+)?", spec.strip())
    full = KUBELET_VERSIONS.get(m.group(1)) if m else None
    if full is None or (m and m.group(2) and "v" + m.group(1) + m.group(2) != full):
        raise LabError(
            f"unknown kubelet version {spec!r}; the lab builds {valid} "
            f"({', '.join(KUBELET_VERSIONS.values())})"
        )
    k, cp = _minor(full), _minor(control_plane)
    if k > cp and not simulated:
        raise LabError(
            f"kubelet {full} is newer than the lab's control plane {control_plane}: the Kubernetes "
            "version skew policy never allows a kubelet newer than kube-apiserver (it may be up "
            f"to {MAX_KUBELET_SKEW} minor versions older); the lab's control plane is always "
            f"{control_plane} (tools/k8sbin/K8S_VERSION), so choose 1.{cp} or older"
        )
    if cp - k > MAX_KUBELET_SKEW:
        raise LabError(
            f"kubelet {full} is {cp - k} minor versions older than the lab's control plane "
            f"{control_plane}: the Kubernetes version skew policy allows at most "
            f"{MAX_KUBELET_SKEW}"
        )
    return full


# ------------------------------------------------------------------------------- build
def _cache() -> Path:
    return Path(os.environ.get("ROLLOUT_LAB_CACHE") or Path.home() / ".cache" / "rollout-lab")


def lab_version() -> str:
    """The lab's Kubernetes version (the control plane's; ``tools/k8sbin/K8S_VERSION``)."""
    return (assets.lab_tools() / "k8sbin" / "K8S_VERSION").read_text().strip()


def find_kubelet_bin_dir(version: str | None = None) -> Path:
    """For the lab's version (the default): ``$ROLLOUT_LAB_KUBELET_BIN``, else the version-keyed
    dir ``tools/build-lab-kubelet.sh`` fills (``${ROLLOUT_LAB_CACHE:-~/.cache/rollout-lab}/
    kubelet-<version>/bin``); for another ``version``, always its cache dir."""
    own = lab_version()
    version = version or own
    env = os.environ.get("ROLLOUT_LAB_KUBELET_BIN")
    if env and version == own:
        return Path(env)
    return _cache() / f"kubelet-{version}" / "bin"


def missing(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def build(progress: Any = lambda _m: None, version: str | None = None) -> Path:
    """Build (or reuse) the real kubelet of ``version`` (default: the lab's) and the node fakes;
    returns their bin dir."""
    script = assets.lab_tools() / "build-lab-kubelet.sh"
    version = version or lab_version()
    progress(f"real kubelet {version}: tools/build-lab-kubelet.sh (builds once per version)")
    proc = subprocess.run(
        ["bash", str(script), version], capture_output=True, text=True, check=False
    )
    if proc.returncode != 0:
        raise LabError(f"{script} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    bin_dir = Path(proc.stdout.strip().splitlines()[-1])
    if missing(bin_dir):
        raise LabError(f"{bin_dir}: missing {', '.join(missing(bin_dir))} after the build")
    return bin_dir


def unit(
    node_unit: str,
    bin_dir: Path,
    fragment: str,
    drop_ins: Sequence[str],
    dra_bin_dir: Path | None = None,
) -> dict[str, Any]:
    """The node's units.json entry: this module as the unit's command (``dra_bin_dir``: the DRA
    driver's bin dir, for :mod:`rollout.lab.daemonsets`)."""
    pythonpath = os.pathsep.join(
        p for p in (str(assets.import_root()), os.environ.get("PYTHONPATH")) if p
    )
    return {
        node_unit: {
            "execStart": [
                sys.executable,
                "-m",
                "rollout.lab.realnode",
                "--node-config",
                "/etc/rollout-lab/node.json",
                "--bin-dir",
                str(bin_dir),
                *(["--dra-bin-dir", str(dra_bin_dir)] if dra_bin_dir else []),
            ],
            "log": "/var/log/kubelet.log",
            "restartSec": 1.0,
            "description": f"real kubelet ({node_unit}.service, lab)",
            "fragmentPath": fragment,
            "dropInPaths": list(drop_ins),
            "environment": {"PYTHONPATH": pythonpath, "PYTHONUNBUFFERED": "1"},
        }
    }


# ------------------------------------------------------------------------------- command line
def kubelet_argv(cfg: Mapping[str, Any], bin_dir: Path, root: Path = Path("/")) -> list[str]:
    """The kubelet's command line as the distribution's service builds it from the node's files
    under ``root``, plus :func:`lab_flags`."""
    from rollout.kubelet import distributions, loading

    dist = distributions.get(str(cfg["distribution"]))
    files = loading.load_node(dist, root)
    flags = loading.node_flags(files)
    names = {f.name for f in flags}
    argv = [str(bin_dir / "kubelet")]
    if (
        dist.config_file
        and "config" not in names
        and (root / dist.config_file.lstrip("/")).exists()
    ):
        argv.append(f"--config={dist.config_file}")
    if dist.dropin_dir and dist.dropin_always and "config-dir" not in names:
        argv.append(f"--config-dir={dist.dropin_dir}")
    if "kubeconfig" not in names:
        argv.append(f"--kubeconfig={cfg['kubeconfig']}")
    if "root-dir" not in names and cfg.get("rootDir", "/var/lib/kubelet") != "/var/lib/kubelet":
        argv.append(f"--root-dir={cfg['rootDir']}")
    argv += [f"--{f.name}={f.value}" for f in flags]
    argv += lab_flags(str(cfg["nodeIP"]), cfg.get("labels") or {})
    return argv


# ------------------------------------------------------------------------------- unit command
def _alive(pidfile: Path, exe: Path) -> bool:
    try:
        pid = int(pidfile.read_text().strip())
        return Path(f"/proc/{pid}/exe").resolve() == exe.resolve()
    except (OSError, ValueError):
        return False


def _ensure(name: str, argv: list[str], ready: Path | None) -> None:
    """Start ``argv`` detached unless the process recorded in its pid file still runs."""
    pidfile = STATE_DIR / f"{name}.pid"
    if not _alive(pidfile, Path(argv[0])):
        STATE_DIR.mkdir(parents=True, exist_ok=True)
        with open(f"/var/log/rollout-lab-{name}.log", "ab") as log:
            p = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        pidfile.write_text(f"{p.pid}\n")
    deadline = time.monotonic() + 10
    while ready is not None and not ready.exists():
        if time.monotonic() > deadline:
            raise LabError(f"{name} did not create {ready} within 10s")
        time.sleep(0.05)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="rollout.lab.realnode", description=__doc__)
    ap.add_argument("--node-config", required=True, type=Path)
    ap.add_argument("--bin-dir", required=True, type=Path)
    ap.add_argument("--dra-bin-dir", type=Path, default=None)
    ap.add_argument("--print", action="store_true", help="print the kubelet command, run nothing")
    a = ap.parse_args(argv)
    cfg = json.loads(a.node_config.read_text())
    cmd = kubelet_argv(cfg, a.bin_dir)
    if a.print:
        print(json.dumps(cmd))
        return 0
    _ensure(
        "fakecri", [str(a.bin_dir / "fakecri"), f"-listen=unix://{CRI_SOCKET}"], Path(CRI_SOCKET)
    )
    plugin_dir = str(cfg.get("rootDir") or "/var/lib/kubelet").rstrip("/") + "/device-plugins"
    _ensure(
        "fakedeviceplugin",
        [
            str(a.bin_dir / "fakedeviceplugin"),
            f"-plugin-dir={plugin_dir}",
            f"-devices-file={GPU_FILE}",
            f"-state-file={PLUGIN_STATE_FILE}",
        ],
        None,
    )
    if a.dra_bin_dir is not None:
        # the node's "DaemonSets": the device plugin and the DRA driver follow the Node's labels
        _ensure(
            "daemonsets",
            [
                sys.executable,
                "-m",
                "rollout.lab.daemonsets",
                "--node-config",
                str(a.node_config),
                "--dra-bin-dir",
                str(a.dra_bin_dir),
            ],
            None,
        )
    # The kubelet's working directory must be an empty directory of the node's own: its container
    # log cleanup globs "<CRI log path>*", and the fake CRI reports an empty log path, so the glob
    # is "*" relative to the working directory; from "/" (the shim's) that unlinked the host's
    # /bin symlink on every container removal (the first entry; "dev" then stopped it).
    cwd = STATE_DIR / "kubelet-cwd"
    cwd.mkdir(parents=True, exist_ok=True)
    os.chdir(cwd)
    print("rollout lab: exec " + " ".join(cmd), file=sys.stderr, flush=True)
    os.execv(cmd[0], cmd)
    return 0  # pragma: no cover


if __name__ == "__main__":
    raise SystemExit(main())
