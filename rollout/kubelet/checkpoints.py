"""The kubelet's CPU and Memory manager checkpoint files; when a config change must remove them.

The kubelet writes ``<root-dir>/cpu_manager_state`` and ``<root-dir>/memory_manager_state`` for
every policy (``none`` and ``None`` included) and, at start, refuses to run when the file
disagrees with the configuration: the process exits 1 and systemd restarts it in a loop until
someone drains the node and deletes the file. ``rollout apply`` must delete exactly the files
that a change would trip (:func:`reset_needed`), and the lab kubelet must fail exactly where the
kubelet fails, with its words.

Formats and texts follow kubernetes
``pkg/kubelet/cm/cpumanager/state/{checkpoint,state_checkpoint}.go``,
``cpumanager/policy_static.go`` (``validateState``) and ``cm/memorymanager/state/checkpoint.go``
/ ``memorymanager/policy_static.go`` (v1.36: the "V2" checkpoint structs; the later "V3" layout
is behind the alpha ``PodLevelResourceManagers`` gate and is not produced).

1.37 changed the CPU file to "V4 with embedded V2" (kubernetes#139102: the V2 fields inline plus
a serialized payload with a checksum of its own). That merged code is not in the sources this
module was checked against (only a closed alternative, #139103, and reverted designs are), so
:func:`parse_cpu` does not read V4: it reads the inline V2 fields, as a 1.36 kubelet reads such a
file. The memory manager's 1.37 V3 file is read and written (:mod:`rollout.kubelet.memory_state`);
:func:`data_checksum` is the checksum rule of both payload strings.

Checksums are reproduced exactly: the kubelet hashes ``spew`` ``%#v`` output of the checkpoint
struct (``checksum`` zeroed, pointer addresses disabled, map keys sorted) with 32-bit FNV-1a.
The unit tests check the values against the kubelet's own test vectors.

The memory manager's file lives in :mod:`rollout.kubelet.memory_state`. Everything here is pure:
text in, records and messages out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.kubelet import cpuset
from rollout.kubelet.findings import Finding, Severity

CPU_STATE_FILE = "cpu_manager_state"
MEMORY_STATE_FILE = "memory_manager_state"

CPU_RESTORE_ERROR = (
    "could not restore state from checkpoint: {err}, please drain this node and delete the CPU "
    'manager checkpoint file "{path}" before restarting Kubelet'
)
CORRUPT = "checkpoint is corrupted"


class CheckpointError(ValueError):
    """A checkpoint file the kubelet could not load (bad JSON or checksum)."""


def fnv32a(text: str) -> int:
    """32-bit FNV-1a, as Go's ``hash/fnv.New32a``."""
    h = 0x811C9DC5
    for b in text.encode():
        h ^= b
        h = (h * 0x01000193) & 0xFFFFFFFF
    return h


def data_checksum(data: str) -> int:
    """``checksum.New(data)`` for a serialized ``data`` string: the checkpoint formats that keep
    their payload as a JSON string (memory manager V3 in 1.37, like the DRA and allocation
    checkpoints) hash ``spew`` ``%#v`` of the string, which is ``(string)`` followed by the text.

    Checked against the kubelet's own test vectors (``tests/unit/test_checkpoints.py``).
    """
    return fnv32a("(string)" + data)


# ------------------------------------------------------------------------------------ CPU manager
@dataclass(frozen=True)
class CPUCheckpoint:
    """``cpu_manager_state``: policy, shared pool, exclusive CPUs (pod UID -> container -> cpus)."""

    policy_name: str
    default_cpu_set: str = ""
    entries: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    checksum: int = 0

    def spew(self) -> str:
        """The ``spew`` ``%#v`` text the kubelet hashes (checksum field zero)."""
        inner = " ".join(
            f"{pod}:map[" + " ".join(f"{c}:{cs}" for c, cs in sorted(ctrs.items())) + "]"
            for pod, ctrs in sorted(self.entries.items())
        )
        return (
            f"(*state.CPUManagerCheckpoint){{PolicyName:(string){self.policy_name} "
            f"DefaultCPUSet:(string){self.default_cpu_set} "
            f"Entries:(map[string]map[string]string)map[{inner}] Checksum:(checksum.Checksum)0}}"
        )

    def computed_checksum(self) -> int:
        return fnv32a(self.spew())

    def assigned(self) -> frozenset[int]:
        """All CPUs held exclusively by containers."""
        out: set[int] = set()
        for ctrs in self.entries.values():
            for cs in ctrs.values():
                out |= cpuset.parse(cs)
        return frozenset(out)


def cpu_checkpoint(
    policy_name: str, default_cpus: Iterable[int], entries: Mapping[str, Mapping[str, str]]
) -> CPUCheckpoint:
    """A checkpoint with the kubelet's checksum filled in."""
    cp = CPUCheckpoint(
        policy_name,
        cpuset.format_cpus(default_cpus),
        {p: dict(c) for p, c in entries.items()},
    )
    return CPUCheckpoint(cp.policy_name, cp.default_cpu_set, cp.entries, cp.computed_checksum())


def render_cpu(cp: CPUCheckpoint) -> str:
    """The file content, as Go's ``json.Marshal`` writes it (``entries`` omitted when empty)."""
    doc: dict[str, Any] = {"policyName": cp.policy_name, "defaultCpuSet": cp.default_cpu_set}
    if cp.entries:
        doc["entries"] = {p: dict(sorted(c.items())) for p, c in sorted(cp.entries.items())}
    doc["checksum"] = cp.checksum
    return json.dumps(doc, separators=(",", ":"))


def ci_get(doc: Mapping[str, Any], key: str, default: Any) -> Any:
    """Go's encoding/json matches field names case-insensitively."""
    for k, v in doc.items():
        if k.lower() == key.lower():
            return v
    return default


def load_json(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"invalid character in checkpoint: {e}") from e
    if not isinstance(doc, dict):
        raise CheckpointError("json: cannot unmarshal checkpoint: not an object")
    return doc


def parse_cpu(text: str) -> CPUCheckpoint:
    """Read ``cpu_manager_state``; verify the checksum as the kubelet does (0 is accepted).

    Raises:
        CheckpointError: bad JSON, or ``checkpoint is corrupted``.
    """
    doc = load_json(text)
    entries = ci_get(doc, "entries", {}) or {}
    if not isinstance(entries, dict) or not all(isinstance(v, dict) for v in entries.values()):
        raise CheckpointError(CORRUPT)
    cp = CPUCheckpoint(
        str(ci_get(doc, "policyName", "")),
        str(ci_get(doc, "defaultCpuSet", "")),
        {str(p): {str(c): str(s) for c, s in v.items()} for p, v in entries.items()},
        int(ci_get(doc, "checksum", 0) or 0),
    )
    if cp.checksum and cp.checksum != cp.computed_checksum():
        raise CheckpointError(CORRUPT)
    return cp


def cpu_initial_state(
    policy_name: str, all_cpus: Iterable[int], reserved: Iterable[int], strict: bool = False
) -> CPUCheckpoint:
    """What the kubelet writes on a clean start: ``none`` keeps an empty default set; ``static``
    puts every CPU in the shared pool (minus the reserved ones under ``strict-cpu-reservation``)."""
    if policy_name != "static":
        return cpu_checkpoint(policy_name, (), {})
    pool = set(all_cpus) - (set(reserved) if strict else set())
    return cpu_checkpoint(policy_name, pool, {})


def cpu_start_error(
    path: str,
    configured_policy: str,
    cp: CPUCheckpoint,
    *,
    all_cpus: Iterable[int],
    reserved: Iterable[int],
    strict: bool = False,
) -> str | None:
    """The error the kubelet's CPU manager fails to start with, or None.

    The restore error (policy mismatch, unparsable sets) comes wrapped with the "please drain this
    node" text; the static policy's ``validateState`` errors come bare, as the kubelet returns them.
    """
    if cp.policy_name != configured_policy:
        inner = (
            f'configured policy "{configured_policy}" differs from state checkpoint policy '
            f'"{cp.policy_name}"'
        )
        return CPU_RESTORE_ERROR.format(err=inner, path=path)
    try:
        default = cpuset.parse(cp.default_cpu_set)
    except cpuset.CPUSetError as e:
        inner = f'could not parse default cpu set "{cp.default_cpu_set}": {e}'
        return CPU_RESTORE_ERROR.format(err=inner, path=path)
    assigned: dict[tuple[str, str], frozenset[int]] = {}
    for pod, ctrs in sorted(cp.entries.items()):
        for ctr, text in sorted(ctrs.items()):
            try:
                assigned[(pod, ctr)] = cpuset.parse(text)
            except cpuset.CPUSetError as e:
                inner = f'could not parse cpuset "{text}" for container "{ctr}" in pod "{pod}": {e}'
                return CPU_RESTORE_ERROR.format(err=inner, path=path)
    if configured_policy != "static":
        return None
    return _static_validate(default, assigned, frozenset(all_cpus), frozenset(reserved), strict)


def _static_validate(
    default: frozenset[int],
    assigned: Mapping[tuple[str, str], frozenset[int]],
    all_cpus: frozenset[int],
    reserved: frozenset[int],
    strict: bool,
) -> str | None:
    """policy_static.go ``validateState`` on a non-empty state."""
    if not default and not assigned:
        return None  # empty state: the kubelet initialises it
    fmt = cpuset.format_cpus
    if strict:
        if reserved & default:
            return (
                f'some of strictly reserved cpus: "{fmt(reserved)}" are present in '
                f'defaultCpuSet: "{fmt(default)}"'
            )
    elif reserved & default != reserved:
        return (
            f'not all reserved cpus: "{fmt(reserved)}" are present in '
            f'defaultCpuSet: "{fmt(default)}"'
        )
    for (pod, ctr), cpus in assigned.items():
        if cpus & default:
            return (
                f'pod: {pod}, container: {ctr} cpuset: "{fmt(cpus)}" overlaps with default '
                f'cpuset "{fmt(default)}"'
            )
    total = set(default)
    for cpus in assigned.values():
        total |= cpus
    if strict:
        total |= reserved
    if total != all_cpus:
        return (
            f'current set of available CPUs "{fmt(all_cpus)}" doesn\'t match with CPUs in state '
            f'"{fmt(total)}"'
        )
    return None


# ------------------------------------------------------------------------ what a change must reset
_CPU_KEYS = ("cpuManagerPolicy", "reservedSystemCPUs", "cpuManagerPolicyOptions")
_MEMORY_KEYS = ("reservedMemory",)


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    cur: Any = cfg
    for part in dotted.split("."):
        if not isinstance(cur, Mapping):
            return None
        cur = cur.get(part)
    return cur


def reset_needed(before_cfg: Mapping[str, Any], after_cfg: Mapping[str, Any]) -> tuple[str, ...]:
    """Which checkpoint files (``cpu_manager_state``, ``memory_manager_state``) a configuration
    change requires removing before the kubelet restarts.

    The CPU file when the CPU policy, its options or the reserved CPUs change
    (``reservedSystemCPUs``, or ``kubeReserved.cpu`` / ``systemReserved.cpu`` while either side
    uses ``static``): the kubelet either refuses the file or keeps exclusive CPUs that overlap the
    new reservation. The memory file when the memory policy changes, or, while either side is
    ``Static``, when the reservation it validates against changes (``reservedMemory``,
    ``kubeReserved.memory``, ``systemReserved.memory``, ``evictionHard["memory.available"]``).
    Website docs: "Changing the CPU Manager Policy" and the Memory Manager page both prescribe
    drain, stop, delete, start.

    Args:
        before_cfg: the effective KubeletConfiguration before (camelCase keys, as in ``/configz``).
        after_cfg: the effective KubeletConfiguration after.
    """
    out: list[str] = []
    cpu_policy = (
        before_cfg.get("cpuManagerPolicy") or "none",
        after_cfg.get("cpuManagerPolicy") or "none",
    )
    cpu_keys = list(_CPU_KEYS)
    if "static" in cpu_policy:
        cpu_keys += ["kubeReserved.cpu", "systemReserved.cpu"]
    norm_cpu = {
        "cpuManagerPolicy": lambda v: v or "none",
        "cpuManagerPolicyOptions": lambda v: v or {},
        "reservedSystemCPUs": _cpus_or_text,
    }
    if any(
        norm_cpu.get(k, _same)(_get(before_cfg, k)) != norm_cpu.get(k, _same)(_get(after_cfg, k))
        for k in cpu_keys
    ):
        out.append(CPU_STATE_FILE)
    mem_policy = (
        before_cfg.get("memoryManagerPolicy") or "None",
        after_cfg.get("memoryManagerPolicy") or "None",
    )
    mem_changed = mem_policy[0] != mem_policy[1]
    if not mem_changed and "Static" in mem_policy:
        keys = [*_MEMORY_KEYS, "kubeReserved.memory", "systemReserved.memory"]
        mem_changed = any(_get(before_cfg, k) != _get(after_cfg, k) for k in keys) or (
            (before_cfg.get("evictionHard") or {}).get("memory.available")
            != (after_cfg.get("evictionHard") or {}).get("memory.available")
        )
    if mem_changed:
        out.append(MEMORY_STATE_FILE)
    if gate_flips(before_cfg, after_cfg):
        # the gate changes both files' format: neither is read back safely across the flip
        out += [f for f in (CPU_STATE_FILE, MEMORY_STATE_FILE) if f not in out]
    return tuple(out)


#: Feature gates that change the format of ``cpu_manager_state`` and ``memory_manager_state``:
#: ``PodLevelResourceManagers`` (alpha 1.36, beta but off by default in 1.37, #141209; a kubelet
#: that used it cannot turn it off without draining and deleting both files, per the docs) and
#: ``InPlacePodVerticalScalingExclusiveCPUs`` (alpha 1.37, on checkpoint v4, #139102). Both are
#: off unless set.
CHECKPOINT_GATES = ("PodLevelResourceManagers", "InPlacePodVerticalScalingExclusiveCPUs")

#: the fields whose change is a resource-manager policy change (besides the checkpoint resets)
_POLICY_KEYS = (
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "reservedSystemCPUs",
    "memoryManagerPolicy",
    "reservedMemory",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "topologyManagerPolicyOptions",
)


def _gate(cfg: Mapping[str, Any], name: str) -> bool:
    gates = cfg.get("featureGates")
    return isinstance(gates, Mapping) and gates.get(name) is True


def gate_flips(
    before_cfg: Mapping[str, Any], after_cfg: Mapping[str, Any]
) -> tuple[tuple[str, bool, bool], ...]:
    """``(gate, before, after)`` for each :data:`CHECKPOINT_GATES` gate the change flips."""
    return tuple(
        (g, _gate(before_cfg, g), _gate(after_cfg, g))
        for g in CHECKPOINT_GATES
        if _gate(before_cfg, g) != _gate(after_cfg, g)
    )


def policy_changes(before_cfg: Mapping[str, Any], after_cfg: Mapping[str, Any]) -> list[str]:
    """The resource-manager policy fields that differ between the two configurations."""
    empty: dict[str, Any] = {}
    defaults = {
        "cpuManagerPolicy": "none",
        "memoryManagerPolicy": "None",
        "topologyManagerPolicy": "none",
        "topologyManagerScope": "container",
    }

    def norm(cfg: Mapping[str, Any], k: str) -> Any:
        v = cfg.get(k)
        if k == "reservedSystemCPUs":
            return _cpus_or_text(v)
        if v in (None, "", empty, []):
            return defaults.get(k)
        return v

    return [k for k in _POLICY_KEYS if norm(before_cfg, k) != norm(after_cfg, k)]


def gate_flip_findings(
    before_cfg: Mapping[str, Any],
    after_cfg: Mapping[str, Any],
    where: Mapping[str, Any] | None = None,
) -> list[Finding]:
    """A refusal for each checkpoint-format gate flipped in the same change as a policy.

    ``where`` maps top-level fields to their origin (anything with ``file`` and ``line``).
    """
    flips = gate_flips(before_cfg, after_cfg)
    changed = policy_changes(before_cfg, after_cfg)
    if not flips or not changed:
        return []
    origin = (where or {}).get("featureGates")
    out = []
    for gate, old, new in flips:
        out.append(
            Finding(
                severity=Severity.ERROR,
                field=f"featureGates.{gate}",
                message=(
                    f"feature gate {gate} changes from {str(old).lower()} to {str(new).lower()} "
                    f"in the same change as {', '.join(changed)}: the gate changes the format "
                    f"of {CPU_STATE_FILE} and {MEMORY_STATE_FILE}, and a kubelet that ran with "
                    "it cannot switch it off without draining the node and deleting both "
                    "files; flip the gate in a change of its own, then change the policy"
                ),
                file=getattr(origin, "file", None),
                line=getattr(origin, "line", None),
            )
        )
    return out


def _same(v: Any) -> Any:
    return v


def _cpus_or_text(v: Any) -> Any:
    """``"0,1"`` and ``"0-1"`` reserve the same CPUs; unparsable text compares as text."""
    try:
        return cpuset.parse(str(v or ""))
    except cpuset.CPUSetError:
        return v
