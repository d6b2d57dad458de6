"""``rollout apply``, ``rollback``, ``status`` and ``resume``: thin commands over the orchestrator.

Parse options, build the adapters (API client, Lease lock, playbook runner, journal), call the core,
print. Errors become exit codes in ``rollout.cli`` (see docs/exit-codes.md).
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from rollout.change.journal import ChangeStatus, Journal, new_change_id, replay, state_dir
from rollout.change.orchestrator import NoGate, resume, rollback, run_change, summary
from rollout.change.plan import Plan, load_plan
from rollout.change.planning import DrainPolicy, parse_strategy
from rollout.change.previewing import predicted_rejections, render_text
from rollout.change.progress import Progress
from rollout.change.restoring import Context
from rollout.change.windows import guard, parse_windows
from rollout.cli.gate import GATE_HOLDS_EXIT, gate_config
from rollout.errors import InputError, Location, NodeOperationError, PreflightError, RolloutError
from rollout.gate.analysis import Predicted
from rollout.interrupt import Interrupt
from rollout.models import Phase
from rollout.protocols import Gate

from .options import inventory_option, kube_options, output_option, plan_option


class SystemClock:
    """The real clock."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return time.monotonic()

    def sleep(self, seconds: float) -> None:
        time.sleep(seconds)


def gate_for(
    plan: Plan,
    api: Any,
    journal: Journal,
    output: str,
    inv: Any,
    progress: Callable[[str], None] | None = None,
    interrupt: Interrupt | None = None,
    predicted: Predicted | None = None,
) -> Gate:
    """The gate run after the canary batch: the rejection-rate gate when the plan has a ``gate:``
    section (built as ``rollout watch`` builds it, journaling into this change), else none.

    With ``interrupt``, the soak ends the moment it is set (a rollback handed to this owner).
    ``predicted``: (node, owner) pairs the admission preview predicted rejected, so a Failed
    verdict says which rejections were expected
    (``rollout.change.previewing.predicted_rejections``)."""
    from rollout.cli.gate import build_soak_gate
    from rollout.gate.soaking import RollbackPolicyGate

    cfg = gate_config(plan)
    if cfg is None:
        return NoGate()

    def record(kind: str, data: Any) -> None:
        journal.append(kind, Phase.DONE, now=datetime.now(UTC), data=data)

    control = [inv.node_of(h) for h in inv.groups.get(cfg.control_group or "", ())]
    soak = build_soak_gate(
        cfg,
        api,
        since=time.time(),
        record=record,
        control=control,
        output=output,
        progress=progress,
        predicted=predicted,
    )
    if interrupt is not None:
        wait = soak.sleep
        for signal in soak.signals:
            if hasattr(signal, "wake"):
                interrupt.add_waker(signal.wake)

        def sleep(seconds: float) -> None:
            interrupt.check()
            wait(seconds)
            interrupt.check()

        soak.sleep = sleep
    return RollbackPolicyGate(soak, record)


def _echo(msg: str) -> None:
    click.echo(msg, err=True)


def _print_status(status: ChangeStatus, output: str) -> None:
    if output == "json":
        click.echo(json.dumps(status.to_dict(), indent=2))
        return
    click.echo(f"change {status.change}: {status.outcome}")
    if status.message:
        click.echo(f"  {status.message}")
    promotion = status.info.get("promotion")
    if promotion:
        forced = f"; forced: {promotion['forced']}" if promotion.get("forced") else ""
        click.echo(f"  promoted by {promotion.get('by')} at {promotion.get('at')}{forced}")
    click.echo(summary(status))


def _inventory(inventory: str | None) -> Path:
    if not inventory:
        raise InputError(
            "no inventory: pass -i/--inventory or set ROLLOUT_INVENTORY", Location(field="-i")
        )
    return Path(inventory)


@contextmanager
def _locked(lock: Any, change_id: str) -> Iterator[None]:
    lock.acquire(change_id)
    try:
        yield
    finally:
        lock.release()


def _context(
    api: Any,
    journal: Journal,
    inventory: Path,
    drain: DrainPolicy,
    verify_timeout: float,
    progress: Progress | None = None,
    hostvars: Mapping[str, Mapping[str, Any]] | None = None,
) -> Context:
    """The orchestrator's context; with ``progress``, every journal entry and event feeds it;
    ``hostvars``: the inventory's variables when the caller has read them already."""
    from rollout.change.progress import ObservedJournal
    from rollout.change.shipping import PlaybookNodeRunner
    from rollout.kube.cluster import KubeCluster

    on_event = progress.event if progress is not None else _echo
    return Context(
        cluster=KubeCluster(api),
        runner=PlaybookNodeRunner(journal.dir / "ansible", inventory, on_event, hostvars=hostvars),
        clock=SystemClock(),
        journal=journal if progress is None else ObservedJournal(journal, progress.entry),
        drain=drain,
        verify_timeout_s=verify_timeout,
        on_event=on_event,
    )


_progress_option = click.option(
    "--progress",
    "progress_mode",
    type=click.Choice(["auto", "table", "plain", "off"]),
    default="auto",
    show_default=True,
    help="Per-node progress on stderr: a table redrawn in place (auto on a terminal), plain "
    "lines (auto elsewhere, e.g. CI logs), or only the event messages (off).",
)


def _progress(mode: str) -> Progress:
    import os
    import shutil

    from rollout.change.progress import for_stream

    width = shutil.get_terminal_size((100, 24)).columns
    return for_stream(sys.stderr, mode, os.environ, width)


def _confirm(yes: bool, what: str) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise InputError(
            f"refusing to {what} without --yes when standard input is not a terminal",
            Location(field="--yes"),
        )
    if not click.confirm(f"{what}?", default=False, err=True):
        raise InputError("not confirmed; nothing was changed", Location(field="--yes"))


_lock_ns = click.option(
    "--lock-namespace",
    default="kube-system",
    show_default=True,
    help="Namespace of the rollout-lock Lease.",
)
_verify_timeout = click.option(
    "--verify-timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for a node to prove healthy after a kubelet restart.",
)


@click.command("apply")
@plan_option
@inventory_option
@click.option("--canary", is_flag=True, help="Change only the canary group, then hold.")
@click.option("--dry-run", is_flag=True, help="Print the whole plan and change nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option(
    "--disable-eviction",
    is_flag=True,
    help="Delete pods instead of evicting them: bypasses PodDisruptionBudgets.",
)
@click.option(
    "--force-window",
    metavar="REASON",
    help="Run outside the plan's change windows; the reason is journaled.",
)
@click.option(
    "--accept-predicted-rejections",
    "accept_rejections",
    is_flag=True,
    help="Go on although pods running on a node in scope are predicted rejected there under "
    "the new config (see `rollout preview`); the accepted predictions are journaled.",
)
@_lock_ns
@_verify_timeout
@_progress_option
@output_option
@kube_options
def apply_cmd(
    plan_path: str | None,
    inventory: str | None,
    canary: bool,
    dry_run: bool,
    yes: bool,
    disable_eviction: bool,
    force_window: str | None,
    accept_rejections: bool,
    lock_namespace: str,
    verify_timeout: float,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Apply the plan's kubelet change: preflight, then per node cordon, drain, write, restart,
    verify, uncordon; any failure restores the node and stops.

    \b
    Examples:
      rollout apply --canary --dry-run
      rollout apply --canary --yes -o json
      rollout apply --plan plan.yaml -i inventory.ini --yes
      rollout apply --yes --progress plain 2> apply.log
      rollout apply --canary --yes --accept-predicted-rejections
    """
    from rollout.change.preparing import start_inventory
    from rollout.kube.canaries import canaries_in_progress
    from rollout.kube.client import connect
    from rollout.kube.leases import LeaseLock

    if not plan_path:
        raise InputError("no plan: pass --plan or set ROLLOUT_PLAN", Location(field="--plan"))
    plan = load_plan(plan_path)
    parse_strategy(plan.strategy, plan.location)  # bad input fails before any I/O
    gate_config(plan)  # the gate: section too
    window_check = guard(
        parse_windows(plan.windows, file=plan.path, line_of=plan.line_of), force_window
    )
    if not dry_run and not (window := window_check(datetime.now(UTC))).allowed:
        raise PreflightError(window.reason)
    # preflight's slow parts overlap: ansible-inventory (~1 s of CPU) and the API client's
    # import, then the nodes' facts over ssh and the API connection, Lease check and reads
    from rollout.kube.client import warm_client

    threading.Thread(target=warm_client, daemon=True).start()
    inv = start_inventory(_inventory(inventory))()
    facts = _Facts(inv)
    try:
        api = connect(kubeconfig, context)
        lock = LeaseLock(api, lock_namespace)
        lock.check()
        in_progress = canaries_in_progress(api)
    except BaseException:
        facts.close()
        raise
    for w in in_progress:
        _echo(f"warning: {w}")
    prepared = _preflight(plan, inv, api, canary, accept_rejections, facts)
    for line in prepared.report:
        _echo(line)
    for w in prepared.warnings:
        _echo(f"warning: {w}")
    if dry_run:
        if output == "json":
            click.echo(json.dumps(prepared.to_dict(), indent=2))
            return
        for i, b in enumerate(prepared.batches, 1):
            click.echo(f"batch {i}{' (canary)' if b.canary else ''}: {', '.join(b.nodes)}")
        for n in (n for b in prepared.batches for n in b.nodes):
            c = prepared.changes[n]
            pods = prepared.evictions.get(n, ())
            click.echo(f"\nnode {n}: evict {', '.join(pods) or 'no pods'}")
            if c.checkpoint_reset:
                click.echo(f"  checkpoint files removed: {', '.join(c.checkpoint_reset)}")
            click.echo(prepared.diffs.get(n, "") or "  (no file changes)", nl=False)
        click.echo("\nadmission preview:")
        click.echo(render_text(prepared.previews), nl=False)
        return
    nodes = [n for b in prepared.batches for n in b.nodes]
    _confirm(yes, f"change {len(nodes)} node(s) ({', '.join(nodes)})")
    drain = prepared.strategy.drain
    if disable_eviction:
        drain = replace(drain, disable_eviction=True)
    change_id = new_change_id(datetime.now(UTC))
    with _locked(lock, change_id):
        journal = Journal.create(state_dir(), change_id)
        _echo(f"change {change_id}: journal {journal.file}")
        if prepared.accepted:
            journal.append(
                "predicted-rejections-accepted",
                Phase.DONE,
                now=datetime.now(UTC),
                data={"rejections": list(prepared.accepted)},
            )
        progress = _progress(progress_mode)
        progress.nodes(tuple(nodes))
        ctx = _context(api, journal, inv.path, drain, verify_timeout, progress, inv.hostvars)
        ctx.interrupt = lock.interrupt
        predicted = predicted_rejections(prepared.previews)
        gate = gate_for(plan, api, journal, output, inv, progress.event, lock.interrupt, predicted)
        with _reported_failure(journal, lock, output):
            status = run_change(
                ctx,
                prepared.changes,
                prepared.batches,
                gate,
                canary,
                info={
                    "plan": str(Path(plan.path).resolve()),
                    "inventory": str(inv.path.resolve()),
                    "intentSha256": intent_digest(plan),
                },
                forward=window_check,
            )
    _print_status(status, output)
    verdict = getattr(gate, "verdict", None)
    if verdict is not None and verdict.holds:  # Inconclusive / Error: held, say what it waits for
        _echo(f"gate {verdict.status}: holding: waiting for {verdict.waiting_for}")
        sys.exit(GATE_HOLDS_EXIT)


@contextmanager
def _reported_failure(journal: Journal, lock: Any, output: str) -> Iterator[None]:
    """On a failed change: tell a requester waiting on the Lease how it ended (when it was rolled
    back), print the replayed status with ``-o json``, and re-raise (the exit code)."""
    try:
        yield
    except RolloutError:
        final = replay(journal.entries())
        if final.outcome in ("rolled-back", "rollback-failed"):
            lock.report(final.outcome, final.message)
        if output == "json":
            _print_status(final, output)
        raise


def intent_digest(plan: Plan) -> str:
    """sha256 of the plan's kubelet intent and per-node overrides: what ``promote`` checks is
    unchanged since the canary."""
    import hashlib
    from dataclasses import asdict

    intent = {
        "kubelet": plan.kubelet,
        "distribution": plan.distribution,
        "method": plan.method,
        "nodes": {h: asdict(o) for h, o in plan.nodes.items()},
    }
    blob = json.dumps(intent, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


class _Facts:
    """Every inventory host's facts, gathered in a thread from the moment the inventory is read
    (over plain ssh that is mostly waiting on the nodes, so the API client's import and the
    Lease check go on meanwhile)."""

    def __init__(self, inv: Any) -> None:
        from rollout.ansible.runner import AnsibleRunner

        self._tmp = tempfile.TemporaryDirectory(prefix="rollout-preflight-")
        self.dir = Path(self._tmp.name) / "facts"
        self._runner = AnsibleRunner(Path(self._tmp.name) / "runner")
        self._got: dict[str, Any] = {}
        self._thread = threading.Thread(target=self._gather, args=(inv,), daemon=True)
        self._thread.start()

    def _gather(self, inv: Any) -> None:
        try:
            self._got["raw"] = self._runner.gather_facts(
                inv.path, list(inv.hosts), self.dir, inv.hostvars
            )
        except BaseException as e:  # re-raised in the caller's thread by result()
            self._got["error"] = e

    def result(self) -> Any:
        self._thread.join()
        if "error" in self._got:
            raise self._got["error"]
        return self._got["raw"]

    def close(self) -> None:
        self._thread.join()
        self._tmp.cleanup()


def _preflight(
    plan: Plan,
    inv: Any,
    api: Any,
    canary: bool,
    accept: bool = False,
    facts: _Facts | None = None,
) -> Any:
    """Gather the nodes' facts (or use ``facts``, already under way) and run every preflight
    check (``rollout.change.preparing.prepare``); ``accept``: predicted rejections of running
    pods are not refusals."""
    from rollout.change.preparing import ClusterReader, prepare

    reader = ClusterReader(api)
    # the API reads that do not need the facts go on while the nodes answer
    reads = threading.Thread(target=reader.prefetch, daemon=True)
    reads.start()
    facts = facts or _Facts(inv)
    try:
        raw = facts.result()
        reads.join()
        return prepare(plan, inv, reader, raw, facts.dir, canary, accept)
    finally:
        reads.join()
        facts.close()


def _existing(change: str | None) -> Journal:
    return Journal.open(state_dir(), change)


def _info_path(journal: Journal, key: str, given: str | None) -> Path:
    info = replay(journal.entries()).info
    value = given or info.get(key)
    if not value:
        raise InputError(f"no {key} recorded for change {journal.change_id}; pass it")
    return Path(str(value))


def _settle_command(
    change: str,
    inventory: str | None,
    lock_namespace: str,
    verify_timeout: float,
    output: str,
    kubeconfig: str | None,
    context: str | None,
    work: Callable[[Context, Any], ChangeStatus],
    progress_mode: str = "auto",
) -> None:
    from rollout.kube.client import connect
    from rollout.kube.leases import LeaseLock

    journal = _existing(change)
    inv = _info_path(journal, "inventory", inventory)
    plan_file = replay(journal.entries()).info.get("plan")
    drain = DrainPolicy()
    if plan_file and Path(str(plan_file)).is_file():
        plan = load_plan(str(plan_file))
        drain = parse_strategy(plan.strategy, plan.location).drain
    api = connect(kubeconfig, context)
    lock = LeaseLock(api, lock_namespace)
    with _locked(lock, journal.change_id):
        progress = _progress(progress_mode)
        progress.nodes(tuple(replay(journal.entries()).nodes))
        ctx = _context(api, journal, inv, drain, verify_timeout, progress)
        ctx.interrupt = lock.interrupt
        with _reported_failure(journal, lock, output):
            status = work(ctx, lock)
    _print_status(status, output)


def _forced(ctx: Context, force: bool) -> Context:
    """``--force``: the restore overwrites files someone edited after our write."""
    if force:
        ctx.runner.force_restore = True  # type: ignore[attr-defined]
    return ctx


_change_required = click.option("--change", "change", required=True, help="The change id.")


@click.command("rollback")
@_change_required
@click.option("--node", "nodes", multiple=True, help="Only these nodes (repeatable).")
@inventory_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option(
    "--no-wait",
    is_flag=True,
    help="When a running process owns the change, return once the request is handed to it.",
)
@click.option(
    "--wait-timeout",
    type=float,
    default=1800.0,
    show_default=True,
    help="Seconds to wait for the owner to report the rollback it was handed.",
)
@click.option(
    "--requested-by",
    metavar="TEXT",
    help="Who asks, as the change's owner reports it (default: user@host pid N).",
)
@click.option(
    "--force",
    is_flag=True,
    help="Also overwrite node files that changed after this change wrote them (without it, "
    "such a node's restore is refused naming the file).",
)
@_lock_ns
@_verify_timeout
@_progress_option
@output_option
@kube_options
def rollback_cmd(
    change: str,
    nodes: tuple[str, ...],
    inventory: str | None,
    yes: bool,
    no_wait: bool,
    wait_timeout: float,
    requested_by: str | None,
    force: bool,
    lock_namespace: str,
    verify_timeout: float,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Put the change's nodes back byte for byte: cordon, drain, restore the journaled files,
    restart, verify against the previous config, uncordon only what this change cordoned.

    While the process that runs the change is alive (it holds the rollout-lock Lease), the
    rollback is handed to it: it stops forward work at once, rolls back, and reports here; this
    command waits for that (exit 0 when the rollback completed). When no live process owns the
    change, this command takes the Lease and rolls back itself.

    \b
    Examples:
      rollout rollback --change 20261130T214802Z-a1b2c3 --yes
      rollout rollback --change 20261130T214802Z-a1b2c3 --node gpu-7 --yes -o json
      rollout rollback --change 20261130T214802Z-a1b2c3 --yes --no-wait
      rollout rollback --change 20261130T214802Z-a1b2c3 --node gpu-7 --force --yes
    """
    from rollout.kube.client import connect
    from rollout.kube.leases import hand_over, holder_identity, wait_outcome

    _confirm(yes, f"roll back change {change}")
    api = connect(kubeconfig, context)
    by = requested_by or holder_identity()
    requested_at = time.time()
    handed = hand_over(api, lock_namespace, change, list(nodes) or None, by, force)
    if handed is not None:
        _echo(
            f"change {change} is owned by {handed.owner}: rollback handed to it "
            f"(request {handed.request.id}{', --force' if handed.request.force else ''})"
        )
        if handed.request.force != force:
            _echo(
                "warning: joined a pending request "
                + ("with --force" if handed.request.force else "without --force")
                + "; the first request decides whether edited files are overwritten"
            )
        result: dict[str, Any] = {
            "change": change,
            "handedTo": handed.owner,
            "request": handed.request.id,
            "nodes": list(handed.request.nodes) if handed.request.nodes else None,
            "force": handed.request.force,
            "requestedAt": requested_at,
        }
        if no_wait:
            result["outcome"] = "handed-over"
            click.echo(json.dumps(result, indent=2) if output == "json" else "handed over")
            return
        outcome = wait_outcome(api, lock_namespace, handed, wait_timeout, _echo)
        if outcome is not None:
            result.update(outcome=outcome.get("outcome"), message=outcome.get("message"))
            if output == "json":
                click.echo(json.dumps(result, indent=2))
            else:
                click.echo(f"change {change}: {outcome.get('outcome')} by {handed.owner}")
                click.echo(f"  {outcome.get('message')}")
            if outcome.get("outcome") != "rolled-back":
                raise NodeOperationError(
                    f"the owner {handed.owner} reported {outcome.get('outcome')}: "
                    f"{outcome.get('message')}"
                )
            return
        _echo(
            f"{handed.owner} released the change without acting on the request; rolling back here"
        )
    _settle_command(
        change,
        inventory,
        lock_namespace,
        verify_timeout,
        output,
        kubeconfig,
        context,
        lambda ctx, _lock: rollback(_forced(ctx, force), list(nodes) or None),
        progress_mode,
    )


@click.command("resume")
@_change_required
@inventory_option
@_lock_ns
@_verify_timeout
@_progress_option
@output_option
@kube_options
def resume_cmd(
    change: str,
    inventory: str | None,
    lock_namespace: str,
    verify_timeout: float,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Finish an interrupted change: each node in flight is finished or restored (a node caught
    before any file was written gets its cordon undone and runs again in its batch), a gate the
    crash cut short is soaked again, then the batches the interrupted apply or promote had not
    started yet are run (with the gate where that command would have run it), unless a node had
    failed (the change had stopped).

    \b
    Examples:
      rollout resume --change 20261130T214802Z-a1b2c3
      rollout resume --change 20261130T214802Z-a1b2c3 --yes -o json --progress plain
    """
    journal = _existing(change)
    before = replay(journal.entries(), journal.change_id)

    def work(ctx: Context, lock: Any) -> ChangeStatus:
        if before.outcome != "running":
            return resume(ctx)  # it had ended (held, completed, stopped): nothing more to start
        # the change stays running until it goes on or ends here: a crash in between leaves
        # it to the next resume, which goes on with it
        settled = resume(ctx, end=False)
        return _resume_later_batches(ctx, lock, before, settled, inventory, output)

    _settle_command(
        change,
        inventory,
        lock_namespace,
        verify_timeout,
        output,
        kubeconfig,
        context,
        work,
        progress_mode,
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
    from rollout.change.orchestrator import continue_change, end_resumed, unfinished_gate
    from rollout.change.planning import Batch
    from rollout.change.preparing import read_inventory
    from rollout.models import NodeState

    info = before.info
    # a node the crash caught on the forward path before any file was written (no step failed):
    # resume undid its cordon; the interrupted command would have gone on with it, so resume
    # runs it again in its batch
    cut = {
        n
        for n, s in before.nodes.items()
        if s.state is NodeState.APPLYING and not s.files_touched and s.phase is not Phase.FAILED
    }
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
    plan_file = info.get("plan")
    plan = load_plan(str(plan_file)) if plan_file and Path(str(plan_file)).is_file() else None
    # a gate the crash cut short (or whose verdict was not acted on) is settled first
    has_gate = plan is not None and gate_config(plan) is not None
    regate = unfinished_gate(ctx.journal.entries(), has_gate)
    if not todo and regate is None:
        return end_resumed(ctx)
    if plan is None:
        plan = load_plan(str(_info_path(ctx.journal, "plan", None)))  # names what is missing
    if info.get("intentSha256") and info["intentSha256"] != intent_digest(plan):
        raise PreflightError(
            f"the plan {plan.path} renders another intent than change {before.change} "
            "started with; its settled nodes stay as they are, the rest is not started"
        )
    inv = read_inventory(_info_path(ctx.journal, "inventory", inventory))
    prepared = _preflight(plan, inv, lock.api, False) if todo else None
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


@click.command("status")
@click.option("--change", "change", help="The change id (default: the latest change).")
@output_option
def status_cmd(change: str | None, output: str) -> None:
    """Every node's state in a change, replayed from its journal.

    \b
    Examples:
      rollout status
      rollout status --change 20261130T214802Z-a1b2c3 -o json
    """
    journal = _existing(change)
    _print_status(replay(journal.entries(), journal.change_id), output)


def last_gate(journal: Journal) -> Mapping[str, Any] | None:
    """The last ``gate`` entry's data (``status``, ``reason``, ``nodes``), or None."""
    gates = [e for e in journal.entries() if e.step == "gate" and e.phase is Phase.DONE]
    return gates[-1].data if gates else None


def promote_refusal(status: ChangeStatus, gate: Mapping[str, Any] | None) -> str | None:
    """Why a change may not be promoted without ``--force`` (pure), or None when it may."""
    from rollout.models import NodeState

    if status.outcome == "running":
        return (
            f"change {status.change} is running or was interrupted (no end recorded); "
            f"`rollout resume --change {status.change}` settles it first"
        )
    canary = [n for b in status.info.get("batches", ()) for n in b]
    not_applied = [n for n in canary if status.nodes[n].state is not NodeState.APPLIED]
    if not_applied:
        states = ", ".join(f"{n}: {status.nodes[n].state.value}" for n in not_applied)
        return f"the canary is not applied ({states})"
    if gate is None or gate.get("status") != "Successful":
        what = f"{gate.get('status')}: {gate.get('reason')}" if gate else "no gate verdict"
        return f"the canary's last gate verdict is not Successful ({what})"
    return None


@click.command("promote")
@_change_required
@click.option("--plan", "plan_path", help="The plan (default: the one the change recorded).")
@inventory_option
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option("--dry-run", is_flag=True, help="Print the remaining batches and change nothing.")
@click.option(
    "--force",
    "force",
    metavar="REASON",
    help="Promote although the canary is not applied or its gate did not pass; journaled.",
)
@click.option(
    "--force-window",
    metavar="REASON",
    help="Run outside the plan's change windows; the reason is journaled.",
)
@_lock_ns
@_verify_timeout
@_progress_option
@output_option
@kube_options
def promote_cmd(
    change: str,
    plan_path: str | None,
    inventory: str | None,
    yes: bool,
    dry_run: bool,
    force: str | None,
    force_window: str | None,
    lock_namespace: str,
    verify_timeout: float,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Continue a held canary with the rest of the fleet: the same change (id, journal,
    backups), the plan's remaining batches, the gate after each batch when the plan has one,
    change windows respected. Refused (exit 3) unless every canary node is applied and the
    canary's last gate verdict is Successful; --force REASON promotes anyway (journaled).
    `rollout rollback --change ID` then restores every node of the change, canary and fleet.

    \b
    Examples:
      rollout promote --change 20261130T214802Z-a1b2c3 --dry-run
      rollout promote --change 20261130T214802Z-a1b2c3 --yes -o json
      rollout promote --change 20261130T214802Z-a1b2c3 --yes --force "gate had no traffic"
    """
    from rollout.change.orchestrator import continue_change
    from rollout.change.planning import Batch
    from rollout.change.preparing import read_inventory
    from rollout.kube.client import connect
    from rollout.kube.leases import LeaseLock, holder_identity
    from rollout.models import NodeState

    journal = _existing(change)
    status = replay(journal.entries(), journal.change_id)
    refusal = promote_refusal(status, last_gate(journal))
    if refusal and status.outcome == "running":
        raise PreflightError(refusal)
    if refusal and not force:
        raise PreflightError(
            f"not promoting change {change}: {refusal}; --force REASON to override"
        )
    plan = load_plan(str(_info_path(journal, "plan", plan_path)))
    recorded = status.info.get("intentSha256")
    if recorded and recorded != intent_digest(plan):
        raise PreflightError(
            f"the plan {plan.path} renders another intent than change {change} applied to its "
            "canary (kubelet settings or node overrides changed); start a new change instead"
        )
    window_check = guard(
        parse_windows(plan.windows, file=plan.path, line_of=plan.line_of), force_window
    )
    if not dry_run and not (window := window_check(datetime.now(UTC))).allowed:
        raise PreflightError(window.reason)
    inv = read_inventory(_info_path(journal, "inventory", inventory))
    api = connect(kubeconfig, context)
    lock = LeaseLock(api, lock_namespace)
    lock.check()
    prepared = _preflight(plan, inv, api, False)
    for w in prepared.warnings:
        _echo(f"warning: {w}")
    done = {n for n, s in status.nodes.items() if s.state is not NodeState.PENDING}
    remaining = [
        Batch(tuple(n for n in b.nodes if n not in done), False)
        for b in prepared.batches
        if any(n not in done for n in b.nodes)
    ]
    nodes = [n for b in remaining for n in b.nodes]
    if dry_run or not nodes:
        if output == "json":
            doc = {"change": change, "batches": [list(b.nodes) for b in remaining]}
            click.echo(json.dumps({**doc, "refusal": refusal, "dryRun": dry_run}, indent=2))
        else:
            for i, b in enumerate(remaining, 1):
                click.echo(f"batch {i}: {', '.join(b.nodes)}")
            if not nodes:
                click.echo(f"change {change}: nothing left to promote")
        return
    _confirm(yes, f"promote change {change} to {len(nodes)} more node(s) ({', '.join(nodes)})")
    all_nodes = list(dict.fromkeys([*status.nodes, *nodes]))
    batches = [list(b.nodes) for b in remaining]
    promotion = {
        "by": holder_identity(),
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "batches": batches,
        "forced": force if refusal else None,
        "refusal": refusal,
    }
    info = {
        **status.info,
        "nodes": all_nodes,
        "batches": [*status.info.get("batches", ()), *batches],
        "canaryOnly": False,
        "promotion": promotion,
    }
    with _locked(lock, journal.change_id):
        progress = _progress(progress_mode)
        progress.nodes(tuple(all_nodes))
        ctx = _context(
            api, journal, inv.path, prepared.strategy.drain, verify_timeout, progress, inv.hostvars
        )
        ctx.interrupt = lock.interrupt
        has_gate = gate_config(plan) is not None
        predicted = predicted_rejections(prepared.previews)
        gate = gate_for(plan, api, journal, output, inv, progress.event, lock.interrupt, predicted)
        with _reported_failure(journal, lock, output):
            final = continue_change(
                ctx,
                prepared.changes,
                remaining,
                gate if has_gate else None,
                info,
                forward=window_check,
            )
    _print_status(final, output)


COMMANDS = [apply_cmd, rollback_cmd, status_cmd, resume_cmd, promote_cmd]
