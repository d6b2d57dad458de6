"""Rules that depend on the machine, checked only when node facts are given.

The kubelet discovers the machine at start (cAdvisor); a configuration that is fine on one node
can stop the kubelet on another: reserved CPUs that are not online there, or a reservation that
swallows a whole NUMA node (the kubelet starts, but with ``single-numa-node`` no exclusive CPU on
that node can ever be aligned with the GPUs or memory next to it). The NUMA-count and
``reservedMemory``-node rules live with their managers in ``rules_managers``.
"""

from __future__ import annotations

from rollout.kubelet import cpuset
from rollout.kubelet.rules_base import Ctx, Stage
from rollout.kubelet.rules_static import cpuset_error


def check_machine(ctx: Ctx) -> None:
    """Reserved CPUs versus online CPUs and NUMA nodes."""
    facts = ctx.facts
    text = ctx.get("reservedSystemCPUs")
    if facts is None or not isinstance(text, str) or not text:
        return
    if cpuset_error(text):
        return  # validation.go already reported it
    reserved = cpuset.parse(text)
    if not reserved <= facts.online_cpus:
        ctx.error(
            Stage.SERVER,
            "reservedSystemCPUs",
            f"reserved-cpus: {text} is not a subset of online-cpus: "
            f"{cpuset.format_cpus(facts.online_cpus)}",
        )
        return
    for node in facts.numa_nodes:
        cpus = node.cpus & facts.online_cpus
        if cpus and cpus <= reserved:
            gpus = [g.id for g in facts.gpus if g.numa_node == node.id]
            extra = f" (GPUs there: {', '.join(gpus)})" if gpus else ""
            ctx.warn(
                Stage.CPU,
                "reservedSystemCPUs",
                f"reservedSystemCPUs {text} reserves every CPU of NUMA node {node.id} "
                f"({cpuset.format_cpus(cpus)}): no exclusive CPU can be aligned to that "
                f"node{extra}",
            )
