"""The runbook of a change, generated from the real plan and inventory before the window.

Why generated: a hand-written runbook drifts from what the tool will do. This one is built from
the same plan file, inventory and strategy that ``apply`` uses (same batches, same canary group,
same gate thresholds, same windows), plus the preflight results when a cluster is reachable, so
what the approvers read is what will run. Building it is pure (:func:`build_runbook` over parsed
inputs); the CLI gathers the live parts (preflight, canary warnings) and renders Markdown or one
self-contained HTML page.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, is_dataclass
from datetime import datetime
from datetime import time as dtime
from enum import Enum
from typing import TYPE_CHECKING, Any

from rollout.change.plan.batches import Batch, make_batches
from rollout.change.plan.gate_section import GateConfig
from rollout.change.plan.schema import Plan
from rollout.change.plan.strategy import Strategy
from rollout.change.plan.windows import Window, forward_allowed
from rollout.evidence.templating import render_template
from rollout.kubelet.admission.node_preview import NodePreview, fleet_misfits

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.kube.client import Api

IGNORED_GROUPS = ("all", "ungrouped")

RULES = (
    "Change the device-allocation layer (this kubelet change) and a model-serving version in "
    "separate windows: if both move at once, neither verdict means anything. apply and promote "
    "refuse while an Argo Rollout, Flagger Canary or KServe InferenceService is in progress, or "
    "a Deployment rolls out on the nodes they change (--force-serving REASON overrides, "
    "journaled).",
    'Never "fix" the queue by removing resource requests or loosening tenant nodeSelectors: '
    "pods rejected with TopologyAffinityError are the signal; roll the nodes back instead.",
    "Never edit workloads, PodDisruptionBudgets or tolerations to make the drain pass: a drain "
    "blocked by a PDB is reported with the pod named; wait or roll back.",
    "Rollback is always allowed, inside or outside the window, and while a gate is holding.",
)


@dataclass(frozen=True)
class Preflight:
    """Preflight results for the runbook.

    Attributes:
        ran: False with ``--offline`` (cluster checks skipped).
        ok: every check passed (meaningless when not ran).
        lines: what preflight reported (API server version, ``resource.k8s.io``), warnings,
            or every refusal.
        previews: the admission preview of every node in scope; None when it did not run
            (offline, or preflight refused before it).
        tenancy: the tenancy audit of the plan's ``tenancy:`` file as ``rollout tenancy audit
            -o json`` prints it (every row), when the plan names one and preflight ran.
    """

    ran: bool
    ok: bool = False
    lines: tuple[str, ...] = ()
    previews: tuple[NodePreview, ...] | None = None
    tenancy: Mapping[str, Any] | None = None


def live_preflight(plan: Plan, inv: Inventory, api: Api) -> tuple[Preflight, list[str]]:
    """Preflight as ``rollout apply`` runs it (every node's facts, then the cluster's checks
    and the admission preview), for the runbook: its result, refusals included, and the
    model-serving canaries in progress (those preflight already names are not repeated as
    warnings); with the plan's ``tenancy:`` file, its audit (``Preflight.tenancy``), as apply's
    preflight judges it. Nothing is written anywhere.

    Raises:
        InputError: the plan's tenancy file is malformed or names what the cluster lacks.
    """
    import tempfile
    from pathlib import Path

    from rollout.ansible.runner import AnsibleRunner
    from rollout.change.preflight.checking import ClusterReader, PreviewedRefusal, prepare
    from rollout.errors import PreflightError
    from rollout.kube.canaries import canaries_in_progress

    warnings = canaries_in_progress(api)
    audit = None
    if plan.tenancy:
        from rollout.change.tenancy.audit import audit_plan_tenancy

        audit = audit_plan_tenancy(plan.tenancy, api)
    table = {"file": plan.tenancy, **audit.to_json()} if audit else None
    with tempfile.TemporaryDirectory(prefix="rollout-runbook-") as tmp:
        facts_dir = Path(tmp) / "facts"
        raw = AnsibleRunner(Path(tmp) / "runner").gather_facts(inv.path, list(inv.hosts), facts_dir)
        reader = ClusterReader(api, {inv.node_of(h) for h in inv.hosts})
        try:
            prepared = prepare(plan, inv, reader, raw, facts_dir, False, tenancy=audit)
        except PreflightError as e:
            problems = [ln.strip() for ln in str(e).splitlines()[1:]] or [str(e)]
            previews = e.previews if isinstance(e, PreviewedRefusal) else None
            repeated = set(problems)
            return Preflight(True, False, tuple(problems), previews, table), [
                w for w in warnings if w not in repeated
            ]
    warnings = [w for w in warnings if w not in prepared.warnings]
    lines = [*prepared.report, *(f"warning: {w}" for w in prepared.warnings)]
    lines += [
        f"{n}: evicts {', '.join(pods) or 'no pods'}" for n, pods in prepared.evictions.items()
    ]
    return Preflight(True, True, tuple(lines), prepared.previews, table), warnings


GO_RULE = (
    "Go only if no pod running on a node in scope is predicted rejected (or the rejections are "
    "accepted with --accept-predicted-rejections, which is journaled)."
)


@dataclass(frozen=True)
class PreviewSection:
    """The runbook's admission preview: what the new config admits and rejects, node by node.

    Attributes:
        ran: the preview ran (a reachable cluster, preflight got that far).
        note: why there is no preview, when it did not run.
        nodes: per node in scope, the predictions (running pods, then workloads that can land).
        fits_no_node: workloads admitted on no node in scope.
        rejected_running: running pods predicted rejected, one line each (node, workload,
            numbers): each one is a no-go unless accepted.
        go: the preview ran and no running pod is predicted rejected.
        rule: the go/no-go rule, in words.
    """

    ran: bool
    note: str = ""
    nodes: tuple[NodePreview, ...] = ()
    fits_no_node: tuple[str, ...] = ()
    rejected_running: tuple[str, ...] = ()
    go: bool = False
    rule: str = GO_RULE

    def to_dict(self) -> dict[str, Any]:
        """The same per-node shape as ``rollout preview -o json``, plus the verdict."""
        return {
            "ran": self.ran,
            "note": self.note,
            "nodes": [n.to_dict() for n in self.nodes],
            "fitsNoNode": list(self.fits_no_node),
            "rejectedRunning": list(self.rejected_running),
            "go": self.go,
            "rule": self.rule,
        }


def preview_section(preflight: Preflight) -> PreviewSection:
    """The admission preview section from preflight's results (pure)."""
    if not preflight.ran:
        return PreviewSection(False, "--offline: no pods or workloads were read from the cluster")
    if preflight.previews is None:
        return PreviewSection(False, "preflight refused before the preview ran; see Preflight")
    nodes = tuple(preflight.previews)
    rejected = tuple(p.describe(n.node) for n in nodes for p in n.rejected_running)
    return PreviewSection(
        ran=True,
        nodes=nodes,
        fits_no_node=tuple(fleet_misfits(nodes)),
        rejected_running=rejected,
        go=not rejected,
    )


@dataclass(frozen=True)
class Pool:
    """Nodes of one inventory group, for the rollback procedure."""

    name: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class Runbook:
    """Everything the runbook shows."""

    plan_name: str
    plan_file: str
    inventory: str
    generated: str
    kubelet: Mapping[str, Any]
    overrides: Mapping[str, Mapping[str, Any]]
    distribution: str
    method: str
    strategy: Strategy
    batches: tuple[Batch, ...]
    canary: tuple[str, ...]
    pools: tuple[Pool, ...]
    gate: GateConfig
    windows: tuple[Window, ...]
    window_now: str
    preflight: Preflight
    preview: PreviewSection
    warnings: tuple[str, ...]
    gpu_resource: str
    commands: tuple[tuple[str, str], ...] = field(default=())
    stages: tuple[Mapping[str, Any], ...] = ()
    rules: tuple[str, ...] = RULES


def operator_commands(gpu_resource: str) -> tuple[tuple[str, str], ...]:
    """(purpose, command) pairs an operator runs to inspect the cluster during the change."""
    col = gpu_resource.replace(".", "\\.")
    alloc = f"kubectl get nodes -o custom-columns=NAME:.metadata.name,GPU:.status.allocatable.{col}"
    return (
        (
            "Is Dynamic Resource Allocation served?",
            "kubectl api-resources --api-group=resource.k8s.io",
        ),
        (f"Allocatable {gpu_resource} per node (compare before and after each node)", alloc),
        (
            "Why is a pod not running? (look for TopologyAffinityError)",
            "kubectl describe pod -n NS POD",
        ),
        ("Events, newest last", "kubectl get events -A --sort-by=.lastTimestamp"),
        ("Pods rejected at admission", "kubectl get pods -A --field-selector=status.phase=Failed"),
        ("DRA claims and their allocation", "kubectl get resourceclaims -A"),
        ("DRA devices published per node", "kubectl get resourceslices"),
        ("Cordoned nodes", "kubectl get nodes --field-selector=spec.unschedulable=true"),
        ("The change's state, node by node", "rollout status --change CHANGE_ID"),
        (
            f"Capacity vs allocatable {gpu_resource} (capacity - allocatable = devices the "
            "kubelet holds unhealthy)",
            alloc.replace(f"GPU:.status.allocatable.{col}", f"CAP:.status.capacity.{col}")
            + f",ALLOC:.status.allocatable.{col}",
        ),
        (
            "Evidence apply collected (before, after) and each check's result",
            "rollout report --change CHANGE_ID -o json | jq .evidence",
        ),
        (
            "Evidence again, e.g. once a device is back (promote reads the last 'after')",
            "rollout evidence --label after --change CHANGE_ID",
        ),
        (
            "Evidence after the canary's pods were recreated",
            "rollout evidence --label after-recreate --change CHANGE_ID",
        ),
        (
            "Performance: your benchmark bound to the GPU's NUMA node and to another, journaled "
            "with the change (docs/bench.md)",
            "rollout bench --change CHANGE_ID --command './bench.sh'",
        ),
        (
            "Performance where the workload runs: the same benchmark in a pod the kubelet placed "
            "(its exclusive CPUs and GPU named from podresources; docs/bench.md)",
            "rollout bench --change CHANGE_ID --mode pod --image IMAGE --command './bench.sh'",
        ),
    )


def _pools(inventory: Inventory, nodes: Sequence[str]) -> tuple[Pool, ...]:
    wanted = set(nodes)
    out = []
    for name, hosts in inventory.groups.items():
        if name in IGNORED_GROUPS:
            continue
        members = tuple(inventory.node_of(h) for h in hosts if inventory.node_of(h) in wanted)
        if members:
            out.append(Pool(name, members))
    covered = {n for p in out for n in p.nodes}
    rest = tuple(n for n in nodes if n not in covered)
    if rest:
        out.append(Pool("ungrouped", rest))
    return tuple(out)


def build_runbook(
    plan: Plan,
    inventory: Inventory,
    now: datetime,
    preflight: Preflight,
    warnings: Sequence[str] = (),
    gpu_resource: str = "nvidia.com/gpu",
) -> Runbook:
    """The runbook (pure over parsed inputs).

    Args:
        plan: the parsed plan.
        inventory: a ``rollout.ansible.hosts.Inventory`` (hosts, groups, ``node_of``).
        now: generation time (timezone-aware); decides what the window section says.
        preflight: preflight results, or ``Preflight(ran=False)`` offline.
        warnings: application canaries in progress and other warnings.
        gpu_resource: the device resource name shown in the inspection commands.

    The plan's sections were parsed with it (``rollout.change.plan.schema``): a plan without a
    ``gate:`` shows the gate's defaults.
    """
    strategy = plan.strategy.for_nodes(len(inventory.hosts))
    gate = plan.gate or GateConfig()
    windows = plan.windows
    order = [inventory.node_of(h) for h in inventory.hosts]
    canary = [inventory.node_of(h) for h in inventory.groups.get(strategy.canary_group, ())]
    batches = tuple(make_batches(order, canary, strategy, canary_only=False))
    decision = forward_allowed(windows, now, None)
    return Runbook(
        plan_name=plan.name,
        plan_file=plan.path,
        inventory=str(inventory.path),
        generated=now.isoformat(timespec="seconds"),
        kubelet=dict(plan.kubelet),
        overrides={h: dict(o.kubelet) for h, o in plan.nodes.items() if o.kubelet},
        distribution=plan.distribution or "from each node's facts",
        method=plan.method or "the distribution's default",
        strategy=strategy,
        batches=batches,
        canary=tuple(canary),
        pools=_pools(inventory, [n for b in batches for n in b.nodes]),
        gate=gate,
        windows=windows,
        window_now=decision.reason if windows else "no change windows configured: any time",
        preflight=preflight,
        preview=preview_section(preflight),
        warnings=tuple(warnings),
        gpu_resource=gpu_resource,
        commands=operator_commands(gpu_resource),
        stages=tuple({"name": s.name, "kubelet": dict(s.kubelet)} for s in plan.stages),
    )


def _plain(value: Any) -> Any:
    """JSON-ready data from dataclasses, enums, sets, times (field names as in the code)."""
    if is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (set, frozenset)):
        return sorted(_plain(v) for v in value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, (datetime, dtime)):
        return value.isoformat()
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def as_json(runbook: Runbook) -> str:
    """The runbook as one JSON document: every section's data, for tools."""
    doc = _plain(runbook)
    doc["commands"] = [{"what": w, "command": c} for w, c in runbook.commands]
    doc["preflight"].pop("previews", None)  # shown once, as ``preview``
    if doc["preflight"].get("tenancy") is None:  # the plan names no tenancy file
        doc["preflight"].pop("tenancy", None)
    doc["preview"] = runbook.preview.to_dict()
    return json.dumps(doc, indent=2, sort_keys=True) + "\n"


def render(runbook: Runbook, fmt: str) -> str:
    """The runbook as ``markdown``, ``html`` (one self-contained page) or ``json``."""
    if fmt == "json":
        return as_json(runbook)
    ctx = {"rb": runbook}
    if fmt == "html":
        return render_template("runbook.html.j2", ctx, html=True)
    return render_template("runbook.md.j2", ctx)
