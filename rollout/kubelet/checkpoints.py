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
/ ``memorymanager/policy_static.go``, of v1.37.2 and v1.36.3.

The CPU file has four layouts (:attr:`CPUCheckpoint.version`): V1 (entries by container ID),
V2 (what kubelets up to 1.36 write), V3 (``podEntries`` too: 1.36 with the alpha
``PodLevelResourceManagers`` gate) and, from 1.37, V4 "with embedded V2" (kubernetes#139102):
the V2 fields inline with their V2 checksum, plus ``data`` (the record serialized: entries,
``podEntries``, ``baselines``) and ``dataChecksum``. :func:`parse_cpu` reads as the kubelet of a
given minor does: 1.37 trusts ``data`` and verifies only ``dataChecksum`` (the inline checksum is
never checked), refuses a broken V4 file without falling back, else tries V3 then V2 and reads no
V1; 1.36 reads a V4 file by its inline V2 fields and ignores ``data``, so a rollback keeps the
policy, pool and container CPUs and loses ``podEntries`` and ``baselines``.
:func:`render_cpu_v4` writes what the 1.37 kubelet writes; :func:`render_cpu` the V2 file.
The tests hold both against files the kubelet's own code wrote and read
(``tests/fixtures/kubelet/checkpoints-v1.37.2``, ``tools/gen-checkpoint-vectors.sh``). The memory
manager's 1.37 V3 file is read and written by :mod:`rollout.kubelet.memory_state`;
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
#: the newest kubelet minor this module reads and writes as (1.37: CPU file V4)
LATEST_MINOR = 37
#: cpumanager/state/state_checkpoint.go (1.37): a V4 file that fails to load
V4_LOAD_ERROR = "could not load v4 checkpoint: {err}"


def _spew_entries(entries: Mapping[str, Mapping[str, str]]) -> str:
    return " ".join(
        f"{pod}:map[" + " ".join(f"{c}:{cs}" for c, cs in sorted(ctrs.items())) + "]"
        for pod, ctrs in sorted(entries.items())
    )


def _spew_cpuset(text: str) -> str:
    """``dump.ForHash`` of a ``cpuset.CPUSet`` (its unexported ``elems`` map, keys numeric)."""
    elems = " ".join(f"{c}:{{}}" for c in sorted(cpuset.parse(text)))
    return f"(cpuset.CPUSet){{elems:(map[int]struct {{}})map[{elems}]}}"


@dataclass(frozen=True)
class CPUCheckpoint:
    """``cpu_manager_state``: policy, shared pool, exclusive CPUs (pod UID -> container -> cpus).

    ``checksum`` is the V2 (or V3) struct's checksum: in a V4 file, that of the inline V2 fields.
    """

    policy_name: str
    default_cpu_set: str = ""
    entries: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    checksum: int = 0
    #: the layout read or to write: 1 (a V1 file, container IDs), 2 (V2: the fields above, what
    #: kubelets up to 1.36 write), 3 (V3: ``podEntries`` too, 1.36 with
    #: ``PodLevelResourceManagers``), 4 (1.37: the V2 fields inline, the record in ``data``)
    version: int = 2
    #: pod-level exclusive CPUs (pod UID -> cpus), V3 ``podEntries`` and V4 ``data.podEntries``
    pod_entries: Mapping[str, str] = field(default_factory=dict)
    #: CPUs at admission before any in-place resize (pod UID -> container -> cpus), V4
    #: ``data.baselines``, written only with ``InPlacePodVerticalScalingExclusiveCPUs``
    baselines: Mapping[str, Mapping[str, str]] = field(default_factory=dict)

    def spew(self, struct: str = "CPUManagerCheckpoint") -> str:
        """The ``spew`` ``%#v`` text the kubelet hashes for the V2 fields (checksum zero).

        Every kubelet writes it under the struct name ``CPUManagerCheckpoint`` (1.36 and 1.37
        rename their ``CPUManagerCheckpointV2`` in the text before hashing)."""
        return (
            f"(*state.{struct}){{PolicyName:(string){self.policy_name} "
            f"DefaultCPUSet:(string){self.default_cpu_set} "
            f"Entries:(map[string]map[string]string)map[{_spew_entries(self.entries)}] "
            "Checksum:(checksum.Checksum)0}"
        )

    def v3_spew(self, struct: str = "CPUManagerCheckpoint") -> str:
        """The hashed text of the V3 struct (``PodEntries`` after ``Entries``)."""
        pods = " ".join(
            f"{pod}:{{CPUSet:{_spew_cpuset(cs)}}}" for pod, cs in sorted(self.pod_entries.items())
        )
        return (
            f"(*state.{struct}){{PolicyName:(string){self.policy_name} "
            f"DefaultCPUSet:(string){self.default_cpu_set} "
            f"Entries:(map[string]map[string]string)map[{_spew_entries(self.entries)}] "
            f"PodEntries:(state.PodCPUAssignments)map[{pods}] Checksum:(checksum.Checksum)0}}"
        )

    def computed_checksum(self) -> int:
        """The checksum of the V2 fields (the whole file up to 1.36, the inline part in V4)."""
        return fnv32a(self.spew())

    def v3_checksum(self, struct: str = "CPUManagerCheckpoint") -> int:
        return fnv32a(self.v3_spew(struct))

    def assigned(self) -> frozenset[int]:
        """All CPUs held exclusively by containers."""
        out: set[int] = set()
        for ctrs in self.entries.values():
            for cs in ctrs.values():
                out |= cpuset.parse(cs)
        return frozenset(out)


def cpu_checkpoint(
    policy_name: str,
    default_cpus: Iterable[int],
    entries: Mapping[str, Mapping[str, str]],
    *,
    version: int = 2,
    pod_entries: Mapping[str, str] | None = None,
    baselines: Mapping[str, Mapping[str, str]] | None = None,
) -> CPUCheckpoint:
    """A checkpoint with the kubelet's checksum filled in (V3's for ``version=3``, else V2's)."""
    cp = CPUCheckpoint(
        policy_name,
        cpuset.format_cpus(default_cpus),
        {p: dict(c) for p, c in entries.items()},
        version=version,
        pod_entries=dict(pod_entries or {}),
        baselines={p: dict(c) for p, c in (baselines or {}).items()},
    )
    checksum = cp.v3_checksum() if version == 3 else cp.computed_checksum()
    return CPUCheckpoint(
        cp.policy_name,
        cp.default_cpu_set,
        cp.entries,
        checksum,
        version,
        cp.pod_entries,
        cp.baselines,
    )


def dumps(doc: Mapping[str, Any]) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False)


def _v2_fields(cp: CPUCheckpoint) -> dict[str, Any]:
    doc: dict[str, Any] = {"policyName": cp.policy_name, "defaultCpuSet": cp.default_cpu_set}
    if cp.entries:
        doc["entries"] = {p: dict(sorted(c.items())) for p, c in sorted(cp.entries.items())}
    return doc


def render_cpu(cp: CPUCheckpoint) -> str:
    """The V2 file, as kubelets up to 1.36 write it with Go's ``json.Marshal`` (``entries``
    omitted when empty)."""
    doc = _v2_fields(cp)
    doc["checksum"] = cp.checksum
    return dumps(doc)


def render_cpu_v4(cp: CPUCheckpoint) -> str:
    """The file as the 1.37 kubelet writes it (``CPUManagerCheckpoint.MarshalCheckpoint``,
    kubernetes#139102): the V2 fields inline with their V2 checksum (what 1.36 reads), then
    ``data``, the record serialized (``entries``, ``podEntries``, ``baselines`` each omitted
    when empty), and ``dataChecksum``, its checksum (what 1.37 reads)."""
    payload = _v2_fields(cp)
    if cp.pod_entries:
        payload["podEntries"] = {
            p: ({"cpuSet": cs} if cs else {}) for p, cs in sorted(cp.pod_entries.items())
        }
    if cp.baselines:
        payload["baselines"] = {
            p: {c: {"baseline": cs} for c, cs in sorted(ctrs.items())}
            for p, ctrs in sorted(cp.baselines.items())
        }
    return render_embedded(_v2_fields(cp), cp.computed_checksum(), payload)


def render_embedded(inline: dict[str, Any], checksum: int, payload: Mapping[str, Any]) -> str:
    """The 1.37 layout of both manager files: the old layout's fields inline with their
    checksum (what 1.36 reads), then ``data`` (``payload`` serialized) and ``dataChecksum``."""
    data = dumps(payload)
    return dumps(
        {**inline, "checksum": checksum, "data": data, "dataChecksum": data_checksum(data)}
    )


def cpu_layout_for(kubelet_minor: int | None) -> int:
    """The layout a kubelet of this minor writes (None: the newest): 4 from 1.37, else 2 (the
    V3 layout only with the alpha ``PodLevelResourceManagers`` gate, which the lab never sets)."""
    return 4 if (kubelet_minor or LATEST_MINOR) >= 37 else 2


def ci_get(doc: Mapping[str, Any], key: str, default: Any) -> Any:
    """Go's encoding/json matches field names case-insensitively."""
    for k, v in doc.items():
        if k.lower() == key.lower():
            return v
    return default


def go_json_syntax_error(text: str, e: json.JSONDecodeError) -> str:
    """encoding/json's text for a syntax error: exact for a truncated document (the usual
    damage: a short write); otherwise the offending character, in Go's words where it is
    looking for a value."""
    if e.pos >= len(text.rstrip()):
        return "unexpected end of JSON input"
    c = text[e.pos]
    return f"invalid character {c!r} looking for beginning of value"


def load_json(text: str) -> dict[str, Any]:
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(go_json_syntax_error(text, e)) from e
    if not isinstance(doc, dict):
        raise CheckpointError("json: cannot unmarshal checkpoint: not an object")
    return doc


def go_kind(v: Any) -> str:
    """The JSON kind as encoding/json names it in an UnmarshalTypeError."""
    if isinstance(v, bool):
        return "bool"
    if isinstance(v, (int, float)):
        return "number"
    if isinstance(v, str):
        return "string"
    return "array" if isinstance(v, list) else "object"


def _is_uint(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


_STR = "string"
_SUM = "checksum.Checksum"
_ENTRIES = "map[string]map[string]string"
_PODS = "state.PodCPUAssignments"
_BASELINES = "map[string]map[string]state.ContainerCPUs"
#: Go map / slice type -> its element type; struct types -> their string field
_ELEM = {
    _ENTRIES: "map[string]string",
    "map[string]string": _STR,
    _PODS: "state.podEntryJSON",
    _BASELINES: "map[string]state.ContainerCPUs",
    "map[string]state.ContainerCPUs": "state.ContainerCPUs",
}
_STRUCT_FIELD = {"state.podEntryJSON": "cpuSet", "state.ContainerCPUs": "baseline"}
#: the fields each struct decodes (JSON name -> Go type), in declaration order
_V1_FIELDS = {
    "policyName": _STR,
    "defaultCpuSet": _STR,
    "entries": "map[string]string",
    "checksum": _SUM,
}
_V2_FIELDS = {"policyName": _STR, "defaultCpuSet": _STR, "entries": _ENTRIES, "checksum": _SUM}
_V3_FIELDS = {
    "policyName": _STR,
    "defaultCpuSet": _STR,
    "entries": _ENTRIES,
    "podEntries": _PODS,
    "checksum": _SUM,
}
_DATA_FIELDS = {
    "policyName": _STR,
    "defaultCpuSet": _STR,
    "entries": _ENTRIES,
    "podEntries": _PODS,
    "baselines": _BASELINES,
}


def _type_error(v: Any, go_type: str) -> tuple[str, str] | None:
    """``(json kind, go type)`` of the first value encoding/json cannot store in ``go_type``."""
    if v is None:
        return None
    if go_type == _STR:
        return None if isinstance(v, str) else (go_kind(v), _STR)
    if go_type == _SUM:
        return None if _is_uint(v) else (go_kind(v), _SUM)
    if not isinstance(v, dict):
        return (go_kind(v), go_type)
    if go_type in _STRUCT_FIELD:
        return _type_error(ci_get(v, _STRUCT_FIELD[go_type], None), _STR)
    for x in v.values():
        err = _type_error(x, _ELEM[go_type])
        if err:
            return err
    return None


def _decode(doc: Mapping[str, Any], struct: str, fields: Mapping[str, str]) -> str | None:
    """The error ``json.Unmarshal`` returns for ``doc`` into the struct, or None. Like Go, it
    reports the first bad field in the document's order (the value it could decode is kept)."""
    lower = {k.lower(): k for k in fields}
    for key, v in doc.items():
        name = lower.get(key.lower())
        if name is None:
            continue
        err = _type_error(v, fields[name])
        if err:
            kind, go_type = err
            return (
                f"json: cannot unmarshal {kind} into Go struct field {struct}.{name} of type "
                f"{go_type}"
            )
    return None


def _str(doc: Mapping[str, Any], key: str) -> str:
    v = ci_get(doc, key, "")
    return v if isinstance(v, str) else ""


def _entries(doc: Mapping[str, Any]) -> dict[str, dict[str, str]]:
    raw = ci_get(doc, "entries", None)
    if not isinstance(raw, dict):
        return {}
    return {
        str(p): {str(c): str(s) for c, s in v.items()}
        for p, v in raw.items()
        if isinstance(v, dict)
    }


def _pod_entries(doc: Mapping[str, Any]) -> dict[str, str]:
    raw = ci_get(doc, "podEntries", None)
    if not isinstance(raw, dict):
        return {}
    out = {}
    for p, e in raw.items():
        text = str(ci_get(e, "cpuSet", "") or "") if isinstance(e, dict) else ""
        try:
            out[str(p)] = cpuset.format_cpus(cpuset.parse(text))
        except cpuset.CPUSetError as err:
            raise CheckpointError(f"failed to parse cpuset: {err}") from err
    return out


def _record(doc: Mapping[str, Any], version: int, checksum: int) -> CPUCheckpoint:
    baselines: dict[str, dict[str, str]] = {}
    raw = ci_get(doc, "baselines", None) if version == 4 else None
    for p, ctrs in (raw or {}).items():
        baselines[str(p)] = {
            str(c): str(ci_get(b, "baseline", "") or "") for c, b in (ctrs or {}).items()
        }
    return CPUCheckpoint(
        _str(doc, "policyName"),
        _str(doc, "defaultCpuSet"),
        _entries(doc),
        checksum,
        version,
        _pod_entries(doc) if version >= 3 else {},
        baselines,
    )


def _checksum(doc: Mapping[str, Any]) -> int:
    v = ci_get(doc, "checksum", 0)
    return v if _is_uint(v) else 0


def _load_v4(doc: Mapping[str, Any]) -> CPUCheckpoint:
    """``CPUManagerCheckpoint`` (V4) ``UnmarshalCheckpoint`` + ``VerifyChecksum``: only
    ``dataChecksum`` over ``data`` is verified; the inline checksum is not read."""
    outer = _decode(doc, "CPUManagerCheckpoint.CPUManagerCheckpointV2", _V2_FIELDS)
    if outer is None:
        outer = _decode(doc, "CPUManagerCheckpoint", {"data": _STR, "dataChecksum": _SUM})
    if outer is not None:
        raise CheckpointError(f"failed to deserialize cpu manager checkpoint: {outer}")
    text = _str(doc, "data")
    inner = "failed to deserialize cpu manager checkpoint data: "
    try:
        payload = json.loads(text)
    except json.JSONDecodeError as e:
        raise CheckpointError(inner + go_json_syntax_error(text, e)) from e
    if not isinstance(payload, dict):
        raise CheckpointError(
            inner + f"json: cannot unmarshal {go_kind(payload)} into Go value of type "
            "state.CPUManagerCheckpointData"
        )
    err = _decode(payload, "CPUManagerCheckpointData", _DATA_FIELDS)
    if err is not None:
        raise CheckpointError(inner + err)
    try:
        cp = _record(payload, 4, _checksum(doc))
    except (AttributeError, TypeError) as e:
        raise CheckpointError(
            inner + f"json: cannot unmarshal cpu manager checkpoint data: {e}"
        ) from e
    dcs = ci_get(doc, "dataChecksum", 0)
    if data_checksum(text) != (dcs if _is_uint(dcs) else 0):
        raise CheckpointError(CORRUPT)
    return cp


def _load_v3(doc: Mapping[str, Any], struct: str, names: tuple[str, ...]) -> CPUCheckpoint:
    err = _decode(doc, struct, _V3_FIELDS)
    if err is not None:
        raise CheckpointError(err)
    cp = _record(doc, 3, _checksum(doc))
    if cp.checksum not in {cp.v3_checksum(n) for n in names}:
        raise CheckpointError(CORRUPT)  # V3 accepts no zero checksum
    return cp


def _load_v2(doc: Mapping[str, Any], gate: bool) -> CPUCheckpoint:
    err = _decode(doc, "CPUManagerCheckpointV2", _V2_FIELDS)
    if err is not None:
        raise CheckpointError(err)
    cp = _record(doc, 2, _checksum(doc))
    # a zero checksum is accepted; with the PodLevelResourceManagers gate off, the text under
    # the struct's own name too (no kubelet writes that one)
    ok = {0, cp.computed_checksum()} | (
        set() if gate else {fnv32a(cp.spew("CPUManagerCheckpointV2"))}
    )
    if cp.checksum not in ok:
        raise CheckpointError(CORRUPT)
    return cp


def _load_v1(doc: Mapping[str, Any]) -> CPUCheckpoint:
    """1.36's last resort (V1, ``entries`` keyed by container ID); its migration to V2 needs the
    container in the runtime's list, which a fresh start does not have."""
    err = _decode(doc, "CPUManagerCheckpointV1", _V1_FIELDS)
    if err is not None:
        raise CheckpointError(err)
    raw = ci_get(doc, "entries", None) or {}
    entries = {str(k): str(v) for k, v in raw.items()}
    policy, default = _str(doc, "policyName"), _str(doc, "defaultCpuSet")
    checksum = _checksum(doc)
    text = (
        f"(*state.CPUManagerCheckpoint){{PolicyName:(string){policy} "
        f"DefaultCPUSet:(string){default} Entries:(map[string]string)map["
        + " ".join(f"{k}:{v}" for k, v in sorted(entries.items()))
        + "] Checksum:(checksum.Checksum)0}"
    )
    if checksum and checksum != fnv32a(text):
        raise CheckpointError(CORRUPT)
    if entries:
        # (Go iterates the map in random order: with several entries any one may be named)
        raise CheckpointError(
            f"failed to migrate checkpoint from v1 to v2: containerID '{min(entries)}' not found "
            "in initial containers list"
        )
    return CPUCheckpoint(policy, default, {}, checksum, version=1)


def parse_cpu(
    text: str, *, kubelet_minor: int | None = None, gates: Mapping[str, Any] | None = None
) -> CPUCheckpoint:
    """Read ``cpu_manager_state`` as the kubelet of ``kubelet_minor`` (None: the newest) does.

    1.37 (``loadAndMigrateCheckpointV4``): V4 first; a file with ``data`` or a non-zero
    ``dataChecksum`` that fails is refused (``could not load v4 checkpoint: ...``), any other
    falls back to V3 (``podEntries``, checksum required) and then V2 (the inline fields, 0
    accepted); 1.37 reads no V1 file. Up to 1.36: V3 (only with the
    ``PodLevelResourceManagers`` gate), V2, then V1; a V4 file is read by its inline V2 fields
    and ``data`` is ignored. Each step's error is the one the kubelet returns (the last step's
    when all fail).

    Raises:
        CheckpointError: with the kubelet's error (still to be wrapped in
            :data:`CPU_RESTORE_ERROR`).
    """
    doc = load_json(text)
    plrm = bool((gates or {}).get("PodLevelResourceManagers") is True)
    if (kubelet_minor or LATEST_MINOR) >= 37:
        try:
            return _load_v4(doc)
        except CheckpointError as e:
            data, dcs = ci_get(doc, "data", ""), ci_get(doc, "dataChecksum", 0)
            if (isinstance(data, str) and data) or (_is_uint(dcs) and dcs):
                raise CheckpointError(V4_LOAD_ERROR.format(err=e)) from e
        try:
            return _load_v3(
                doc, "CPUManagerCheckpointV3", ("CPUManagerCheckpointV3", "CPUManagerCheckpoint")
            )
        except CheckpointError:
            return _load_v2(doc, plrm)
    pods: dict[str, str] = {}
    if plrm:
        try:
            return _load_v3(doc, "CPUManagerCheckpoint", ("CPUManagerCheckpoint",))
        except CheckpointError:
            # 1.36 migrates V2 into the V3 struct its failed attempt filled (no reset): the
            # podEntries of a V3 file with a zero or stale checksum survive
            if _decode(doc, "CPUManagerCheckpoint", _V3_FIELDS) is None:
                pods = _pod_entries(doc)
    try:
        cp = _load_v2(doc, plrm)
    except CheckpointError:
        cp = _load_v1(doc)
    if plrm:
        return CPUCheckpoint(
            cp.policy_name, cp.default_cpu_set, cp.entries, cp.checksum, 3, pods, {}
        )
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
    kubelet_minor: int | None = None,
) -> str | None:
    """The error the kubelet's CPU manager fails to start with, or None.

    The restore error (policy mismatch, unparsable sets) comes wrapped with the "please drain this
    node" text; the static policy's ``validateState`` errors come bare, as the kubelet returns them.
    ``cp`` is the record :func:`parse_cpu` read for the same ``kubelet_minor`` (None: the
    newest; 1.37 writes "default CPU set" where 1.36 wrote "default cpu set").
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
        what = "CPU" if (kubelet_minor or LATEST_MINOR) >= 37 else "cpu"
        inner = f'could not parse default {what} set "{cp.default_cpu_set}": {e}'
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


#: Feature gates that change what ``cpu_manager_state`` and ``memory_manager_state`` hold:
#: ``PodLevelResourceManagers`` (alpha 1.36, beta but off by default in 1.37, #141209; a kubelet
#: that used it cannot turn it off without draining and deleting both files, per the docs: a 1.36
#: kubelet without the gate refuses the V3 file it wrote with it, see the checkpoint vectors) and
#: ``InPlacePodVerticalScalingExclusiveCPUs`` (alpha 1.37, #139102: adds ``baselines`` to the V4
#: ``data``; v1.37.2 reads a V4 file with or without them, and the memory manager never reads
#: the gate, so resetting on its flip is caution, not the kubelet's need). Both off unless set.
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
