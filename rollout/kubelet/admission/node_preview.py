"""The admission preview: which pods a node will admit or reject under the config being rendered.

Pure: it takes plain dicts (Pod, controller and Node objects as the API serves them, camelCase)
and a node's facts and effective KubeletConfiguration, and asks the admission model
(``rollout.kubelet.admission``) pod by pod. Per node it predicts

- the pods on it now, admitted in order on the node as it restarts (they are evicted and
  recreated; the kubelet's state starts empty after the checkpoint reset), and
- every workload whose pod template can land on it (nodeSelector, required node affinity and
  tolerations match the node), each on the node alone: could the new policy ever admit it here.

``fleet_misfits`` lists workloads that fit no node in scope.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rollout.kubelet.admission.inputs import (
    POD_LEVEL_SKIPPED,
    config_from_kubelet,
    explain,
    machine_from_facts,
    pod_from_api,
    pod_level_managers,
)
from rollout.kubelet.admission.model import Config, Node, Pod, Verdict
from rollout.kubelet.facts import NodeFacts
from rollout.models import requirement_holds

CONTROLLERS = ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")


@dataclass(frozen=True)
class Prediction:
    """One pod's predicted verdict on one node.

    Attributes:
        workload: ``Kind/namespace/name`` of the owner (the pod itself when it has none).
        pod: the pod's ``namespace/name`` (the workload's template: empty).
        running: the pod runs on the node now.
        admitted: predicted admitted.
        reason: the kubelet's reason (``TopologyAffinityError`` ...), empty when admitted.
        message: the kubelet's message, empty when admitted.
        numbers: ``explain()``: the numbers behind the verdict.
        owners: the controllers (``Kind/namespace/name``) that the pods of this prediction name
            as their owner, the form the gate's samples carry: a running pod's own controller
            (a Deployment's pod names its ReplicaSet), a workload's ReplicaSets for a Deployment,
            else the workload itself; empty for a bare pod.
        note: what the verdict does not say (a pod with pod-level resources is admitted without
            alignment while ``PodLevelResourceManagers`` is off); empty when nothing.
    """

    workload: str
    pod: str
    running: bool
    admitted: bool
    reason: str = ""
    message: str = ""
    numbers: str = ""
    owners: tuple[str, ...] = ()
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "workload": self.workload,
            "pod": self.pod,
            "running": self.running,
            "verdict": "admitted" if self.admitted else "rejected",
            "reason": self.reason,
            "message": self.message,
            "numbers": self.numbers,
            "note": self.note,
        }

    @property
    def what(self) -> str:
        return f"pod {self.pod} of {self.workload}" if self.pod else f"workload {self.workload}"

    def describe(self, node: str) -> str:
        return f"{self.what} predicted rejected on node {node}: {self.reason}: {self.numbers}"


@dataclass(frozen=True)
class NodePreview:
    node: str
    predictions: tuple[Prediction, ...]

    @property
    def rejected_running(self) -> list[Prediction]:
        return [p for p in self.predictions if p.running and not p.admitted]

    @property
    def rejected_candidates(self) -> list[Prediction]:
        return [p for p in self.predictions if not p.running and not p.admitted]

    def to_dict(self) -> dict[str, Any]:
        return {"node": self.node, "pods": [p.to_dict() for p in self.predictions]}


def _label_matches(expr: Mapping[str, Any], labels: Mapping[str, str]) -> bool:
    key, op = str(expr.get("key", "")), str(expr.get("operator", ""))
    return requirement_holds(labels, key, op, [str(v) for v in expr.get("values") or ()])


def _term_matches(term: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    meta = node.get("metadata") or {}
    labels = {str(k): str(v) for k, v in (meta.get("labels") or {}).items()}
    fields = {"metadata.name": str(meta.get("name", ""))}
    exprs = term.get("matchExpressions") or ()
    field_exprs = term.get("matchFields") or ()
    if not exprs and not field_exprs:
        return False  # an empty term matches no node
    return all(_label_matches(e, labels) for e in exprs) and all(
        _label_matches(e, fields) for e in field_exprs
    )


def _tolerates(tolerations: Sequence[Mapping[str, Any]], taint: Mapping[str, Any]) -> bool:
    for t in tolerations:
        if t.get("effect") and t.get("effect") != taint.get("effect"):
            continue
        op = t.get("operator") or "Equal"
        if not t.get("key"):
            if op == "Exists":
                return True
            continue
        if t.get("key") != taint.get("key"):
            continue
        if op == "Exists" or str(t.get("value") or "") == str(taint.get("value") or ""):
            return True
    return False


def lands_on(spec: Mapping[str, Any], node: Mapping[str, Any]) -> bool:
    """Whether a pod spec can be scheduled onto a Node by its ``nodeName``, nodeSelector,
    required node affinity and tolerations (taints with effect NoSchedule or NoExecute must be
    tolerated). A spec with a ``nodeName`` lands on that Node alone, as the kubelet's own
    admission says ("node(s) didn't match the requested node name")."""
    meta = node.get("metadata") or {}
    if (pinned := spec.get("nodeName")) and pinned != meta.get("name"):
        return False
    labels = meta.get("labels") or {}
    for k, v in (spec.get("nodeSelector") or {}).items():
        if labels.get(k) != v:
            return False
    required = (
        ((spec.get("affinity") or {}).get("nodeAffinity") or {}).get(
            "requiredDuringSchedulingIgnoredDuringExecution"
        )
        or {}
    ).get("nodeSelectorTerms")
    if required is not None and not any(_term_matches(t, node) for t in required):
        return False
    tolerations = spec.get("tolerations") or ()
    return all(
        _tolerates(tolerations, taint)
        for taint in (node.get("spec") or {}).get("taints") or ()
        if taint.get("effect") in ("NoSchedule", "NoExecute")
    )


def _key(kind: str, obj: Mapping[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return f"{kind}/{meta.get('namespace', '')}/{meta.get('name', '')}"


def _owner(obj: Mapping[str, Any]) -> tuple[str, str] | None:
    for o in (obj.get("metadata") or {}).get("ownerReferences") or ():
        if o.get("controller", True):
            return str(o.get("kind", "")), str(o.get("name", ""))
    return None


def workloads(objects: Iterable[Mapping[str, Any]]) -> dict[str, Mapping[str, Any]]:
    """Controllers by ``Kind/namespace/name`` (their ``kind`` field set), ReplicaSets owned by
    a Deployment left out (the Deployment stands for them), and so is a controller known by its
    metadata alone (no ``spec``: ``ClusterReader.controllers`` found its pods land on no Node
    the preview judges; it only names owners, and an absent template is not an empty one)."""
    out: dict[str, Mapping[str, Any]] = {}
    for o in objects:
        kind = str(o.get("kind", ""))
        if kind not in CONTROLLERS or "spec" not in o:
            continue
        owner = _owner(o)
        if kind == "ReplicaSet" and owner is not None and owner[0] == "Deployment":
            continue
        out[_key(kind, o)] = o
    return out


class _Owners:
    """The ReplicaSets of ``objects`` indexed both ways, once per node's preview: up (a
    ReplicaSet's Deployment) and down (a Deployment's ReplicaSets). Each lookup was a scan of
    every controller of the cluster, once per pod on the node and per workload landing on it."""

    def __init__(self, objects: Iterable[Mapping[str, Any]]) -> None:
        self.up: dict[tuple[Any, Any], str] = {}
        self.down: dict[tuple[str, str], list[str]] = {}
        for o in objects:
            if o.get("kind") != "ReplicaSet":
                continue
            meta = o.get("metadata") or {}
            up = _owner(o)
            if up is None or up[0] != "Deployment":
                continue
            self.up.setdefault((meta.get("name"), meta.get("namespace")), up[1])
            self.down.setdefault((meta.get("namespace", ""), up[1]), []).append(
                _key("ReplicaSet", o)
            )

    def workload_of(self, pod: Mapping[str, Any]) -> str:
        owner = _owner(pod)
        ns = (pod.get("metadata") or {}).get("namespace", "")
        if owner is None:
            return _key("Pod", pod)
        kind, name = owner
        if kind == "ReplicaSet" and (name, ns) in self.up:
            return f"Deployment/{ns}/{self.up[(name, ns)]}"
        return f"{kind}/{ns}/{name}"

    def controllers_of(self, key: str) -> tuple[str, ...]:
        """The owner keys a workload's pods carry: a Deployment's ReplicaSets, else itself."""
        kind, ns, name = key.split("/", 2)
        if kind != "Deployment":
            return (key,)
        return tuple(sorted(self.down.get((ns, name), ())))


def workload_of(pod: Mapping[str, Any], objects: Iterable[Mapping[str, Any]]) -> str:
    """The workload a pod belongs to: its controller, a Deployment through its ReplicaSet."""
    return _Owners(objects).workload_of(pod)


def preview_node(
    node: Mapping[str, Any],
    facts: NodeFacts,
    kubelet_config: Mapping[str, Any],
    pods: Sequence[Mapping[str, Any]],
    objects: Sequence[Mapping[str, Any]],
) -> NodePreview:
    """Predict the node's running pods (in order, on the restarted node) and every workload
    that can land on it (each alone on the node).

    Args:
        node: the Node object.
        facts: the node's hardware facts.
        kubelet_config: the effective KubeletConfiguration after the change.
        pods: the pods on the node now.
        objects: controllers (Deployments, StatefulSets, DaemonSets, ReplicaSets); one with
            no ``spec`` (its metadata alone, ``ClusterReader.controllers``) only names owners.
    """
    name = str((node.get("metadata") or {}).get("name", ""))
    machine = machine_from_facts(facts)
    config = config_from_kubelet(kubelet_config)
    managers = pod_level_managers(kubelet_config)
    kubelet = Node(machine, config)
    owners = _Owners(objects)
    out: list[Prediction] = []
    running: set[str] = set()
    for p in pods:
        pod = pod_from_api(p, managers=managers)
        v = kubelet.admit(pod)
        meta = p.get("metadata") or {}
        workload = owners.workload_of(p)
        running.add(workload)
        owner = _owner(p)
        ns = meta.get("namespace", "")
        out.append(
            Prediction(
                workload,
                f"{ns}/{meta.get('name', '')}",
                True,
                v.admitted,
                v.reason,
                v.message,
                explain(v, pod, machine, config, name),
                (f"{owner[0]}/{ns}/{owner[1]}",) if owner is not None else (),
                _join(
                    _note(pod, v.admitted, managers, config),
                    _resize_note(pod, v, config),
                    _init_note(p, pod, config),
                ),
            )
        )
    for key, w in sorted(workloads(objects).items()):
        spec = ((w.get("spec") or {}).get("template") or {}).get("spec") or {}
        if key in running or not lands_on(spec, node):
            continue
        pod = pod_from_api({"metadata": {"name": key}, "spec": spec}, uid=key, managers=managers)
        v = Node(machine, config).admit(pod)
        out.append(
            Prediction(
                key,
                "",
                False,
                v.admitted,
                v.reason,
                v.message,
                explain(v, pod, machine, config, name),
                owners.controllers_of(key),
                _join(_note(pod, v.admitted, managers, config), _init_note(w, pod, config)),
            )
        )
    return NodePreview(name, tuple(out))


def _init_note(obj: Mapping[str, Any], pod: Pod, config: Config) -> str:
    """Init and sidecar containers under the static CPU policy: what the kubelet does that the
    preview does not model (restartable init containers) or that is known to reject pods on a
    restart (#123816, #112228, #119447)."""
    if config.cpu_policy != "static" or not pod.guaranteed:
        return ""
    spec = obj.get("spec") or {}
    if "template" in spec:
        spec = (spec.get("template") or {}).get("spec") or {}
    inits = spec.get("initContainers") or ()
    sidecars = [str(c.get("name", "")) for c in inits if c.get("restartPolicy") == "Always"]
    exclusive = [c.name for c in pod.init if c.cpu_millis and c.cpu_millis % 1000 == 0]
    notes = []
    if sidecars and any(n in exclusive for n in sidecars):
        notes.append(
            f"sidecar (restartable init) container(s) {', '.join(sidecars)} get exclusive CPUs "
            "that the app containers do not reuse (#119447); the preview models them as plain "
            "init containers"
        )
    plain = [n for n in exclusive if n not in sidecars]
    if plain and config.topology_policy != "none":
        notes.append(
            f"init container(s) {', '.join(plain)} request integer CPUs under "
            f"{config.topology_policy}: pods like this have been rejected with "
            "TopologyAffinityError or UnexpectedAdmissionError when the kubelet restarts "
            "(#123816, #112228, open)"
        )
    return "; ".join(notes)


def _join(*notes: str) -> str:
    return "; ".join(n for n in notes if n)


#: the kubelet's resize refusals (pod condition PodResizePending, reason Infeasible)
RESIZE_INFEASIBLE = {
    "cpu": "Resize is infeasible for Guaranteed Pods alongside CPU Manager static policy",
    "memory": "Resize is infeasible for Guaranteed Pods alongside Memory Manager static policy",
}


def _resize_note(pod: Pod, verdict: Verdict, config: Config) -> str:
    """A running Guaranteed pod under a static resource manager cannot be resized in place
    (KEP-1287 GA in 1.35; the exclusive-CPU resize of KEP-5554 is alpha, off)."""
    if not (pod.guaranteed and verdict.admitted):
        return ""
    said = []
    if config.cpu_policy == "static":
        said.append(RESIZE_INFEASIBLE["cpu"])
    if config.memory_policy == "Static":
        said.append(RESIZE_INFEASIBLE["memory"])
    if not said:
        return ""
    quoted = " / ".join(f'"{m}"' for m in said)
    return (
        f"in-place resize of this Guaranteed pod will be refused ({quoted}: PodResizePending, "
        "reason Infeasible); resize by recreating the pod"
    )


def _note(pod: Pod, admitted: bool, managers: bool, config: Config) -> str:
    """Pod-level resources under a resource-manager policy while the gate is off: admitted,
    but with no exclusive CPUs, pinned memory or NUMA hints from those managers."""
    if not (pod.pod_level and admitted) or managers:
        return ""
    if config.cpu_policy != "static" and config.memory_policy != "Static":
        return ""
    return (
        "uses pod-level resources (spec.resources) and PodLevelResourceManagers is off: admitted "
        "without exclusive CPUs, pinned memory or NUMA alignment from the CPU and Memory "
        f'managers (kubelet: "{POD_LEVEL_SKIPPED}"; #133279)'
    )


def fleet_misfits(previews: Iterable[NodePreview]) -> list[str]:
    """Workloads predicted somewhere in scope and admitted on none of those nodes."""
    seen: dict[str, bool] = {}
    for pv in previews:
        for p in pv.predictions:
            seen[p.workload] = seen.get(p.workload, False) or p.admitted
    return sorted(w for w, ok in seen.items() if not ok)


def predicted_rejections(previews: Iterable[NodePreview]) -> frozenset[tuple[str, str]]:
    """(node, owner) of every pod predicted rejected, running or can land, for the gate's
    verdict to tell an expected rejection from a surprise (owners as the gate's samples name
    them, and each workload's own key)."""
    return frozenset(
        (pv.node, o)
        for pv in previews
        for p in pv.predictions
        if not p.admitted
        for o in (p.workload, *p.owners)
    )


def decide(previews: Sequence[NodePreview], accept: bool) -> tuple[list[str], list[str], list[str]]:
    """Preflight's use of the preview: (refusals, warnings, accepted).

    A running pod predicted rejected is a refusal, or accepted with ``accept``; a workload that
    can land and is predicted rejected, and a workload that fits no node in scope, are warnings.
    """
    refusals: list[str] = []
    warnings: list[str] = []
    accepted: list[str] = []
    for pv in previews:
        rejected = [p.describe(pv.node) for p in pv.rejected_running]
        if accept:
            accepted += rejected
        else:
            refusals += [f"{r} (--accept-predicted-rejections to go on)" for r in rejected]
        warnings += [p.describe(pv.node) for p in pv.rejected_candidates]
        warnings += [f"{p.what} on node {pv.node}: {p.note}" for p in pv.predictions if p.note]
    warnings += [f"{w} fits no node in scope under the new config" for w in fleet_misfits(previews)]
    return refusals, warnings, accepted


def render_text(previews: Sequence[NodePreview]) -> str:
    """The preview as lines a person reads: per node, per pod, then the fleet view."""
    lines: list[str] = []
    for pv in previews:
        lines.append(f"node {pv.node}:")
        if not pv.predictions:
            lines.append("  (no pods and no workload can land here)")
        for p in pv.predictions:
            what = f"{p.pod} ({p.workload}), running" if p.running else f"{p.workload}, can land"
            verdict = "admitted" if p.admitted else f"REJECTED {p.reason}: {p.message}"
            lines.append(f"  {what}: {verdict}")
            lines.append(f"    {p.numbers}")
            if p.note:
                lines.append(f"    note: {p.note}")
    misfits = fleet_misfits(previews)
    lines.append(
        "fits no node in scope: " + (", ".join(misfits) if misfits else "(none)"),
    )
    return "\n".join(lines) + "\n"
