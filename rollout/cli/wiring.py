"""What the change commands share: the adapters they build and the options they take.

``apply`` (``change.py``), ``promote``, ``resume`` and ``rollback`` each parse their options, build
the adapters here (API client, Lease lock, playbook runner, journal, gate, progress), call the core
and print. Errors become exit codes in ``rollout.cli`` (see docs/exit-codes.md).
"""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import click

from rollout.change.journal import Journal, Kind
from rollout.change.orchestrator import NoGate, summary
from rollout.change.plan import Plan, recorded_plan
from rollout.change.planning import DrainOverrides, DrainPolicy, parse_strategy
from rollout.change.progress import Progress
from rollout.change.replaying import ChangeStatus, status_of
from rollout.change.restoring import Context
from rollout.cli.gate import gate_config
from rollout.cli.record import existing_journal, mirrored
from rollout.errors import InputError, Location, RolloutError
from rollout.fanout import DEFAULT_FORKS
from rollout.gate.analysis import Predicted
from rollout.interrupt import Interrupt
from rollout.models import Phase
from rollout.protocols import Gate


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
    from rollout.change.orchestrator import node_pool
    from rollout.kube.workloads import owner_running, rejected_owners_on

    since = time.time()
    return RollbackPolicyGate(
        soak,
        record,
        lambda: node_pool(status_of(journal)),
        lambda owner: owner_running(api, owner),
        lambda nodes: rejected_owners_on(api, list(nodes), since),
    )


def echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def print_status(status: ChangeStatus, output: str) -> None:
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
    for label, ev in status.evidence.items():
        failed = [c["name"] for c in ev.get("checks") or () if c.get("status") == "fail"]
        why = f": {ev['error']}" if ev.get("error") else f" ({', '.join(failed)})" if failed else ""
        nodes = ", ".join(ev.get("nodes") or ())
        click.echo(f"  evidence {label} ({nodes}): {ev.get('overall')}{why}")
    click.echo(summary(status))


def inventory_path(inventory: str | None) -> Path:
    if not inventory:
        raise InputError(
            "no inventory: pass -i/--inventory or set ROLLOUT_INVENTORY", Location(field="-i")
        )
    return Path(inventory)


@contextmanager
def holding(lock: Any, change_id: str) -> Iterator[None]:
    lock.acquire(change_id)
    try:
        yield
    finally:
        lock.release()


def open_context(
    api: Any,
    journal: Journal,
    inventory: Path,
    drain: DrainPolicy,
    verify_timeout: float,
    progress: Progress | None = None,
    hostvars: Mapping[str, Mapping[str, Any]] | None = None,
    forks: int = DEFAULT_FORKS,
) -> Context:
    """The orchestrator's context; with ``progress``, every journal entry and event feeds it;
    ``hostvars``: the inventory's variables when the caller has read them already; ``forks``:
    at most this many nodes at once (``--forks``)."""
    from rollout.change.progress import ObservedJournal
    from rollout.change.shipping import PlaybookNodeRunner
    from rollout.kube.cluster import KubeCluster

    on_event = progress.event if progress is not None else echo_err
    return Context(
        cluster=KubeCluster(api),
        runner=PlaybookNodeRunner(
            journal.dir / "ansible", inventory, on_event, hostvars=hostvars, forks=forks
        ),
        clock=SystemClock(),
        journal=journal if progress is None else ObservedJournal(journal, progress.entry),
        drain=drain,
        verify_timeout_s=verify_timeout,
        on_event=on_event,
        forks=forks,
    )


forks_option = click.option(
    "--forks",
    envvar="ROLLOUT_FORKS",
    type=click.IntRange(min=1),
    default=DEFAULT_FORKS,
    show_default=True,
    help="At most this many nodes at once: ssh calls, playbook forks and per-node work; a "
    "batch wider than it runs in waves (default: the shipped ansible.cfg's forks; "
    "$ROLLOUT_FORKS).",
)

progress_option = click.option(
    "--progress",
    "progress_mode",
    type=click.Choice(["auto", "table", "plain", "off"]),
    default="auto",
    show_default=True,
    help="Per-node progress on stderr: a table redrawn in place (auto on a terminal), plain "
    "lines (auto elsewhere, e.g. CI logs), or only the event messages (off).",
)


def progress_for(mode: str) -> Progress:
    import os
    import shutil

    from rollout.change.progress import for_stream

    width = shutil.get_terminal_size((100, 24)).columns
    return for_stream(sys.stderr, mode, os.environ, width)


def confirm(yes: bool, what: str) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise InputError(
            f"refusing to {what} without --yes when standard input is not a terminal",
            Location(field="--yes"),
        )
    if not click.confirm(f"{what}?", default=False, err=True):
        raise InputError("not confirmed; nothing was changed", Location(field="--yes"))


lock_ns_option = click.option(
    "--lock-namespace",
    default="kube-system",
    show_default=True,
    help="Namespace of the rollout-lock Lease.",
)
verify_timeout_option = click.option(
    "--verify-timeout",
    type=float,
    default=120.0,
    show_default=True,
    help="Seconds to wait for a node to prove healthy after a kubelet restart.",
)


@contextmanager
def reported_failure(journal: Journal, lock: Any, output: str) -> Iterator[None]:
    """On a failed change: tell a requester waiting on the Lease how it ended (when it was rolled
    back), print the replayed status with ``-o json``, and re-raise (the exit code)."""
    try:
        yield
    except RolloutError:
        final = status_of(journal)
        if final.outcome in ("rolled-back", "rollback-failed"):
            lock.report(final.outcome, final.message)
        if output == "json":
            print_status(final, output)
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


class FactsGathering:
    """Every inventory host's facts, gathered in a thread from the moment the inventory is read
    (over plain ssh that is mostly waiting on the nodes, so the API client's import and the
    Lease check go on meanwhile)."""

    def __init__(self, inv: Any, forks: int = DEFAULT_FORKS) -> None:
        from rollout.ansible.runner import AnsibleRunner

        self._tmp = tempfile.TemporaryDirectory(prefix="rollout-preflight-")
        self.dir = Path(self._tmp.name) / "facts"
        self._runner = AnsibleRunner(Path(self._tmp.name) / "runner", forks=forks)
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


def run_preflight(
    plan: Plan,
    inv: Any,
    api: Any,
    canary: bool,
    accept: bool = False,
    facts: FactsGathering | None = None,
    forks: int = DEFAULT_FORKS,
    force: bool = False,
    overrides: DrainOverrides | None = None,
    settled: Collection[str] = (),
) -> Any:
    """Gather the nodes' facts (or use ``facts``, already under way) and run every preflight
    check (``rollout.change.preparing.prepare``); ``accept``: predicted rejections of running
    pods are not refusals; ``force``: nor are the device refusals (``--force REASON``);
    ``overrides``: what the drains may lose (``rollout.change.planning.DrainOverrides``);
    ``settled``: nodes the change already moved."""
    from rollout.change.preparing import ClusterReader, prepare

    reader = ClusterReader(api, {inv.node_of(h) for h in inv.hosts})
    # the API reads that do not need the facts go on while the nodes answer
    reads = threading.Thread(target=reader.prefetch, daemon=True)
    reads.start()
    facts = facts or FactsGathering(inv, forks)
    try:
        raw = facts.result()
        reads.join()
        return prepare(
            plan,
            inv,
            reader,
            raw,
            facts.dir,
            canary,
            accept,
            force,
            overrides or DrainOverrides(),
            settled,
        )
    finally:
        reads.join()
        facts.close()


OVERRIDES_STEP = Kind.DRAIN_OVERRIDES
"""The journal entry ``apply`` and ``promote`` write when drain flags were given (``flags``,
``pods``); ``resume`` and ``rollback`` run on with the same allowances."""


def journaled_overrides(journal: Journal) -> DrainOverrides:
    """The drain overrides every part of the change was started with (their union)."""
    flags = {
        str(f)
        for e in journal.entries()
        if e.step == OVERRIDES_STEP
        for f in e.data.get("flags") or ()
    }
    return DrainOverrides.from_flags(flags)


def info_path(journal: Journal, key: str, given: str | None) -> Path:
    info = status_of(journal).info
    value = given or info.get(key)
    if not value:
        raise InputError(f"no {key} recorded for change {journal.change_id}; pass it")
    return Path(str(value))


def settle_command(
    change: str,
    inventory: str | None,
    lock_namespace: str,
    verify_timeout: float,
    output: str,
    kubeconfig: str | None,
    context: str | None,
    work: Callable[[Context, Any], ChangeStatus],
    progress_mode: str = "auto",
    forks: int = DEFAULT_FORKS,
) -> None:
    from rollout.kube.client import connect
    from rollout.kube.leases import LeaseLock

    api = connect(kubeconfig, context)
    journal = existing_journal(change, api, lock_namespace)
    inv = info_path(journal, "inventory", inventory)
    plan = recorded_plan(status_of(journal).info, journal.change_id)
    drain = DrainPolicy()
    if plan is not None:
        drain = parse_strategy(plan.strategy, plan.location).drain
    allowed = journaled_overrides(journal)  # what the change's drains were allowed to lose
    drain = replace(
        drain,
        delete_unmanaged=allowed.delete_unmanaged,
        delete_emptydir_data=allowed.delete_emptydir_data,
    )
    lock = LeaseLock(api, lock_namespace)
    with holding(lock, journal.change_id):
        mirrored(journal, api, lock_namespace)
        progress = progress_for(progress_mode)
        progress.nodes(tuple(status_of(journal).nodes))
        ctx = open_context(api, journal, inv, drain, verify_timeout, progress, forks=forks)
        ctx.interrupt = lock.interrupt
        with reported_failure(journal, lock, output):
            status = work(ctx, lock)
    print_status(status, output)


def forced_context(ctx: Context, force: bool) -> Context:
    """``--force``: the restore overwrites files someone edited after our write."""
    if force:
        ctx.runner.force_restore = True  # type: ignore[attr-defined]
    return ctx


change_required = click.option("--change", "change", required=True, help="The change id.")
