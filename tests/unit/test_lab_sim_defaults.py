"""The sim's /configz defaulting against a /configz the real kubelet v1.36.3 served for the same
kubeadm node files (``tests/fixtures/kubelet/configz-*.json``, captured from a lab with one sim and
one real node). What still differs is exactly the documented list (docs/lab-real-kubelet.md)."""

from __future__ import annotations

import json
from pathlib import Path

from rollout.kubelet import loading
from rollout.lab.kubelet.defaults import _seconds, defaulted
from rollout.lab.realnode import LAB_FLAG_FIELDS

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet"


def _load(name: str) -> dict:
    return json.loads((FIX / name).read_text())["kubeletconfig"]


def test_defaulted_sim_configz_matches_the_real_kubelets() -> None:
    merged = _load("configz-sim-merged-kubeadm.json")
    # captured before the model's default evictionHard gained imagefs.inodesFree (the kubelet's
    # DefaultEvictionHard has five thresholds): the merged files now carry the model's default
    assert "imagefs.inodesFree" not in merged["evictionHard"]
    merged["evictionHard"] = loading.DEFAULTS["evictionHard"]
    sim = defaulted(merged)
    real = _load("configz-real-v1.36.3-kubeadm.json")
    differ = {k for k in set(sim) | set(real) if sim.get(k) != real.get(k)}
    # cgroupDriver comes from the (fake) CRI in the real kubelet
    assert differ == LAB_FLAG_FIELDS | {"cgroupDriver"}, differ
    # what those fields would be without the lab flags: the kubelet's defaults
    assert sim["failSwapOn"] is True and sim["cgroupsPerQOS"] is True
    assert sim["enforceNodeAllocatable"] == ["pods"]


def test_explicit_values_and_pointer_zeros_are_kept() -> None:
    cfg = {
        "syncFrequency": "30s",
        "nodeStatusUpdateFrequency": "4s",
        "imageGCHighThresholdPercent": 0,  # a pointer: an explicit 0 stays
        "maxPods": 0,  # not a pointer: 0 is unset
        "cpuManagerPolicy": "static",
        "featureGates": {"KubeletCrashLoopBackOffMax": False},
        "maxParallelImagePulls": 5,
    }
    out = defaulted(cfg)
    assert out["syncFrequency"] == "30s"
    assert out["nodeStatusReportFrequency"] == "4s"  # follows an explicit update frequency
    assert out["imageGCHighThresholdPercent"] == 0 and out["maxPods"] == 110
    assert out["cpuManagerPolicy"] == "static"
    assert "crashLoopBackOff" not in out  # its gate is off
    assert out["serializeImagePulls"] is False
    assert cfg == {**cfg} and "apiVersion" not in cfg  # the input is not changed


def test_go_durations() -> None:
    assert _seconds("0s") == 0 and _seconds("1m30s") == 90 and _seconds("100ms") == 0.1
    assert _seconds("4h0m0s") == 14400 and _seconds("10Mi") is None
