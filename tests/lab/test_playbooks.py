"""The playbooks against lab nodes over real SSH: facts (the cgroup version included), apply then
restore byte for byte, and an unreachable node reported as such.

Runtime (2-core machine, warm lab binaries): about 60-70 s for the module (one real-kubelet node).
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest
import testinfra

from rollout.ansible.payloads import ApplyPayload, FileWrite, RestorePayload
from rollout.ansible.runner import AnsibleRunner
from rollout.lab.cluster import Lab

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

CA = "/etc/rollout-lab/pki/ca.crt"
CONFIG = "/var/lib/kubelet/config.yaml"
DROPIN = "/etc/kubernetes/kubelet.conf.d/90-rollout.conf"


def _payload(node: Any, change: str, config_text: bytes) -> ApplyPayload:
    return ApplyPayload(
        change_id=change,
        files=(
            FileWrite(
                CONFIG,
                config_text + b"# touched by the playbook test\n",
                expect=hashlib.sha256(config_text).hexdigest(),
            ),
            FileWrite(
                DROPIN,
                b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n",
                mode="0600",
            ),
        ),
        service=node.unit,
        healthz_url=f"https://{node.ip}:10250/healthz",
        healthz_ca_path=CA,
    )


def test_facts_then_apply_then_restore_is_byte_identical(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    nodes = lab_nodes(1, "kubeadm")
    node = nodes[0]
    host = testinfra.get_host(f"ansible://{node.name}?ansible_inventory={nodes.inventory}")
    runner = AnsibleRunner(tmp_path / "controller")

    facts = runner.gather_facts(nodes.inventory, nodes.names)[node.name]
    assert facts["hostname"] == node.name and facts["distribution"] == "kubeadm"
    assert [n["cpus"] for n in facts["numaNodes"]] == ["0-15,32-47", "16-31,48-63"]
    assert len(facts["gpus"]) == 8 and facts["onlineCPUs"] == "0-63"
    on_node = (lab.machines.node_root(node.name) / CONFIG.lstrip("/")).read_bytes()
    read = facts["kubeletFileMeta"][CONFIG]
    assert base64.b64decode(read["content_b64"]) == on_node
    assert read["sha256"] == hashlib.sha256(on_node).hexdigest()
    assert (read["mode"], read["owner"], read["group"]) == ("0644", "root", "root")

    before = host.file(CONFIG).sha256sum
    assert not host.file(DROPIN).exists
    applied = runner.apply(nodes.inventory, "c1", {node.name: _payload(node, "c1", on_node)})
    result = applied.playbook.hosts[node.name]
    assert result.status == "ok", result
    assert host.file(CONFIG).sha256sum != before
    assert host.file(DROPIN).mode == 0o600
    assert host.file("/var/lib/rollout/backups/c1/manifest.json").exists
    backup = applied.backups[node.name]
    assert backup is not None

    restore = RestorePayload.from_backup(
        backup,
        service=node.unit,
        healthz_url=f"https://{node.ip}:10250/healthz",
        healthz_ca_path=CA,
        written={f.path: f.sha256 for f in _payload(node, "c1", on_node).files},
    )
    restored = runner.restore(nodes.inventory, "c1", {node.name: restore}).hosts[node.name]

    assert restored.status == "ok", restored
    assert host.file(CONFIG).sha256sum == before
    assert not host.file(DROPIN).exists


def test_a_node_whose_sshd_is_down_is_reported_unreachable(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    nodes = lab_nodes(2, "kubeadm")
    down, up = nodes[0], nodes[1]
    runner = AnsibleRunner(tmp_path / "controller")
    config = (lab.machines.node_root(up.name) / CONFIG.lstrip("/")).read_bytes()
    lab.machines.stop_sshd(down.name)
    try:
        result = runner.apply(
            nodes.inventory,
            "c2",
            {n.name: _payload(n, "c2", config) for n in (down, up)},
        )
    finally:
        lab.machines.start_sshd(down.name)
    assert result.playbook.hosts[down.name].status == "unreachable"
    assert result.playbook.hosts[up.name].status == "ok"
    assert result.backups[down.name] is None and result.backups[up.name] is not None


def _host_cgroup_version() -> int | None:
    """What the host's mount table says (this lab machine: tmpfs, cgroup v1)."""
    found = None
    for line in Path("/proc/mounts").read_text().splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[1] == "/sys/fs/cgroup":
            found = 2 if parts[2] == "cgroup2" else 1
    return found


def test_facts_report_the_nodes_cgroup_version_and_the_labs_seeds_pass_it(
    lab: Lab, tmp_path: Path
) -> None:
    """A real-kubelet node sees the host's cgroup mounts, and the facts report their version;
    its seeded files (failCgroupV1: false from 1.35) then pass lint's cgroup v1 rule on them.
    A simulated node's netns remounts /sys (no /sys/fs/cgroup): unknown, not guessed."""
    from rollout.kubelet.facts import node_facts_from_dict
    from rollout.kubelet.loading import effective, load_node
    from rollout.kubelet.validation import validate
    from tests.lab import changekit as ck

    names = ["pb-cgroup-real", "pb-cgroup-sim"]
    lab.machines.add_nodes(names[:1], ["kubeadm"], kubelet="real", timeout=120)
    lab.machines.add_nodes(names[1:], ["kubeadm"], timeout=120)
    try:
        inv = ck.inventory(lab, names, names[:1], tmp_path / "inventory.ini")
        facts = AnsibleRunner(tmp_path / "controller").gather_facts(inv, names)
        assert facts[names[0]]["cgroupVersion"] == _host_cgroup_version()
        assert "cgroupVersion" not in facts[names[1]]
        eff = effective(load_node("kubeadm", lab.machines.node_root(names[0])))
        found = validate(
            eff.config,
            origins=eff.origins,
            kubelet_version="1.36",
            node_facts=node_facts_from_dict(facts[names[0]]),
            flags=eff.flag_origins,
        )
        assert [f.message for f in found if f.field == "failCgroupV1"] == []
        assert eff.config["failCgroupV1"] is False
    finally:
        lab.machines.remove_nodes(names)
