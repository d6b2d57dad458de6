"""The kubelet's Memory manager checkpoint, ``memory_manager_state``: format, checksum, start check.

Follows kubernetes ``pkg/kubelet/cm/memorymanager/state/checkpoint.go`` and
``memorymanager/policy_static.go`` (v1.36, the "V2" checkpoint structs), with the same checksum
reproduction as the CPU manager's file (:mod:`rollout.kubelet.checkpoints`, whose shared helpers
it uses). Pure: text in, records and messages out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.kubelet.checkpoints import CORRUPT, CheckpointError, _ci_get, _load, fnv32a

MEMORY_RESTORE_ERROR = (
    "could not restore state from checkpoint: {err}, please drain this node and delete the memory "
    'manager checkpoint file "{path}" before restarting Kubelet'
)


@dataclass(frozen=True)
class MemoryTable:
    total: int
    system_reserved: int
    allocatable: int
    reserved: int
    free: int

    def spew(self) -> str:
        return (
            f"<*>{{TotalMemSize:(uint64){self.total} SystemReserved:(uint64){self.system_reserved} "
            f"Allocatable:(uint64){self.allocatable} Reserved:(uint64){self.reserved} "
            f"Free:(uint64){self.free}}}"
        )

    def as_json(self) -> dict[str, int]:
        return {
            "total": self.total,
            "systemReserved": self.system_reserved,
            "allocatable": self.allocatable,
            "reserved": self.reserved,
            "free": self.free,
        }


@dataclass(frozen=True)
class NUMAState:
    number_of_assignments: int
    memory_map: Mapping[str, MemoryTable]
    cells: tuple[int, ...]

    def spew(self) -> str:
        mm = " ".join(f"{k}:{t.spew()}" for k, t in sorted(self.memory_map.items()))
        cells = " ".join(str(c) for c in self.cells)
        return (
            f"<*>{{NumberOfAssignments:(int){self.number_of_assignments} "
            f"MemoryMap:(map[v1.ResourceName]*state.MemoryTable)map[{mm}] Cells:([]int)[{cells}]}}"
        )


@dataclass(frozen=True)
class MemoryBlock:
    numa_affinity: tuple[int, ...]
    type: str
    size: int

    def spew(self) -> str:
        aff = " ".join(str(n) for n in self.numa_affinity)
        return (
            f"{{NUMAAffinity:([]int)[{aff}] Type:(v1.ResourceName){self.type} "
            f"Size:(uint64){self.size}}}"
        )


@dataclass(frozen=True)
class MemoryCheckpoint:
    """``memory_manager_state``: policy (``None``/``Static``), per-NUMA state, assignments."""

    policy_name: str
    machine_state: Mapping[int, NUMAState] = field(default_factory=dict)
    entries: Mapping[str, Mapping[str, tuple[MemoryBlock, ...]]] = field(default_factory=dict)
    checksum: int = 0

    def spew(self) -> str:
        ms = " ".join(f"{n}:{s.spew()}" for n, s in sorted(self.machine_state.items()))
        ent = " ".join(
            f"{pod}:map["
            + " ".join(
                f"{c}:[" + " ".join(b.spew() for b in blocks) + "]"
                for c, blocks in sorted(ctrs.items())
            )
            + "]"
            for pod, ctrs in sorted(self.entries.items())
        )
        return (
            f"(*state.MemoryManagerCheckpoint){{PolicyName:(string){self.policy_name} "
            f"MachineState:(state.NUMANodeMap)map[{ms}] "
            f"Entries:(state.ContainerMemoryAssignments)map[{ent}] "
            f"PodEntries:(state.PodMemoryAssignments)map[] Checksum:(checksum.Checksum)0}}"
        )

    def computed_checksum(self) -> int:
        return fnv32a(self.spew())


def memory_checkpoint(
    policy_name: str,
    machine_state: Mapping[int, NUMAState],
    entries: Mapping[str, Mapping[str, tuple[MemoryBlock, ...]]] | None = None,
) -> MemoryCheckpoint:
    cp = MemoryCheckpoint(policy_name, dict(machine_state), dict(entries or {}))
    return MemoryCheckpoint(cp.policy_name, cp.machine_state, cp.entries, cp.computed_checksum())


def render_memory(cp: MemoryCheckpoint) -> str:
    doc: dict[str, Any] = {
        "policyName": cp.policy_name,
        "machineState": {
            str(n): {
                "numberOfAssignments": s.number_of_assignments,
                "memoryMap": {k: t.as_json() for k, t in sorted(s.memory_map.items())},
                "cells": list(s.cells),
            }
            for n, s in sorted(cp.machine_state.items())
        },
    }
    if cp.entries:
        doc["entries"] = {
            pod: {
                c: [
                    {"numaAffinity": list(b.numa_affinity), "type": b.type, "size": b.size}
                    for b in blocks
                ]
                for c, blocks in sorted(ctrs.items())
            }
            for pod, ctrs in sorted(cp.entries.items())
        }
    doc["checksum"] = cp.checksum
    return json.dumps(doc, separators=(",", ":"))


def parse_memory(text: str) -> MemoryCheckpoint:
    """Read ``memory_manager_state`` and verify its checksum (v1.36 V2 layout; 0 is accepted).

    Raises:
        CheckpointError: bad JSON or structure, or ``checkpoint is corrupted``.
    """
    doc = _load(text)
    try:
        ms: dict[int, NUMAState] = {}
        for n, s in (_ci_get(doc, "machineState", {}) or {}).items():
            mm = {
                str(k): MemoryTable(
                    int(t.get("total", 0)),
                    int(t.get("systemReserved", 0)),
                    int(t.get("allocatable", 0)),
                    int(t.get("reserved", 0)),
                    int(t.get("free", 0)),
                )
                for k, t in (s.get("memoryMap") or {}).items()
            }
            ms[int(n)] = NUMAState(
                int(s.get("numberOfAssignments", 0)),
                mm,
                tuple(int(c) for c in s.get("cells") or ()),
            )
        entries = {
            str(pod): {
                str(c): tuple(
                    MemoryBlock(
                        tuple(int(x) for x in b.get("numaAffinity") or ()),
                        str(b["type"]),
                        int(b["size"]),
                    )
                    for b in blocks
                )
                for c, blocks in ctrs.items()
            }
            for pod, ctrs in (_ci_get(doc, "entries", {}) or {}).items()
        }
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"json: cannot unmarshal memory manager checkpoint: {e}") from e
    cp = MemoryCheckpoint(
        str(_ci_get(doc, "policyName", "")), ms, entries, int(_ci_get(doc, "checksum", 0) or 0)
    )
    if cp.checksum and cp.checksum != cp.computed_checksum():
        raise CheckpointError(CORRUPT)
    return cp


def memory_machine_state(
    numa_memory: Mapping[int, int], reserved: Mapping[int, int]
) -> dict[int, NUMAState]:
    """The Static policy's expected machine state for a node with no assignments (memory only;
    the lab has no hugepages): total per NUMA node, ``reservedMemory`` as system reserved."""
    out: dict[int, NUMAState] = {}
    for n, total in sorted(numa_memory.items()):
        r = reserved.get(n, 0)
        table = MemoryTable(total, r, total - r, 0, total - r)
        out[n] = NUMAState(0, {"memory": table}, (n,))
    return out


def memory_start_error(
    path: str, configured_policy: str, cp: MemoryCheckpoint, expected: Mapping[int, NUMAState]
) -> str | None:
    """The error the kubelet's Memory manager fails to start with, or None.

    ``expected`` is the machine state the Static policy computes from the machine and
    ``reservedMemory`` (with the checkpoint's assignments applied by the caller).
    """
    if cp.policy_name != configured_policy:
        inner = (
            f'[memorymanager] configured policy "{configured_policy}" differs from state '
            f'checkpoint policy "{cp.policy_name}"'
        )
        return MEMORY_RESTORE_ERROR.format(err=inner, path=path)
    if configured_policy != "Static" or not cp.machine_state:
        return None
    if not _machine_states_equal(cp.machine_state, expected):
        return "[memorymanager] the expected machine state is different from the real one"
    return None


def _machine_states_equal(a: Mapping[int, NUMAState], b: Mapping[int, NUMAState]) -> bool:
    if set(a) != set(b):
        return False
    for n, sa in a.items():
        sb = b[n]
        if sa.number_of_assignments != sb.number_of_assignments or set(sa.cells) != set(sb.cells):
            return False
        if dict(sa.memory_map) != dict(sb.memory_map):
            return False
    return True
