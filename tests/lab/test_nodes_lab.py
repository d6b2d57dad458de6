"""``rollout nodes`` on the lab's real API server, sshd and Ansible: the fleet as it is.

A canary change (kubeadm, ``method: inplace``: the change edits ``/var/lib/kubelet/config.yaml``)
is applied from one machine; then the canary's config.yaml is rewritten as ``kubeadm upgrade
node`` rewrites it (from the cluster's kubelet-config: the pre-change bytes) and its kubelet
restarted. ``rollout nodes`` from a second machine (its own state directory) names the file and
the settings that differ and exits 9; the nodes nobody touched, and the canary before the rewrite,
are not reported. ``rollout serve`` (a state directory of its own) exports the same drift as
``rollout_node_drifted``.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from rollout.cli.fleet import DRIFT_EXIT
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab
CONFIG = "/var/lib/kubelet/config.yaml"
CHECKPOINTS = ("var/lib/kubelet/cpu_manager_state", "var/lib/kubelet/memory_manager_state")


def _policy(lab: Lab, node: str) -> str | None:
    """The running kubelet's cpuManagerPolicy, None while it restarts."""
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}/proxy/configz")
    if code != 200:
        return None
    data = body if isinstance(body, dict) else json.loads(body)
    return str(data.get("kubeletconfig", data).get("cpuManagerPolicy"))


@pytest.fixture
def home() -> Any:
    made = Path(tempfile.mkdtemp(prefix="ro-"))  # short: ssh's ControlPath lives under it
    yield made
    shutil.rmtree(made, ignore_errors=True)


def test_nodes_reports_a_kubeadm_upgrade_rewrite_as_drift_and_nothing_else(
    lab: Lab, lab_nodes: Any, tmp_path: Path, home: Path
) -> None:
    names = lab_nodes(3).names
    canary = names[0]
    ns = "rollout-nodes-lab"
    code, out = lab.api.request(
        "POST", "/api/v1/namespaces", {"metadata": {"name": ns}, "kind": "Namespace"}
    )
    assert code == 201, out
    lock = ["--lock-namespace", ns]
    inv = ck.inventory(lab, names, [canary], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"))
    text = plan.read_text().replace("metadata:\n", "method: inplace\nmetadata:\n", 1)
    plan.write_text(text)
    root = lab.machines.node_root(canary)
    original = (root / CONFIG.lstrip("/")).read_bytes()
    applier = ck.env(lab, tmp_path / "a")
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
    r = ck.cli([*args, *lock], applier)
    assert r.returncode == 0, r.stderr[-3000:]
    change = json.loads(r.stdout)["change"]
    assert (root / CONFIG.lstrip("/")).read_bytes() != original  # inplace: config.yaml edited

    other = {**ck.env(lab, tmp_path / "b"), "HOME": str(home)}
    r = ck.cli(["nodes", "-i", str(inv), "-o", "json", *lock], other)
    assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
    rows = {n["node"]: n for n in json.loads(r.stdout)["nodes"]}
    assert set(rows) == set(names)
    assert rows[canary]["change"] == change and rows[canary]["state"] == "applied"
    assert rows[canary]["policy"]["cpuManagerPolicy"] == "static"
    assert len(rows[canary]["configzSha256"]) == 64
    assert rows[names[1]]["change"] is None and rows[names[1]]["policy"]["cpuManagerPolicy"] == (
        "none"
    )
    assert not any(row["drifted"] for row in rows.values())

    # `kubeadm upgrade node`: config.yaml written again from the cluster's kubelet-config
    lab.machines.stop_kubelet(canary)
    (root / CONFIG.lstrip("/")).write_bytes(original)
    for rel in CHECKPOINTS:
        (root / rel).unlink(missing_ok=True)
    lab.machines.start_kubelet(canary)
    ck.wait_for(
        lambda: _policy(lab, canary) == "none",
        120,
        f"{canary}'s kubelet back on the upgraded config",
    )

    r = ck.cli(["nodes", "-i", str(inv), "-o", "json", *lock], other)
    assert r.returncode == DRIFT_EXIT, (r.returncode, r.stdout, r.stderr[-2000:])
    doc = json.loads(r.stdout)
    assert doc["drifted"] == [canary]
    drift = {n["node"]: n["drift"] for n in doc["nodes"]}[canary]
    assert any(d.startswith(f"{CONFIG}: sha256 ") for d in drift), drift
    assert "/configz shows cpuManagerPolicy='none', expected 'static'" in drift, drift
    r = ck.cli(["nodes", "-i", str(inv), *lock], other)
    assert r.returncode == DRIFT_EXIT
    assert f"{canary}: DRIFT" in r.stdout and f"drift: {CONFIG}: sha256" in r.stdout
    assert f"{names[1]}: ok" in r.stdout, r.stdout

    # rollout serve exports it: rollout_node_drifted{node, change}
    token = tmp_path / "token"
    token.write_text("t0ken\n")
    server = {**ck.env(lab, tmp_path / "serve"), "HOME": str(home)}
    listen = ["serve", "--listen", "127.0.0.1:0", "--token-file", str(token), *lock]
    proc = ck.start_cli([*listen, "--drift-interval", "1"], server)
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()
        assert "listening on 127.0.0.1:" in line, line
        port = int(line.split("127.0.0.1:")[1].split()[0])
        want = f'rollout_node_drifted{{change="{change}",node="{canary}"}} 1.0'
        deadline = time.monotonic() + 60
        metrics = ""
        while time.monotonic() < deadline and want not in metrics:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
                metrics = resp.read().decode()
            time.sleep(0.5)
        assert want in metrics, metrics[-3000:]
        assert f'node="{names[1]}"' not in metrics.split("rollout_node_drifted", 1)[1]
    finally:
        proc.terminate()
        proc.communicate(timeout=30)
