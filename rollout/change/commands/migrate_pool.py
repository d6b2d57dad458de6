"""``migrate``: an allocation-path change from a plan, below the CLI (``rollout migrate``).

Two steps, as ``apply``: :func:`prepare_migration` reads the plan's ``allocationPath`` section,
the inventory and the cluster, cuts the batches and runs the preflight (nothing is written);
:func:`run_migration` takes the Lease, creates the change's journal (mirrored into the
cluster) and runs the batches and the gate through the engine with the allocation-path kind.
``resume``, ``rollback`` and ``status`` need nothing of this module: the journal names the kind.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.change.commands.evidence_hooks import EvidenceHooks
from rollout.change.commands.migrate_evidence import collect_before, record_after
from rollout.change.kinds.allocation_path import (
    ALLOCATION_PATH,
    PathChange,
    claims_consent,
    path_plan_of,
    targets_of,
    works_of,
)
from rollout.change.kinds.allocation_preflight import PathWorld, path_refusals
from rollout.change.plan.allocation_path_section import AllocationPath, PathPlan
from rollout.change.plan.batches import Batch, make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.schema import Plan, load_plan
from rollout.change.plan.windows import Decision, guard
from rollout.change.record.entries import ChangeBegin, PreflightForced, Promotion
from rollout.change.record.journal import Journal, Kind
from rollout.change.record.replay import ChangeStatus
from rollout.change.tenancy.audit import Audit, audit_plan_tenancy, change_refusals
from rollout.errors import PreflightError
from rollout.models import Phase, PodRef
from rollout.protocols import Gate

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.change.commands.progress import Progress
    from rollout.kube.client import Api
    from rollout.kube.leases import LeaseLock


@dataclass(frozen=True)
class PreparedMigration:
    """A migration checked and prepared, not started: what ``--dry-run`` prints.

    Attributes:
        plan: the plan. path_plan: its ``allocationPath`` section. inventory: the inventory.
        works: node -> its move. batches: the batches, canary first.
        pods: node -> the pods its drain evicts (every pod but DaemonSets' and mirrors').
        drain: the drain policy (the plan's strategy).
        window_check: the plan's change windows, asked before each batch.
        tenancy: the audit of the plan's tenancy file (``tenancy:``), None when it names none.
        forced: the tenancy refusals ``--force REASON`` overrode (journaled as
            ``preflight-forced`` with ``force``, the reason).
    """

    plan: Plan
    path_plan: PathPlan
    inventory: Inventory
    works: Mapping[str, PathChange]
    batches: Sequence[Batch]
    pods: Mapping[str, Sequence[PodRef]]
    drain: DrainPolicy
    window_check: Callable[[datetime], Decision]
    tenancy: Audit | None = None
    forced: tuple[str, ...] = ()
    force: str | None = None

    def steps(self, node: str) -> list[str]:
        """The steps the node goes through, in order (what ``--dry-run`` lists)."""
        w = self.works[node]
        s = w.settings
        if w.target is AllocationPath.DRA:
            mine = [
                f"release (no {s.resource} of the device plugin still assigned)",
                f"switch ({s.device_plugin_label}=false)",
                f"allocatable-zero (wait until allocatable {s.resource} is 0)",
                f"start-driver ({s.dra_label}=true)",
                f"verify ({s.driver}'s ResourceSlices list the node's healthy GPUs)",
            ]
        else:
            mine = [
                f"release (no ResourceClaim allocated from pool {node}; the kubelet's account "
                "empty)",
                f"stop-driver ({s.dra_label}=false)",
                f"slices-gone (wait until {s.driver}'s ResourceSlices for the node are wiped)",
                f"switch ({s.device_plugin_label}=true)",
                f"verify (allocatable {s.resource} equals the healthy count)",
            ]
        return ["preflight", "cordon", "drain", *mine, "uncordon"]

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": ALLOCATION_PATH.name,
            "plan": self.plan.path,
            "batches": [{"canary": b.canary, "nodes": list(b.nodes)} for b in self.batches],
            "tenancy": self.tenancy.to_json() if self.tenancy is not None else None,
            "forced": list(self.forced),
            "nodes": [
                {
                    "node": n,
                    "target": w.target.value,
                    "steps": self.steps(n),
                    "evicts": [
                        p.key for p in self.pods.get(n, ()) if not (p.daemonset or p.mirror)
                    ],
                }
                for n, w in self.works.items()
            ],
        }


def read_world(api: Api, driver: str) -> PathWorld:
    """What the preflight reads, all from the API server."""
    from rollout.kube import devices, nodes

    infos, _ = nodes.nodes_listed(api, keep=())
    listing = nodes.pods_by_node(api)
    versions = sorted(nodes.resource_api_versions(api), key=lambda v: v != "v1")
    daemonsets: Any = api.apps.list_daemon_set_for_all_namespaces()
    return PathWorld(
        nodes=infos,
        pods=listing.refs,
        slices=devices.driver_nodes(api, driver),
        device_classes=nodes.device_class_objects(api, versions),
        daemonsets=list(daemonsets.get("items") or []),
    )


def prepare_migration(
    api: Api,
    plan_path: str,
    inventory: Path,
    canary_only: bool,
    terminate_claims: bool,
    force_window: str | None = None,
    dry_run: bool = False,
    force: str | None = None,
) -> PreparedMigration:
    """Read and check everything, change nothing.

    A plan that names a tenancy file (``tenancy:``) has it audited (``rollout tenancy audit``,
    the file's identities): a move of a GPU pool is only as safe as its tenants' inability to
    take devices around it, so an audit that does not pass refuses the migration unless
    ``force`` (``--force REASON``: journaled with the refusals).

    Raises:
        InputError: a bad plan or inventory (file, field and line named).
        PreflightError: the cluster cannot carry the change (every reason named).
    """
    from rollout.ansible.hosts import read_inventory

    plan = load_plan(plan_path)
    pp = path_plan_of(plan)
    window_check = guard(plan.windows, force_window)
    if not dry_run and not (window := window_check(datetime.now(UTC))).allowed:
        raise PreflightError(window.reason)
    if terminate_claims:
        pp = replace(pp, settings=replace(pp.settings, terminate_claims=True))
    inv = read_inventory(inventory)
    targets = targets_of(inv, pp, plan)
    # a percentage maxUnavailable is of the migration's nodes, as apply's is of its change's
    strategy = plan.strategy.for_nodes(len(targets))
    canary = [inv.node_of(h) for h in inv.groups.get(strategy.canary_group, ())]
    batches = make_batches(list(targets), canary, strategy, canary_only)
    world = read_world(api, pp.settings.driver)
    refusals = path_refusals(world, pp.settings, targets, [b.nodes for b in batches])
    audit = audit_plan_tenancy(plan.tenancy, api) if plan.tenancy else None
    tenancy = change_refusals(audit) if audit is not None and audit.result != "pass" else []
    if tenancy and not force:
        refusals += [*tenancy, "(the tenancy refusals above: `--force REASON` overrides)"]
    if refusals:
        raise PreflightError(
            "migration refused before any change:\n" + "\n".join(f"  - {r}" for r in refusals)
        )
    works = works_of(plan, inv, terminate_claims)
    return PreparedMigration(
        plan=plan,
        path_plan=pp,
        inventory=inv,
        works=works,
        batches=batches,
        pods={n: list(world.pods.get(n, ())) for n in targets},
        drain=strategy.drain,
        window_check=window_check,
        tenancy=audit,
        forced=tuple(tenancy) if force else (),
        force=force,
    )


def run_migration(
    api: Api,
    lock: LeaseLock,
    ready: PreparedMigration,
    make_gate: Callable[[Journal], Gate],
    *,
    canary_only: bool,
    lock_namespace: str,
    verify_timeout: float,
    forks: int,
    progress: Progress | None,
    say: Callable[[str], None],
    evidence: EvidenceHooks | None = None,
) -> ChangeStatus:
    """Start the change under the Lease and run it through the engine; with ``evidence``, the
    moving nodes' ``before`` and ``after`` evidence
    (:mod:`rollout.change.commands.migrate_evidence`)."""
    from rollout.change.commands.change_options import ChangeOptions
    from rollout.change.commands.session import ChangeSession, RunSetup
    from rollout.change.engine.orchestrator import run_change
    from rollout.kube.lease_objects import holder_identity

    opts = ChangeOptions(lock_namespace=lock_namespace, verify_timeout=verify_timeout, forks=forks)
    setup = RunSetup(ready.inventory.path, ready.drain, ready.inventory.hostvars, ALLOCATION_PATH)
    with ChangeSession(api, lock, opts, setup, progress=progress, say=say) as session:
        journal, ctx = session.journal, session.ctx
        if ready.forced:
            journal.append(
                Kind.PREFLIGHT_FORCED,
                Phase.DONE,
                now=datetime.now(UTC),
                data=PreflightForced(ready.force, tuple(ready.forced)).data(),
            )
        moving = [n for b in ready.batches for n in b.nodes]
        before = collect_before(evidence, journal, moving)
        if progress is not None:
            progress.nodes(tuple(moving))
        info = ChangeBegin(
            plan=str(Path(ready.plan.path).resolve()),
            plan_text=Path(ready.plan.path).read_text(encoding="utf-8"),
            inventory=str(ready.inventory.path.resolve()),
            by=holder_identity(),
            # the operator's consent, in the change record: promote, resume and a rollback
            # from any machine or the webhook receiver read it (claims_consent)
            terminate_claims=ready.path_plan.settings.terminate_claims,
        )
        status = session.run(
            lambda: run_change(
                ctx,
                ready.works,
                ready.batches,
                make_gate(journal),
                canary_only,
                info=info,
                forward=ready.window_check,
            ),
        )
        return record_after(evidence, journal, moving, before, status)


@dataclass(frozen=True)
class MigrationPromotion:
    """A held migration's promotion, checked, not started (what ``promote --dry-run`` prints).

    Attributes:
        status: the change now. plan: its recorded plan. inventory: its inventory.
        works: every node's move. remaining: the batches left. refusal: why it may not be
        promoted without ``--force`` (None: it may). terminate_claims: the operator's consent
        to terminate claim holders on the way back (given to ``promote`` now, or recorded by
        an earlier command of the change).
    """

    status: ChangeStatus
    plan: Plan
    inventory: Inventory
    works: Mapping[str, PathChange]
    remaining: Sequence[Batch]
    refusal: str | None
    window_check: Callable[[datetime], Decision]
    terminate_claims: bool = False


def prepare_migration_promotion(
    journal: Journal,
    force: str | None,
    dry_run: bool,
    force_window: str | None = None,
    inventory: str | None = None,
    terminate_claims: bool = False,
) -> MigrationPromotion:
    """Check that the held migration may go on and cut the batches left (canary refusals as
    ``promote``'s: every canary node applied, the last gate verdict Successful).

    Raises:
        PreflightError: the change is running, or refused without ``force``, or the change
            window is closed.
    """
    from rollout.ansible.hosts import read_inventory
    from rollout.change.commands.promote_change import last_gate, promote_refusal
    from rollout.change.commands.session import info_path
    from rollout.change.plan.schema import recorded_plan
    from rollout.change.record.replay import replay
    from rollout.models import NodeState

    status = replay(journal.entries(), journal.change_id)
    refusal = promote_refusal(status, last_gate(journal))
    if refusal and (status.outcome == "running" or not force):
        raise PreflightError(
            f"not promoting change {journal.change_id}: {refusal}"
            + ("" if status.outcome == "running" else "; --force REASON to override")
        )
    plan = recorded_plan(status.info, journal.change_id)
    if plan is None:
        raise PreflightError(f"change {journal.change_id} recorded no plan")
    window_check = guard(plan.windows, force_window)
    if not dry_run and not (window := window_check(datetime.now(UTC))).allowed:
        raise PreflightError(window.reason)
    inv = read_inventory(info_path(journal, "inventory", inventory))
    consent = terminate_claims or claims_consent(journal.entries())
    works = works_of(plan, inv, consent)
    # of every node of the migration (done or not), as at migrate: the batches keep their size
    strategy = plan.strategy.for_nodes(len(works))
    done = {n for n, s in status.nodes.items() if s.state is not NodeState.PENDING}
    rest = [n for n in works if n not in done]
    remaining = make_batches(rest, [], strategy, False)
    return MigrationPromotion(
        status, plan, inv, works, remaining, refusal, window_check, terminate_claims=consent
    )


def run_migration_promotion(
    api: Api,
    lock: LeaseLock,
    promo: MigrationPromotion,
    journal: Journal,
    make_gate: Callable[[Journal], Gate],
    *,
    force: str | None,
    lock_namespace: str,
    verify_timeout: float,
    forks: int,
    progress: Progress | None,
    say: Callable[[str], None],
) -> ChangeStatus:
    """Run the batches left in the same change under its Lease, the gate (``make_gate``: the DRA
    pool's signals over the plan's gate) after each batch, the change windows asked before
    each."""
    from rollout.change.commands.change_options import ChangeOptions
    from rollout.change.commands.session import ChangeSession, RunSetup
    from rollout.change.engine.orchestrator import continue_change
    from rollout.kube.lease_objects import holder_identity

    status = promo.status
    batches = [list(b.nodes) for b in promo.remaining]
    nodes = [n for b in batches for n in b]
    info = replace(
        status.info,
        rollback=None,
        nodes=tuple(dict.fromkeys([*status.nodes, *nodes])),
        batches=(*status.info.batches, *(tuple(b) for b in batches)),
        canary_only=False,
        terminate_claims=promo.terminate_claims,
        promotion=Promotion(
            by=holder_identity(),
            at=datetime.now(UTC).isoformat(timespec="seconds"),
            batches=tuple(tuple(b) for b in batches),
            forced=force if promo.refusal else None,
            refusal=promo.refusal,
            terminate_claims=promo.terminate_claims,
        ),
    )
    opts = ChangeOptions(lock_namespace=lock_namespace, verify_timeout=verify_timeout, forks=forks)
    setup = RunSetup(promo.inventory.path, promo.plan.strategy.drain, promo.inventory.hostvars)
    with ChangeSession(
        api, lock, opts, setup, journal=journal, progress=progress, say=say
    ) as session:
        if progress is not None:
            progress.nodes(info.nodes)
        gate = make_gate(journal)  # the DRA pool's signals need no gate section
        return session.run(
            lambda: continue_change(
                session.ctx,
                {n: promo.works[n] for n in nodes},
                promo.remaining,
                gate,
                info,
                forward=promo.window_check,
            ),
        )
