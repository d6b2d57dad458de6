"""The few fields preflight reads from the cluster-wide listings, decoded without the rest.

Why: preflight lists every Node and every pod of the cluster (the capacity and placement checks
sum what the Nodes outside the change have free), and in a cluster of 5,000 Nodes and 50,000
pods the API server's answer is some 200 MB of JSON. Parsed whole into dicts (``json.loads``)
that was most of preflight's CPU (``docs/scale.md``), although the checks read a dozen fields
of each object and never its ``managedFields``, status conditions or container statuses. A
typed decoder (``msgspec``) given only those fields skips everything else while it scans, about
7x less CPU on the same bytes (``benchmarks/scale_bench.py decode``).

Every field is optional and loosely typed where the API is (requests are strings or numbers),
so an object the API server may send never fails to decode; what an object lacks reads as
empty, as ``dict.get(...) or {}`` read it before. The few whole objects the tool still needs
(the inventory's Nodes and pods, for the admission preview) are decoded whole from the same
bytes (:func:`split_items`).
"""

from __future__ import annotations

from typing import Any

import msgspec


class Owner(msgspec.Struct, frozen=True, omit_defaults=True):
    kind: str = ""
    name: str = ""
    controller: bool | None = None


class Meta(msgspec.Struct, frozen=True, omit_defaults=True):
    name: str = ""
    namespace: str = ""
    uid: str = ""
    labels: dict[str, str] | None = None
    annotations: dict[str, str] | None = None
    ownerReferences: list[Owner] | None = None


class Resources(msgspec.Struct, frozen=True):
    requests: dict[str, Any] | None = None


class Container(msgspec.Struct, frozen=True):
    resources: Resources | None = None


class Volume(msgspec.Struct, frozen=True):
    # presence is what matters (``emptyDir: {}``)
    emptyDir: dict[str, Any] | None = None


class PodSpec(msgspec.Struct, frozen=True):
    nodeName: str | None = None
    containers: list[Container] | None = None
    volumes: list[Volume] | None = None
    nodeSelector: dict[str, Any] | None = None
    affinity: dict[str, Any] | None = None
    tolerations: list[Any] | None = None


class PodStatus(msgspec.Struct, frozen=True):
    phase: str | None = None


class Pod(msgspec.Struct, frozen=True):
    metadata: Meta | None = None
    spec: PodSpec | None = None
    status: PodStatus | None = None


class Condition(msgspec.Struct, frozen=True):
    type: str = ""
    status: str = ""


class NodeSpec(msgspec.Struct, frozen=True):
    unschedulable: bool | None = None
    taints: list[dict[str, Any]] | None = None


class NodeStatus(msgspec.Struct, frozen=True):
    conditions: list[Condition] | None = None
    allocatable: dict[str, Any] | None = None
    capacity: dict[str, Any] | None = None


class Node(msgspec.Struct, frozen=True):
    metadata: Meta | None = None
    spec: NodeSpec | None = None
    status: NodeStatus | None = None


class Template(msgspec.Struct, frozen=True):
    spec: PodSpec | None = None


class ControllerSpec(msgspec.Struct, frozen=True):
    template: Template | None = None


class Controller(msgspec.Struct, frozen=True):
    """A Deployment, StatefulSet, DaemonSet or ReplicaSet: its name, owners and where its pods
    may go (the template's placement)."""

    metadata: Meta | None = None
    spec: ControllerSpec | None = None


class ControllerList(msgspec.Struct, frozen=True):
    items: list[Controller] | None = None


class UseSpec(msgspec.Struct, frozen=True):
    nodeName: str | None = None
    containers: list[Container] | None = None


class PodUse(msgspec.Struct, frozen=True):
    """A pod as the capacity check reads one on a Node outside the change: where it is bound,
    whether it finished, what its containers request."""

    spec: UseSpec | None = None
    status: PodStatus | None = None


class ListMeta(msgspec.Struct, frozen=True):
    cont: str | None = msgspec.field(default=None, name="continue")


class PodUseList(msgspec.Struct, frozen=True):
    items: list[PodUse] | None = None
    metadata: ListMeta | None = None


class NodeList(msgspec.Struct, frozen=True):
    items: list[Node] | None = None


class RawList(msgspec.Struct, frozen=True):
    items: list[msgspec.Raw] | None = None


EMPTY_META = Meta()
EMPTY_POD_SPEC = PodSpec()

pod_use_list = msgspec.json.Decoder(PodUseList)
node_list = msgspec.json.Decoder(NodeList)
controller_list = msgspec.json.Decoder(ControllerList)
_raw_list = msgspec.json.Decoder(RawList)


def split_items(body: bytes, indexes: set[int]) -> dict[int, dict[str, Any]]:
    """The listing's items at ``indexes`` (0-based), decoded whole as dicts; the others are
    only scanned past."""
    if not indexes:
        return {}
    items = _raw_list.decode(body).items or []
    return {i: msgspec.json.decode(items[i]) for i in indexes if i < len(items)}


def placement(c: Controller) -> dict[str, Any]:
    """A controller's pod placement as the API serves it (``nodeName``, ``nodeSelector``,
    ``affinity``, ``tolerations``; those it has), the shape ``lands_on`` reads."""
    spec = (c.spec.template.spec if c.spec and c.spec.template else None) or EMPTY_POD_SPEC
    return {
        k: v
        for k, v in (
            ("nodeName", spec.nodeName),
            ("nodeSelector", spec.nodeSelector),
            ("affinity", spec.affinity),
            ("tolerations", spec.tolerations),
        )
        if v
    }


def metadata_dict(meta: Meta | None) -> dict[str, Any]:
    """A brief's metadata as the API's JSON (only the fields the brief holds)."""
    out: dict[str, Any] = msgspec.to_builtins(meta or EMPTY_META)
    return out


def to_pod(obj: dict[str, Any]) -> Pod:
    """A pod already decoded whole (a watch event, a single-node listing) as the brief."""
    return msgspec.convert(obj, Pod, strict=False)


def to_node(obj: dict[str, Any]) -> Node:
    """A Node already decoded whole as the brief."""
    return msgspec.convert(obj, Node, strict=False)
