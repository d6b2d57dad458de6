"""The reads and the one write the allocation-path change makes beyond a cordon: a Node's path
labels (compare-and-swap), the DRA driver's ResourceSlices, the ResourceClaims allocated from a
node's pool, and the pods that hold devices.

Why here: the change layer decides over names and counts (``rollout.change.kinds.allocation_path``)
and never sees the API server's objects.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout.errors import ExternalError, NodeFilesChangedError
from rollout.kube.client import Api, call, describe
from rollout.kube.nodes import pod_objects_on, pod_refs, resource_api_versions, resource_objects
from rollout.kube.rest import AnswerError
from rollout.models import PodRef
from rollout.retrying import retry


def _versions(api: Api) -> list[str]:
    """``resource.k8s.io`` versions, ``v1`` first when served."""
    served = resource_api_versions(api)
    return sorted(served, key=lambda v: v != "v1")


LABEL_ATTEMPTS = 5
"""How many times a label write is tried while only the rest of the Node changes under it."""


def patch_labels(
    api: Api, node: str, expect: Mapping[str, str | None], labels: Mapping[str, str | None]
) -> None:
    """Set ``labels`` on the Node (None removes one) while its labels still have the ``expect``
    values: the patch carries the resourceVersion read, so a write in between makes the API
    server answer 409 Conflict and nothing is written. The kubelet writes its own Node's status
    (allocatable, conditions, images) at any time, so a 409 is read again: while the labels
    still hold the ``expect`` values the write is tried again (at most :data:`LABEL_ATTEMPTS`
    times); the compare is on the labels, as the step's record holds them.

    Raises:
        NodeFilesChangedError: a label differs from ``expect``, or the Node changed between each
            read and its write, every time.
    """

    def write() -> None:
        obj: Any = call(f"read node {node}", api.core.read_node, node)
        meta = obj.get("metadata") or {}
        now = meta.get("labels") or {}
        for k, v in expect.items():
            if now.get(k) != v:
                raise NodeFilesChangedError(
                    f"node {node}: label {k} is {now.get(k)!r}, expected {v!r}: changed by "
                    "someone else since rollout read it; nothing written"
                )
        rv = meta.get("resourceVersion")
        body = {"metadata": {"labels": dict(labels), "resourceVersion": rv}}
        try:
            call(f"label node {node}", api.core.patch_node, node, body)
        except AnswerError as e:
            if e.status != 409:
                raise ExternalError(f"label node {node}: {describe(e)}") from e
            raise

    retry(
        write,
        _conflict,
        attempts=LABEL_ATTEMPTS,
        give_up=lambda e: NodeFilesChangedError(
            f"node {node}: the Node changed between rollout's read and its label write "
            f"{LABEL_ATTEMPTS} times ({describe(e)}); nothing written"
        ),
    )


def _conflict(e: Exception) -> bool:
    """A 409 Conflict: the Node's resourceVersion moved between the read and the write."""
    return isinstance(e, AnswerError) and e.status == 409


def slice_devices(api: Api, driver: str, node: str) -> list[str]:
    """The devices ``driver``'s ResourceSlices list for ``node`` (``pool/device``)."""
    out = []
    for s in resource_objects(api, _versions(api), "resourceslices", "ResourceSlices"):
        spec = s.get("spec") or {}
        if spec.get("driver") != driver or spec.get("nodeName") != node:
            continue
        pool = (spec.get("pool") or {}).get("name", node)
        out += [f"{pool}/{d.get('name')}" for d in spec.get("devices") or []]
    return sorted(out)


def driver_nodes(api: Api, driver: str) -> dict[str, int]:
    """Per node, how many devices ``driver``'s ResourceSlices list."""
    out: dict[str, int] = {}
    for s in resource_objects(api, _versions(api), "resourceslices", "ResourceSlices"):
        spec = s.get("spec") or {}
        if spec.get("driver") == driver and spec.get("nodeName"):
            n = str(spec["nodeName"])
            out[n] = out.get(n, 0) + len(spec.get("devices") or [])
    return out


def _claims_from(api: Api, driver: str, node: str) -> list[dict[str, Any]]:
    out = []
    for c in resource_objects(api, _versions(api), "resourceclaims", "ResourceClaims"):
        results = ((c.get("status") or {}).get("allocation") or {}).get("devices", {})
        if any(
            r.get("driver") == driver and r.get("pool") == node
            for r in results.get("results") or []
        ):
            out.append(c)
    return out


def _key(obj: Mapping[str, Any]) -> str:
    md = obj.get("metadata") or {}
    return f"{md.get('namespace')}/{md.get('name')}"


def claims_on(api: Api, driver: str, node: str) -> list[str]:
    """ResourceClaims with a device of ``driver`` allocated from ``node``'s pool
    (``status.allocation.devices.results[].pool``)."""
    return sorted(_key(c) for c in _claims_from(api, driver, node))


def reserved_on(api: Api, driver: str, node: str) -> list[str]:
    """Those claims still reserved for a consumer (``status.reservedFor``): the API server's
    account of what the kubelet holds prepared on the node."""
    return sorted(
        _key(c)
        for c in _claims_from(api, driver, node)
        if (c.get("status") or {}).get("reservedFor")
    )


def claim_holders(api: Api, node: str) -> list[PodRef]:
    """The pods on ``node`` that hold a claim: their own (``spec.resourceClaims``) or the one the
    scheduler made for an extended resource (``status.extendedResourceClaimStatus``)."""
    objs = [
        p
        for p in pod_objects_on(api, node)
        if (p.get("spec") or {}).get("resourceClaims")
        or (p.get("status") or {}).get("extendedResourceClaimStatus")
    ]
    return pod_refs(objs)


def assigned(api: Api, resource: str, node: str) -> list[str]:
    """The pods on ``node`` whose containers still request ``resource`` from the device plugin
    (``ns/name: N``), none served through a claim."""
    out = []
    for p in pod_refs(
        [
            o
            for o in pod_objects_on(api, node)
            if not (o.get("status") or {}).get("extendedResourceClaimStatus")
        ]
    ):
        if p.extended.get(resource):
            out.append(f"{p.key}: {p.extended[resource]}")
    return out


def claims_and_pods(api: Api) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Every ResourceClaim and every pod, as the API server serves them (the DRA pool's gate)."""
    claims = resource_objects(api, _versions(api), "resourceclaims", "ResourceClaims")
    pods: Any = call("list pods", api.core.list_pod_for_all_namespaces)
    return claims, list(pods.get("items") or [])
