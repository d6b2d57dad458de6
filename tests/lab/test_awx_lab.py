"""The AWX job form (``deploy/awx/``) run the way AWX runs it: ``ansible-runner run`` on a private
data directory laid out as AWX lays one out, against the lab's real API server, sshd and Ansible.

AWX builds, per job (``awx/main/tasks``, ansible-runner's documented layout): ``project/`` (the
project checkout: here a link to this repository, so the root ``ansible.cfg`` is the one AWX
reads), ``inventory/hosts`` (the job's inventory: groups and host variables, no key file),
``env/extravars`` (the template's and the survey's variables, and the previous workflow node's
``set_stats``), ``env/envvars``, ``env/ssh_key`` (the Machine credential: ansible-runner adds it
to an ssh-agent, whose ``SSH_AUTH_SOCK`` rollout's own Ansible runs inherit) and the custom
credential's file: ``deploy/awx/credential-type.yml``'s injectors rendered as AWX renders them
(a sandboxed Jinja template written with ``mkstemp`` into ``env/``, mode 0600, and
``KUBECONFIG`` naming it). Only the container is missing: ``rollout`` is the one on this
interpreter's PATH, where the execution environment has the wheel's.

* canary applied (the job successful, ``set_stats`` carrying the change id and outcome
  ``held``), status read with that id, promote, then the rollback job: every node byte for byte;
* a gate that fails during the canary's soak (a workload that fits the node but no NUMA node):
  the job ends failed, ``set_stats`` says ``rolled-back`` and exit code 5, the node is restored.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import yaml
from jinja2 import sandbox

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck
from tests.lab.test_gate import _deployment, _gate_plan, _rejected

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PLAYBOOK = "deploy/awx/rollout.yml"
CREDENTIAL_TYPE = REPO / "deploy" / "awx" / "credential-type.yml"


@dataclass
class Job:
    """An ended AWX-style job: ansible-runner's status and rc, the playbook's ``set_stats``
    (what AWX hands the next workflow node) and its stdout."""

    status: str
    rc: int
    stats: dict[str, Any]
    stdout: str


def _awx_inventory(lab: Lab, names: list[str], canary: list[str], tmp: Path) -> str:
    """The job's inventory as AWX would have it: the lab's groups and host variables, without
    the key file (the Machine credential brings the key)."""
    ini = ck.inventory(lab, names, canary, tmp / "lab-inventory.ini").read_text()
    return "".join(
        line + "\n"
        for line in ini.splitlines()
        if not line.startswith("ansible_ssh_private_key_file=")
    )


def _inject_kubeconfig(env: Path, kubeconfig: str) -> dict[str, str]:
    """The ``rollout kubeconfig`` credential, injected as AWX injects a custom credential."""
    cred = yaml.safe_load(CREDENTIAL_TYPE.read_text())
    render = sandbox.ImmutableSandboxedEnvironment()
    fd, path = tempfile.mkstemp(dir=env)
    with os.fdopen(fd, "w") as f:
        f.write(render.from_string(cred["injectors"]["file"]["template.kubeconfig"]).render(
            kube_config=kubeconfig
        ))  # fmt: skip
    os.chmod(path, 0o600)
    tower = SimpleNamespace(filename=SimpleNamespace(kubeconfig=path))
    return {
        k: render.from_string(v).render(tower=tower) for k, v in cred["injectors"]["env"].items()
    }


def _start_job(
    lab: Lab, tmp_path: Path, ident: str, inventory: str, extravars: dict[str, Any]
) -> tuple[subprocess.Popen[str], Path]:
    pdd = tmp_path / ident
    (pdd / "inventory").mkdir(parents=True)
    (pdd / "project").symlink_to(REPO)
    (pdd / "inventory" / "hosts").write_text(inventory)
    env = pdd / "env"
    env.mkdir()
    envvars = _inject_kubeconfig(env, lab.kubeconfig.read_text())
    # the execution environment's PATH: rollout (the wheel), ansible, ssh
    envvars["PATH"] = f"{BIN}:/usr/local/bin:/usr/bin:/bin"
    (env / "envvars").write_text(json.dumps(envvars))
    (env / "extravars").write_text(json.dumps(extravars))
    (env / "ssh_key").write_text(lab.machines.ssh_key.read_text())
    # ansible-runner's own process: nothing of this test's environment leaks into the job
    outer = {"PATH": envvars["PATH"], "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}
    proc = subprocess.Popen(
        [str(BIN / "ansible-runner"), "run", str(pdd), "-p", PLAYBOOK, "--ident", ident],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=outer,
    )
    return proc, pdd


def _ended(proc: subprocess.Popen[str], pdd: Path, ident: str, timeout: float = 300) -> Job:
    try:
        out, _ = proc.communicate(timeout=timeout)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    art = pdd / "artifacts" / ident
    stats: dict[str, Any] = {}
    for f in sorted((art / "job_events").glob("*.json")):
        event = json.loads(f.read_text())
        if event.get("event") == "playbook_on_stats":
            stats = event["event_data"].get("artifact_data") or {}
    return Job((art / "status").read_text().strip(), int((art / "rc").read_text()), stats, out)


def _job(lab: Lab, tmp_path: Path, ident: str, inventory: str, extravars: dict[str, Any]) -> Job:
    proc, pdd = _start_job(lab, tmp_path, ident, inventory, extravars)
    job = _ended(proc, pdd, ident)
    print(f"AWX job {ident}: {job.status} rc {job.rc} outcome {job.stats.get('rollout_outcome')}")
    return job


def _node_state(lab: Lab, node: str) -> str | None:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    return (body["metadata"].get("annotations") or {}).get("rollout.dev/state")


@pytest.mark.timeout(420)
def test_awx_job_applies_the_canary_reads_status_promotes_and_rolls_back(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    names = lab_nodes(2).names
    canary = names[:1]
    inventory = _awx_inventory(lab, names, canary, tmp_path)
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"), max_unavailable=1)
    lock = {"rollout_lock_namespace": "kube-system"}
    before = {n: ck.snapshot(lab, n) for n in names}

    job = _job(
        lab,
        tmp_path,
        "canary",
        inventory,
        {"rollout_action": "apply-canary", "rollout_plan": str(plan), **lock},
    )
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-4000:]
    change = job.stats["rollout_change"]
    assert job.stats["rollout_outcome"] == "held" and job.stats["rollout_exit_code"] == 0
    nodes = {n["node"]: n["state"] for n in job.stats["rollout_summary"]["nodes"]}
    assert nodes[canary[0]] == "applied", nodes
    assert ck.snapshot(lab, canary[0]) != before[canary[0]]
    assert ck.snapshot(lab, names[1]) == before[names[1]]

    # the next workflow nodes get the canary job's set_stats as extra variables; each job is a
    # fresh private data directory (the journal comes from the cluster record)
    passed = {"rollout_change": change, **lock}
    job = _job(lab, tmp_path, "status", inventory, {"rollout_action": "status", **passed})
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-4000:]
    assert job.stats["rollout_summary"]["change"] == change
    assert job.stats["rollout_outcome"] == "held"

    job = _job(lab, tmp_path, "promote", inventory, {"rollout_action": "promote", **passed})
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-4000:]
    nodes = {n["node"]: n["state"] for n in job.stats["rollout_summary"]["nodes"]}
    assert nodes == dict.fromkeys(names, "applied"), nodes
    assert all(ck.snapshot(lab, n) != before[n] for n in names)

    job = _job(lab, tmp_path, "rollback", inventory, {"rollout_action": "rollback", **passed})
    assert (job.status, job.rc) == ("successful", 0), job.stdout[-4000:]
    assert job.stats["rollout_outcome"] == "rolled-back"
    for n in names:
        assert ck.snapshot(lab, n) == before[n], n  # byte for byte
        assert _node_state(lab, n) == "restored"
    print(f"AWX canary, status, promote, rollback: {time.monotonic() - started:.1f}s")


@pytest.mark.timeout(300)
def test_awx_job_fails_when_the_gate_fails_and_the_canary_is_rolled_back(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    (node,) = lab_nodes(1).names
    inventory = _awx_inventory(lab, [node], [node], tmp_path)
    plan = _gate_plan(tmp_path / "plan.yaml", [node], soak="20s")
    before = ck.snapshot(lab, node)
    extravars = {"rollout_action": "apply-canary", "rollout_plan": str(plan)}
    proc, pdd = _start_job(lab, tmp_path, "canary-gate", inventory, extravars)
    try:
        # the canary applied (its Node says so): a workload that fits the node (6 of 8 GPUs)
        # but no NUMA node (4) arrives during the soak
        ck.wait_for(lambda: _node_state(lab, node) == "applied", 180, "the canary applied", 0.5)
        _deployment(lab, namespace, "numa-misfit", node, 6)
        ck.wait_for(lambda: _rejected(lab, namespace), 60, "the kubelet's first rejection")
    finally:
        job = _ended(proc, pdd, "canary-gate")
    assert (job.status, job.rc) == ("failed", 2), job.stdout[-4000:]
    assert job.stats["rollout_exit_code"] == 5 and job.stats["rollout_outcome"] == "rolled-back"
    assert "rollout apply-canary exited 5 (a node failed and was restored" in job.stdout
    nodes = {n["node"]: n["state"] for n in job.stats["rollout_summary"]["nodes"]}
    assert nodes == {node: "restored"}, nodes
    assert ck.snapshot(lab, node) == before  # byte for byte
    assert _node_state(lab, node) == "restored"
    print(f"AWX canary with a failing gate: {time.monotonic() - started:.1f}s")
