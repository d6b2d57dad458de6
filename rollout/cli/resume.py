"""``rollout resume``: finish an interrupted change (nodes in flight, a cut gate, later batches)."""

from __future__ import annotations

from typing import Any

import click

from rollout.change.context import Context
from rollout.change.journal import Kind
from rollout.change.outcomes import ChangeOutcome
from rollout.change.plan import load_plan, recorded_plan
from rollout.change.previewing import predicted_rejections
from rollout.change.replaying import ChangeStatus, replay
from rollout.change.resuming import rerun_nodes, resume, resume_rollback, unfinished_rollback
from rollout.change.session import info_path, intent_digest, journaled_overrides, run_preflight
from rollout.cli.gate import gate_config
from rollout.cli.wiring import (
    change_required,
    confirm,
    forks_option,
    gate_for,
    lock_ns_option,
    progress_option,
    settle_command,
    verify_timeout_option,
)
from rollout.errors import PreflightError

from .options import inventory_option, kube_options, output_option


@click.command("resume")
@change_required
@inventory_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@lock_ns_option
@verify_timeout_option
@forks_option
@progress_option
@output_option
@kube_options
def resume_cmd(
    change: str,
    inventory: str | None,
    yes: bool,
    lock_namespace: str,
    verify_timeout: float,
    forks: int,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Finish an interrupted change: each node in flight is finished or restored (a node caught
    before any file was written gets its cordon undone and runs again in its batch), a gate the
    crash cut short is soaked again, then the batches the interrupted apply or promote had not
    started yet are run (with the gate where that command would have run it), unless a node had
    failed (the change had stopped). An interrupted rollback (`rollout rollback`, or one handed
    to the change's owner) is finished instead: every node it names ends restored.

    \b
    Examples:
      rollout resume --change 20261130T214802Z-a1b2c3 --yes
      rollout resume --change 20261130T214802Z-a1b2c3 --yes -o json --progress plain
    """
    confirm(yes, f"resume change {change}")

    def work(ctx: Context, lock: Any) -> ChangeStatus:
        # read under the Lease, from the journal settle_command fetched or refreshed from the
        # cluster record: a machine that never saw the change resumes it too
        before = replay(ctx.journal.entries(), ctx.journal.change_id)
        if before.outcome != ChangeOutcome.RUNNING:
            return resume(ctx)  # it had ended (held, completed, stopped): nothing more to start
        pending = unfinished_rollback(ctx.journal.entries())
        if pending is not None:  # a rollback was under way: finish it, never go forward
            return resume_rollback(ctx, pending)
        # the change stays running until it goes on or ends here: a crash in between leaves
        # it to the next resume, which goes on with it
        settled = resume(ctx, end=False)
        return _resume_later_batches(ctx, lock, before, settled, inventory, output)

    settle_command(
        change,
        inventory,
        lock_namespace,
        verify_timeout,
        output,
        kubeconfig,
        context,
        work,
        progress_mode,
        forks,
    )


def _resume_later_batches(
    ctx: Context,
    lock: Any,
    before: ChangeStatus,
    settled: ChangeStatus,
    inventory: str | None,
    output: str,
) -> ChangeStatus:
    """The batches an interrupted apply / promote had not started: rendered again from the plan
    (its intent checked unchanged), the gate where that command would have run it."""
    from rollout.change.orchestrator import continue_change
    from rollout.change.planning import Batch
    from rollout.change.preparing import read_inventory
    from rollout.change.resuming import end_resumed, unfinished_gate
    from rollout.models import NodeState

    info = before.info
    # a node the crash caught on the forward path before any file was written (no step failed):
    # resume undid its cordon; the interrupted command would have gone on with it, so resume
    # runs it again in its batch (also when an earlier resume undid the cordon and was killed)
    cut = rerun_nodes(ctx.journal.entries())
    if any(
        s.state in (NodeState.RESTORED, NodeState.FAILED) and n not in cut
        for n, s in settled.nodes.items()
    ):
        # a node failed forward: the interrupted command would have stopped
        return end_resumed(ctx)
    pending = [
        [n for n in b if settled.nodes[n].state is NodeState.PENDING or n in cut]
        for b in info.get("batches", ())
    ]
    todo = [b for b in pending if b]
    plan = recorded_plan(info, before.change)
    # a gate the crash cut short (or whose verdict was not acted on) is settled first
    has_gate = plan is not None and gate_config(plan) is not None
    regate = unfinished_gate(ctx.journal.entries(), has_gate)
    if not todo and regate is None:
        return end_resumed(ctx)
    if plan is None:
        plan = load_plan(str(info_path(ctx.journal, "plan", None)))  # names what is missing
    if info.get("intentSha256") and info["intentSha256"] != intent_digest(plan):
        raise PreflightError(
            f"the plan {plan.path} renders another intent than change {before.change} "
            "started with; its settled nodes stay as they are, the rest is not started"
        )
    inv = read_inventory(info_path(ctx.journal, "inventory", inventory))
    # a change started with --force over device refusals carries that consent to its resume
    forced = any(e.step == Kind.PREFLIGHT_FORCED for e in ctx.journal.entries())
    moved = {n for n, s in settled.nodes.items() if s.state is not NodeState.PENDING}
    prepared = (
        run_preflight(
            plan,
            inv,
            lock.api,
            False,
            forks=ctx.forks,
            force=forced,
            overrides=journaled_overrides(ctx.journal),
            settled=moved - set(cut),
        )
        if todo
        else None
    )
    canary = set(info.get("canary", ()))
    batches = [Batch(tuple(b), bool(canary & set(b))) for b in todo]
    if info.get("promotion"):  # promote gates after each batch when the plan has a gate
        gate_at = {i: b.nodes for i, b in enumerate(batches)} if has_gate else {}
    else:  # apply gates once, after its last canary batch, over the whole canary
        last = max((i for i, b in enumerate(batches) if b.canary), default=None)
        gate_at = {last: tuple(canary)} if last is not None else {}
    predicted = predicted_rejections(prepared.previews) if prepared is not None else None
    gate = gate_for(
        plan, lock.api, ctx.journal, output, inv, ctx.on_event, lock.interrupt, predicted
    )
    if todo:
        ctx.on_event(f"resuming the batches not started: {', '.join(n for b in todo for n in b)}")
    return continue_change(
        ctx,
        prepared.changes if prepared is not None else {},
        batches,
        gate,
        {**info, "resumed": True},
        gate_at=gate_at,
        canary_only=bool(info.get("canaryOnly")),
        regate=regate,
    )


COMMANDS = [resume_cmd]
