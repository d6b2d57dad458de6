"""The kubelet device manager's checkpoint (``device-plugins/kubelet_internal_checkpoint``).

Why: it is the one place on a node that says which device IDs the kubelet handed to which pod and
container, grouped by the NUMA node the device plugin reported. The evidence report reads it
(collected read-only by the facts playbook) to prove that no device is assigned to two running
pods and that a Guaranteed pod's GPUs sit on the NUMA node of its exclusive CPUs; the lab kubelet
writes it so that proof runs against the real format.

Format and checksum follow kubernetes v1.36 ``pkg/kubelet/cm/devicemanager/checkpoint``::

    {"Data": {"PodDeviceEntries": [{"PodUID", "ContainerName", "ResourceName",
                                    "DeviceIDs": {"<numa>": ["id", ...]}, "AllocResp": "<base64>"}],
              "RegisteredDevices": {"<resource>": ["id", ...]}},
     "Checksum": N}

``Checksum`` is 32-bit FNV-1a over ``spew`` ``%#v`` of the ``Data`` value (map keys sorted, no
pointer addresses), as for the CPU manager's file (:mod:`rollout.kubelet.checkpoints`); later
kubelets add a ``BootID`` beside ``Data`` that the checksum does not cover. The unit tests check
the values against checkpoints written by the kubelet's own package.

Pure: text in, records out.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.kubelet.checkpoints import CheckpointError, fnv32a

DEVICE_CHECKPOINT_FILE = "device-plugins/kubelet_internal_checkpoint"


@dataclass(frozen=True)
class PodDevices:
    """One ``PodDevicesEntry``: the devices of one resource given to one container.

    Attributes:
        pod_uid: the pod's UID.
        container: the container's name.
        resource: the extended resource (``nvidia.com/gpu``).
        device_ids: NUMA node id -> device IDs, in the plugin's order; ``None`` is Go's nil map.
        alloc_resp: the plugin's serialized AllocateResponse (``None`` is Go's nil slice).
    """

    pod_uid: str
    container: str
    resource: str
    device_ids: Mapping[int, tuple[str, ...] | None] | None = field(default_factory=dict)
    alloc_resp: bytes | None = None

    def devices(self) -> frozenset[str]:
        """Every device ID of the entry, whatever its NUMA node."""
        return frozenset(d for ids in (self.device_ids or {}).values() for d in ids or ())


@dataclass(frozen=True)
class DeviceCheckpoint:
    """The file's content. ``None`` fields are Go nil (``null`` in the JSON)."""

    entries: tuple[PodDevices, ...] | None = ()
    registered: Mapping[str, tuple[str, ...] | None] | None = field(default_factory=dict)
    checksum: int = 0

    def spew(self) -> str:
        """The ``spew`` ``%#v`` text of ``checkpointData`` that the kubelet hashes."""
        if self.entries is None:
            entries = "<nil>"
        else:
            entries = "[" + " ".join(_spew_entry(e) for e in self.entries) + "]"
        if self.registered is None:
            registered = "<nil>"
        else:
            registered = _spew_map(self.registered.items(), key=str)
        return (
            "(checkpoint.checkpointData){PodDeviceEntries:([]checkpoint.PodDevicesEntry)"
            f"{entries} RegisteredDevices:(map[string][]string){registered}}}"
        )

    def computed_checksum(self) -> int:
        return fnv32a(self.spew())


def _spew_list(items: Iterable[str] | None) -> str:
    return "<nil>" if items is None else "[" + " ".join(items) + "]"


def _spew_map(items: Iterable[tuple[Any, tuple[str, ...] | None]], key: Any) -> str:
    inner = " ".join(f"{k}:{_spew_list(v)}" for k, v in sorted(items, key=lambda kv: key(kv[0])))
    return f"map[{inner}]"


def _spew_entry(e: PodDevices) -> str:
    ids = "<nil>" if e.device_ids is None else _spew_map(e.device_ids.items(), key=int)
    resp = "<nil>" if e.alloc_resp is None else _spew_list(str(b) for b in e.alloc_resp)
    return (
        f"{{PodUID:(string){e.pod_uid} ContainerName:(string){e.container} "
        f"ResourceName:(string){e.resource} DeviceIDs:(checkpoint.DevicesPerNUMA){ids} "
        f"AllocResp:([]uint8){resp}}}"
    )


def device_checkpoint(
    entries: Iterable[PodDevices], registered: Mapping[str, Iterable[str]]
) -> DeviceCheckpoint:
    """A checkpoint with the kubelet's checksum filled in."""
    cp = DeviceCheckpoint(tuple(entries), {r: tuple(ids) for r, ids in registered.items()})
    return DeviceCheckpoint(cp.entries, cp.registered, cp.computed_checksum())


def _list(ids: tuple[str, ...] | None) -> list[str] | None:
    return None if ids is None else list(ids)


def render_device(cp: DeviceCheckpoint) -> str:
    """The file content as Go's ``json.Marshal`` writes it (map keys sorted, bytes in base64)."""

    def entry(e: PodDevices) -> dict[str, Any]:
        ids = (
            None
            if e.device_ids is None
            else {str(n): _list(e.device_ids[n]) for n in sorted(e.device_ids, key=str)}
        )
        resp = None if e.alloc_resp is None else base64.b64encode(e.alloc_resp).decode()
        return {
            "PodUID": e.pod_uid,
            "ContainerName": e.container,
            "ResourceName": e.resource,
            "DeviceIDs": ids,
            "AllocResp": resp,
        }

    data = {
        "PodDeviceEntries": None if cp.entries is None else [entry(e) for e in cp.entries],
        "RegisteredDevices": (
            None
            if cp.registered is None
            else {r: _list(cp.registered[r]) for r in sorted(cp.registered)}
        ),
    }
    return json.dumps({"Data": data, "Checksum": cp.checksum}, separators=(",", ":"))


def _ci(doc: Mapping[str, Any], key: str) -> Any:
    """Go's encoding/json matches field names case-insensitively."""
    for k, v in doc.items():
        if k.lower() == key.lower():
            return v
    return None


def _ids(v: Any, what: str) -> tuple[str, ...] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, str) for x in v):
        raise CheckpointError(f"{what}: expected a list of device IDs")
    return tuple(v)


def from_document(doc: Any) -> DeviceCheckpoint:
    """The checkpoint in a parsed JSON document (what the facts playbook returns).

    Raises:
        CheckpointError: not the device manager's format.
    """
    if not isinstance(doc, Mapping) or not isinstance(_ci(doc, "Data"), Mapping):
        raise CheckpointError("not a device manager checkpoint: no Data object")
    data = _ci(doc, "Data")
    raw_entries = _ci(data, "PodDeviceEntries")
    entries: list[PodDevices] | None = None
    if raw_entries is not None:
        if not isinstance(raw_entries, list):
            raise CheckpointError("Data.PodDeviceEntries: expected a list")
        entries = []
        for i, e in enumerate(raw_entries):
            where = f"Data.PodDeviceEntries[{i}]"
            if not isinstance(e, Mapping):
                raise CheckpointError(f"{where}: expected an object")
            raw_ids = _ci(e, "DeviceIDs")
            ids: dict[int, tuple[str, ...] | None] | None = None
            if raw_ids is not None:
                if not isinstance(raw_ids, Mapping):
                    raise CheckpointError(f"{where}.DeviceIDs: expected an object")
                try:
                    ids = {int(n): _ids(v, f"{where}.DeviceIDs.{n}") for n, v in raw_ids.items()}
                except ValueError as err:
                    raise CheckpointError(f"{where}.DeviceIDs: NUMA keys must be integers") from err
            resp = _ci(e, "AllocResp")
            try:
                alloc = None if resp is None else base64.b64decode(str(resp), validate=True)
            except binascii.Error as err:
                raise CheckpointError(f"{where}.AllocResp: not base64") from err
            entries.append(
                PodDevices(
                    str(_ci(e, "PodUID") or ""),
                    str(_ci(e, "ContainerName") or ""),
                    str(_ci(e, "ResourceName") or ""),
                    ids,
                    alloc,
                )
            )
    raw_reg = _ci(data, "RegisteredDevices")
    registered: dict[str, tuple[str, ...] | None] | None = None
    if raw_reg is not None:
        if not isinstance(raw_reg, Mapping):
            raise CheckpointError("Data.RegisteredDevices: expected an object")
        registered = {str(r): _ids(v, f"Data.RegisteredDevices.{r}") for r, v in raw_reg.items()}
    checksum = _ci(doc, "Checksum")
    return DeviceCheckpoint(
        None if entries is None else tuple(entries),
        registered,
        int(checksum) if isinstance(checksum, int) else 0,
    )


def parse_device(text: str) -> DeviceCheckpoint:
    """The file's content, checked as the kubelet checks it.

    Raises:
        CheckpointError: bad JSON or "checkpoint is corrupted" (checksum mismatch).
    """
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise CheckpointError(str(e)) from e
    cp = from_document(doc)
    if cp.checksum != cp.computed_checksum():
        raise CheckpointError("checkpoint is corrupted")
    return cp
