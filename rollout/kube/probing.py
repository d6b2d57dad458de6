"""Probe pods, and the gate's Events on nodes.

Why probes: a canary with no traffic has no admissions, and no admissions must never pass the gate
(flagger #1035: "no values found ... probably not receiving traffic"). A probe is a Guaranteed pod
(requests = limits, whole CPUs) bound to one canary node with ``nodeName``, so it skips the
scheduler and goes straight to the kubelet's admission: with ``single-numa-node`` it is admitted
only if its CPUs and memory fit one NUMA node, which one CPU and a little memory always do on a
healthy node. A probe rejected with ``TopologyAffinityError`` is a real failure signal.

Probes are the one workload write ``rollout`` makes: its own pods, in its own namespace
(``rollout-probes`` by default), labelled ``app.kubernetes.io/managed-by=rollout`` and
``rollout.io/change=<id>``, tolerating every taint, and deleted when the gate is done. Each names
the process that created it (``rollout.io/created-by``): SIGTERM deletes them before the tool
dies, and the next run deletes those a killed tool left (:mod:`rollout.kube.owned_pods`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from contextlib import ExitStack
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rollout.kube.client import Api

from rollout.errors import ExternalError, truncate
from rollout.kube import owned_pods

PROBE_NAMESPACE = "rollout-probes"
PROBE_IMAGE = "registry.k8s.io/pause:3.10"
MANAGED_BY = {"app.kubernetes.io/managed-by": "rollout"}


def _dns(s: str) -> str:
    return re.sub(r"[^a-z0-9-]", "-", s.lower()).strip("-")[:40]


def probe_manifest(
    node: str,
    change_id: str,
    index: int,
    cpu: str = "1",
    memory: str = "64Mi",
    namespace: str = PROBE_NAMESPACE,
    image: str = PROBE_IMAGE,
) -> dict[str, Any]:
    """A Guaranteed probe pod bound to ``node`` (pure: the manifest only)."""
    resources = {"cpu": cpu, "memory": memory}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": f"rollout-probe-{_dns(node)}-{index}-{_dns(change_id)[-6:]}",
            "namespace": namespace,
            "labels": {
                **MANAGED_BY,
                "rollout.io/change": _dns(change_id),
                "rollout.io/probe": "true",
            },
        },
        "spec": {
            "nodeName": node,
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 0,
            "tolerations": [{"operator": "Exists"}],
            "automountServiceAccountToken": False,
            "containers": [
                {
                    "name": "probe",
                    "image": image,
                    "resources": {"requests": resources, "limits": resources},
                }
            ],
        },
    }


class ProbePods:
    """Creates probe pods on the canary nodes and deletes them afterwards.

    Every pod it creates names this process (``rollout.io/created-by``); from the first create
    until :meth:`cleanup`, SIGTERM deletes them before the process dies
    (:func:`rollout.kube.owned_pods.deleted_on_term`). ``say``: where :meth:`sweep` names the
    pods a killed tool left that it deletes."""

    def __init__(
        self,
        api: Api,
        namespace: str = PROBE_NAMESPACE,
        image: str = PROBE_IMAGE,
        say: Callable[[str], None] = lambda _m: None,
    ) -> None:
        self._core = api.core
        self.namespace = namespace
        self.image = image
        self.say = say
        self.created: list[str] = []
        self._on_term = ExitStack()
        self._guarded = False

    def _guard(self) -> None:
        """SIGTERM deletes the pods created so far, from now until :meth:`cleanup`."""
        if not self._guarded:
            self._on_term.enter_context(owned_pods.deleted_on_term(self._delete_created))
            self._guarded = True

    def _delete_created(self) -> None:
        for name in list(self.created):
            self.delete(name)

    def sweep(self) -> list[str]:
        """Delete the tool's pods a killed tool left in the namespace, saying each, and wait
        until they are gone (:func:`rollout.kube.owned_pods.sweep`); returns their names.

        Raises:
            ExternalError: the pods could not be listed or deleted, or one stayed.
        """
        return owned_pods.sweep(self, self.say)[0]

    def ensure_namespace(self) -> None:
        """Create the probes' namespace when it is missing."""
        from rollout.kube.rest import AnswerError

        try:
            self._core.create_namespace(
                {"metadata": {"name": self.namespace, "labels": MANAGED_BY}}
            )
        except AnswerError as e:
            if e.status != 409:
                raise ExternalError(
                    f"create namespace {self.namespace}: {e.status} {e.reason}"
                ) from e

    def create(self, manifest: dict[str, Any]) -> str:
        """Create one probe from its manifest (deleted by :meth:`cleanup`); returns its name."""
        name = str(manifest["metadata"]["name"])
        owned_pods.stamp(manifest)
        self._guard()
        self._create(name, manifest)
        return name

    def _create(self, name: str, manifest: dict[str, Any]) -> None:
        """Create the pod, named in :attr:`created` before the request: a SIGTERM while its
        answer is on the way deletes it too (not yet there: a 404, fine). A create the API
        server refused (4xx: e.g. the name is another's pod) is taken off again.

        Raises:
            ExternalError: the API server refused it or did not answer.
        """
        from rollout.kube.rest import AnswerError

        self.created.append(name)
        try:
            self._core.create_namespaced_pod(self.namespace, manifest)
        except AnswerError as e:
            if 400 <= e.status < 500:
                self.created.remove(name)
            node = manifest["spec"].get("nodeName", "")
            raise ExternalError(
                f"create probe pod on {node}: {e.status} {e.reason}: {truncate(str(e.body))}"
            ) from e

    def delete(self, name: str) -> None:
        """Delete one probe at once (grace 0; already gone is fine)."""
        from rollout.kube.rest import AnswerError

        try:
            self._core.delete_namespaced_pod(name, self.namespace, grace_period_seconds=0)
        except AnswerError as e:
            if e.status != 404:
                raise ExternalError(f"delete probe pod {name}: {e.status} {e.reason}") from e

    def state(self, name: str) -> dict[str, str] | None:
        """The probe's ``phase``, ``reason``, ``message`` and ``node``; None once it is gone."""
        from rollout.kube.rest import AnswerError

        try:
            pod = self._core.read_namespaced_pod(name, self.namespace)
        except AnswerError as e:
            if e.status == 404:
                return None
            raise ExternalError(f"read probe pod {name}: {e.status} {e.reason}") from e
        st = pod.get("status") or {}
        return {
            "phase": str(st.get("phase") or ""),
            "reason": str(st.get("reason") or ""),
            "message": str(st.get("message") or ""),
            "node": str((pod.get("spec") or {}).get("nodeName") or ""),
        }

    def status(self, name: str) -> dict[str, Any] | None:
        """The pod's whole ``status``; None once it is gone (the bench pod's wait)."""
        from rollout.kube.rest import AnswerError

        try:
            pod = self._core.read_namespaced_pod(name, self.namespace)
        except AnswerError as e:
            if e.status == 404:
                return None
            raise ExternalError(f"read pod {self.namespace}/{name}: {e.status} {e.reason}") from e
        return dict(pod.get("status") or {})

    def log(self, name: str, container: str) -> str:
        """The container's log through the API server's ``pods/log`` (the kubelet serves it);
        empty while the container has not started."""
        from rollout.kube.rest import AnswerError

        try:
            return self._core.read_namespaced_pod_log(name, self.namespace, container)
        except AnswerError as e:
            if e.status in (400, 404):  # "ContainerCreating", or not there yet
                return ""
            raise ExternalError(
                f"read the log of pod {self.namespace}/{name}: {e.status} {e.reason}"
            ) from e

    def launch(self, change_id: str, nodes: Sequence[str], per_node: int) -> list[str]:
        """Create ``per_node`` probes on each node, once the pods a killed tool left are deleted
        (:meth:`sweep`); returns their names."""
        self.ensure_namespace()
        self.sweep()
        self._guard()
        names = []
        for node in nodes:
            for _ in range(per_node):
                m = probe_manifest(
                    node,
                    change_id,
                    len(self.created),
                    namespace=self.namespace,
                    image=self.image,
                )
                owned_pods.stamp(m)
                name = str(m["metadata"]["name"])
                self._create(name, m)
                names.append(name)
        return names

    def labelled(self, selector: str) -> list[dict[str, Any]]:
        """The pods of this namespace whose labels match ``selector`` (a label selector)."""
        from rollout.kube.rest import AnswerError

        try:
            got = self._core.list_pod_for_all_namespaces(
                field_selector=f"metadata.namespace={self.namespace}", label_selector=selector
            )
        except AnswerError as e:
            raise ExternalError(
                f"list pods {self.namespace} ({selector}): {e.status} {e.reason}"
            ) from e
        return [dict(p) for p in got.get("items") or ()]

    def cleanup(self) -> None:
        """Delete every probe this object created (already gone is fine); SIGTERM acts as
        before again."""
        try:
            for name in self.created:
                self.delete(name)
            self.created = []
        finally:
            self._on_term.close()
            self._guarded = False


class NodeEvents:
    """Posts the gate's verdicts as Events on the Node objects (``kubectl describe node``)."""

    def __init__(self, api: Api, namespace: str = "default") -> None:
        self._core = api.core
        self.namespace = namespace

    def post(self, node: str, reason: str, message: str, warning: bool, now: datetime) -> None:
        """One Event: involvedObject the Node, source component ``rollout``."""
        from rollout.kube.rest import AnswerError

        stamp = now.astimezone(UTC).isoformat().replace("+00:00", "Z")
        body = {
            "metadata": {"generateName": f"{node}.rollout-", "namespace": self.namespace},
            "involvedObject": {"kind": "Node", "name": node, "uid": node, "apiVersion": "v1"},
            "reason": reason,
            "message": message[:1000],
            "type": "Warning" if warning else "Normal",
            "source": {"component": "rollout"},
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            self._core.create_namespaced_event(self.namespace, body)
        except AnswerError as e:
            raise ExternalError(f"post Event on node {node}: {e.status} {e.reason}") from e
