"""The files ``rollout lab up`` writes for the user: the Ansible inventory (canary group = the
first quarter of the nodes) and a ready canary plan."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

from rollout.lab.nodefiles import LabNode


def canary_count(total: int) -> int:
    """The first quarter of the nodes, at least one."""
    return max(1, math.floor(total / 4)) if total else 0


def inventory_text(nodes: Sequence[LabNode], key: Path, header: str = "") -> str:
    """An Ansible INI inventory: groups ``canary`` (first quarter) and ``nodes`` (all)."""
    lines = [
        "# Written by `rollout lab`. Works with plain ansible-playbook:",
        "#   ansible-playbook -i THIS_FILE playbook.yml",
    ]
    if header:
        lines.append(f"# {header}")
    lines.append("[canary]")
    lines += [x.name for x in nodes[: canary_count(len(nodes))]]
    lines += ["", "[nodes]"]
    lines += [f"{x.name} ansible_host={x.ip} rollout_distribution={x.distribution}" for x in nodes]
    args = "-o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR"
    lines += [
        "",
        "[all:vars]",
        "ansible_user=root",
        "ansible_port=22",
        f"ansible_ssh_private_key_file={key}",
        f"ansible_ssh_common_args='{args}'",
        "ansible_python_interpreter=/usr/bin/python3",
        "",
    ]
    return "\n".join(lines)


# The change the lab's plans make: static CPU manager reserving one core's two threads (CPUs 0
# and 32 on the default node shape), Topology Manager single-numa-node at pod scope.
LAB_INTENT = (
    "kubelet:",
    "  cpuManagerPolicy: static",
    '  reservedSystemCPUs: "0,32"',
    "  topologyManagerPolicy: single-numa-node",
    "  topologyManagerScope: pod",
)


def plan_text(nodes: Sequence[LabNode], name: str) -> str:
    """A ready canary plan for the lab's nodes."""
    dists = sorted({x.distribution for x in nodes})
    out = [
        "# A canary plan for this lab, written by `rollout lab up`.",
        "# Static CPU manager reserving one core's two threads (CPUs 0 and 32), Topology Manager",
        "# single-numa-node at pod scope; the canary group first.",
        "apiVersion: rollout.dev/v1alpha1",
        "kind: RolloutPlan",
        "metadata:",
        f"  name: lab-{name}-canary",
    ]
    if len(dists) == 1:
        out.append(f"distribution: {dists[0]}")
    out += [
        *LAB_INTENT,
        "strategy:",
        "  canaryGroup: canary",
        "  maxUnavailable: 1",
        "# The rejection-rate gate, sized for a demo: a one-minute soak; a canary with too little",
        "# traffic gets probe pods; more than 5% of admissions rejected rolls the canary back.",
        "gate:",
        "  soak: 60s",
        "  window: 60s",
        "  interval: 2s",
        "  threshold: 5%",
        "  minAdmissions: 3",
        "  baseline: none",
        "  probes: true",
        "  onFailure: rollback-group  # the default: a Failed verdict restores every canary node",
    ]
    if len(dists) > 1:
        out.append("nodes:")
        for x in nodes:
            out += [f"  {x.name}:", f"    distribution: {x.distribution}"]
    return "\n".join(out) + "\n"
