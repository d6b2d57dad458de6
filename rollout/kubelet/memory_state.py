"""The kubelet's Memory manager checkpoint, ``memory_manager_state``: format, checksum, start check.

Follows kubernetes ``pkg/kubelet/cm/memorymanager/state/checkpoint.go`` and
``memorymanager/policy_static.go``, with the same checksum reproduction as the CPU manager's file
(:mod:`rollout.kubelet.checkpoints`, whose shared helpers it uses). Two layouts:

- up to 1.36 (``render_memory``): the V1/V2 structs, one ``checksum`` over the struct's ``spew``;
- 1.37 (``render_memory_v3``, kubernetes#139626 "Generalize memorymanager checkpoint"): V3, the
  V1 fields kept inline for older kubelets (their ``checksum`` computed as a V1 file's), plus
  ``data`` (the payload serialized to a JSON string) and ``dataChecksum`` (its checksum). A 1.37
  kubelet reads only ``data``; a file with ``data`` or ``dataChecksum`` that fails to load is not
  read as an older version but refused: ``could not load v3 checkpoint: ...``.

Pure: text in, records and messages out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.kubelet.checkpoints import (
    CORRUPT,
    CheckpointError,
    ci_get,
    data_checksum,
    dumps,
    fnv32a,
    go_kind,
    load_json,
    render_embedded,
)

MEMORY_RESTORE_ERROR = (
    "could not restore state from checkpoint: {err}, please drain this node and delete the memory "
    'manager checkpoint file "{path}" before restarting Kubelet'
)
#: memorymanager/state/state_checkpoint.go (1.37): a V3 file that fails to load
V3_LOAD_ERROR = "could not load v3 checkpoint: {err}"


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
    #: 2: the V1/V2 layout (up to 1.36); 3: the 1.37 layout with ``data`` / ``dataChecksum``
    version: int = 2
    #: pod-level assignments (``podEntries``, ``PodLevelResourceManagers``), read from V3 only
    pod_entries: Mapping[str, tuple[MemoryBlock, ...]] = field(default_factory=dict)

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

    def v1_checksum(self) -> int:
        """The checksum of the same fields hashed as the V1 struct (no ``PodEntries``): what a
        1.36 kubelet writes with ``PodLevelResourceManagers`` off, and what the 1.37 kubelet
        puts in the inline fields of a V3 file."""
        return fnv32a(self.spew().replace(" PodEntries:(state.PodMemoryAssignments)map[]", ""))


def memory_checkpoint(
    policy_name: str,
    machine_state: Mapping[int, NUMAState],
    entries: Mapping[str, Mapping[str, tuple[MemoryBlock, ...]]] | None = None,
) -> MemoryCheckpoint:
    cp = MemoryCheckpoint(policy_name, dict(machine_state), dict(entries or {}))
    return MemoryCheckpoint(cp.policy_name, cp.machine_state, cp.entries, cp.computed_checksum())


def _blocks_json(blocks: tuple[MemoryBlock, ...]) -> list[dict[str, Any]]:
    return [{"numaAffinity": list(b.numa_affinity), "type": b.type, "size": b.size} for b in blocks]


def _fields_json(cp: MemoryCheckpoint) -> dict[str, Any]:
    """``policyName``, ``machineState`` and (omitempty) ``entries`` as Go's ``json.Marshal``
    writes them (map keys sorted as strings, as encoding/json sorts them)."""
    doc: dict[str, Any] = {
        "policyName": cp.policy_name,
        "machineState": {
            str(n): {
                "numberOfAssignments": s.number_of_assignments,
                "memoryMap": {k: t.as_json() for k, t in sorted(s.memory_map.items())},
                "cells": list(s.cells),
            }
            for n, s in sorted(cp.machine_state.items(), key=lambda kv: str(kv[0]))
        },
    }
    if cp.entries:
        doc["entries"] = {
            pod: {c: _blocks_json(blocks) for c, blocks in sorted(ctrs.items())}
            for pod, ctrs in sorted(cp.entries.items())
        }
    return doc


def render_memory(cp: MemoryCheckpoint) -> str:
    """The file as a kubelet up to 1.36 writes it (one ``checksum``)."""
    doc = _fields_json(cp)
    doc["checksum"] = cp.checksum
    return dumps(doc)


def render_memory_v3(cp: MemoryCheckpoint) -> str:
    """The file as the 1.37 kubelet writes it (``MemoryManagerCheckpointV3.MarshalCheckpoint``):
    the V1 fields inline with their V1 checksum, then ``data`` (the payload with ``podEntries``
    when set) and ``dataChecksum``."""
    payload = _fields_json(cp)
    if cp.pod_entries:
        payload["podEntries"] = {
            pod: {"memoryBlocks": _blocks_json(blocks)}
            for pod, blocks in sorted(cp.pod_entries.items())
        }
    return render_embedded(_fields_json(cp), cp.v1_checksum(), payload)


def _blocks(raw: Any) -> tuple[MemoryBlock, ...]:
    return tuple(
        MemoryBlock(
            tuple(int(x) for x in b.get("numaAffinity") or ()), str(b["type"]), int(b["size"])
        )
        for b in raw or ()
    )


def _records(doc: Mapping[str, Any]) -> tuple[dict[int, NUMAState], dict[str, Any], dict[str, Any]]:
    """``machineState``, ``entries`` and ``podEntries`` of a checkpoint (or of a V3 payload)."""
    ms: dict[int, NUMAState] = {}
    for n, s in (ci_get(doc, "machineState", {}) or {}).items():
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
            int(s.get("numberOfAssignments", 0)), mm, tuple(int(c) for c in s.get("cells") or ())
        )
    entries = {
        str(pod): {str(c): _blocks(blocks) for c, blocks in ctrs.items()}
        for pod, ctrs in (ci_get(doc, "entries", {}) or {}).items()
    }
    pods = {
        str(pod): _blocks(ci_get(e, "memoryBlocks", ()))
        for pod, e in (ci_get(doc, "podEntries", {}) or {}).items()
    }
    return ms, entries, pods


def _parse_v3(doc: Mapping[str, Any], data: Any, dcs: Any) -> MemoryCheckpoint:
    """The 1.37 kubelet's load of a V3 file: unmarshal the file, then ``data``, then verify
    ``dataChecksum`` over ``data``; the inline V1 fields are not used."""

    def fail(err: str) -> CheckpointError:
        return CheckpointError(V3_LOAD_ERROR.format(err=err))

    outer = "failed to deserialize memory manager checkpoint: json: cannot unmarshal {k} into Go "
    if data is not None and not isinstance(data, str):
        raise fail(
            outer.format(k=go_kind(data))
            + "struct field MemoryManagerCheckpoint.data of type string"
        )
    if dcs is not None and (isinstance(dcs, bool) or not isinstance(dcs, int) or dcs < 0):
        raise fail(
            outer.format(k=go_kind(dcs))
            + "struct field MemoryManagerCheckpoint.dataChecksum of type checksum.Checksum"
        )
    text = data or ""
    inner = "failed to deserialize memory manager checkpoint data: "
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as e:
        if e.pos >= len(text.rstrip()):
            raise fail(inner + "unexpected end of JSON input") from e
        raise fail(inner + f"invalid character {text[e.pos]!r} in checkpoint data") from e
    if not isinstance(payload, dict):
        raise fail(
            inner + f"json: cannot unmarshal {go_kind(payload)} into Go value of type "
            "state.MemoryManagerCheckpointData"
        )
    try:
        ms, entries, pods = _records(payload)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise fail(inner + f"json: cannot unmarshal memory manager checkpoint data: {e}") from e
    if data_checksum(text) != int(dcs or 0):
        raise fail(CORRUPT)
    return MemoryCheckpoint(
        str(ci_get(payload, "policyName", "")),
        ms,
        entries,
        int(ci_get(doc, "checksum", 0) or 0),
        version=3,
        pod_entries=pods,
    )


def parse_memory(text: str, *, reads_v3: bool = True) -> MemoryCheckpoint:
    """Read ``memory_manager_state`` and verify its checksums as the kubelet does.

    A file with ``data`` or ``dataChecksum`` is the 1.37 V3 layout (:func:`render_memory_v3`):
    its payload is the record, ``dataChecksum`` must match and nothing falls back to the inline
    fields. Any other file is the V2/V1 layout: its ``checksum`` must be that of the V2 or the V1
    struct (the kubelet tries V2, then V1), and 0 is accepted. ``reads_v3=False`` reads as a
    kubelet before 1.37 (no V3 code): the inline fields, ``data`` ignored.

    Raises:
        CheckpointError: bad JSON or structure, ``checkpoint is corrupted``, or
            ``could not load v3 checkpoint: ...``.
    """
    doc = load_json(text)
    data = ci_get(doc, "data", None)
    dcs = ci_get(doc, "dataChecksum", None)
    if reads_v3 and (data or dcs):
        return _parse_v3(doc, data, dcs)
    try:
        ms, entries, _pods = _records(doc)
    except (AttributeError, KeyError, TypeError, ValueError) as e:
        raise CheckpointError(f"json: cannot unmarshal memory manager checkpoint: {e}") from e
    cp = MemoryCheckpoint(
        str(ci_get(doc, "policyName", "")), ms, entries, int(ci_get(doc, "checksum", 0) or 0)
    )
    if cp.checksum and cp.checksum not in (cp.computed_checksum(), cp.v1_checksum()):
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
