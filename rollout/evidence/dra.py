"""DRA devices in the evidence: the device each ResourceClaim of the nodes' pods was allocated,
from the claims' ``status`` (pure; listed by :func:`rollout.kube.nodes.resource_claim_objects`).

Why: with Dynamic Resource Allocation the kubelet's device checkpoint does not hold the device;
the scheduler writes it into the claim (``status.allocation.devices.results``: driver, pool,
device, and ``shareID`` when one device is shared by several allocations on purpose) and
``status.reservedFor`` names the pods using the claim. One claim used by several pods is sharing
the claim asks for; one device in two claims is two owners of one device, which is what
``unique-device-ids`` must catch. A collection's node carries, under ``draClaims``, the
allocated claims reserved by its pods::

    "draClaims": [{"claim": "ml/train-0-gpu", "pods": ["ml/train-0"],
                   "devices": [{"request": "gpu", "driver": "gpu.example.com",
                                "pool": "gpu-07", "device": "gpu-3", "shareID": null}]}]

Claims are compared across the nodes of one collection: a device both in a claim of a changed
node's pod and in a claim of a pod on a node outside the collection is not seen.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any


def claims_by_node(
    claims: Iterable[Mapping[str, Any]], pods: Mapping[str, Sequence[Mapping[str, Any]]]
) -> dict[str, list[dict[str, Any]]]:
    """The allocated claims reserved by each node's pods (``pods``: node -> the evidence's pod
    dicts, matched by ``uid``); every node of ``pods`` gets a list, empty when none."""
    where = {
        str(p.get("uid")): (node, f"{p.get('namespace', '')}/{p.get('name', '')}")
        for node, ps in pods.items()
        for p in ps
        if p.get("uid")
    }
    out: dict[str, list[dict[str, Any]]] = {node: [] for node in pods}
    for c in claims:
        meta, status = c.get("metadata") or {}, c.get("status") or {}
        results = ((status.get("allocation") or {}).get("devices") or {}).get("results") or ()
        if not results:
            continue
        users: dict[str, list[str]] = {}
        for r in status.get("reservedFor") or ():
            if r.get("resource") == "pods" and str(r.get("uid")) in where:
                node, pod = where[str(r.get("uid"))]
                users.setdefault(node, []).append(pod)
        devices = [
            {
                "request": str(r.get("request", "")),
                "driver": str(r.get("driver", "")),
                "pool": str(r.get("pool", "")),
                "device": str(r.get("device", "")),
                "shareID": r.get("shareID"),
            }
            for r in results
        ]
        name = f"{meta.get('namespace', '')}/{meta.get('name', '')}"
        for node, using in users.items():
            out[node].append({"claim": name, "pods": sorted(using), "devices": devices})
    return out


def dra_owners(nodes: Mapping[str, Mapping[str, Any]]) -> dict[str, list[str]]:
    """Each DRA device (``driver/pool/device``, with ``#shareID`` when shared on purpose) of the
    collection's claims, and the claims that hold it (``node: ns/claim (pods)``), once each."""
    owners: dict[str, list[str]] = {}
    seen: set[tuple[str, str]] = set()
    for node, d in sorted(nodes.items()):
        for c in d.get("draClaims") or ():
            for dev in c.get("devices") or ():
                key = f"{dev.get('driver')}/{dev.get('pool')}/{dev.get('device')}"
                if dev.get("shareID"):
                    key += f"#{dev['shareID']}"
                if (key, str(c.get("claim"))) in seen:
                    continue  # the same claim seen from a second node's pods
                seen.add((key, str(c.get("claim"))))
                pods = ", ".join(c.get("pods") or ())
                owners.setdefault(key, []).append(f"{node}: {c.get('claim')} ({pods})")
    return owners
