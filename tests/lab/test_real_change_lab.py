"""The change suite on the real kubelet (``--kubelet real``), through the CLI.

One small lab for the whole module: two real-kubelet kubeadm nodes (the canary and one node the
canary apply must leave alone), on the session's control plane. In file order:

* ``apply --canary`` of the static CPU manager (reserving 0,32) with ``single-numa-node`` at pod
  scope: the canary's real kubelet runs it (``/configz``), writes its own ``cpu_manager_state``
  (policy ``static``) after the tool reset the ``none`` one; the gate gets its admissions from
  probe pods the real kubelet admits and says Successful; the other node is untouched. Then
  ``rollback``: every watched file byte for byte as before, the kubelet back on ``none`` with a
  ``none`` checkpoint, no cordon left.
* a config the real kubelet refuses to start with (image GC thresholds the wrong way round, which
  the tool's own model does not check): the apply fails at the kubelet's ``/healthz`` wait, the
  error quotes the kubelet's logged reason, and the node is restored automatically, byte for byte.

Each node keeps the previous test's state, so the order matters; each test restores what it
changed and checks it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.kubelet import checkpoints as kc
from rollout.kubelet.cpuset import parse as cpus
from rollout.lab.cluster import Lab
from rollout.lab.inventory import LAB_INTENT
from rollout.lab.network import netns_pids
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab]

WANT = {
    "cpuManagerPolicy": "static",
    "reservedSystemCPUs": "0,32",
    "topologyManagerPolicy": "single-numa-node",
    "topologyManagerScope": "pod",
}
# the real kubelet's words (k8s.io/kubernetes pkg/kubelet/apis/config/validation)
GC_REFUSAL = (
    "invalid configuration: imageGCLowThresholdPercent (--image-gc-low-threshold) 60 must be "
    "less than imageGCHighThresholdPercent (--image-gc-high-threshold) 40"
)
STARTED = time.monotonic()


@pytest.fixture(scope="module")
def real(lab: Lab) -> Iterator[list[str]]:
    """Two real-kubelet kubeadm nodes for the whole module."""
    names = ["rc-real-1", "rc-real-2"]
    t0 = time.monotonic()
    lab.machines.add_nodes(names, ["kubeadm"], kubelet="real", timeout=120)
    print(f"\n2 real-kubelet nodes Ready in {time.monotonic() - t0:.1f}s")
    try:
        yield names
    finally:
        lab.machines.remove_nodes(names)
        print(f"test_real_change_lab.py wall time: {time.monotonic() - STARTED:.1f}s")


def _inventory(lab: Lab, names: list[str], path: Path, healthz_retries: int) -> Path:
    """The canary group is the first node. The real kubelet answers /healthz a few seconds after
    it starts (longer on a loaded machine): the wait is ``healthz_retries`` x 1 s."""
    inv = ck.inventory(lab, names, names[:1], path)
    text = inv.read_text().replace(
        ck.FAST_VARS,
        f"rollout_kubelet_healthz_retries={healthz_retries}\nrollout_kubelet_healthz_delay=1\n",
    )
    inv.write_text(text)
    return inv


def _plan(path: Path, names: list[str], extra: list[str], gate: dict[str, Any] | None) -> Path:
    ck.plan(path, dict.fromkeys(names, "kubeadm"))
    text = path.read_text()
    assert "\n".join(LAB_INTENT) in text
    text = text.replace("\n".join(LAB_INTENT), "\n".join([*LAB_INTENT, *extra]))
    if gate:
        text += "gate:\n" + "".join(f"  {k}: {json.dumps(v)}\n" for k, v in gate.items())
    path.write_text(text)
    return path


def _cpu_state(lab: Lab, node: str) -> kc.CPUCheckpoint | None:
    p = lab.machines.node_root(node) / "var/lib/kubelet" / kc.CPU_STATE_FILE
    try:
        return kc.parse_cpu(p.read_text())
    except (OSError, ValueError):
        return None


def _records(state: Path, kind: str) -> list[Any]:
    j = ck.latest_journal(state)
    assert j is not None
    return [e for e in j.entries() if e.step == kind]


def _exe(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return ""


def _kubelet_version(lab: Lab, node: str) -> str:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    return str(body["status"]["nodeInfo"]["kubeletVersion"])


@pytest.mark.timeout(420)
def test_real_canary_apply_gated_by_probes_then_rollback_byte_for_byte(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    started = time.monotonic()
    canary, other = real
    # the real kubelet binary, not the sim: its version string comes from the build's ldflags
    assert _kubelet_version(lab, canary) == str(lab.api.version()["gitVersion"])
    assert (
        "rollout.lab.realnode"
        in (lab.machines.node_root(canary) / "etc/rollout-lab/units.json").read_text()
    )
    first = ck.wait_for(lambda: _cpu_state(lab, canary), 60, "the first cpu_manager_state")
    assert first.policy_name == "none"
    inv = _inventory(lab, real, tmp_path / "inv.ini", healthz_retries=90)
    gate = {
        "soak": "6s",
        "window": "60s",
        "interval": "1s",
        "threshold": "5%",
        "minAdmissions": 3,
        "baseline": "none",
        "probes": True,
    }
    plan = _plan(tmp_path / "plan.yaml", real, [], gate)
    state = tmp_path / "state"
    env = ck.env(lab, state)
    before = {n: ck.snapshot(lab, n) for n in real}

    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"],
        env,
        timeout=360,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-4000:])
    out = json.loads(r.stdout)
    assert {n["node"]: n["state"] for n in out["nodes"]} == {canary: "applied", other: "pending"}
    cfg = ck.configz(lab, canary)
    assert {k: cfg.get(k) for k in WANT} == WANT
    # the tool removed the "none" checkpoint; the real kubelet wrote its own under static
    st = ck.wait_for(
        lambda: (s := _cpu_state(lab, canary)) and s.policy_name == "static" and s,
        60,
        "the static cpu_manager_state",
    )
    assert {0, 32} <= cpus(st.default_cpu_set)  # the reserved CPUs stay in the shared pool
    # the gate: probes admitted by the real kubelet, one Successful verdict, no rollback
    (verdict,) = _records(state, "verdict")
    assert verdict.data["outcome"] == "Successful", verdict.data
    assert not _records(state, "trigger")
    assert not ck.unschedulable(lab, canary)
    assert ck.snapshot(lab, other) == before[other]  # the rest untouched
    assert ck.configz(lab, other).get("cpuManagerPolicy") == "none"

    r = ck.cli(["rollback", "--change", out["change"], "--yes", "-o", "json"], env, timeout=300)
    assert r.returncode == 0, (r.returncode, r.stderr[-4000:])
    st2 = {n["node"]: n["state"] for n in json.loads(r.stdout)["nodes"]}
    assert st2[canary] == "restored", st2
    for n in real:
        assert ck.snapshot(lab, n) == before[n], n  # byte for byte
    assert ck.configz(lab, canary).get("cpuManagerPolicy") == "none"
    back = ck.wait_for(
        lambda: (s := _cpu_state(lab, canary)) and s.policy_name == "none" and s,
        60,
        "the none cpu_manager_state again",
    )
    assert back.policy_name == "none"
    assert not ck.unschedulable(lab, canary)
    lab.machines.wait_ready(real, timeout=60)
    print(f"real canary apply + gate + rollback: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(300)
def test_config_the_real_kubelet_refuses_is_restored_quoting_the_kubelet(
    lab: Lab, real: list[str], tmp_path: Path
) -> None:
    started = time.monotonic()
    canary = real[0]
    inv = _inventory(lab, real, tmp_path / "inv.ini", healthz_retries=20)
    extra = ["  imageGCHighThresholdPercent: 40", "  imageGCLowThresholdPercent: 60"]
    plan = _plan(tmp_path / "plan.yaml", real, extra, None)
    state = tmp_path / "state"
    before = {n: ck.snapshot(lab, n) for n in real}
    log = lab.machines.node_root(canary) / "var/log/kubelet.log"
    log_size = log.stat().st_size

    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"],
        ck.env(lab, state),
        timeout=240,
    )
    assert r.returncode != 0, r.stdout
    # the kubelet's own logged reason, quoted by the tool
    assert "the kubelet logged:" in r.stderr, r.stderr[-4000:]
    assert GC_REFUSAL in r.stderr, r.stderr[-4000:]
    assert "node restored" in r.stderr, r.stderr[-4000:]
    # and it is the kubelet's own log line (the real binary wrote it on this node)
    assert GC_REFUSAL in log.read_bytes()[log_size:].decode(errors="replace")
    assert ck.states(state)[canary] == "restored"
    for n in real:
        assert ck.snapshot(lab, n) == before[n], n
    assert ck.configz(lab, canary).get("imageGCLowThresholdPercent") != 60
    assert ck.configz(lab, canary).get("cpuManagerPolicy") == "none"
    assert not ck.unschedulable(lab, canary)
    lab.machines.wait_ready(real, timeout=60)
    print(f"real kubelet refusal + automatic restore: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(120)
def test_removing_a_container_leaves_the_host_root_alone(lab: Lab, real: list[str]) -> None:
    """The kubelet's container log cleanup globs ``<CRI log path>*``; the fake CRI reports an
    empty path, so the glob is ``*`` in the kubelet's working directory. From ``/`` that unlinked
    the host's ``/bin`` symlink on every container removal (found by this module's neighbours);
    the kubelet now runs in an empty directory of the node's own."""
    node = real[1]
    root_before = sorted(os.listdir("/"))
    bin_link = os.readlink("/bin") if os.path.islink("/bin") else None
    pids = [p for p in netns_pids(lab.nodes[node].node.netns) if _exe(p).endswith("/kubelet")]
    assert pids, "no kubelet process in the node"
    assert all(os.readlink(f"/proc/{p}/cwd").endswith("/rollout-lab/kubelet-cwd") for p in pids)
    ns = "default"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "log-cleanup"},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [
                {
                    "name": "c",
                    "image": "registry.invalid/pause:3.10",
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                }
            ],
        },
    }
    code, out = lab.api.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert code == 201, out

    def running() -> bool:
        code, p = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods/log-cleanup")
        return code == 200 and p.get("status", {}).get("phase") == "Running"

    ck.wait_for(running, 60, "the pod running")
    code, out = lab.api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/log-cleanup")
    assert code == 200, out
    # the kubelet removes the container, then confirms the deletion: the object goes away
    ck.wait_for(
        lambda: lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods/log-cleanup")[0] == 404,
        60,
        "the pod deleted by the kubelet",
    )
    assert sorted(os.listdir("/")) == root_before
    assert (os.readlink("/bin") if os.path.islink("/bin") else None) == bin_link
