"""Tiny in-memory fakes of the orchestrator's Protocols (unit tests of decisions only; the lab
tests prove the same paths against the real API server, sshd and Ansible)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

from rollout.models import NodeChange, NodeInfo, PodRef
from rollout.protocols import Eviction, EvictionResult, OneSoak, RestoreFile, RunResult
from rollout.verdicts import Verdict, VerdictStatus


class FakeClock:
    """Advances only when slept on."""

    def __init__(self) -> None:
        self.t = 0.0

    def now(self) -> datetime:
        return datetime(2026, 1, 1, tzinfo=UTC) + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.t += max(seconds, 0.001)


class RecordingClock:
    """Monotonic time that moves only when slept through, by exactly what was asked; every sleep
    recorded in ``slept`` (the schedules of ``rollout.retrying`` and its callers)."""

    def __init__(self, start: float = 0.0) -> None:
        self.t = start
        self.slept: list[float] = []

    def monotonic(self) -> float:
        return self.t

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.t += seconds


@dataclass
class FakeNode:
    info: NodeInfo
    config: dict[str, Any]
    files: dict[str, bytes]
    pods: list[PodRef] = field(default_factory=list)
    healthy: bool = True
    #: DRA driver -> slice uid -> device count (the node's ResourceSlices)
    slices: dict[str, dict[str, int]] = field(default_factory=dict)


class FakeCluster:
    """Nodes, pods and one kubelet config each; PDB-blocked pods refuse every eviction."""

    def __init__(self, nodes: Mapping[str, FakeNode], blocked: Sequence[str] = ()) -> None:
        self.nodes = dict(nodes)
        self.blocked = set(blocked)
        self.calls: list[tuple[str, str]] = []

    def node(self, name: str) -> NodeInfo:
        return self.nodes[name].info

    def cordon(self, name: str) -> None:
        self.calls.append(("cordon", name))
        n = self.nodes[name]
        n.info = replace(n.info, unschedulable=True)

    def uncordon(self, name: str) -> None:
        self.calls.append(("uncordon", name))
        n = self.nodes[name]
        n.info = replace(n.info, unschedulable=False)

    def pods_on_node(self, name: str) -> list[PodRef]:
        return list(self.nodes[name].pods)

    def evict(self, pod: PodRef, grace_period_s: int | None) -> EvictionResult:
        self.calls.append(("evict", pod.key))
        if pod.key in self.blocked:
            return EvictionResult(
                Eviction.BLOCKED,
                "Cannot evict pod as it would violate the pod's disruption budget.",
            )
        self.nodes[pod.node].pods.remove(pod)
        return EvictionResult(Eviction.EVICTED)

    def delete_pod(self, pod: PodRef, grace_period_s: int | None) -> None:
        self.calls.append(("delete", pod.key))
        self.nodes[pod.node].pods.remove(pod)

    def pod_gone(self, pod: PodRef) -> bool:
        return pod not in self.nodes[pod.node].pods

    def pdbs_for(self, pod: PodRef) -> list[str]:
        return [f"{pod.namespace}/never"] if pod.key in self.blocked else []

    def healthz(self, node: str) -> bool:
        return self.nodes[node].healthy

    def configz(self, node: str) -> Mapping[str, Any]:
        return {"kubeletconfig": dict(self.nodes[node].config)}

    def dra_slices(self, node: str) -> Mapping[str, Mapping[str, int]]:
        return {d: dict(s) for d, s in self.nodes[node].slices.items()}


class FakeRunner:
    """Writes files into the fake node; ``refuse`` makes the new config fail to start;
    ``pipelined``: each node of a batch runs on its own (the plain-ssh node step's shape)."""

    pipelined = False

    def __init__(
        self, cluster: FakeCluster, refuse: Sequence[str] = (), fail_restore: Sequence[str] = ()
    ) -> None:
        self.cluster = cluster
        self.refuse = set(refuse)
        self.fail_restore = set(fail_restore)
        self.applied: list[str] = []
        self.restored: list[str] = []
        self.runs: list[tuple[str, tuple[str, ...]]] = []
        #: (node, force) of every restore, as ``restore_many`` was called
        self.forced: list[tuple[str, bool]] = []

    def per_node(self, hosts: Sequence[str]) -> bool:
        return self.pipelined

    def apply(self, change: NodeChange, change_id: str, backup_dir: str) -> RunResult:
        self.applied.append(change.node)
        n = self.cluster.nodes[change.node]
        n.files.update(change.files)
        for p in change.removed:
            n.files.pop(p, None)
        if change.node in self.refuse:
            n.healthy = False
            return RunResult(False, "kubelet did not become healthy")
        n.config.update(change.expected)
        return RunResult(True, changed=True)

    def restore(
        self, change: NodeChange, change_id: str, files: Sequence[RestoreFile]
    ) -> RunResult:
        self.restored.append(change.node)
        if change.node in self.fail_restore:
            return RunResult(False, "ssh: connect to host: Connection refused")
        n = self.cluster.nodes[change.node]
        for f in files:
            if f.content is None:
                n.files.pop(f.path, None)
            else:
                n.files[f.path] = f.content
        n.config = _config_of(n.files)
        n.healthy = True
        return RunResult(True, changed=True)

    def apply_many(self, changes: Sequence[NodeChange], change_id: str) -> dict[str, RunResult]:
        """One shared run; each outcome its own (via ``apply``, so tests can patch it)."""
        self.runs.append(("apply", tuple(c.node for c in changes)))
        return {c.node: self.apply(c, change_id, "") for c in changes}

    def restore_many(
        self,
        items: Sequence[tuple[NodeChange, Sequence[RestoreFile]]],
        change_id: str,
        force: bool = False,
    ) -> dict[str, RunResult]:
        """One shared run: each node's outcome its own; ``force`` is recorded."""
        self.runs.append(("restore", tuple(c.node for c, _ in items)))
        self.forced.extend((c.node, force) for c, _ in items)
        return {c.node: self.restore(c, change_id, files) for c, files in items}


def _config_of(files: Mapping[str, bytes]) -> dict[str, Any]:
    """The fake kubelet's 'effective config': key=value lines of /etc/kubelet.conf."""
    out: dict[str, Any] = {}
    for line in files.get(CONF, b"").decode().splitlines():
        k, _, v = line.partition("=")
        out[k] = v
    return out


CONF = "/etc/kubelet.conf"
OLD = b"cpuManagerPolicy=none\ntopologyManagerPolicy=none\n"
NEW = b"cpuManagerPolicy=static\ntopologyManagerPolicy=single-numa-node\n"
EXPECTED = {"cpuManagerPolicy": "static", "topologyManagerPolicy": "single-numa-node"}


def make_node(name: str, cordoned: bool = False, pods: int = 1) -> FakeNode:
    files = {CONF: OLD}
    return FakeNode(
        info=NodeInfo(name, unschedulable=cordoned, allocatable={"nvidia.com/gpu": "2"}),
        config=_config_of(files),
        files=files,
        pods=[PodRef("default", f"{name}-p{i}", node=name, uid=f"u{i}") for i in range(pods)],
    )


def make_change(name: str) -> NodeChange:
    return NodeChange(
        node=name,
        host=name,
        files={CONF: NEW, "/etc/dropin.conf": b"x\n"},
        expected=EXPECTED,
        before={CONF: OLD, "/etc/dropin.conf": None},
    )


class ScriptedGate(OneSoak):
    def __init__(self, status: VerdictStatus) -> None:
        self.status = status
        self.seen: list[list[str]] = []

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        self.seen.append(list(nodes))
        return Verdict(self.status, "scripted")


class Killed(BaseException):
    """Stands in for SIGKILL: not an Exception, so nothing in the loop catches it."""


def fake_context(cluster: FakeCluster, runner: Any, journal: Any, **extra: Any) -> Any:
    """A ``Context`` over the fakes: the fake clock, a short drain and verify (the values every
    unit test of the engine uses), and ``extra`` (``on_event``, ``forks``, ...)."""
    from rollout.change.engine.context import Context
    from rollout.change.plan.drain_rules import DrainPolicy

    return Context(
        cluster=cluster,
        runner=runner,
        clock=FakeClock(),
        journal=journal,
        drain=DrainPolicy(timeout_s=5, backoff_initial_s=0.5, backoff_cap_s=2),
        verify_timeout_s=3,
        **extra,
    )
