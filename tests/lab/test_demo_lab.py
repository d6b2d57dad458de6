"""The README's main job, ``scripts/demo``, run as a newcomer runs it, end to end.

The demo starts its own lab (a control plane of its own, 4 nodes running the real kubelet on
the fake runtime), deploys the GPU workload, applies the canary with ``--recreate-probes`` and
prints the report's evidence checks. This test holds it to what it shows: every collection is
collected from the real kubelet's podresources API and passes, ``before`` says why NUMA placement
is not judged under ``none`` (and where the pods sit), and ``after-recreate`` judges a pod the
changed kubelet admitted: its GPU by ID, on the NUMA node of its exclusive CPU, podresources
agreeing with the checkpoints. Runtime: about 2 minutes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rollout.change.record.journal import Journal
from rollout.lab.binaries import find_bin_dir, missing_binaries
from rollout.lab.realnode import find_kubelet_bin_dir, missing
from tests.lab.conftest import IN_CI

pytestmark = pytest.mark.lab

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def demo_env(tmp_path: Path) -> dict[str, str]:
    absent = missing_binaries(find_bin_dir()) + missing(find_kubelet_bin_dir())
    if absent:
        msg = f"lab binaries missing: {absent}; run scripts/setup"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update(DEMO_NAME=f"demo{os.getpid()}", ROLLOUT_STATE_DIR=str(tmp_path / "state"))
    for k in ("KUBECONFIG", "ROLLOUT_INVENTORY", "ROLLOUT_PLAN", "ROLLOUT_KUBECONFIG"):
        env.pop(k, None)
    return env


def _demo(env: dict[str, str], *args: str, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROOT / "scripts" / "demo"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.timeout(720)
def test_the_demo_shows_the_evidence_on_real_kubelets(demo_env: dict[str, str]) -> None:
    try:
        run = _demo(demo_env, timeout=600)
    finally:
        down = _demo(demo_env, "down", timeout=120)
    out = run.stdout + run.stderr
    assert run.returncode == 0, out[-5000:]
    assert down.returncode == 0, down.stderr[-2000:]
    assert "--kubelet real" in out, out[:2000]
    for label in ("before", "after", "after-recreate"):
        assert f"evidence {label}: pass" in out, out[-5000:]
    assert "not-collected" not in out, out[-5000:]

    (change,) = (Path(demo_env["ROLLOUT_STATE_DIR"]) / "changes").iterdir()
    journal = Journal(change, change.name)
    collected = {e.data["label"]: e.data for e in journal.entries() if e.step == "evidence"}
    assert list(collected) == ["before", "after", "after-recreate"], collected
    checks = {
        (label, c["name"]): c for label, d in collected.items() for c in d.get("checks") or ()
    }
    assert all(d["overall"] == "pass" for d in collected.values()), collected

    # before: the node under `none` admits any placement; the workload's GPU pod is listed
    numa = checks[("before", "numa-aligned")]
    assert numa["status"] == "not-judged", numa
    assert "topologyManagerPolicy none" in numa["summary"], numa
    # after: the drained canary runs no pod: nothing to compare, said so, never a pass
    agree = checks[("after", "podresources-matches-checkpoint")]
    assert agree["status"] == "not-judged" and agree["checked"] == 0, agree
    # after-recreate: every check judged the probe the changed kubelet admitted
    for name in (
        "allocatable-matches-healthy",
        "unique-device-ids",
        "numa-aligned",
        "podresources-matches-checkpoint",
    ):
        c = checks[("after-recreate", name)]
        assert c["status"] == "pass" and c["checked"] >= 1, c
    (placed,) = checks[("after-recreate", "numa-aligned")]["notes"]
    assert "rollout-device-" in placed and "nvidia.com/gpu GPU-" in placed, placed
    assert placed.count("NUMA ") == 1 and ": cpu " in placed, placed  # CPU and GPU together

    # the kubelet's own account: podresources (only the real kubelet serves it)
    doc = json.loads((change / "evidence.json").read_text())
    for col in doc["collections"]:
        for node, d in col["nodes"].items():
            assert d["deviceSource"] == d["healthySource"] == "podresources", (node, d)
    # the demo prints the report's evidence table
    assert "| after-recreate | numa-aligned | pass |" in run.stdout, run.stdout[-3000:]
