"""Nodes, pods and PodDisruptionBudgets, read and translated into ``rollout.models``.

Why translate here: the core decides over small frozen records (``NodeInfo``, ``PodRef``,
``PdbRef``) and never sees a client object. The only writes in this module are a Node's
``spec.unschedulable`` (cordon / uncordon): never a workload.
"""

from __future__ import annotations

import functools
from collections.abc import Collection, Sequence
from typing import Any

from kubernetes.utils import parse_quantity

from rollout.errors import ExternalError, PreflightError
from rollout.kube import briefs
from rollout.kube.client import Api, call, describe
from rollout.kube.rest import AnswerError
from rollout.models import NodeInfo, PdbRef, PodListing, PodRef, Requests

MIRROR = "kubernetes.io/config.mirror"


def extended_resource(name: str) -> bool:
    """Whether a resource name is an extended resource (``vendor.com/name``: a device plugin's
    GPUs, NICs), not CPU, memory, hugepages or a ``kubernetes.io/`` name."""
    return "/" in name and not name.startswith(("hugepages-", "kubernetes.io/", "k8s.io/"))


def _qty(value: Any, scale: int = 1) -> int:
    return _quantity(str(value), scale)


@functools.lru_cache(maxsize=4096)
def _quantity(text: str, scale: int) -> int:
    """A quantity (``100m``, ``64Mi``) times ``scale``, as an int; 0 when it does not parse.
    Cached: a cluster's pods repeat a few request values, and the pod listing of 100,000 pods
    parsed each one (Decimal arithmetic) 200,000 times."""
    try:
        return int(parse_quantity(text) * scale)  # type: ignore[no-untyped-call]
    except (ValueError, TypeError, ArithmeticError):
        return 0


def to_node_info(n: dict[str, Any]) -> NodeInfo:
    """A Node (the API server's JSON) as a :class:`NodeInfo`."""
    return node_info_of(briefs.to_node(n))


def node_info_of(n: briefs.Node) -> NodeInfo:
    """A Node's brief (:mod:`rollout.kube.briefs`) as a :class:`NodeInfo`."""
    meta = n.metadata or briefs.EMPTY_META
    spec = n.spec or _NO_NODE_SPEC
    status = n.status or _NO_NODE_STATUS
    ready = any(c.type == "Ready" and c.status == "True" for c in status.conditions or ())
    alloc = {k: str(v) for k, v in (status.allocatable or {}).items()}
    return NodeInfo(
        name=meta.name,
        unschedulable=bool(spec.unschedulable),
        ready=ready,
        allocatable=alloc,
        cpu_millis=_qty(alloc.get("cpu", 0), 1000),
        memory_bytes=_qty(alloc.get("memory", 0)),
        capacity={k: str(v) for k, v in (status.capacity or {}).items()},
        labels={str(k): str(v) for k, v in (meta.labels or {}).items()},
        taints=tuple(spec.taints or ()),
    )


_NO_NODE_SPEC = briefs.NodeSpec()
_NO_NODE_STATUS = briefs.NodeStatus()


def node_info(api: Api, name: str) -> NodeInfo:
    """Read one Node.

    Raises:
        PreflightError: no such Node.
    """
    try:
        return to_node_info(call(f"read node {name}", api.core.read_node, name))
    except AnswerError as e:
        if e.status == 404:
            raise PreflightError(f"no Node named {name!r} in the cluster") from e
        raise ExternalError(f"read node {name}: {describe(e)}") from e


def set_unschedulable(api: Api, name: str, value: bool) -> None:
    """Cordon (True) or uncordon (False) a Node: the only Node field we write."""
    try:
        call(
            f"{'cordon' if value else 'uncordon'} node {name}",
            api.core.patch_node,
            name,
            {"spec": {"unschedulable": value or None}},
        )
    except AnswerError as e:
        raise ExternalError(f"patch node {name}: {describe(e)}") from e


def to_pod_ref(p: dict[str, Any]) -> PodRef:
    """A pod (the API server's JSON) as a :class:`PodRef` (requests summed over containers)."""
    return pod_ref_of(briefs.to_pod(p))


class _Tally:
    """Container requests summed as the capacity check counts them: CPU in millicores, memory
    in bytes, each extended resource in units (one pod's, or every pod's on a node)."""

    def __init__(self) -> None:
        self.cpu = self.mem = 0
        self.extended: dict[str, int] = {}

    def add(self, containers: Sequence[briefs.Container] | None) -> None:
        for c in containers or ():
            req = (c.resources.requests if c.resources else None) or {}
            if not req:
                continue
            self.cpu += _qty(req.get("cpu", 0), 1000)
            self.mem += _qty(req.get("memory", 0))
            for k, v in req.items():
                if extended_resource(k):
                    self.extended[k] = self.extended.get(k, 0) + _qty(v)

    def requests(self) -> Requests:
        return Requests(self.cpu, self.mem, self.extended)


def pod_ref_of(p: briefs.Pod) -> PodRef:
    """A pod's brief (:mod:`rollout.kube.briefs`) as a :class:`PodRef`."""
    meta = p.metadata or briefs.EMPTY_META
    spec = p.spec or briefs.EMPTY_POD_SPEC
    owners = meta.ownerReferences or ()
    tally = _Tally()
    tally.add(spec.containers)
    placement = {
        k: v
        for k, v in (
            ("nodeSelector", spec.nodeSelector),
            ("affinity", spec.affinity),
            ("tolerations", spec.tolerations),
        )
        if v
    }
    return PodRef(
        namespace=meta.namespace,
        name=meta.name,
        node=spec.nodeName or "",
        uid=meta.uid,
        labels=dict(meta.labels or {}),
        daemonset=any(o.kind == "DaemonSet" for o in owners),
        mirror=MIRROR in (meta.annotations or {}),
        cpu_millis=tally.cpu,
        memory_bytes=tally.mem,
        unmanaged=not any(o.controller is True for o in owners),
        local_storage=any(v.emptyDir is not None for v in spec.volumes or ()),
        extended=tally.extended,
        placement=placement,
    )


def pod_objects_on(api: Api, node: str) -> list[dict[str, Any]]:
    """Every pod bound to the node (any phase), as the API server returns it."""
    listing = call(
        f"list pods on {node}",
        api.core.list_pod_for_all_namespaces,
        field_selector=f"spec.nodeName={node}",
    )
    items: list[dict[str, Any]] = listing.get("items") or []
    return items


POD_PAGE = 500
"""How many pods one page of the cluster-wide pod listing holds (``limit``; the API server's own
default chunk size for ``kubectl get``)."""

LIVE = "status.phase!=Succeeded,status.phase!=Failed"
"""The field selector of pods that have not finished (what every preflight check reads)."""

_RESTARTS = 3


def pods_by_node(api: Api, keep: Collection[str] | None = None, page: int = POD_PAGE) -> PodListing:
    """Every pod bound to a Node that has not finished, from one paginated listing of the
    cluster's pods (``limit`` / ``continue``): ``ceil(pods / page)`` requests however many Nodes
    the cluster has, where a listing per Node cost one request per Node.

    Of the pods on the nodes in ``keep`` (None: every node) the records and whole objects are
    kept; of every other pod only its node, phase and requests are decoded
    (:mod:`rollout.kube.briefs`), page by page, and summed into its node's requests: a cluster
    of 100,000 pods is never held whole, nor parsed whole, and makes no record per pod.

    A continue token the API server has compacted away (410 Gone: "The provided continue
    parameter is too old") starts the listing again, at most three times.
    """
    for _attempt in range(_RESTARTS):
        objects: dict[str, list[dict[str, Any]]] = {}
        tallies: dict[str, _Tally] = {}
        token: str | None = None
        try:
            while True:
                body: bytes = call(
                    "list pods",
                    api.core.list_pod_for_all_namespaces,
                    field_selector=LIVE,
                    limit=page,
                    _continue=token,
                    _raw=True,
                )
                listing = briefs.pod_use_list.decode(body)
                whole: set[int] = set()
                for i, p in enumerate(listing.items or ()):
                    node = p.spec.nodeName if p.spec else None
                    if not node or (p.status and p.status.phase in ("Succeeded", "Failed")):
                        continue
                    if keep is None or node in keep:
                        whole.add(i)
                    tallies.setdefault(node, _Tally()).add(p.spec.containers if p.spec else None)
                for _i, d in sorted(briefs.split_items(body, whole).items()):
                    objects.setdefault(d["spec"]["nodeName"], []).append(d)
                token = (listing.metadata.cont if listing.metadata else None) or None
                if token is None:
                    break
        except AnswerError as e:
            if e.status == 410 and token is not None:
                continue  # the snapshot the pages came from is gone: list again, whole
            raise
        refs = {n: [to_pod_ref(d) for d in pods] for n, pods in objects.items()}  # listed order
        for pods in objects.values():
            pods.sort(key=lambda d: str(d["metadata"].get("creationTimestamp") or ""))
        used = {n: t.requests() for n, t in tallies.items()}
        return PodListing(refs=refs, objects=objects, used=used)
    raise ExternalError(f"list pods: the continue token expired {_RESTARTS} times in a row")


def nodes_listed(
    api: Api, keep: Collection[str] | None = None
) -> tuple[dict[str, NodeInfo], dict[str, dict[str, Any]]]:
    """Every Node as a :class:`NodeInfo` by name, and as the API server's object for the Nodes
    in ``keep`` only (None: every Node), from one listing: only the fields a ``NodeInfo``
    holds are decoded for the others (:mod:`rollout.kube.briefs`)."""
    body: bytes = call("list nodes", api.core.list_node, _raw=True)
    infos: dict[str, NodeInfo] = {}
    whole: set[int] = set()
    for i, n in enumerate(briefs.node_list.decode(body).items or ()):
        info = node_info_of(n)
        infos[info.name] = info
        if keep is None or info.name in keep:
            whole.add(i)
    objects = {d["metadata"]["name"]: d for d in briefs.split_items(body, whole).values()}
    return infos, objects


def finished(pod: dict[str, Any]) -> bool:
    """Whether a pod (JSON) has finished (``Succeeded`` or ``Failed``)."""
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


def pod_refs(pods: list[dict[str, Any]]) -> list[PodRef]:
    """The pods (JSON) that have not finished, as :class:`PodRef` (pure)."""
    return [to_pod_ref(p) for p in pods if not finished(p)]


def pods_on_node(api: Api, node: str) -> list[PodRef]:
    """Every pod bound to the node that has not finished."""
    return pod_refs(pod_objects_on(api, node))


def pod_gone(api: Api, pod: PodRef) -> bool:
    """Whether this pod (same uid) no longer exists."""
    try:
        p: Any = call(f"read pod {pod.key}", api.core.read_namespaced_pod, pod.name, pod.namespace)
    except AnswerError as e:
        if e.status == 404:
            return True
        raise ExternalError(f"read pod {pod.key}: {describe(e)}") from e
    return bool(pod.uid) and (p.get("metadata") or {}).get("uid") != pod.uid


def to_pdb_ref(b: dict[str, Any]) -> PdbRef:
    """A PodDisruptionBudget (the API server's JSON) as a :class:`PdbRef`."""
    spec = b.get("spec") or {}
    status = b.get("status") or {}
    sel = spec.get("selector")
    min_avail = spec.get("minAvailable")
    return PdbRef(
        namespace=b["metadata"]["namespace"],
        name=b["metadata"]["name"],
        selector=None if sel is None else dict(sel.get("matchLabels") or {}),
        disruptions_allowed=int(status.get("disruptionsAllowed") or 0),
        expected_pods=int(status.get("expectedPods") or 0),
        min_available=min_avail if isinstance(min_avail, int) else None,
        match_expressions=tuple(
            (str(r["key"]), str(r["operator"]), tuple(str(v) for v in r.get("values") or ()))
            for r in (sel or {}).get("matchExpressions") or ()
        ),
    )


def list_pdbs(api: Api, namespace: str | None = None) -> list[PdbRef]:
    """PodDisruptionBudgets (all namespaces, or one)."""
    if namespace:
        found = call("list PDBs", api.policy.list_namespaced_pod_disruption_budget, namespace)
    else:
        found = call("list PDBs", api.policy.list_pod_disruption_budget_for_all_namespaces)
    return [to_pdb_ref(b) for b in found.get("items") or []]


def server_version(api: Api) -> str:
    """The API server's gitVersion."""
    return str(call("read version", api.apis.get_code).get("gitVersion"))


def resource_api_versions(api: Api) -> list[str]:
    """The versions of ``resource.k8s.io`` the API server serves (empty: DRA not served)."""
    groups = call("API discovery", api.apis.get_api_versions).get("groups") or []
    for g in groups:
        if g.get("name") == "resource.k8s.io":
            return [v["version"] for v in g.get("versions") or []]
    return []


def _resource_objects(api: Api, versions: list[str], plural: str, what: str) -> list[Any]:
    """Every object of a cluster-scoped ``resource.k8s.io`` kind (empty when it is not served)."""
    if not versions:
        return []
    try:
        listing: Any = call(
            f"list {what}",
            api.custom.list_cluster_custom_object,
            "resource.k8s.io",
            versions[0],
            plural,
        )
    except AnswerError as e:
        raise ExternalError(f"list {what}: {describe(e)}") from e
    return list(listing.get("items", []))


def resource_objects(api: Api, versions: list[str], plural: str, what: str) -> list[Any]:
    """Every object of a cluster-scoped (or all namespaces') ``resource.k8s.io`` kind, listed
    at the first of ``versions`` (empty when the group is not served)."""
    return _resource_objects(api, versions, plural, what)


def device_class_objects(api: Api, versions: list[str]) -> list[dict[str, Any]]:
    """Every DeviceClass (empty when ``resource.k8s.io`` is not served)."""
    return _resource_objects(api, versions, "deviceclasses", "DeviceClasses")


def resource_claim_objects(api: Api, versions: list[str]) -> list[dict[str, Any]]:
    """Every ResourceClaim, all namespaces (empty when ``resource.k8s.io`` is not served)."""
    return _resource_objects(api, versions, "resourceclaims", "ResourceClaims")


def dra_slices_on(api: Api, versions: list[str], node: str) -> dict[str, dict[str, int]]:
    """The node's ResourceSlices (a field selector on ``spec.nodeName``): driver -> slice uid
    -> number of devices."""
    if not versions:
        return {}
    try:
        listing: Any = call(
            "list ResourceSlices",
            api.custom.list_cluster_custom_object,
            "resource.k8s.io",
            versions[0],
            "resourceslices",
            field_selector=f"spec.nodeName={node}",
        )
    except AnswerError as e:
        raise ExternalError(f"list ResourceSlices of node {node}: {describe(e)}") from e
    out: dict[str, dict[str, int]] = {}
    for s in listing.get("items", []):
        spec = s.get("spec") or {}
        uid = str((s.get("metadata") or {}).get("uid", ""))
        out.setdefault(str(spec.get("driver", "")), {})[uid] = len(spec.get("devices") or ())
    return out


def dra_drivers_by_node(api: Api, versions: list[str]) -> dict[str, list[str]]:
    """DRA drivers publishing ResourceSlices, by node name."""
    out: dict[str, list[str]] = {}
    for s in _resource_objects(api, versions, "resourceslices", "ResourceSlices"):
        spec = s.get("spec", {})
        if spec.get("nodeName"):
            out.setdefault(spec["nodeName"], []).append(spec.get("driver", ""))
    return out
