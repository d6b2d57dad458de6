"""Building the lab's binaries (control plane, kwok, monitoring) with the shipped scripts, and the
check of a lab's kubelet kind and version before anything starts."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable
from pathlib import Path

from rollout import assets
from rollout.errors import LabError
from rollout.lab import kwok, realnode
from rollout.lab import monitoring as mon
from rollout.lab.binaries import find_bin_dir, missing_binaries

Progress = Callable[[str], None]


def _run_build(script_name: str, progress: Progress) -> Path:
    """Run one of the shipped build scripts, passing its lines to ``progress``; returns the bin
    dir it prints last."""
    script = assets.lab_tools() / script_name
    proc = subprocess.Popen(
        ["bash", str(script)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    last = ""
    assert proc.stdout is not None
    with proc.stdout:
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


def build_kwok(progress: Progress) -> Path:
    """Build or reuse kwok (``tools/build-lab-kwok.sh``); returns its bin dir."""
    d = kwok.find_kwok_bin_dir()
    if os.access(d / "kwok", os.X_OK):
        return d
    progress(f"building kwok {kwok.KWOK_VERSION} into {d} (first time only; takes a few minutes)")
    got = _run_build("build-lab-kwok.sh", progress)
    if not os.access(got / "kwok", os.X_OK):
        raise LabError(f"tools/build-lab-kwok.sh ended without a kwok binary in {got}")
    return got


def check_kubelet(kubelet: str, kubelet_version: str | None, control_plane: str) -> str | None:
    """The full kubelet version a lab node runs (``None``: the simulated kubelet at the control
    plane's version); raises :class:`LabError` for an unknown kind, an unknown version or one
    the version skew policy forbids (:func:`realnode.kubelet_version`; the simulated kubelet
    may be newer than the control plane, as it plays only the node's side)."""
    if kubelet not in realnode.KINDS:
        raise LabError(f"unknown kubelet {kubelet!r}; valid: {', '.join(realnode.KINDS)}")
    if kubelet != "real":
        if not kubelet_version:
            return None
        return realnode.kubelet_version(kubelet_version, control_plane, simulated=True)
    return realnode.kubelet_version(kubelet_version, control_plane)
