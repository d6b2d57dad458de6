"""``apply``: a new change from a plan, below the CLI.

Two steps, so the CLI can print a dry run and ask between them: :func:`prepare_apply` checks the
plan, reads the inventory, gathers the nodes' facts and runs preflight (nothing is written
anywhere); :func:`run_apply` takes the Lease, creates the change's journal (mirrored into the
cluster), journals what the operator consented to, collects the ``before`` evidence, runs the
batches and the gate, and collects the ``after`` evidence.

Evidence is collected through the :class:`rollout.change.commands.evidence_hooks.EvidenceHooks` the
caller passes: the collection lives in ``rollout.evidence``, a layer above this one.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.change.commands.change_options import ApplyOptions
from rollout.change.commands.evidence_hooks import EvidenceHooks, recreate_evidence
from rollout.change.commands.progress import Progress
from rollout.change.commands.stages import StageChoice
from rollout.change.plan.drain_rules import DrainOverrides
from rollout.change.plan.schema import Plan
from rollout.change.plan.windows import Decision
from rollout.change.record.change_outcomes import ended_exit
from rollout.change.record.entries import (
    ChangeBegin,
    DrainOverridesUsed,
    EvidenceRecord,
    PreflightForced,
    RejectionsAccepted,
    ServingForced,
    trigger_data,
)
from rollout.change.record.journal import EVIDENCE_STEP, Journal, Kind
from rollout.change.record.replay import ChangeStatus
from rollout.models import NodeState, Phase
from rollout.protocols import Gate
from rollout.verdicts import Verdict, VerdictStatus

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.change.preflight.checking import Prepared
    from rollout.kube.client import Api
    from rollout.kube.leases import LeaseLock


def _import_kube() -> None:
    """The API client and preflight's modules (the kubernetes package among them)."""
    import rollout.change.preflight.checking
    import rollout.kube.leases  # noqa: F401


@dataclass(frozen=True)
class PreparedApply:
    """An apply checked and prepared, not started: what ``--dry-run`` prints and
    :func:`run_apply` runs. ``prepared``: preflight's result (``rollout.change.preflight.checking``;
    model-serving canaries in progress are among its refusals, or its warnings when forced)."""

    plan: Plan
    inventory: Inventory
    api: Api
    lock: LeaseLock
    prepared: Prepared
    window_check: Callable[[datetime], Decision]
    options: ApplyOptions
    stage: StageChoice | None = None

    @property
    def overrides(self) -> DrainOverrides:
        """What the drains may lose (the command's drain flags)."""
        return self.options.overrides

    @property
    def nodes(self) -> list[str]:
        """The nodes the change would move, batch after batch."""
        return [n for b in self.prepared.batches for n in b.nodes]


def prepare_apply(
    plan: Plan,
    inventory: Callable[[], Path],
    connect: Callable[[], Any],
    opts: ApplyOptions,
    say: Callable[[str], None] = lambda _m: None,
) -> PreparedApply:
    """Check the change window, read the inventory, gather every node's facts and run
    preflight; nothing is written anywhere. ``inventory`` names the inventory file, asked after
    the window check (a closed window refuses before any input is read). A staged plan
    (``stages:``) runs the stage :func:`rollout.change.commands.stages.choose_stage` picks from the
    cluster's record of its earlier changes (``stage`` says which and why).

    The API client is imported once the facts calls are under way (it runs while the nodes
    answer; on a thread of its own beside them it was slower on a loaded 2-core machine:
    ``benchmarks/README.md``); the connection, the Lease check and the reads follow.

    Raises:
        PreflightError: the change window is closed (not under ``dry_run``), preflight
            refuses, or a staged plan has no stage that may start (the reason names why).
        LockHeldError: a live process holds the cluster lock.
    """
    from rollout.ansible.hosts import start_inventory
    from rollout.change.commands.session import FactsGathering, run_preflight
    from rollout.change.commands.stages import choose_stage, stage_history
    from rollout.change.plan.windows import guard
    from rollout.errors import PreflightError

    window_check = guard(plan.windows, opts.force_window)
    if not opts.dry_run and not (window := window_check(datetime.now(UTC))).allowed:
        raise PreflightError(window.reason)
    inv = start_inventory(inventory())()
    facts = FactsGathering(inv, opts.forks)
    try:
        _import_kube()  # while the nodes answer the facts calls
        from rollout.kube.leases import LeaseLock

        api = connect()
        lock = LeaseLock(api, opts.lock_namespace)
        lock.check()
        stage = None
        if plan.stages and plan.stage is None:
            stage = choose_stage(plan, stage_history(api, opts.lock_namespace, plan, say))
            if stage.index is None:
                raise PreflightError(stage.reason)
            plan = plan.at_stage(stage.index)
    except BaseException:
        facts.close()
        raise
    prepared = run_preflight(
        plan,
        inv,
        api,
        opts.canary,
        opts.accept_rejections,
        facts,
        opts.forks,
        opts.force is not None,
        opts.overrides,
        force_serving=opts.force_serving is not None,
    )
    return PreparedApply(plan, inv, api, lock, prepared, window_check, opts, stage)


def journal_consents(
    journal: Journal,
    prepared: Prepared,
    force: str | None,
    now: datetime,
    force_serving: str | None = None,
) -> None:
    """Journal what the operator consented to before the first node step: device refusals
    overridden with ``--force REASON`` (``preflight-forced``, with the reason), model-serving
    canaries in progress overridden with ``--force-serving REASON`` (``serving-canary-forced``,
    with the reason) and predicted rejections accepted (``predicted-rejections-accepted``)."""
    if prepared.forced:
        journal.append(
            Kind.PREFLIGHT_FORCED,
            Phase.DONE,
            now=now,
            data=PreflightForced(force, tuple(prepared.forced)).data(),
        )
    if prepared.serving_forced:
        journal.append(
            Kind.SERVING_FORCED,
            Phase.DONE,
            now=now,
            data=ServingForced(force_serving, tuple(prepared.serving_forced)).data(),
        )
    if prepared.accepted:
        journal.append(
            Kind.REJECTIONS_ACCEPTED,
            Phase.DONE,
            now=now,
            data=RejectionsAccepted(tuple(prepared.accepted)).data(),
        )


class EvidenceGate:
    """The canary's gate when the plan's ``gate.requireEvidence`` is true: once the soak is
    Successful, the nodes' ``after`` evidence is collected and journaled, and decides too. A
    failed check makes the verdict Failed (the nodes are restored, as for any Failed verdict);
    evidence that could not be collected makes it Inconclusive (the change holds, exit 8). The
    ``before`` collection is journaled just before it. A Failed verdict of the evidence's names
    the nodes it collected and journals a ``trigger`` record (``source: evidence``), as a soak's
    Failed verdict does, so the journal says why the rollback started.

    Why in the gate: without it a canary whose evidence fails is held on the new config and only
    ``promote`` refuses; with it the change acts on the evidence as it acts on rejections.
    """

    def __init__(
        self, gate: Gate, journal: Journal, evidence: EvidenceHooks, before: Any = None
    ) -> None:
        self.gate, self.journal, self.evidence, self.before = gate, journal, evidence, before
        self.collected: list[str] = []  # the nodes it collected (and so recorded ``before`` of)
        self._verdict: Verdict | None = None

    @property
    def verdict(self) -> Verdict | None:
        """The verdict that decided: the evidence's when it overrode the soak's."""
        return self._verdict or self.gate.verdict

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        from rollout.change.commands.promote_change import evidence_refusal

        soaked = self.gate.evaluate(change_id, nodes)
        if soaked.status is not VerdictStatus.SUCCESSFUL:
            return soaked
        moving = list(nodes)
        if not self.collected:
            self.evidence.record(self.journal, "before", moving, self.before)
        self.evidence.record(
            self.journal, "after", moving, self.evidence.collect(self.journal, "after", moving)
        )
        self.collected = moving
        entries = self.journal.entries()
        refusal = evidence_refusal(entries, moving)
        if refusal is None:
            return soaked
        why = f"{soaked.reason}; gate.requireEvidence: {refusal}"
        after = next(
            ev
            for ev in (
                EvidenceRecord.read(e.data) for e in reversed(entries) if e.step == EVIDENCE_STEP
            )
            if ev.label == "after"
        )
        if any(c.status == "fail" for c in after.checks):
            self._verdict = replace(
                soaked, status=VerdictStatus.FAILED, reason=why, failed_nodes=tuple(moving)
            )
            # what asked for the rollback, as the soak's own Failed verdict journals it
            self.journal.append(
                Kind.TRIGGER,
                Phase.DONE,
                now=datetime.now(UTC),
                data=trigger_data(change_id, "gate", moving, why, source="evidence"),
            )
        else:
            self._verdict = replace(
                soaked,
                status=VerdictStatus.INCONCLUSIVE,
                reason=why,
                waiting_for="the canary's 'after' evidence",
            )
        return self._verdict

    def soaks_on(self) -> bool:
        return self.gate.soaks_on()

    def keep_watching(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        return self.gate.keep_watching(change_id, nodes)

    def after_rollback(self, change_id: str, nodes: Sequence[str]) -> str:
        return self.gate.after_rollback(change_id, nodes)


class _Background:
    """One call run on a thread from now on (None: nothing to run, :meth:`result` is None)."""

    def __init__(self, call: Callable[[], Any] | None) -> None:
        self._got: dict[str, Any] = {}
        self._thread: threading.Thread | None = None
        if call is not None:
            self._thread = threading.Thread(target=self._run, args=(call,), daemon=True)
            self._thread.start()

    def _run(self, call: Callable[[], Any]) -> None:
        try:
            self._got["value"] = call()
        except BaseException as e:  # re-raised in the caller's thread by result()
            self._got["error"] = e

    def result(self) -> Any:
        """Wait for the call; its value, or raise what it raised."""
        if self._thread is None:
            return None
        self._thread.join()
        if "error" in self._got:
            raise self._got["error"]
        return self._got.get("value")


def _collecting(
    evidence: EvidenceHooks, journal: Journal, nodes: list[str], raw_facts: Any
) -> Callable[[], Any]:
    """The ``before`` collection of ``nodes`` from the facts preflight judged, as a call."""
    return lambda: evidence.collect(journal, "before", nodes, raw_facts)


ApplyGate = Callable[[Journal, "Inventory", "frozenset[tuple[str, str]] | None", Progress], Gate]
"""Builds the gate after the canary: given the change's journal, the inventory, the predicted
rejections and the progress; the CLI's ``gate_for`` (the gate layer sits above this one)."""


@dataclass(frozen=True)
class AppliedChange:
    """How an apply ended: the change's status and the gate it ran (its last ``verdict``)."""

    status: ChangeStatus
    gate: Gate
    journal: Journal


def run_apply(
    ready: PreparedApply,
    make_gate: ApplyGate,
    *,
    progress: Progress,
    evidence: EvidenceHooks | None = None,
    say: Callable[[str], None],
    failed: Callable[[ChangeStatus], None] | None = None,
) -> AppliedChange:
    """Start the change under the Lease and run it: consents journaled, ``before`` evidence
    (from the facts preflight judged), the batches and the gate, ``after`` evidence of the
    nodes applied; both collections are journaled once the change has ended (held or
    completed): an evidence entry is never the last one of a change that has not begun.

    Returns:
        The change as it ended (:func:`rollout.change.engine.orchestrator.run_change`); evidence is
        recorded only when it did not fail (a failed change's exit code is its outcome's).

    Raises:
        LockHeldError: another process took the Lease meanwhile.
    """
    from rollout.change.commands.session import (
        OVERRIDES_STEP,
        ChangeSession,
        RunSetup,
        intent_digest,
    )
    from rollout.change.commands.stages import stage_info
    from rollout.change.engine.orchestrator import run_change
    from rollout.change.record.replay import replay
    from rollout.kube.lease_objects import holder_identity
    from rollout.kubelet.admission.node_preview import predicted_rejections

    plan, inv, api, lock, prepared = (
        ready.plan,
        ready.inventory,
        ready.api,
        ready.lock,
        ready.prepared,
    )
    opts = ready.options
    drain = prepared.strategy.drain
    if opts.disable_eviction:
        drain = replace(drain, disable_eviction=True)
    setup = RunSetup(inv.path, drain, inv.hostvars)
    with ChangeSession(api, lock, opts, setup, progress=progress, say=say) as session:
        journal, ctx = session.journal, session.ctx
        used = ready.overrides.used()
        if used:  # what the drains were allowed to lose, and which pods that is
            journal.append(
                OVERRIDES_STEP,
                Phase.DONE,
                now=datetime.now(UTC),
                data=DrainOverridesUsed(tuple(used), tuple(prepared.losses)).data(),
            )
        moving = ready.nodes
        # the ``before`` evidence (reads only) goes on while the consents are journaled and the
        # gate is built; it is complete before the first node step
        # (``tests/unit/test_evidence_concurrency.py``)
        before_collection = _Background(
            None if evidence is None else _collecting(evidence, journal, moving, prepared.raw_facts)
        )
        try:
            journal_consents(journal, prepared, opts.force, datetime.now(UTC), opts.force_serving)
            progress.nodes(tuple(moving))
            if evidence is not None:  # the ``after`` facts sessions open as the last batch begins
                runs = {n for b in prepared.batches for n in b.nodes}  # not those --canary leaves
                # --forks bounds every ssh child at once: only the slots the last batch's node
                # steps leave free open ahead (tests/lab/test_fanout_lab.py)
                last = len(prepared.batches[-1].nodes) if prepared.batches else 0
                spare = max(0, opts.forks - last)
                after = [n for n in moving if n in runs][:spare]
                ctx.next_batch = lambda later: (
                    None if later or not after else evidence.open_sessions(after)
                )
            gate = make_gate(journal, inv, predicted_rejections(prepared.previews), progress)
        finally:
            before = before_collection.result()
        gated = None
        if opts.require_evidence and evidence is not None:
            gate = gated = EvidenceGate(gate, journal, evidence, before)
        info = ChangeBegin(
            plan=str(Path(plan.path).resolve()),
            # the plan itself, so a machine without the file resumes and rolls back with it
            # (rollout.change.plan.schema.recorded_plan)
            plan_text=Path(plan.path).read_text(encoding="utf-8"),
            inventory=str(inv.path.resolve()),
            intent_sha256=intent_digest(plan),
            by=holder_identity(),  # who ran it, in the cluster record too
            stage=stage_info(plan),  # a staged plan's stage (change.staging)
        )
        status = session.run(
            lambda: run_change(
                ctx,
                prepared.changes,
                prepared.batches,
                gate,
                opts.canary,
                info=info,
                forward=ready.window_check,
            ),
            failed,
        )
        if evidence is not None and ended_exit(status.outcome, status.cause) == 0:
            if gated is None or not gated.collected:
                evidence.record(journal, "before", moving, before)
            applied = [n for n in moving if status.nodes[n].state is NodeState.APPLIED]
            if applied and (gated is None or not set(applied) <= set(gated.collected)):
                evidence.record(
                    journal, "after", applied, evidence.collect(journal, "after", applied)
                )
            recreate_evidence(
                evidence,
                journal,
                applied,
                probes=opts.recreate_probes,
                workloads=drain if opts.recreate_workloads else None,
            )
            status = replay(journal.entries(), journal.change_id)  # with its evidence
    return AppliedChange(status, gate, journal)
