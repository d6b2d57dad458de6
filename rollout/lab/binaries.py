"""Which control-plane binaries the lab runs, at which versions, and where they are found.

Why apart from :mod:`rollout.lab.controlplane`: the lab's test fixtures, ``lab up``, the
installed-wheel test and the benchmarks ask "are the binaries there?" without starting anything;
the versions are also checked against the build script's (``tools/k8sbin``, ``tools/etcdbin``).
"""

from __future__ import annotations

import os
from pathlib import Path

# Must match tools/k8sbin/K8S_VERSION and tools/etcdbin/ETCD_VERSION (a test checks it).
K8S_VERSION = "v1.36.3"
ETCD_VERSION = "v3.6.8"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def find_bin_dir() -> Path:
    """Where the lab binaries are: ``$ROLLOUT_LAB_BIN``, else ``$KUBEBUILDER_ASSETS``, else the
    version-keyed cache dir that ``tools/build-lab-binaries.sh`` fills
    (``${ROLLOUT_LAB_CACHE:-~/.cache/rollout-lab}/k8s-<ver>-etcd-<ver>/bin``). The directory may
    not exist or be incomplete: check with :func:`missing_binaries`."""
    for var in ("ROLLOUT_LAB_BIN", "KUBEBUILDER_ASSETS"):
        if os.environ.get(var):
            return Path(os.environ[var])
    cache = Path(os.environ.get("ROLLOUT_LAB_CACHE") or Path.home() / ".cache" / "rollout-lab")
    return cache / f"k8s-{K8S_VERSION}-etcd-{ETCD_VERSION}" / "bin"


def missing_binaries(bin_dir: Path) -> list[str]:
    """Names of the control-plane binaries that ``bin_dir`` lacks."""
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]
