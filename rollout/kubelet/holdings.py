"""What the kubelet itself says a node still holds of a GPU path: its own account, not the API
server's.

Why: the allocation-path change moves a node between the device plugin and a DRA driver only
once the path it leaves has released every device. The API server's account (pods bound to the
node, ResourceClaims allocated from its pool) can be empty while the kubelet still has a
container running with a device, or a claim prepared (a pod force-deleted, a kubelet that has
not synced). The kubelet's own account is read on the node by the facts module (read-only, the
node transport every change already uses):

* the podresources API's ``List`` (``podResources.pods``): every container's devices per
  resource, and the DRA claims it uses (``dynamicResources``);
* the device manager's checkpoint (``kubelet_internal_checkpoint``): the devices handed to each
  pod UID. The kubelet prunes entries of pods that are gone only at its next allocation
  (``UpdateAllocatedDevices``), so an entry of a pod the API server no longer has on the node is
  *stale*: reported, not held;
* the DRA manager's checkpoint (``dra_manager_state``): the claims prepared on the node; the
  kubelet removes one only once its driver unprepared it.

A source that cannot be read is a problem (fail closed: the node is not confirmed released).

Pure: the facts dict in, an :class:`Account` out.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from rollout.kubelet.checkpoints import CheckpointError
from rollout.kubelet.device_checkpoint import from_document
from rollout.kubelet.dra_state import DRA_STATE_FILE, parse_dra_state

PODRESOURCES = "podresources"
DEVICE_CHECKPOINT = "kubelet_internal_checkpoint"
DRA_STATE = DRA_STATE_FILE


@dataclass(frozen=True)
class Held:
    """One thing the kubelet still holds: ``what`` (a device or a claim), ``by`` (the pod or
    pods), ``source`` (which of the kubelet's accounts says so)."""

    what: str
    by: str
    source: str

    def __str__(self) -> str:
        return f"{self.what} held by {self.by} ({self.source})"


@dataclass(frozen=True)
class Account:
    """The kubelet's account of one path on one node.

    Attributes:
        held: what is still held (empty: released, when ``problems`` is empty too).
        stale: device checkpoint entries of pods no longer on the node (not held).
        sources: the accounts read.
        problems: the accounts that could not be read (the node is then not confirmed).
    """

    held: tuple[Held, ...] = ()
    stale: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    problems: tuple[str, ...] = field(default_factory=tuple)

    def why_not_released(self) -> str | None:
        """Why the kubelet's account does not confirm the release (None: it does)."""
        parts = [str(h) for h in self.held] + [f"unread: {p}" for p in self.problems]
        return "; ".join(parts) if parts else None

    def to_json(self) -> dict[str, Any]:
        return {
            "held": [str(h) for h in self.held],
            "stale": list(self.stale),
            "sources": list(self.sources),
            "problems": list(self.problems),
        }


def _podresources(facts: Mapping[str, Any]) -> tuple[list[Mapping[str, Any]] | None, str | None]:
    pr = facts.get("podResources") or {}
    if not isinstance(pr, Mapping):
        return None, "podresources: not reported"
    if pr.get("error") or pr.get("listError"):
        return None, f"podresources: {pr.get('error') or pr.get('listError')}"
    pods = pr.get("pods")
    if not isinstance(pods, list):
        return None, "podresources: no List answer"
    return [p for p in pods if isinstance(p, Mapping)], None


def _checkpoint(facts: Mapping[str, Any], name: str) -> Any:
    return (facts.get("checkpoints") or {}).get(name)


def device_account(
    facts: Mapping[str, Any], resource: str, pods_by_uid: Mapping[str, str]
) -> Account:
    """The devices of ``resource`` (the device plugin's extended resource) the kubelet still has
    assigned on the node. ``pods_by_uid``: the pods the API server has bound to the node
    (UID -> ``namespace/name``), to name a checkpoint entry's pod and to tell a stale one."""
    held: list[Held] = []
    stale: list[str] = []
    sources: list[str] = []
    problems: list[str] = []
    pods, problem = _podresources(facts)
    if pods is None:
        problems.append(str(problem))
    else:
        sources.append(PODRESOURCES)
        for p in pods:
            key = f"{p.get('namespace')}/{p.get('name')}"
            for c in p.get("containers") or ():
                for d in c.get("devices") or ():
                    if d.get("resourceName") == resource and d.get("deviceIds"):
                        ids = ", ".join(str(i) for i in d["deviceIds"])
                        held.append(
                            Held(
                                f"{resource} {ids}",
                                f"pod {key} container {c.get('name')}",
                                PODRESOURCES,
                            )
                        )
    raw = _checkpoint(facts, DEVICE_CHECKPOINT)
    if raw is not None:  # absent: no device plugin ever registered on the node, none assigned
        try:
            if isinstance(raw, Mapping) and "unparsable" in raw:
                raise CheckpointError("not JSON")
            cp = from_document(raw)
            if cp.checksum != cp.computed_checksum():
                raise CheckpointError("checkpoint is corrupted")
        except CheckpointError as err:
            problems.append(f"{DEVICE_CHECKPOINT}: {err}")
        else:
            sources.append(DEVICE_CHECKPOINT)
            for entry in cp.entries or ():
                if entry.resource != resource or not entry.devices():
                    continue
                ids = ", ".join(sorted(entry.devices()))
                if entry.pod_uid in pods_by_uid:
                    who = f"pod {pods_by_uid[entry.pod_uid]} container {entry.container}"
                    held.append(Held(f"{resource} {ids}", who, DEVICE_CHECKPOINT))
                else:
                    stale.append(f"{resource} {ids} of gone pod {entry.pod_uid}")
    return Account(tuple(held), tuple(stale), tuple(sources), tuple(problems))


def claim_account(facts: Mapping[str, Any], driver: str, pods_by_uid: Mapping[str, str]) -> Account:
    """The claims with a device of ``driver`` the kubelet still has prepared or in use on the
    node (its podresources ``dynamicResources`` and ``dra_manager_state``)."""
    held: list[Held] = []
    sources: list[str] = []
    problems: list[str] = []
    pods, problem = _podresources(facts)
    if pods is None:
        problems.append(str(problem))
    else:
        sources.append(PODRESOURCES)
        for p in pods:
            key = f"{p.get('namespace')}/{p.get('name')}"
            for c in p.get("containers") or ():
                for d in c.get("dynamicResources") or ():
                    devs = [
                        f"{r.get('poolName')}/{r.get('deviceName')}"
                        for r in d.get("claimResources") or ()
                        if r.get("driverName") == driver
                    ]
                    if devs:
                        claim = f"ResourceClaim {d.get('claimNamespace')}/{d.get('claimName')}"
                        held.append(
                            Held(
                                f"{claim} ({', '.join(devs)})",
                                f"pod {key} container {c.get('name')}",
                                PODRESOURCES,
                            )
                        )
    raw = _checkpoint(facts, DRA_STATE)
    if raw is not None:  # absent: the DRA manager never ran on the node, nothing prepared
        try:
            if isinstance(raw, Mapping) and "unparsable" in raw:
                raise CheckpointError("not JSON")
            claims = parse_dra_state(raw)
        except CheckpointError as e:
            problems.append(f"{DRA_STATE}: {e}")
        else:
            sources.append(DRA_STATE)
            for cl in claims:
                prepared = cl.devices.get(driver)
                if prepared is None:
                    continue
                pods_of = [pods_by_uid.get(u, f"uid {u}") for u in cl.pod_uids] or ["no pod"]
                held.append(
                    Held(
                        f"ResourceClaim {cl.key} prepared ({', '.join(prepared) or 'no device'})",
                        "pod " + ", pod ".join(pods_of),
                        DRA_STATE,
                    )
                )
    return Account(tuple(held), (), tuple(sources), tuple(problems))
