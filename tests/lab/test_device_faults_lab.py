"""Device faults on the real kubelet, through the CLI (``rollout lab fault``), and what the tool
makes of them.

One small lab for the module: two real-kubelet kubeadm nodes (the canary and one more), 8 GPUs
each from the fake device plugin. In file order:

* one GPU marked unhealthy: the real kubelet takes it out of allocatable (capacity keeps it) and
  out of ``RegisteredDevices`` in its checkpoint; ``rollout evidence`` then passes
  ``allocatable-matches-healthy`` (7 = 7) and names the unhealthy device, where the old check
  (against the 8 PCI functions) failed; ``rollout apply --canary`` refuses the canary, naming
  it and the cause; the GPU healthy again, allocatable is 8.
* the plugin stopped: allocatable 0 of 8; ``apply --canary`` refuses (exit 3) naming the node,
  nothing is written and nothing cordoned; ``--force REASON --dry-run`` goes past the refusal
  and says it was forced; the plugin started and restarted, it registers again and all 8 are
  back.
* a DeviceClass with ``spec.extendedResourceName: nvidia.com/gpu`` over a DRA driver that
  publishes a ResourceSlice for the canary, whose device plugin advertises ``nvidia.com/gpu``:
  ``apply --canary`` refuses naming node, class and driver (the older check by vendor domain
  let driver ``gpu.example.com`` pass); with ``--force`` it goes on and warns that DRA devices get
  no Topology Manager hints.
* the plugin stopped while ``apply --canary`` restarts the canary's kubelet: the node stays
  cordoned, its verify waiting, until the plugin registers again and all 8 GPUs are back; then it
  is uncordoned and applied, and its 'after' evidence passes. Rolled back at the end.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.kubelet.device_checkpoint import DEVICE_CHECKPOINT_FILE, parse_device
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab]
GPU = "nvidia.com/gpu"


@pytest.fixture(scope="module")
def real(lab: Lab) -> Iterator[list[str]]:
    names = ["df-real-1", "df-real-2"]
    lab.machines.add_nodes(names, ["kubeadm"], kubelet="real", timeout=120)
    try:
        yield names
    finally:
        lab.machines.remove_nodes(names)


def _fault(lab: Lab, env: dict[str, str], *args: str) -> dict[str, Any]:
    where = ["--name", lab.name, "--workdir", str(lab.dir), "-o", "json"]
    r = ck.cli(["lab", "fault", *args, *where], env, timeout=120)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


def _counts(lab: Lab, node: str) -> tuple[str, str]:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    st = body["status"]
    return str(st["capacity"].get(GPU)), str(st["allocatable"].get(GPU))


def _registered(lab: Lab, node: str) -> set[str]:
    text = (lab.machines.node_root(node) / "var/lib/kubelet" / DEVICE_CHECKPOINT_FILE).read_text()
    return set((parse_device(text).registered or {}).get(GPU) or ())


def _setup(lab: Lab, real: list[str], tmp: Path) -> tuple[Path, Path, dict[str, str]]:
    inv = ck.inventory(lab, real, real[:1], tmp / "inv.ini")
    plan = ck.plan(tmp / "plan.yaml", dict.fromkeys(real, "kubeadm"))
    return inv, plan, ck.env(lab, tmp / "state")


@pytest.mark.timeout(420)
def test_an_unhealthy_gpu_leaves_allocatable_and_the_evidence_names_it(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    started = time.monotonic()
    canary = real[0]
    inv, plan, env = _setup(lab, real, tmp_path)
    evidence = tmp_path / "evidence.json"
    before = ck.cli(["evidence", "--label", "before", "-i", str(inv), "--out", str(evidence)], env)
    assert before.returncode == 0, before.stderr
    assert len(_registered(lab, canary)) == 8

    got = _fault(lab, env, "device-unhealthy", canary, "GPU-3")
    assert (got["capacity"], got["allocatable"], got["changed"]) == (8, 7, ["GPU-3"])
    assert _counts(lab, canary) == ("8", "7")
    # the real kubelet's device manager wrote its healthy set without GPU-3
    ck.wait_for(lambda: "GPU-3" not in _registered(lab, canary), 30, "RegisteredDevices")
    assert len(_registered(lab, canary)) == 7

    after = ck.cli(
        ["evidence", "--label", "after", "-i", str(inv), "--out", str(evidence), "-o", "json"],
        env,
    )
    assert after.returncode == 0, after.stderr
    checks = {c["name"]: c for c in json.loads(after.stdout)["checks"]}
    alloc = checks["allocatable-matches-healthy"]
    assert alloc["status"] == "pass", alloc
    assert (
        f"{canary}: 1 {GPU} device(s) unhealthy (capacity 8, allocatable 7): GPU-3"
        in alloc["notes"]
    ), alloc
    node = json.loads(after.stdout)["collection"]["nodes"][canary]
    assert node["healthyDevices"] == {GPU: 7} and node["pciGpus"] == {GPU: 8}, node

    r = ck.cli(["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes"], env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert f"node {canary}: advertises 7 of 8 {GPU}" in r.stderr, r.stderr
    assert not (tmp_path / "state").exists()

    back = _fault(lab, env, "device-healthy", canary, "GPU-3")
    assert (back["capacity"], back["allocatable"]) == (8, 8)
    print(f"unhealthy GPU, evidence, refusal, healthy again: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(420)
def test_a_stopped_device_plugin_is_refused_by_preflight_naming_the_node(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    started = time.monotonic()
    canary, other = real
    inv, plan, env = _setup(lab, real, tmp_path)
    files = {n: ck.snapshot(lab, n) for n in real}

    stopped = _fault(lab, env, "plugin-stop", canary)
    assert (stopped["state"], stopped["allocatable"]) == ("stopped", 0)
    assert _counts(lab, canary) == ("8", "0")  # the kubelet holds all 8, unhealthy
    assert _counts(lab, other) == ("8", "8")

    r = ck.cli(["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes"], env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    assert f"node {canary}: advertises 0 of 8 {GPU}" in r.stderr, r.stderr
    assert "--force REASON" in r.stderr
    assert other not in r.stderr.split("preflight refused the change")[-1]
    assert not (tmp_path / "state").exists()  # no journal, nothing written
    assert {n: ck.snapshot(lab, n) for n in real} == files
    assert not ck.unschedulable(lab, canary)

    why = ["--force", "lab: plugin down on purpose"]
    forced = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--dry-run", *why], env
    )
    assert forced.returncode == 0, forced.stderr[-3000:]
    assert f"warning: forced (--force): node {canary}: advertises 0 of 8" in forced.stderr

    started_again = _fault(lab, env, "plugin-start", canary)
    assert started_again["allocatable"] == 8 and started_again["changed"] is True
    log = lab.machines.node_root(canary) / "var/log/rollout-lab-fakedeviceplugin.log"
    registrations = log.read_text().count("fakedeviceplugin: registered ")
    restarted = _fault(lab, env, "plugin-restart", canary)
    assert restarted["allocatable"] == 8
    assert log.read_text().count("fakedeviceplugin: registered ") == registrations + 1
    print(f"plugin stop, refusal, force, start, restart: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(300)
def test_one_resource_from_a_device_plugin_and_a_dra_device_class_is_refused(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    canary = real[0]
    inv, plan, env = _setup(lab, real, tmp_path)
    driver = "gpu.example.com"
    klass = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "df-gpu"},
        "spec": {
            "extendedResourceName": GPU,
            "selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}],
        },
    }
    rs = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{canary}-df"},
        "spec": {
            "driver": driver,
            "nodeName": canary,
            "pool": {"name": canary, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }
    base = "/apis/resource.k8s.io/v1"
    code, body = lab.api.request("POST", f"{base}/deviceclasses", klass)
    assert code == 201, body
    try:
        # the API server keeps the field (DRAExtendedResource is on in the lab's v1.36)
        assert body["spec"].get("extendedResourceName") == GPU, body
        code, body = lab.api.request("POST", f"{base}/resourceslices", rs)
        assert code == 201, body
        args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--dry-run"]
        r = ck.cli(args, env)
        assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
        assert f"node {canary}: {GPU} is served by a device plugin (capacity 8) and by DRA" in (
            r.stderr
        ), r.stderr
        assert f"DeviceClass df-gpu has spec.extendedResourceName {GPU} and driver(s) {driver}" in (
            r.stderr
        )
        forced = ck.cli([*args, "--force", "lab: both paths on purpose"], env)
        assert forced.returncode == 0, forced.stderr[-3000:]
        assert f"warning: forced (--force): node {canary}: {GPU} is served" in forced.stderr
        assert f"warning: node {canary}: devices of DRA driver(s) {driver} are DRA-managed" in (
            forced.stderr
        )
    finally:
        lab.api.request("DELETE", f"{base}/resourceslices/{canary}-df")
        lab.api.request("DELETE", f"{base}/deviceclasses/df-gpu")


@pytest.mark.timeout(420)
def test_a_node_is_not_uncordoned_until_its_gpus_are_back_after_the_restart(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    started = time.monotonic()
    canary = real[0]
    inv, plan, env = _setup(lab, real, tmp_path)
    state = tmp_path / "state"
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    proc = ck.start_cli([*args, "--verify-timeout", "180"], env)
    try:
        ck.wait_for(lambda: ck.journal_has(state, canary, "apply", "begin"), 120, "apply begin")
        _fault(lab, env, "plugin-stop", canary)  # the restarted kubelet finds no plugin
        ck.wait_for(lambda: ck.journal_has(state, canary, "verify", "begin"), 120, "verify begin")
        time.sleep(8)  # several verify rounds without the GPUs
        assert proc.poll() is None, proc.communicate()
        assert ck.unschedulable(lab, canary), "uncordoned without its GPUs"
        assert not ck.journal_has(state, canary, "verify", "done")
        assert _counts(lab, canary)[1] == "0"
        back = _fault(lab, env, "plugin-start", canary)
        assert back["allocatable"] == 8
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err[-3000:]
    doc = json.loads(out)
    assert {n["node"]: n["state"] for n in doc["nodes"]}[canary] == "applied", doc
    assert not ck.unschedulable(lab, canary)
    assert doc["evidence"]["after"]["overall"] != "fail", doc["evidence"]
    r = ck.cli(["rollback", "--change", doc["change"], "--yes"], env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _counts(lab, canary) == ("8", "8")
    print(f"plugin stopped across the restart, verify waited: {time.monotonic() - started:.1f}s")
