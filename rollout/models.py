"""Plain data shared by planning, the journal and the orchestrator.

Everything here is a frozen dataclass or an enum with no I/O, so the decisions made over it
(which batch comes next, what a node's state is after a crash, what to restore) are pure
functions that unit tests can drive with literals. The Kubernetes and Ansible adapters translate
their objects into these types at the boundary.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any


class Step(StrEnum):
    """A step on one node, in the order the forward path runs them.

    The restore path reuses ``cordon``/``drain``/``uncordon`` and adds ``restore`` and
    ``restore-verify``; the journal tells the two paths apart by the ``path`` of each entry.
    """

    PREFLIGHT = "preflight"
    CORDON = "cordon"
    DRAIN = "drain"
    BACKUP = "backup"
    APPLY = "apply"
    VERIFY = "verify"
    UNCORDON = "uncordon"
    RESTORE = "restore"
    RESTORE_VERIFY = "restore-verify"
    # the allocation-path change's own steps (rollout.change.kinds.allocation_path)
    RELEASE = "release"
    CLAIMS = "claims"
    SWITCH = "switch"
    STOP_DRIVER = "stop-driver"
    START_DRIVER = "start-driver"
    SLICES_GONE = "slices-gone"
    ALLOCATABLE_ZERO = "allocatable-zero"


WRITES = frozenset({Step.APPLY, Step.SWITCH, Step.STOP_DRIVER, Step.START_DRIVER})
"""The steps whose ``begin`` means the node may differ from before (a kind's write; see
``rollout.change.engine.context.KindSteps``): replay sets ``files_touched`` on it, a restore then
runs the kind's restore steps (before it, only the cordon is undone), and ``resume`` runs the step
again when it has no end."""

WRITE_PHASE = frozenset(
    {Step.SWITCH, Step.ALLOCATABLE_ZERO, Step.STOP_DRIVER, Step.START_DRIVER, Step.SLICES_GONE}
)
"""The steps of a write made of several (the allocation-path change's): after any of them, ended
or not, ``resume`` runs the kind's write again (each of its steps is idempotent) before verify."""


class Phase(StrEnum):
    """Where a step is: journaled before it starts and again when it ends."""

    BEGIN = "begin"
    DONE = "done"
    FAILED = "failed"


class StepPath(StrEnum):
    """Which path a node step belongs to (named so it never shadows ``pathlib.Path``)."""

    FORWARD = "forward"
    RESTORE = "restore"


class NodeState(StrEnum):
    """A node's state as replayed from the journal.

    ``pending``: not touched yet. ``applying``: a forward step started and the node has not
    yet finished (after a crash: ``rollout resume`` settles it). ``applied``: new config
    verified and the node back to its prior cordon state. ``restoring``: a restore step
    started. ``restored``: the previous files are back, verified, cordon state as before.
    ``failed``: the restore itself failed; a human must look (the message says which step).
    """

    PENDING = "pending"
    APPLYING = "applying"
    APPLIED = "applied"
    RESTORING = "restoring"
    RESTORED = "restored"
    FAILED = "failed"


@dataclass(frozen=True)
class FileBackup:
    """One node file as it was before the change.

    Attributes:
        path: node path.
        existed: False when the change creates the file (restore removes it).
        sha256: hex digest of the original bytes ("" when it did not exist).
        mode: octal mode string such as ``"0644"``.
        owner: file owner.
        group: file group.
    """

    path: str
    existed: bool
    sha256: str = ""
    mode: str = "0644"
    owner: str = "root"
    group: str = "root"


@dataclass(frozen=True)
class NodeFacts:
    """What the facts playbook found on one node, reduced to what decisions need.

    Attributes:
        host: inventory host name.
        node: the Kubernetes Node name it maps to.
        distribution: distribution name (render's layout table).
        cpu_model: CPU model string.
        numa: NUMA layout, one CPU list string per NUMA node, in node order.
        gpu_model: ``vendor:device`` of the GPUs ("" when none).
        files: current kubelet files: path -> bytes (None: absent).
        kubelet_after: the effective KubeletConfiguration after the change (the preview's input).
    """

    host: str
    node: str
    distribution: str
    cpu_model: str = ""
    numa: tuple[str, ...] = ()
    gpu_model: str = ""
    files: Mapping[str, bytes | None] = field(default_factory=dict)
    kubelet_after: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class NodeChange:
    """What the change does to one node: computed by render before anything is touched.

    Attributes:
        node: Node name.
        host: inventory host.
        files: path -> new bytes.
        removed: paths the change deletes.
        checkpoint_reset: checkpoint files to remove while the kubelet is stopped.
        expected: the effective kubelet settings ``/configz`` must show afterwards.
        service: the kubelet's systemd unit.
        mode: path -> (mode, owner, group) for written files.
        before: path -> bytes before the change, for every touched path (None: absent).
        before_meta: path -> (mode, owner, group) before the change.
        healthz_url: the kubelet's healthz endpoint on the node (the playbook waits on it).
        written: path -> sha256 of the bytes the change writes there, when rebuilt from the
            journal for a restore whose machine has no copy of those bytes (``files`` lacks them).
        expect: path -> the sha256 preflight read for every written path, or ``"absent"``: the
            node step writes only while the node's file still has it (compare-and-swap).
    """

    node: str
    host: str
    files: Mapping[str, bytes]
    removed: tuple[str, ...] = ()
    checkpoint_reset: tuple[str, ...] = ()
    expected: Mapping[str, object] = field(default_factory=dict)
    service: str = "kubelet"
    mode: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    before: Mapping[str, bytes | None] = field(default_factory=dict)
    before_meta: Mapping[str, tuple[str, str, str]] = field(default_factory=dict)
    healthz_url: str = "http://127.0.0.1:10248/healthz"
    expect: Mapping[str, str] = field(default_factory=dict)
    written: Mapping[str, str] = field(default_factory=dict)

    @property
    def touched(self) -> tuple[str, ...]:
        """Every path the change writes or removes, sorted."""
        return tuple(sorted({*self.files, *self.removed}))


@dataclass(frozen=True)
class PodRef:
    """A pod as the drain sees it.

    Attributes:
        namespace: namespace.
        name: name.
        node: node it runs on.
        uid: metadata.uid (a StatefulSet pod comes back with the same name, not the same uid).
        labels: labels (PDB selectors match against them).
        daemonset: owned by a DaemonSet (not evicted, like ``--ignore-daemonsets``).
        mirror: a static pod's mirror (cannot be evicted).
        cpu_millis: CPU requests, for the capacity check.
        memory_bytes: memory requests, for the capacity check.
        unmanaged: no ``ownerReferences`` entry with ``controller: true``: nothing recreates the
            pod once evicted (kubectl drain refuses it without ``--force``).
        local_storage: has an ``emptyDir`` volume, whose data an eviction deletes (kubectl drain
            refuses it without ``--delete-emptydir-data``).
        extended: requests of extended resources (``nvidia.com/gpu``), for the capacity check.
        placement: the spec's ``nodeSelector``, ``affinity`` and ``tolerations`` (as the API
            serves them): where the scheduler may put the pod's replacement.
    """

    namespace: str
    name: str
    node: str = ""
    uid: str = ""
    labels: Mapping[str, str] = field(default_factory=dict)
    daemonset: bool = False
    mirror: bool = False
    cpu_millis: int = 0
    memory_bytes: int = 0
    unmanaged: bool = False
    local_storage: bool = False
    extended: Mapping[str, int] = field(default_factory=dict)
    placement: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        """``namespace/name``."""
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class Requests:
    """What the live pods bound to a Node request, summed: what the capacity and placement
    checks subtract from its allocatable.

    Why apart from :class:`PodRef`: of a Node outside the change this sum is all preflight
    needs, and in a cluster of 50,000 pods a record per pod was most of the listing's cost.

    Attributes:
        cpu_millis: CPU requests, millicores.
        memory_bytes: memory requests, bytes.
        extended: requests of extended resources (``nvidia.com/gpu``), units.
    """

    cpu_millis: int = 0
    memory_bytes: int = 0
    extended: Mapping[str, int] = field(default_factory=dict)


def requests_of(pods: Iterable[PodRef]) -> Requests:
    """The summed requests of ``pods``."""
    cpu = mem = 0
    extended: dict[str, int] = {}
    for p in pods:
        cpu += p.cpu_millis
        mem += p.memory_bytes
        for k, v in p.extended.items():
            extended[k] = extended.get(k, 0) + v
    return Requests(cpu, mem, extended)


@dataclass(frozen=True)
class PodListing:
    """The cluster's live pods, from one paginated listing (``rollout.kube.nodes.pods_by_node``).

    Attributes:
        refs: the pods of the kept nodes as :class:`PodRef`, by node name.
        objects: the same pods as the API server's objects, oldest first.
        used: every node's summed requests (:class:`Requests`), kept or not.
    """

    refs: dict[str, list[PodRef]]
    objects: dict[str, list[dict[str, Any]]]
    used: dict[str, Requests]


@dataclass(frozen=True)
class ServingReads:
    """What preflight read about model-serving canaries (``rollout.kube.canaries``).

    Attributes:
        canaries: one line per custom resource in progress (Argo Rollout, Flagger Canary,
            KServe InferenceService), every namespace.
        deployments: the Deployments rolling out (old-revision pods beside new ones), as the
            API server's objects; preflight keeps those with a pod on a node it changes.
        unread: listings the tool could not read (warnings: a canary may be in progress).
    """

    canaries: tuple[str, ...] = ()
    deployments: tuple[dict[str, Any], ...] = ()
    unread: tuple[str, ...] = ()


@dataclass(frozen=True)
class PdbRef:
    """A PodDisruptionBudget, reduced to what preflight and drain messages need.

    Attributes:
        namespace: namespace.
        name: name.
        selector: ``spec.selector.matchLabels``; None for a null (absent) selector, which in
            policy/v1 selects no pod, while an empty one (``{}``) selects every pod of the
            namespace.
        disruptions_allowed: ``status.disruptionsAllowed``.
        expected_pods: ``status.expectedPods``.
        min_available: ``spec.minAvailable`` when an integer.
        match_expressions: ``spec.selector.matchExpressions`` as (key, operator, values).
    """

    namespace: str
    name: str
    selector: Mapping[str, str] | None
    disruptions_allowed: int
    expected_pods: int = 0
    min_available: int | None = None
    match_expressions: tuple[tuple[str, str, tuple[str, ...]], ...] = ()

    def matches(self, pod: PodRef) -> bool:
        """Whether this PDB selects the pod, as the Eviction API decides: same namespace, every
        matchLabel and matchExpression holds; ``{}`` selects every pod there, null none."""
        if pod.namespace != self.namespace or self.selector is None:
            return False
        labels = pod.labels
        return all(labels.get(k) == v for k, v in self.selector.items()) and all(
            requirement_holds(labels, key, op, values) for key, op, values in self.match_expressions
        )


def requirement_holds(labels: Mapping[str, str], key: str, op: str, values: Sequence[str]) -> bool:
    """One label selector requirement: ``In``, ``NotIn``, ``Exists``, ``DoesNotExist`` (and, for
    node selector terms, ``Gt``/``Lt`` on integer values); any other operator selects nothing."""
    if op in ("Gt", "Lt"):
        if key not in labels or not values:
            return False
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    if op == "In":
        return key in labels and labels[key] in values
    if op == "NotIn":
        return key not in labels or labels[key] not in values
    if op == "Exists":
        return key in labels
    if op == "DoesNotExist":
        return key not in labels
    return False


@dataclass(frozen=True)
class NodeInfo:
    """A Node as the orchestrator sees it.

    Attributes:
        name: Node name.
        unschedulable: ``spec.unschedulable`` (cordoned).
        ready: the Ready condition is True.
        allocatable: extended and core allocatable, as strings (``nvidia.com/gpu: "8"``).
        cpu_millis: allocatable CPU, for the capacity check.
        memory_bytes: allocatable memory, for the capacity check.
        capacity: ``status.capacity`` as strings; for a device plugin's resource it counts
            healthy and unhealthy devices, allocatable only the healthy ones.
        labels: the Node's labels (nodeSelector and node affinity match against them).
        taints: ``spec.taints`` (as the API serves them; tolerations are matched against them).
    """

    name: str
    unschedulable: bool = False
    ready: bool = True
    allocatable: Mapping[str, str] = field(default_factory=dict)
    cpu_millis: int = 0
    memory_bytes: int = 0
    capacity: Mapping[str, str] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)
    taints: tuple[Mapping[str, Any], ...] = ()
