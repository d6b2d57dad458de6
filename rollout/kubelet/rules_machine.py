"""Rules that depend on the machine, checked only when node facts are given.

The kubelet discovers the machine at start (cAdvisor); a configuration that is fine on one node
can stop the kubelet on another: reserved CPUs that are not online there, or a reservation that
swallows a whole NUMA node (the kubelet starts, but with ``single-numa-node`` no exclusive CPU on
that node can ever be aligned with the GPUs or memory next to it). The NUMA-count and
``reservedMemory``-node rules live with their managers in ``rules_managers``.

``strict-cpu-reservation`` takes the reserved CPUs out of the shared pool (``defaultCpuSet``).
Nothing in the kubelet stops that pool from becoming empty (kubernetes#141196, open; fix PR
#141197 open): exclusive allocations may take every non-reserved CPU, and a checkpoint with
assignments and an empty default set is refused on the next start with ``default cpuset cannot
be empty``. A reservation covering every online CPU makes the pool empty from the first start.
"""

from __future__ import annotations

from collections.abc import Mapping

from rollout.kubelet import cpuset, quantity
from rollout.kubelet.rules_base import Ctx, Stage, parse_bool
from rollout.kubelet.rules_managers import reserved_cpu_count
from rollout.kubelet.rules_static import cpuset_error

#: the kubelet's error for a checkpoint whose shared pool is empty (``policy_static.go``)
EMPTY_POOL = "default cpuset cannot be empty"
STRICT = "strict-cpu-reservation"


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


def check_strict_pool(
    ctx: Ctx, reserved: Mapping[str, Mapping[str, quantity.Quantity]] | None
) -> None:
    """``strict-cpu-reservation`` and an empty shared pool (kubernetes#141196).

    Error (with node facts): the reservation covers every online CPU, so the shared pool is
    empty from the start; no CPU is allocatable. Warning (always, static policy with the option
    on): exclusive allocations can still empty the pool, and the next restart then fails.
    """
    if ctx.get("cpuManagerPolicy") != "static":
        return
    opts = ctx.get("cpuManagerPolicyOptions")
    if not isinstance(opts, Mapping) or parse_bool(opts.get(STRICT, "false")) is not True:
        return
    field = f"cpuManagerPolicyOptions.{STRICT}"
    facts = ctx.facts
    if facts is not None and facts.online_cpus:
        text = ctx.get("reservedSystemCPUs")
        online = cpuset.format_cpus(facts.online_cpus)
        if isinstance(text, str) and text:
            full = not cpuset_error(text) and cpuset.parse(text) >= facts.online_cpus
            what = f"reservedSystemCPUs {text}"
        else:
            count = reserved_cpu_count(ctx, reserved)
            full = count is not None and count == len(facts.online_cpus)
            what = f"kubeReserved + systemReserved cpu ({count} CPUs)"
        if full:
            ctx.error(
                Stage.LATER,
                field,
                f"{STRICT} with {what} reserving every online CPU ({online}) leaves the shared "
                "pool (defaultCpuSet) empty: no CPU is allocatable to any pod, and a CPU "
                "Manager checkpoint with an empty default set is refused on restart with "
                f'"{EMPTY_POOL}" (kubernetes#141196)',
            )
            return
    ctx.warn(
        Stage.LATER,
        field,
        f"{STRICT}: exclusive CPUs of Guaranteed pods can take every non-reserved CPU and leave "
        "the shared pool (defaultCpuSet) empty; the next kubelet restart then fails with "
        f'"{EMPTY_POOL}" (kubernetes#141196, open): keep Guaranteed integer-CPU requests '
        "below the allocatable CPUs",
    )
