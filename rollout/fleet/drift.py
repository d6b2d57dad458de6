"""Drift: a node whose files or running kubelet config differ from what its last change left.

Why: a change is only as good as its last day. ``kubeadm upgrade node`` rewrites
``/var/lib/kubelet/config.yaml`` from the cluster's ConfigMap, a person edits a file by hand, a node
is re-imaged, and the node silently leaves the policy the change put it on (or the restore put it
back to). ``rollout nodes`` asks each node, and this module says what differs, against what the
journal of the node's last change recorded:

* a node the change left ``applied``: every file the change wrote has the sha256 it wrote, every
  file it removed is absent, and ``/configz`` shows the settings its verify step expected;
* a node it left ``restored``: every file is back to the backup's sha256 (or absent when it did
  not exist), and ``/configz`` shows the watched settings it showed before the change.

Pure: the caller reads the journal, the node's files and ``/configz``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.change.kinds.kubelet_record import NodeRecord
from rollout.change.kinds.kubelet_verify import WATCHED, config_mismatches
from rollout.change.preflight.device_checks import BOTH_PATHS, AllocationPath
from rollout.change.record.replay import NodeStatus
from rollout.models import NodeState


@dataclass(frozen=True)
class Left:
    """What a change left on one node.

    Attributes:
        files: path -> sha256 of the bytes left there (None: the file must not exist).
        config: the kubelet settings ``/configz`` must show.
    """

    files: Mapping[str, str | None] = field(default_factory=dict)
    config: Mapping[str, Any] = field(default_factory=dict)


def left_by(status: NodeStatus) -> Left | None:
    """What the change of ``status`` left on its node (None: it left nothing settled there: a
    node in flight or failed is ``rollout status``'s to report, not drift)."""
    if status.state is NodeState.APPLIED:
        rec = NodeRecord.read(status.record)
        files: dict[str, str | None] = {f.path: f.sha256 for f in rec.files}
        files.update({p: None for p in rec.removed})
        return Left(files, dict(rec.expected))
    if status.state is NodeState.RESTORED:
        back = {b.path: (b.sha256 if b.existed else None) for b in status.backups}
        prior = {k: v for k, v in status.prior_config.items() if k in WATCHED}
        return Left(back, prior)
    return None


def drift(
    left: Left,
    files: Mapping[str, bytes | None] | None,
    configz: Mapping[str, Any] | None,
) -> list[str]:
    """What differs on the node from ``left``, one sentence each (empty: no drift).

    Args:
        files: the node's files now (path -> bytes, None: absent); None: not read (the node is
            not in the inventory), so only ``/configz`` is compared.
        configz: the kubelet's ``/configz`` body now; None: not read (the kubelet is down).
    """
    out = []
    if files is not None:
        for path, want in sorted(left.files.items()):
            have = files.get(path)
            digest = hashlib.sha256(have).hexdigest() if have is not None else None
            if digest == want:
                continue
            if want is None:
                out.append(f"{path}: present (sha256 {digest}), the change left it absent")
            elif digest is None:
                out.append(f"{path}: absent, the change left sha256 {want}")
            else:
                out.append(f"{path}: sha256 {digest}, the change left {want}")
    if configz is not None and left.config:
        out += config_mismatches(left.config, configz)
    return out


POLICY_FIELDS = (
    "cpuManagerPolicy",
    "cpuManagerPolicyOptions",
    "reservedSystemCPUs",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "memoryManagerPolicy",
)
"""The settings ``rollout nodes`` shows of each node's live config."""


@dataclass(frozen=True)
class NodeReport:
    """One row of ``rollout nodes``.

    Attributes:
        node: Node name.
        in_inventory: the node is in the inventory given (its files were read).
        change, intent, state: the change that last wrote the node (its ``rollout.dev/*``
            marks), its intent digest and the node's state in it ("" when no change did).
        configz_sha256: sha256 of the live ``/configz`` (keys sorted); "" when not read.
        policy: the :data:`POLICY_FIELDS` of the live config.
        drift: what differs from what the change left (:func:`drift`).
        error: why the live config or files could not be read ("" when they were).
        paths: how the node serves each extended resource it advertises or DRA backs there
            (:func:`rollout.change.preflight.device_checks.allocation_paths`).
        dra_drivers: the DRA drivers publishing ResourceSlices for the node (its devices are
            DRA-managed, whether or not a DeviceClass maps an extended resource to them).
    """

    node: str
    in_inventory: bool
    change: str = ""
    intent: str = ""
    state: str = ""
    configz_sha256: str = ""
    policy: Mapping[str, Any] = field(default_factory=dict)
    drift: tuple[str, ...] = ()
    error: str = ""
    paths: tuple[AllocationPath, ...] = ()
    dra_drivers: tuple[str, ...] = ()

    @property
    def two_paths(self) -> list[str]:
        """The extended resources the node serves through the device plugin and DRA at once."""
        return [p.resource for p in self.paths if p.path == BOTH_PATHS]

    def to_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "inInventory": self.in_inventory,
            "change": self.change or None,
            "intent": self.intent or None,
            "state": self.state or None,
            "configzSha256": self.configz_sha256 or None,
            "policy": dict(self.policy),
            "drifted": bool(self.drift),
            "drift": list(self.drift),
            "error": self.error or None,
            "allocation": {p.resource: p.to_dict() for p in self.paths},
            "twoPaths": self.two_paths,
            "draDrivers": list(self.dra_drivers),
        }


def configz_digest(configz: Mapping[str, Any]) -> str:
    """sha256 of a ``/configz`` body's kubelet config, keys sorted (the same config, the same
    digest, whatever order the kubelet serialises it in)."""
    import json

    cfg = configz.get("kubeletconfig", configz)
    return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()


def report_node(
    node: str,
    in_inventory: bool,
    mark: Mapping[str, str] | None,
    status: NodeStatus | None,
    files: Mapping[str, bytes | None] | None,
    configz: Mapping[str, Any] | None,
    error: str = "",
    paths: tuple[AllocationPath, ...] = (),
    dra_drivers: tuple[str, ...] = (),
) -> NodeReport:
    """One node's row: its live config, the change that last wrote it, and the drift from what
    that change left (none when no change left it settled: untouched, in flight or failed)."""
    mark = mark or {}
    cfg = (configz or {}).get("kubeletconfig", configz or {})
    left = left_by(status) if status is not None else None
    found = tuple(drift(left, files, configz)) if left is not None else ()
    return NodeReport(
        node=node,
        in_inventory=in_inventory,
        change=mark.get("change", ""),
        intent=mark.get("intent", ""),
        state=mark.get("state", "") or (status.state.value if status else ""),
        configz_sha256=configz_digest(configz) if configz is not None else "",
        policy={k: cfg[k] for k in POLICY_FIELDS if isinstance(cfg, Mapping) and k in cfg},
        drift=found,
        error=error,
        paths=paths,
        dra_drivers=dra_drivers,
    )
