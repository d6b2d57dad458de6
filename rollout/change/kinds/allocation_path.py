"""The allocation-path change: a GPU node moved between the device plugin and a DRA driver, as a
kind of change (``rollout.change.engine.context.KindSteps``).

A node's path follows its labels, as the DaemonSets of a cluster select on them: the device
plugin's (NVIDIA's operator: ``nvidia.com/gpu.deploy.device-plugin``) and the DRA kubelet
plugin's (``nvidia.com/dra-kubelet-plugin``); both keys are plan settings. The engine cordons and
drains; this kind then moves the node in the one order that never lets it serve the extended
resource through both paths (KEP-5004: the device plugin serves the name while the node's
allocatable for it is > 0, DRA once it is 0 and a DeviceClass maps the name):

* to DRA: ``release`` (no device of the plugin still assigned), ``switch`` (the device-plugin
  label off, allocatable down to 0, only then the DRA label on), verify (the driver's
  ResourceSlices for the node list its healthy GPUs, allocatable still 0);
* to the device plugin, the design document's rollback order: ``claims`` (before the drain: wait
  for the pods holding claims on the node to end, or with the operator's consent let the drain
  terminate them), ``release`` (no ResourceClaim allocated from the node's pool, the kubelet's
  own account empty), ``stop-driver`` (the DRA label off), ``slices-gone`` (the driver's slices
  for the node wiped), ``switch`` (the device-plugin label on), verify (allocatable equals the
  healthy count). Stopping the driver before the claims are released strands pods in
  Terminating (kubernetes#129402); starting the plugin before the slices are gone serves the
  name twice.

A restore runs the way back to where the node was. Each step checks what must hold before it,
and refuses by name when it does not (``OutOfOrderError``). Every label write is a
compare-and-swap against the values the record holds (``DeviceWorld.patch_labels``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any, Protocol, runtime_checkable

from rollout.ansible.hosts import Inventory
from rollout.change.engine.context import Context
from rollout.change.kinds import claim_freeze
from rollout.change.plan.allocation_path_section import (
    AllocationPath,
    PathPlan,
    PathSettings,
)
from rollout.change.plan.schema import Plan
from rollout.change.record.entries import ChangeBegin
from rollout.change.record.journal import CHANGE_STEP, Entry
from rollout.change.record.replay import NodeStatus
from rollout.errors import InputError, NodeOperationError, PreflightError, RolloutError
from rollout.kubelet.holdings import Account, claim_account, device_account
from rollout.models import NodeInfo, Phase, PodRef, Step, StepPath
from rollout.protocols import Clock
from rollout.retrying import Poll, wait_until


@dataclass(frozen=True)
class PathChange:
    """One node's move (the kind's ``work``).

    Attributes:
        node: Node name. host: inventory host.
        target: the path the node ends on.
        settings: how paths are selected (recorded with the node, so resume and rollback need no
            plan).
    """

    node: str
    host: str
    target: AllocationPath
    settings: PathSettings


@runtime_checkable
class DeviceWorld(Protocol):
    """What the allocation-path kind reads and writes beyond the engine's ``Cluster`` (the
    context's cluster must have these too)."""

    def node(self, name: str) -> NodeInfo:
        """The Node (its labels and allocatable)."""
        ...

    def patch_labels(
        self, node: str, expect: Mapping[str, str | None], labels: Mapping[str, str | None]
    ) -> None:
        """Set ``labels`` (None: remove) on the Node, only while its labels still have the
        values ``expect`` names (compare-and-swap: the write carries the resourceVersion it
        read).

        Raises:
            NodeFilesChangedError: a label no longer has the expected value; nothing written.
        """
        ...

    def slice_devices(self, driver: str, node: str) -> list[str]:
        """The devices the driver's ResourceSlices list for the node (healthy ones only, where
        the driver says)."""
        ...

    def claims_on(self, driver: str, node: str) -> list[str]:
        """The ResourceClaims (``namespace/name``) with a device of ``driver`` allocated from
        the node's pool (``status.allocation.devices.results[].pool == node``)."""
        ...

    def prepared(self, driver: str, node: str) -> list[str]:
        """The kubelet's own account of the driver's claims prepared on the node."""
        ...

    def assigned(self, resource: str, node: str) -> list[str]:
        """The devices of ``resource`` the kubelet still has assigned to a pod on the node."""
        ...

    def claim_holders(self, driver: str, node: str) -> list[PodRef]:
        """The pods on the node that hold a claim of the driver (their own or an extended
        resource claim)."""
        ...


class OutOfOrderError(NodeOperationError):
    """A step whose precondition does not hold: refused by name, nothing done."""


def _world(ctx: Context) -> DeviceWorld:
    if not isinstance(ctx.cluster, DeviceWorld):
        raise InputError("the allocation-path change needs a cluster that reads DRA objects")
    return ctx.cluster


_FAST_POLL_S = 0.25
"""How often a wait asks in its first ``_FAST_FOR_S``: what it waits for (the driver's republish,
about 1.3 s; allocatable reaching 0) mostly lands there, and a 1 s poll added up to a second per
wait (``benchmarks/migration_bench.py``: the floor polls every 0.1 s)."""
_FAST_FOR_S = 10.0


def _wait(
    clock: Clock, timeout_s: float, what: str, problem: Callable[[], str | None], poll_s: float = 1
) -> None:
    """Wait until ``problem`` says None, or raise with its last word. Asks every
    ``_FAST_POLL_S`` for the first ``_FAST_FOR_S``, then every ``poll_s`` (two GETs a second per
    node after that, whatever the batch's size)."""
    last: str | None = None

    def settled() -> bool:
        nonlocal last
        last = problem()
        return last is None

    poll = Poll(_FAST_POLL_S, _FAST_FOR_S, poll_s)
    if not wait_until(settled, timeout_s, poll, clock.sleep, clock.monotonic):
        raise NodeOperationError(f"{what}: still {last} after {timeout_s:g}s")


def _count(info: NodeInfo, resource: str) -> int:
    try:
        return int(info.allocatable.get(resource, "0"))
    except ValueError:
        return 0


def _labels(info: NodeInfo, s: PathSettings) -> dict[str, str | None]:
    return {k: info.labels.get(k) for k in (s.device_plugin_label, s.dra_label)}


def _switch(
    ctx: Context,
    node: str,
    s: PathSettings,
    labels: Mapping[str, str | None],
    step: Step,
    path: StepPath,
) -> None:
    """Set labels on the node, a compare-and-swap against their values now (idempotent: labels
    already so are left; ``resume`` runs a write step again)."""
    world = _world(ctx)
    now = _labels(world.node(node), s)
    want = {k: v for k, v in labels.items() if now.get(k) != v}
    ctx.record(node, step, Phase.BEGIN, path, {"labels": dict(labels)})
    if want:
        world.patch_labels(node, {k: now[k] for k in want}, want)
    ctx.record(node, step, Phase.DONE, path, {"written": sorted(want)})


@runtime_checkable
class NodeAccounts(Protocol):
    """What the kind reads on the node itself (the context's runner must have it): the node's
    facts, which carry the kubelet's own account (``rollout.kubelet.holdings``)."""

    def node_facts(self, host: str) -> Mapping[str, Any]:
        """The host's node facts, read now (the facts module; read-only).

        Raises:
            RolloutError: the node could not be read.
        """
        ...


def _api_plugin_released(ctx: Context, node: str, s: PathSettings) -> str | None:
    left = _world(ctx).assigned(s.resource, node)
    return f"{len(left)} device(s) of {s.resource} assigned ({', '.join(left)})" if left else None


def _api_driver_released(ctx: Context, node: str, s: PathSettings) -> str | None:
    world = _world(ctx)
    claims = world.claims_on(s.driver, node)
    if claims:
        return f"ResourceClaim(s) {', '.join(claims)} allocated from pool {node}"
    held = world.prepared(s.driver, node)
    if held:
        return f"ResourceClaim(s) {', '.join(held)} still reserved for a pod on the node"
    return None


class Release:
    """Whether the path a node leaves has released every device: first the API server's account
    (pods bound to the node, claims allocated from its pool), then the kubelet's own, read on the
    node (``rollout.kubelet.holdings``: podresources, ``kubelet_internal_checkpoint``,
    ``dra_manager_state``). Called, it says why not (None: released); ``account`` keeps the
    kubelet's account it read last, for the journal."""

    def __init__(
        self,
        ctx: Context,
        node: str,
        host: str,
        s: PathSettings,
        leaving: AllocationPath,
        kubelet: bool = True,
    ) -> None:
        self.ctx, self.node, self.host, self.s, self.leaving = ctx, node, host, s, leaving
        self.kubelet = kubelet  # False: the API server's account only
        self.account: Account | None = None

    def __call__(self) -> str | None:
        ctx, node, s = self.ctx, self.node, self.s
        plugin = self.leaving is AllocationPath.DEVICE_PLUGIN
        why = _api_plugin_released(ctx, node, s) if plugin else _api_driver_released(ctx, node, s)
        if why is not None or not self.kubelet:
            return why
        runner = ctx.runner
        if not isinstance(runner, NodeAccounts):
            raise InputError("the allocation-path change needs a runner that reads the node")
        try:
            facts = runner.node_facts(self.host)
            pods = {p.uid: p.key for p in ctx.cluster.pods_on_node(node) if p.uid}
        except RolloutError as e:
            return f"the kubelet's own account on node {node} unread ({e})"
        if plugin:
            self.account = device_account(facts, s.resource, pods)
        else:
            self.account = claim_account(facts, s.driver, pods)
        held = self.account.why_not_released()
        return f"the kubelet's own account says {held}" if held else None

    def record(self) -> dict[str, Any]:
        """The kubelet's account as the journal keeps it (empty when it was not read)."""
        return {"kubelet": self.account.to_json()} if self.account is not None else {}


def _just_confirmed(ctx: Context, node: str, path: StepPath) -> bool:
    """Whether the node's last journal entry is its ``release`` end on ``path`` with the
    kubelet's account read: nothing happened on the node since, so the check before the first
    label write reads the API server's account only (one facts call over ssh less per node). On
    ``resume`` the write runs again after other entries, and the kubelet is read again."""
    last = None
    for e in ctx.journal.entries():
        if e.node == node:
            last = e
    return (
        last is not None
        and last.step == Step.RELEASE.value
        and last.phase is Phase.DONE
        and last.path is path
        and "kubelet" in last.data
    )


def plugin_released(
    ctx: Context, node: str, s: PathSettings, host: str = "", kubelet: bool = True
) -> str | None:
    """Why the device plugin has not released the node's devices (None: it has): a pod bound
    to the node still requests ``resource`` from it, or (``kubelet``) the kubelet's own account
    (its podresources API, its device checkpoint) still has a device assigned to a pod."""
    return Release(ctx, node, host or node, s, AllocationPath.DEVICE_PLUGIN, kubelet)()


def driver_released(
    ctx: Context, node: str, s: PathSettings, host: str = "", kubelet: bool = True
) -> str | None:
    """Why the driver has not released the node's devices (None: it has): a ResourceClaim is
    allocated from the node's pool or reserved for a pod on it, or (``kubelet``) the kubelet's
    own account (podresources' dynamic resources, ``dra_manager_state``) still has a claim of
    the driver."""
    return Release(ctx, node, host or node, s, AllocationPath.DRA, kubelet)()


Labels = Mapping[str, str | None]


def _to_dra(
    ctx: Context,
    node: str,
    s: PathSettings,
    final: Labels,
    path: StepPath,
    clock: Clock,
    host: str = "",
) -> None:
    """The write steps to DRA: the device-plugin label off, allocatable 0, only then the DRA
    label on (``final``: the two labels as the node ends)."""
    again = not _just_confirmed(ctx, node, path)
    if (why := plugin_released(ctx, node, s, host, kubelet=again)) is not None:
        raise OutOfOrderError(
            f"refusing switch on node {node}: the device plugin has not released every "
            f"device: {why}"
        )
    _switch(ctx, node, s, {s.device_plugin_label: final[s.device_plugin_label]}, Step.SWITCH, path)
    _allocatable_zero(ctx, node, s, path, clock)
    _switch(ctx, node, s, {s.dra_label: final[s.dra_label]}, Step.START_DRIVER, path)


def _allocatable_zero(
    ctx: Context, node: str, s: PathSettings, path: StepPath, clock: Clock
) -> None:
    """The wait between the device plugin's label going off and the DRA label going on, a step
    of its own (``allocatable-zero``, journaled before and after: a crash inside it or after it
    resumes by running the write again, whose label writes are idempotent): the Node's
    allocatable ``resource`` is 0, so the device plugin serves the name no more."""
    world = _world(ctx)
    ctx.record(node, Step.ALLOCATABLE_ZERO, Phase.BEGIN, path, {"resource": s.resource})
    _wait(
        clock,
        s.timeout_s,
        f"node {node}: the device plugin's allocatable {s.resource}",
        lambda: f"{c}" if (c := _count(world.node(node), s.resource)) else None,
    )
    ctx.record(node, Step.ALLOCATABLE_ZERO, Phase.DONE, path, {"allocatable": 0})


def _to_device_plugin(
    ctx: Context,
    node: str,
    s: PathSettings,
    final: Labels,
    path: StepPath,
    clock: Clock,
    host: str = "",
) -> None:
    """The write steps back to the device plugin, in the design document's order (``final``:
    the two labels as the node ends)."""
    world = _world(ctx)
    again = not _just_confirmed(ctx, node, path)
    if (why := driver_released(ctx, node, s, host, kubelet=again)) is not None:
        raise OutOfOrderError(f"refusing stop-driver on node {node}: {why}")
    _switch(ctx, node, s, {s.dra_label: final[s.dra_label]}, Step.STOP_DRIVER, path)
    ctx.record(node, Step.SLICES_GONE, Phase.BEGIN, path, {"driver": s.driver})
    _wait(
        clock,
        s.timeout_s,
        f"node {node}: driver {s.driver}'s ResourceSlices",
        lambda: (
            f"{len(d)} device(s) listed" if (d := world.slice_devices(s.driver, node)) else None
        ),
    )
    ctx.record(node, Step.SLICES_GONE, Phase.DONE, path)
    if world.slice_devices(s.driver, node):  # never both: refused by name, whatever the caller
        raise OutOfOrderError(
            f"refusing switch on node {node}: driver {s.driver} still publishes ResourceSlices"
        )
    _switch(ctx, node, s, {s.device_plugin_label: final[s.device_plugin_label]}, Step.SWITCH, path)


def _on_path(
    ctx: Context, node: str, s: PathSettings, target: AllocationPath, healthy: int, clock: Clock
) -> None:
    """Wait until the node serves ``resource`` on ``target`` alone with its ``healthy`` GPUs."""
    world = _world(ctx)

    def problem() -> str | None:
        info = world.node(node)
        if not info.ready:
            return f"Node {node} not Ready"
        count = _count(info, s.resource)
        devices = world.slice_devices(s.driver, node)
        if target is AllocationPath.DRA:
            if count:
                return f"allocatable {s.resource}={count} (the device plugin still serves it)"
            if len(devices) < healthy:
                return f"{len(devices)} device(s) in {s.driver}'s ResourceSlices, want {healthy}"
            return None
        if devices:
            return f"{len(devices)} device(s) still in {s.driver}'s ResourceSlices"
        if count != healthy:
            return f"allocatable {s.resource}={count}, want {healthy}"
        return None

    _wait(clock, s.timeout_s, f"verify of node {node} on {target}", problem)


def _record(change: PathChange, prior: AllocationPath, healthy: int, labels: Any) -> dict[str, Any]:
    return {
        "target": change.target.value,
        "prior": prior.value,
        "healthy": healthy,
        "labels": dict(labels),
        "settings": asdict(change.settings),
        "host": change.host,
    }


def _from_record(node: str, rec: Mapping[str, Any], consent: bool = False) -> PathChange:
    """The node's move as its record holds it; ``consent``: the change's recorded consent to
    terminate claim holders (:func:`claims_consent`), given after the node moved too."""
    settings = PathSettings(**rec["settings"])
    if consent and not settings.terminate_claims:
        settings = replace(settings, terminate_claims=True)
    return PathChange(node, str(rec.get("host", node)), AllocationPath(rec["target"]), settings)


def claims_consent(entries: Iterable[Entry]) -> bool:
    """Whether the operator gave ``--terminate-claims`` to any command of the change (the
    journal's ``change`` ``begin`` entries): once given, ``promote``, ``resume`` and a rollback
    from any machine or the webhook receiver carry it (the journal is the change record)."""
    return any(
        e.node is None
        and e.step == CHANGE_STEP
        and e.phase is Phase.BEGIN
        and bool(ChangeBegin.read(e.data).terminate_claims)
        for e in entries
    )


class AllocationPathKind:
    """The allocation-path kind (``work`` is a :class:`PathChange`)."""

    @property
    def name(self) -> str:
        return "allocation-path"

    def per_node(self, ctx: Context, works: Sequence[Any]) -> bool:
        return True  # each node waits on its own driver and plugin

    def baseline(self, ctx: Context, work: Any, info: NodeInfo) -> dict[str, Any]:
        c: PathChange = work
        s = c.settings
        prior = s.path_of(info.labels)
        if prior is None:
            now = _labels(info, s)
            raise PreflightError(
                f"node {c.node}: labels {s.device_plugin_label}={now[s.device_plugin_label]!r} "
                f"and {s.dra_label}={now[s.dra_label]!r} select no single path"
            )
        if prior is c.target:
            raise PreflightError(f"node {c.node} is already on the {c.target} path")
        slices = _world(ctx).slice_devices(s.driver, c.node)
        healthy = _count(info, s.resource) if prior is AllocationPath.DEVICE_PLUGIN else len(slices)
        return {
            "allocatable": {s.resource: info.allocatable.get(s.resource, "0")},
            "path": prior.value,
            "healthy": healthy,
            "labels": _labels(info, s),
        }

    def prepare(self, ctx: Context, work: Any) -> None:
        c: PathChange = work
        s = c.settings
        before = next(
            e.data
            for e in reversed(ctx.journal.entries())
            if e.node == c.node and e.step == Step.PREFLIGHT.value and e.phase is Phase.DONE
        )
        prior = AllocationPath(before["path"])
        ctx.record(c.node, Step.RELEASE, Phase.BEGIN, StepPath.FORWARD, {"from": prior.value})
        released = Release(ctx, c.node, c.host, s, prior)
        _wait(
            ctx.forward_clock,
            s.timeout_s,
            f"node {c.node}: release from the {prior} path",
            released,
        )
        record = _record(c, prior, int(before["healthy"]), before["labels"])
        data = {"change": record, **released.record()}
        ctx.record(c.node, Step.RELEASE, Phase.DONE, StepPath.FORWARD, data)

    def write(self, ctx: Context, works: Sequence[Any]) -> dict[str, RolloutError]:
        errors: dict[str, RolloutError] = {}
        for c in works:
            move = _to_dra if c.target is AllocationPath.DRA else _to_device_plugin
            ctx.on_event(f"{c.node}: moving to the {c.target} path")
            final = c.settings.labels_for(c.target)
            try:
                move(ctx, c.node, c.settings, final, StepPath.FORWARD, ctx.forward_clock, c.host)
            except RolloutError as e:
                errors[c.node] = e
        return errors

    def expected(self, work: Any) -> dict[str, Any]:
        return {"path": work.target.value}

    def verify(self, ctx: Context, work: Any, before: NodeStatus) -> None:
        c: PathChange = work
        healthy = int(before.record.get("healthy", 0))
        _on_path(ctx, c.node, c.settings, c.target, healthy, ctx.forward_clock)

    def rebuild(self, ctx: Context, status: NodeStatus, for_restore: bool) -> Any:
        if not status.record:
            raise InputError(f"journal has no change record for node {status.node}")
        return _from_record(status.node, status.record, claims_consent(ctx.journal.entries()))

    def restore_before_drain(self, ctx: Context, status: NodeStatus, work: Any) -> None:
        c: PathChange = work
        s = c.settings
        if c.target is not AllocationPath.DRA:
            return  # the way back to DRA: the drain ends the device plugin's pods
        world = _world(ctx)
        holders = world.claim_holders(s.driver, c.node)
        ctx.record(
            c.node,
            Step.CLAIMS,
            Phase.BEGIN,
            StepPath.RESTORE,
            {"pods": [p.key for p in holders], "terminate": s.terminate_claims},
        )
        if not s.terminate_claims:  # wait for them to end; the drain terminates the rest
            _wait(
                ctx.clock,
                s.timeout_s,
                f"node {c.node}: pods holding claims of {s.driver} (no consent to terminate "
                "them: --terminate-claims)",
                lambda: (
                    ", ".join(p.key for p in left)
                    if (left := world.claim_holders(s.driver, c.node))
                    else None
                ),
            )
        ctx.record(c.node, Step.CLAIMS, Phase.DONE, StepPath.RESTORE)

    def restore_prepare(self, ctx: Context, status: NodeStatus, work: Any) -> Any:
        c: PathChange = work
        s = c.settings
        released = Release(ctx, c.node, c.host, s, c.target)  # the path it leaves
        ctx.record(c.node, Step.RELEASE, Phase.BEGIN, StepPath.RESTORE, {"from": c.target.value})
        _wait(ctx.clock, s.timeout_s, f"node {c.node}: release", released)
        ctx.record(c.node, Step.RELEASE, Phase.DONE, StepPath.RESTORE, released.record())
        return c

    def restore_write(
        self, ctx: Context, items: Sequence[tuple[NodeStatus, Any]]
    ) -> dict[str, RolloutError]:
        errors: dict[str, RolloutError] = {}
        for status, c in items:
            back = _to_device_plugin if c.target is AllocationPath.DRA else _to_dra
            final = dict(status.record.get("labels") or {})  # the labels as they were
            try:
                back(ctx, c.node, c.settings, final, StepPath.RESTORE, ctx.clock, c.host)
            except RolloutError as e:
                errors[c.node] = e
        return errors

    def restore_done(self, ctx: Context, status: NodeStatus) -> None:
        return None  # every restore step journaled its own end

    # the claim freeze around the way back (``RestoreBracket``,
    # ``rollout.change.kinds.claim_freeze``)
    def restore_begin(self, ctx: Context, statuses: Sequence[NodeStatus]) -> None:
        claim_freeze.begin_restore(ctx, [s.record for s in statuses if s.files_touched])

    def restore_end(self, ctx: Context) -> None:
        claim_freeze.end_restore(ctx)

    def change_end(self, ctx: Context) -> None:
        claim_freeze.end_change(ctx)

    def restore_expected(self, status: NodeStatus) -> dict[str, Any]:
        return {"path": status.record.get("prior")}

    def restore_verify(self, ctx: Context, status: NodeStatus) -> None:
        c = _from_record(status.node, status.record, claims_consent(ctx.journal.entries()))
        prior = AllocationPath(str(status.record["prior"]))
        healthy = int(status.record.get("healthy", 0))
        _on_path(ctx, c.node, c.settings, prior, healthy, ctx.clock)


def path_plan_of(plan: Plan) -> PathPlan:
    """The plan's ``allocationPath`` section (parsed with the plan).

    Raises:
        InputError: the plan has none (file, field and line named).
    """
    if plan.allocation_path is None:
        raise InputError(
            "the plan has no allocationPath section: rollout migrate moves GPU nodes between "
            "the device plugin and DRA (rollout apply changes kubelet configuration)",
            plan.location("allocationPath"),
        )
    return plan.allocation_path


def targets_of(inv: Inventory, pp: PathPlan, plan: Plan) -> dict[str, AllocationPath]:
    """Node -> the path it ends on, from the inventory groups the plan names (inventory order).

    Raises:
        InputError: a group the inventory lacks, or a node two groups send to different paths.
    """
    out: dict[str, AllocationPath] = {}
    for group, path in pp.groups.items():
        if group not in inv.groups:
            raise InputError(
                f"inventory {inv.path} has no group {group!r} (its groups: "
                f"{', '.join(sorted(inv.groups))})",
                plan.location(f"allocationPath.groups.{group}"),
            )
        for host in inv.groups[group]:
            node = inv.node_of(host)
            if out.get(node, path) is not path:
                raise InputError(
                    f"node {node} is in two groups that end on different paths",
                    plan.location(f"allocationPath.groups.{group}"),
                )
            out[node] = path
    order = [inv.node_of(h) for h in inv.hosts]
    return {n: out[n] for n in order if n in out}


def works_of(plan: Plan, inv: Inventory, terminate_claims: bool = False) -> dict[str, PathChange]:
    """Node -> its move, from the plan's ``allocationPath`` and the inventory (``prepare``, and
    ``resume`` of the batches an interrupted migration had not started)."""
    pp = path_plan_of(plan)
    settings = replace(pp.settings, terminate_claims=terminate_claims)
    hosts = {inv.node_of(h): h for h in inv.hosts}
    return {
        n: PathChange(n, hosts.get(n, n), t, settings) for n, t in targets_of(inv, pp, plan).items()
    }


ALLOCATION_PATH = AllocationPathKind()
"""The allocation-path kind (stateless: its world is the context's cluster)."""
