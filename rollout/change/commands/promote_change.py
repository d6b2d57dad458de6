"""``promote``: may a held canary go on to the rest of the fleet, and what it then runs.

Why a module of its own: the refusals (canary not applied, gate not Successful, the canary's
``after`` evidence missing or failed, the plan's intent changed) and the remaining batches are
the engine's decisions; the CLI only prints them (``--dry-run``), asks, and runs
:func:`run_promotion`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rollout.change.commands.change_options import PromoteOptions
from rollout.change.commands.progress import Progress
from rollout.change.plan.batches import Batch
from rollout.change.plan.drain_rules import DrainOverrides
from rollout.change.plan.schema import Plan
from rollout.change.plan.windows import Decision
from rollout.change.record.change_outcomes import ChangeOutcome
from rollout.change.record.entries import (
    CheckResult,
    DrainOverridesUsed,
    EvidenceRecord,
    GateRecord,
)
from rollout.change.record.entries import Promotion as PromotionRecord
from rollout.change.record.journal import EVIDENCE_STEP, Journal, Kind
from rollout.change.record.replay import ChangeStatus
from rollout.models import Phase
from rollout.protocols import Gate

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.change.commands.evidence_hooks import EvidenceHooks
    from rollout.change.preflight.checking import Prepared
    from rollout.kube.client import Api
    from rollout.kube.leases import LeaseLock


def last_gate(journal: Journal) -> GateRecord | None:
    """The last ``gate`` verdict (``status``, ``reason``, ``nodes``), or None."""
    gates = [e for e in journal.entries() if e.step == Kind.GATE and e.phase is Phase.DONE]
    return GateRecord.read(gates[-1].data) if gates else None


def promote_refusal(status: ChangeStatus, gate: GateRecord | None) -> str | None:
    """Why a change may not be promoted without ``--force`` (pure), or None when it may."""
    from rollout.models import NodeState

    if status.outcome == ChangeOutcome.RUNNING:
        return (
            f"change {status.change} is running or was interrupted (no end recorded); "
            f"`rollout resume --change {status.change} --yes` settles it first"
        )
    canary = [n for b in status.info.batches for n in b]
    not_applied = [n for n in canary if status.nodes[n].state is not NodeState.APPLIED]
    if not_applied:
        states = ", ".join(f"{n}: {status.nodes[n].state.value}" for n in not_applied)
        return f"the canary is not applied ({states})"
    if gate is None or gate.status != "Successful":
        what = f"{gate.status}: {gate.reason}" if gate else "no gate verdict"
        return f"the canary's last gate verdict is not Successful ({what})"
    return None


def check_failures(checks: Iterable[CheckResult]) -> list[str]:
    """Each failed check's problems as ``name: problem`` lines."""
    return [f"{c.name}: {p}" for c in checks for p in (c.problems or [c.summary])]


def evidence_refusal(entries: Iterable[Any], canary: Sequence[str]) -> str | None:
    """Why the canary's evidence does not allow a promotion (pure over the journal's entries),
    or None: the last ``after`` collection must exist, cover every canary node and fail no
    check (a check with nothing to judge, ``not-collected``, does not refuse)."""
    evidence = [EvidenceRecord.read(e.data) for e in entries if e.step == EVIDENCE_STEP]
    after = [ev for ev in evidence if ev.label == "after"]
    how = "`rollout evidence --label after --change ID` collects it"
    if not after:
        return f"the canary has no 'after' evidence ({how})"
    last = after[-1]
    if last.error:
        return f"the canary's 'after' evidence was not collected: {last.error} ({how})"
    missing = sorted(set(canary) - set(last.nodes))
    if missing:
        return f"the canary's 'after' evidence lacks {', '.join(missing)} ({how})"
    failed = [c for c in last.checks if c.status == "fail"]
    if failed:
        return "the canary's 'after' evidence failed: " + "; ".join(check_failures(failed))
    return None


@dataclass(frozen=True)
class Promotion:
    """A promotion checked and prepared, not started: what ``--dry-run`` prints and
    :func:`run_promotion` runs.

    ``refusal``: why it would be refused without ``--force`` (None: it would not be);
    ``remaining``: the batches still to run (nodes the change already moved are left out);
    ``prepared``: preflight's result over them (``rollout.change.preflight.checking.Prepared``).
    """

    journal: Journal
    status: ChangeStatus
    refusal: str | None
    plan: Plan
    inventory: Inventory
    prepared: Prepared
    remaining: Sequence[Batch]
    window_check: Callable[[datetime], Decision]
    options: PromoteOptions = field(default_factory=PromoteOptions)

    @property
    def overrides(self) -> DrainOverrides:
        """What the drains may lose (the command's drain flags)."""
        return self.options.overrides

    @property
    def force(self) -> str | None:
        """The reason a refusal is overridden (``--force``)."""
        return self.options.force

    @property
    def nodes(self) -> list[str]:
        """The nodes the promotion would change, batch after batch."""
        return [n for b in self.remaining for n in b.nodes]


def prepare_promotion(
    api: Api,
    journal: Journal,
    lock: LeaseLock,
    opts: PromoteOptions,
) -> Promotion:
    """Check that the change may be promoted and run preflight over the nodes left.

    Raises:
        PreflightError: the change is running or was interrupted, it is refused and ``force``
            is None, the plan renders another intent than the canary's, the change window is
            closed (not under ``dry_run``), or preflight refuses; nothing was changed.
        LockHeldError: a live process holds the cluster lock.
    """
    from rollout.ansible.hosts import read_inventory
    from rollout.change.commands.session import info_path, intent_digest, run_preflight
    from rollout.change.plan.windows import guard
    from rollout.change.record.replay import replay
    from rollout.errors import PreflightError
    from rollout.models import NodeState

    change = journal.change_id
    status = replay(journal.entries(), change)
    refusal = promote_refusal(status, last_gate(journal))
    if refusal is None:
        canary = [n for b in status.info.batches for n in b]
        refusal = evidence_refusal(journal.entries(), canary)
    if refusal and status.outcome == ChangeOutcome.RUNNING:
        raise PreflightError(refusal)
    if refusal and not opts.force:
        raise PreflightError(
            f"not promoting change {change}: {refusal}; --force REASON to override"
        )
    from rollout.change.plan.schema import load_plan

    # a staged plan's change promotes the stage it canaried (rollout.change.commands.stages)
    plan = load_plan(str(info_path(journal, "plan", opts.plan_path))).for_change(status.info)
    recorded = status.info.intent_sha256
    if recorded and recorded != intent_digest(plan):
        raise PreflightError(
            f"the plan {plan.path} renders another intent than change {change} applied to its "
            "canary (kubelet settings or node overrides changed); start a new change instead"
        )
    window_check = guard(plan.windows, opts.force_window)
    if not opts.dry_run and not (window := window_check(datetime.now(UTC))).allowed:
        raise PreflightError(window.reason)
    inv = read_inventory(info_path(journal, "inventory", opts.inventory))
    lock.check()
    done = {n for n, s in status.nodes.items() if s.state is not NodeState.PENDING}
    prepared = run_preflight(
        plan,
        inv,
        api,
        False,
        forks=opts.forks,
        force=opts.force is not None,
        overrides=opts.overrides,
        settled=done,
        force_serving=opts.force_serving is not None,
    )
    remaining = [
        Batch(tuple(n for n in b.nodes if n not in done), False)
        for b in prepared.batches
        if any(n not in done for n in b.nodes)
    ]
    return Promotion(journal, status, refusal, plan, inv, prepared, remaining, window_check, opts)


PromotionGate = Callable[[Plan, "Inventory", "frozenset[tuple[str, str]] | None", Progress], Gate]
"""Builds the gate run after each promoted batch: given the plan, the inventory, the predicted
rejections and the progress; the CLI's ``gate_for`` (the gate layer sits above this one)."""


def run_promotion(
    api: Api,
    promo: Promotion,
    lock: LeaseLock,
    make_gate: PromotionGate,
    *,
    progress: Progress,
    failed: Callable[[ChangeStatus], None] | None = None,
    evidence: EvidenceHooks | None = None,
) -> ChangeStatus:
    """Run the remaining batches in the same change under its Lease, the gate after each batch
    when the plan has one, the change windows asked before each. With ``evidence``, the
    promoted nodes' ``before`` (from the facts preflight judged) and, once the change completed,
    the ``after`` of those applied are collected beside the canary's and journaled.

    Returns:
        The change as it ended (a node or a gate failed: stopped or rolled back, the message
        says which).

    Raises:
        LockHeldError: another process took the Lease.
    """
    from rollout.change.commands.evidence_hooks import recreate_evidence
    from rollout.change.commands.session import OVERRIDES_STEP, ChangeSession, RunSetup
    from rollout.change.engine.orchestrator import continue_change
    from rollout.change.record.change_outcomes import ended_exit
    from rollout.change.record.replay import replay
    from rollout.kube.lease_objects import holder_identity
    from rollout.kubelet.admission.node_preview import predicted_rejections
    from rollout.models import NodeState

    journal, status, prepared = promo.journal, promo.status, promo.prepared
    nodes = promo.nodes
    all_nodes = list(dict.fromkeys([*status.nodes, *nodes]))
    batches = [list(b.nodes) for b in promo.remaining]
    promotion = PromotionRecord(
        by=holder_identity(),
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        batches=tuple(tuple(b) for b in batches),
        forced=promo.force if promo.refusal or prepared.forced else None,
        refusal=promo.refusal,
        forced_refusals=tuple(prepared.forced),
        forced_serving=promo.options.force_serving if prepared.serving_forced else None,
        forced_serving_canaries=tuple(prepared.serving_forced),
    )
    info = replace(
        status.info,
        rollback=None,  # a new part, no rollback
        nodes=tuple(all_nodes),
        batches=(*status.info.batches, *promotion.batches),
        canary_only=False,
        promotion=promotion,
    )
    setup = RunSetup(promo.inventory.path, prepared.strategy.drain, promo.inventory.hostvars)
    with ChangeSession(
        api, lock, promo.options, setup, journal=journal, progress=progress
    ) as session:
        ctx = session.ctx
        used = promo.overrides.used()
        if used:  # what this part's drains may lose, and which pods that is
            journal.append(
                OVERRIDES_STEP,
                Phase.DONE,
                now=datetime.now(UTC),
                data=DrainOverridesUsed(tuple(used), tuple(prepared.losses)).data(),
            )
        progress.nodes(tuple(all_nodes))
        predicted = predicted_rejections(prepared.previews)
        gate = make_gate(promo.plan, promo.inventory, predicted, progress)
        before = (
            None
            if evidence is None
            else evidence.collect(journal, "before", nodes, prepared.raw_facts)
        )
        status = session.run(
            lambda: continue_change(
                ctx,
                prepared.changes,
                promo.remaining,
                gate if promo.plan.has_gate else None,
                info,
                forward=promo.window_check,
            ),
            failed,
        )
        if evidence is not None and ended_exit(status.outcome, status.cause) == 0:
            evidence.record(journal, "before", nodes, before)
            applied = [n for n in nodes if status.nodes[n].state is NodeState.APPLIED]
            if applied:
                evidence.record(
                    journal, "after", applied, evidence.collect(journal, "after", applied)
                )
            workloads = prepared.strategy.drain if promo.options.recreate_workloads else None
            recreate_evidence(evidence, journal, applied, probes=False, workloads=workloads)
            status = replay(journal.entries(), journal.change_id)  # with its evidence
        return status
