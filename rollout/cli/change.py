"""``rollout apply``, ``rollback``, ``status`` and ``resume``: thin commands over the orchestrator.

Parse options, build the adapters (API client, Lease lock, playbook runner, journal), call the core,
print. Errors become exit codes in ``rollout.cli`` (see README, "Exit codes").
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from rollout.cli.gate import GATE_HOLDS_EXIT, gate_config
from rollout.errors import InputError, Location, PreflightError, RolloutError
from rollout.journal import ChangeStatus, Journal, new_change_id, replay, state_dir
from rollout.orchestrator import NoGate, resume, rollback, run_change, summary
from rollout.plan import Plan, load_plan
from rollout.planning import DrainPolicy, parse_strategy
from rollout.progress import Progress
from rollout.protocols import Gate
from rollout.restoring import Context
from rollout.windows import guard, parse_windows

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
) -> Gate:
    """The gate run after the canary batch: the rejection-rate gate when the plan has a ``gate:``
    section (built as ``rollout watch`` builds it, journaling into this change), else none."""
    from rollout.cli.gate import build_soak_gate
    from rollout.gate import RollbackPolicyGate
    from rollout.models import Phase

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
    )
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
) -> Context:
    """The orchestrator's context; with ``progress``, every journal entry and event feeds it."""
    from rollout.kube.cluster import KubeCluster
    from rollout.progress import ObservedJournal
    from rollout.shipping import PlaybookNodeRunner

    on_event = progress.event if progress is not None else _echo
    return Context(
        cluster=KubeCluster(api),
        runner=PlaybookNodeRunner(journal.dir / "ansible", inventory, on_event),
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

    from rollout.progress import for_stream

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
    """
    from rollout.ansible.runner import AnsibleRunner
    from rollout.kube.canaries import canaries_in_progress
    from rollout.kube.client import connect
    from rollout.kube.leases import LeaseLock
    from rollout.preparing import ClusterReader, prepare, read_inventory

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
    inv = read_inventory(_inventory(inventory))
    api = connect(kubeconfig, context)
    lock = LeaseLock(api, lock_namespace)
    lock.check()
    for w in canaries_in_progress(api):
        _echo(f"warning: {w}")
    with tempfile.TemporaryDirectory(prefix="rollout-preflight-") as tmp:
        facts_dir = Path(tmp) / "facts"
        raw = AnsibleRunner(Path(tmp) / "runner").gather_facts(inv.path, list(inv.hosts), facts_dir)
        prepared = prepare(plan, inv, ClusterReader(api), raw, facts_dir, canary)
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
        progress = _progress(progress_mode)
        progress.nodes(tuple(nodes))
        ctx = _context(api, journal, inv.path, drain, verify_timeout, progress)
        gate = gate_for(plan, api, journal, output, inv, progress.event)
        try:
            status = run_change(
                ctx,
                prepared.changes,
                prepared.batches,
                gate,
                canary,
                info={"plan": str(Path(plan.path).resolve()), "inventory": str(inv.path.resolve())},
                forward=window_check,
            )
        except RolloutError:
            if output == "json":
                _print_status(replay(journal.entries()), output)
            raise
    _print_status(status, output)
    verdict = getattr(gate, "verdict", None)
    if verdict is not None and verdict.holds:  # Inconclusive / Error: held, say what it waits for
        _echo(f"gate {verdict.status}: holding: waiting for {verdict.waiting_for}")
        sys.exit(GATE_HOLDS_EXIT)


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
    work: Callable[[Context], ChangeStatus],
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
    with _locked(LeaseLock(api, lock_namespace), journal.change_id):
        progress = _progress(progress_mode)
        progress.nodes(tuple(replay(journal.entries()).nodes))
        ctx = _context(api, journal, inv, drain, verify_timeout, progress)
        try:
            status = work(ctx)
        except RolloutError:
            if output == "json":
                _print_status(replay(journal.entries()), output)
            raise
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

    \b
    Examples:
      rollout rollback --change 20261130T214802Z-a1b2c3 --yes
      rollout rollback --change 20261130T214802Z-a1b2c3 --node gpu-7 --yes -o json
      rollout rollback --change 20261130T214802Z-a1b2c3 --node gpu-7 --force --yes
    """
    _confirm(yes, f"roll back change {change}")
    _settle_command(
        change,
        inventory,
        lock_namespace,
        verify_timeout,
        output,
        kubeconfig,
        context,
        lambda ctx: rollback(_forced(ctx, force), list(nodes) or None),
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
    """Settle an interrupted change: each node in flight is finished or restored.

    \b
    Examples:
      rollout resume --change 20261130T214802Z-a1b2c3
      rollout resume --change 20261130T214802Z-a1b2c3 --yes -o json --progress plain
    """
    _settle_command(
        change,
        inventory,
        lock_namespace,
        verify_timeout,
        output,
        kubeconfig,
        context,
        resume,
        progress_mode,
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


COMMANDS = [apply_cmd, rollback_cmd, status_cmd, resume_cmd]
