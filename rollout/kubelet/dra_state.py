"""The kubelet DRA manager's checkpoint (``dra_manager_state`` in the kubelet's root directory).

Why: it is the kubelet's own record of the ResourceClaims it has prepared on the node (which
driver prepared which device of which pool, for which pods). Until a claim's last pod is gone the
kubelet keeps it here; it removes the entry only once the driver has unprepared it
(``NodeUnprepareResources``). The allocation-path change reads it (through the facts module,
read-only) to confirm a node's DRA devices are released before the driver is stopped.

Format follows kubernetes v1.36 ``pkg/kubelet/cm/dra/state`` (``checkpoint.go``, ``state.go``)::

    {"Data": "<JSON text>", "Checksum": N}

where ``Checksum`` is CRC-32 (IEEE) of the bytes of ``Data``, and ``Data`` is::

    {"kind": "DRACheckpoint", "apiVersion": "checkpoint.dra.kubelet.k8s.io/v1",
     "ClaimInfoStateList": [{"ClaimUID", "ClaimName", "Namespace",
                             "PodUIDs": {"<uid>": {}, ...},
                             "DriverState": {"<driver>": {"Devices": [{"PoolName",
                                 "DeviceName", "ShareID", "RequestNames", "CDIDeviceIDs"}]}}}]}

The unit tests check the values against checkpoints from the kubelet's own package tests.

Pure: parsed JSON in, records out.
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from rollout.kubelet.checkpoints import CheckpointError, ci_get

DRA_STATE_FILE = "dra_manager_state"
DRA_KIND = "DRACheckpoint"
DRA_API_VERSION = "checkpoint.dra.kubelet.k8s.io/v1"


@dataclass(frozen=True)
class PreparedClaim:
    """One ``ClaimInfoState``: a claim the kubelet has prepared on the node.

    Attributes:
        uid: the claim's UID. name, namespace: the claim's.
        pod_uids: the pods that reference it.
        devices: driver -> ``pool/device`` of each device it prepared for the claim.
    """

    uid: str
    name: str
    namespace: str
    pod_uids: tuple[str, ...]
    devices: Mapping[str, tuple[str, ...]]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


def _claim(doc: Mapping[str, Any]) -> PreparedClaim:
    pods = ci_get(doc, "PodUIDs", None) or {}
    drivers = ci_get(doc, "DriverState", None) or {}
    if not isinstance(pods, Mapping) or not isinstance(drivers, Mapping):
        raise CheckpointError("ClaimInfoStateList: PodUIDs and DriverState must be objects")
    devices = {}
    for driver, st in drivers.items():
        found = ci_get(st, "Devices", None) or [] if isinstance(st, Mapping) else []
        devices[str(driver)] = tuple(
            f"{ci_get(d, 'PoolName', '')}/{ci_get(d, 'DeviceName', '')}"
            for d in found
            if isinstance(d, Mapping)
        )
    return PreparedClaim(
        uid=str(ci_get(doc, "ClaimUID", "")),
        name=str(ci_get(doc, "ClaimName", "")),
        namespace=str(ci_get(doc, "Namespace", "")),
        pod_uids=tuple(sorted(str(u) for u in pods)),
        devices=devices,
    )


def parse_dra_state(doc: Any) -> tuple[PreparedClaim, ...]:
    """The claims of the checkpoint document (the file's JSON, parsed), checked as the kubelet
    checks it (``UnmarshalCheckpoint``: CRC-32 of ``Data``).

    Raises:
        CheckpointError: not the DRA manager's format, or "checkpoint is corrupted".
    """
    if not isinstance(doc, Mapping):
        raise CheckpointError("not a JSON object")
    data = ci_get(doc, "Data", None)
    checksum = ci_get(doc, "Checksum", None)
    if not isinstance(data, str) or not isinstance(checksum, int):
        raise CheckpointError("not the DRA manager's checkpoint (Data, Checksum)")
    if zlib.crc32(data.encode("utf-8")) != checksum:
        raise CheckpointError("checkpoint is corrupted")
    try:
        inner = json.loads(data)
    except ValueError as e:
        raise CheckpointError(f"Data: {e}") from e
    if not isinstance(inner, Mapping):
        raise CheckpointError("Data is not a JSON object")
    kind, version = inner.get("kind"), inner.get("apiVersion")
    if (kind, version) != (DRA_KIND, DRA_API_VERSION):
        raise CheckpointError(f"Data is {kind}/{version}, not {DRA_KIND}/{DRA_API_VERSION}")
    claims = ci_get(inner, "ClaimInfoStateList", None) or []
    if not isinstance(claims, list):
        raise CheckpointError("ClaimInfoStateList must be a list")
    return tuple(_claim(c) for c in claims if isinstance(c, Mapping))
