"""Rules the kubelet applies only at start: ``server.go`` and the Topology, CPU, Memory managers.

``validation.go`` does not look at ``cpuManagerPolicy``, its options, ``memoryManagerPolicy`` or
the topology options; the managers reject them in their constructors and the kubelet exits
("failed to run Kubelet: ..."), so a node crash-loops on a config that parsed fine. The order
of the checks follows ``cmd/kubelet/app/server.go`` and ``NewContainerManager``: topology
manager, then CPU manager, then memory manager; each constructor stops at its first error.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from fractions import Fraction

from rollout.kubelet import cpuset, quantity
from rollout.kubelet.options import (
    CPU_INCOMPATIBLE,
    CPU_OPTIONS,
    DEFAULT_MAX_ALLOWABLE_NUMA_NODES,
    TOPOLOGY_OPTIONS,
    PolicyOption,
)
from rollout.kubelet.rules_base import Ctx, Stage, go_map, go_quote, parse_bool
from rollout.kubelet.rules_static import reserved_memory_entries

_RESERVABLE = ("cpu", "memory", "ephemeral-storage", "pid")


def _options(ctx: Ctx, name: str) -> dict[str, str]:
    raw = ctx.get(name)
    if not isinstance(raw, Mapping):
        return {}
    return {str(k): str(v) for k, v in raw.items()}


def reserved_quantities(ctx: Ctx) -> dict[str, dict[str, quantity.Quantity]] | None:
    """Parse kubeReserved/systemReserved like ``parseResourceList``; None after an error."""
    out: dict[str, dict[str, quantity.Quantity]] = {}
    for name, flag in (
        ("kubeReserved", "--kube-reserved"),
        ("systemReserved", "--system-reserved"),
    ):
        raw = ctx.get(name)
        out[name] = {}
        if not isinstance(raw, Mapping):
            continue
        for k, v in raw.items():
            k = str(k)
            if k not in _RESERVABLE:
                ctx.error(
                    Stage.SERVER,
                    f"{name}.{k}",
                    f'{flag} value failed to parse: cannot reserve "{k}" resource',
                )
                return None
            try:
                q = quantity.parse(v)
            except quantity.QuantityError as e:
                ctx.error(
                    Stage.SERVER,
                    f"{name}.{k}",
                    f"{flag} value failed to parse: failed to parse quantity {go_quote(str(v))} "
                    f"for {go_quote(k)} resource: {e}",
                )
                return None
            if q.value < 0:
                ctx.error(
                    Stage.SERVER,
                    f"{name}.{k}",
                    f"{flag} value failed to parse: resource quantity for {go_quote(k)} cannot be "
                    f"negative: {v}",
                )
                return None
            out[name][k] = q
    return out


def check_server(ctx: Ctx) -> dict[str, dict[str, quantity.Quantity]] | None:
    """``server.go`` before the container manager: reservations and the policy-options gates."""
    reserved = reserved_quantities(ctx)
    cpu_opts = ctx.get("cpuManagerPolicyOptions")
    if isinstance(cpu_opts, Mapping) and cpu_opts and not ctx.gate("CPUManagerPolicyOptions"):
        ctx.error(
            Stage.SERVER,
            "cpuManagerPolicyOptions",
            "CPU Manager policy options "
            f"{go_map(_options(ctx, 'cpuManagerPolicyOptions'))} require "
            'feature gates "CPUManager", "CPUManagerPolicyOptions" enabled',
        )
    topo_opts = ctx.get("topologyManagerPolicyOptions")
    if (
        isinstance(topo_opts, Mapping)
        and topo_opts
        and not ctx.gate("TopologyManagerPolicyOptions")
    ):
        ctx.error(
            Stage.SERVER,
            "topologyManagerPolicyOptions",
            "topology manager policy options "
            f"{go_map(_options(ctx, 'topologyManagerPolicyOptions'))} require feature gates "
            '"TopologyManagerPolicyOptions" enabled',
        )
    return reserved


def _availability(
    ctx: Ctx, opt: PolicyOption | None, name: str, label: str, gate: str
) -> str | None:
    maturity = opt.maturity(ctx.version) if opt else "unknown"
    if maturity == "unknown":
        return f"unknown {label} Policy option: {go_quote(name)}"
    if maturity == "alpha" and not ctx.gate(f"{gate}PolicyAlphaOptions"):
        return (
            f"{label} Policy Alpha-level Options not enabled, but option {go_quote(name)} provided"
        )
    if maturity == "beta" and not ctx.gate(f"{gate}PolicyBetaOptions"):
        return (
            f"{label} Policy Beta-level Options not enabled, but option {go_quote(name)} provided"
        )
    return None


def check_topology_manager(ctx: Ctx) -> None:
    """``topologymanager.NewManager``: options, then the NUMA node limit (needs node facts)."""
    policy = ctx.get("topologyManagerPolicy")
    if policy == "none":
        opts = _options(ctx, "topologyManagerPolicyOptions")
        if opts:
            ctx.warn(
                Stage.TOPOLOGY,
                "topologyManagerPolicyOptions",
                'topologyManagerPolicyOptions have no effect with topologyManagerPolicy "none"',
            )
        return
    limit = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    for name, value in sorted(_options(ctx, "topologyManagerPolicyOptions").items()):
        field = f"topologyManagerPolicyOptions.{name}"
        why = _availability(
            ctx, TOPOLOGY_OPTIONS.get(name), name, "Topology Manager", "TopologyManager"
        )
        if why:
            ctx.error(Stage.TOPOLOGY, field, why)
            return
        opt = TOPOLOGY_OPTIONS[name]
        if opt.kind == "bool":
            if parse_bool(value) is None:
                ctx.error(
                    Stage.TOPOLOGY,
                    field,
                    f"bad value for option {go_quote(name)}: strconv.ParseBool: parsing "
                    f"{go_quote(value)}: invalid syntax",
                )
                return
        else:
            if not re.fullmatch(r"[+-]?\d+", value):
                ctx.error(
                    Stage.TOPOLOGY,
                    field,
                    f"unable to convert policy option to integer {go_quote(name)}: strconv.Atoi: "
                    f"parsing {go_quote(value)}: invalid syntax",
                )
                return
            n = int(value)
            if n < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
                ctx.error(
                    Stage.TOPOLOGY,
                    field,
                    f"the minimum value of {go_quote(name)} should not be less than "
                    f"{DEFAULT_MAX_ALLOWABLE_NUMA_NODES}",
                )
                return
            limit = n
    if ctx.facts is not None and len(ctx.facts.numa_nodes) > limit:
        ctx.error(
            Stage.TOPOLOGY,
            "topologyManagerPolicy",
            f"unsupported on machines with more than {limit} NUMA Nodes",
        )


def reserved_cpu_count(
    ctx: Ctx, reserved: Mapping[str, Mapping[str, quantity.Quantity]] | None
) -> int | None:
    """CPUs the static policy reserves: the reservedSystemCPUs set, else ceil(kube + system)."""
    text = ctx.get("reservedSystemCPUs")
    if isinstance(text, str) and text:
        try:
            return len(cpuset.parse(text))
        except cpuset.CPUSetError:
            return None
    if reserved is None:
        return None
    total = Fraction(0)
    for name in ("kubeReserved", "systemReserved"):
        q = reserved.get(name, {}).get("cpu")
        if q is not None:
            total += q.value
    return math.ceil(total)


def check_cpu_manager(
    ctx: Ctx, reserved: Mapping[str, Mapping[str, quantity.Quantity]] | None
) -> None:
    """``cpumanager.NewManager``: policy, reservation, then ``NewStaticPolicyOptions``."""
    policy = ctx.get("cpuManagerPolicy")
    opts = _options(ctx, "cpuManagerPolicyOptions")
    if policy == "none":
        if opts:
            ctx.error(
                Stage.CPU,
                "cpuManagerPolicyOptions",
                f"new none policy error: None policy: received unsupported options={go_map(opts)}",
            )
        return
    if policy != "static":
        ctx.error(Stage.CPU, "cpuManagerPolicy", f'unknown policy: "{policy}"')
        return
    count = reserved_cpu_count(ctx, reserved)
    if count == 0:
        ctx.error(
            Stage.CPU,
            "cpuManagerPolicy",
            "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be "
            "greater than zero",
        )
        return
    enabled: set[str] = set()
    for name, value in sorted(opts.items()):
        field = f"cpuManagerPolicyOptions.{name}"
        why = _availability(ctx, CPU_OPTIONS.get(name), name, "CPU Manager", "CPUManager")
        if why:
            ctx.error(Stage.CPU, field, f"new static policy error: {why}")
            return
        flag = parse_bool(value)
        if flag is None:
            ctx.error(
                Stage.CPU,
                field,
                f"new static policy error: bad value for option {go_quote(name)}: "
                f"strconv.ParseBool: parsing {go_quote(value)}: invalid syntax",
            )
            return
        if flag:
            enabled.add(name)
    for a, b in CPU_INCOMPATIBLE:
        if a in enabled and b in enabled:
            ctx.error(
                Stage.CPU,
                "cpuManagerPolicyOptions",
                f"new static policy error: static policy options {a} and {b} can not be used at "
                "the same time",
            )
            return
    if "align-by-socket" in enabled:
        if ctx.get("topologyManagerPolicy") == "single-numa-node":
            ctx.error(
                Stage.CPU,
                "cpuManagerPolicyOptions.align-by-socket",
                "new static policy error: Topolgy manager single-numa-node policy is incompatible "
                "with CPUManager align-by-socket policy option",
            )
            return
        facts = ctx.facts
        if (
            facts is not None
            and facts.sockets is not None
            and facts.sockets > len(facts.numa_nodes)
        ):
            ctx.error(
                Stage.CPU,
                "cpuManagerPolicyOptions.align-by-socket",
                "new static policy error: Align by socket is not compatible with hardware where "
                "number of sockets are more than number of NUMA",
            )


def _eviction_memory(ctx: Ctx) -> quantity.Quantity | None:
    hard = ctx.get("evictionHard")
    if not isinstance(hard, Mapping):
        return quantity.Quantity(Fraction(0))
    value = hard.get("memory.available")
    if value is None:
        return quantity.Quantity(Fraction(0))
    text = str(value)
    if text.endswith("%"):
        capacity = ctx.facts.memory_bytes if ctx.facts else None
        if capacity is None:
            return None
        pct = Fraction(text[:-1]) / 100
        return quantity.Quantity(Fraction(int(capacity * float(pct))), "BinarySI")
    try:
        return quantity.parse(text)
    except quantity.QuantityError:
        return None


def check_memory_manager(
    ctx: Ctx, reserved: Mapping[str, Mapping[str, quantity.Quantity]] | None
) -> None:
    """``memorymanager.NewManager``: policy name (case matters), then the reservedMemory sums."""
    policy = ctx.get("memoryManagerPolicy")
    entries = reserved_memory_entries(ctx)
    if policy == "None":
        if entries:
            ctx.warn(
                Stage.MEMORY,
                "reservedMemory",
                'reservedMemory has no effect with memoryManagerPolicy "None"',
            )
        return
    if policy != "Static":
        ctx.error(Stage.MEMORY, "memoryManagerPolicy", f'unknown policy: "{policy}"')
        return
    if ctx.facts is not None:
        ids = {n.id for n in ctx.facts.numa_nodes}
        for i, node, _ in entries:
            if node not in ids:
                ctx.error(
                    Stage.MEMORY,
                    f"reservedMemory[{i}]",
                    f"the reserved memory configuration references a NUMA node {node} that does "
                    "not exist on this machine",
                )
                return
    if reserved is None:
        return
    totals: dict[str, quantity.Quantity] = {}
    for _, _, limits in entries:
        for resource, value in limits.items():
            try:
                q = quantity.parse(value)
            except quantity.QuantityError:
                return
            prev = totals.get(str(resource))
            totals[str(resource)] = q if prev is None else q + prev
    # Node allocatable reservation: system-reserved + kube-reserved + hard eviction (memory only).
    eviction = _eviction_memory(ctx)
    allocatable: dict[str, quantity.Quantity] = {}
    for resource in ["memory", *sorted(r for r in totals if r != "memory")]:
        acc = quantity.Quantity(Fraction(0))
        for name in ("systemReserved", "kubeReserved"):
            part = reserved.get(name, {}).get(resource)
            if part is not None:
                acc = acc + part
        if resource == "memory":
            if eviction is None:
                ctx.warn(
                    Stage.MEMORY,
                    "evictionHard",
                    "evictionHard memory.available is a percentage: give --node-facts with NUMA "
                    "memory to check the reservedMemory sum",
                )
                continue
            acc = acc + eviction
        allocatable[resource] = acc
    for resource, want in allocatable.items():
        got = totals.get(resource, quantity.Quantity(Fraction(0)))
        if got.value != want.value:
            got_q = (
                quantity.Quantity(got.value, got.format)
                if got.value
                else quantity.Quantity(Fraction(0))
            )
            ctx.error(
                Stage.MEMORY,
                "reservedMemory",
                f"the total amount {go_quote(str(got_q))} of type {go_quote(resource)} is not "
                f"equal to the value {go_quote(str(want))} determined by Node Allocatable feature",
            )
            return
