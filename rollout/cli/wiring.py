"""What the change commands share on the CLI side: the options they take, the gate and progress
they build from them, confirmation and printing.

The session below them (Lease, journal, runner, context, preflight) is
``rollout.change.commands.session``; ``apply`` (``change.py``), ``promote``, ``resume`` and
``rollback`` parse their options, call it and print. Errors become exit codes in ``rollout.cli``
(see docs/exit-codes.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path

import click

from rollout.change.commands.progress import Progress
from rollout.change.engine.orchestrator import failure_text, summary
from rollout.change.record.change_outcomes import ended_exit
from rollout.change.record.replay import ChangeStatus
from rollout.errors import InputError, Location
from rollout.fanout import DEFAULT_FORKS


def echo_err(msg: str) -> None:
    click.echo(msg, err=True)


def finish(status: ChangeStatus, output: str) -> None:
    """Print how the change ended and, when that is a failure, exit with its outcome's code
    (``docs/exit-codes.md``), stderr saying why and every node's state; with text output a
    failed change prints nothing on stdout."""
    code = ended_exit(status.outcome, status.cause)
    if code == 0 or output == "json":
        print_status(status, output)
    if code != 0:
        echo_err(f"error: {failure_text(status)}")
        sys.exit(code)


def print_status(status: ChangeStatus, output: str) -> None:
    if output == "json":
        click.echo(json.dumps(status.to_dict(), indent=2))
        return
    click.echo(f"change {status.change}: {status.outcome}")
    if status.message:
        click.echo(f"  {status.message}")
    stage = status.info.stage
    if stage:
        click.echo(
            f"  stage {(stage.index or 0) + 1}/{stage.count} ({stage.name}) of plan {stage.plan}"
        )
    if status.bench:
        for v, what in (
            (status.bench.regression, "regression"),
            (status.bench.tightening, "aligned advantage"),
        ):
            click.echo(f"  bench {what}: {v.outcome}: {v.reason}")
        nxt = "may start" if status.bench.allows_tightening else "is held"
        click.echo(f"  bench: a tighter next stage {nxt} once this change is promoted")
    promotion = status.info.promotion
    if promotion:
        forced = f"; forced: {promotion.forced}" if promotion.forced else ""
        click.echo(f"  promoted by {promotion.by} at {promotion.at}{forced}")
    for label, ev in status.evidence.items():
        failed = [str(c.name) for c in ev.checks if c.status == "fail"]
        why = f": {ev.error}" if ev.error else f" ({', '.join(failed)})" if failed else ""
        nodes = ", ".join(ev.nodes)
        click.echo(f"  evidence {label} ({nodes}): {ev.overall}{why}")
    for t in status.triggers:
        what = f"alert {t.alert} (trigger {t.id})" if t.alert else str(t.trigger)
        on = ", ".join(t.nodes or ()) or "every node"
        ended = f": {t.outcome}" if t.outcome else ""
        click.echo(f"  rollback asked by {what} at {t.at} for {on}{ended}")
    click.echo(summary(status))


def inventory_path(inventory: str | None) -> Path:
    if not inventory:
        raise InputError(
            "no inventory: pass -i/--inventory or set ROLLOUT_INVENTORY", Location(field="-i")
        )
    return Path(inventory)


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

    from rollout.change.commands.progress import for_stream

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


def json_status(output: str) -> Callable[[ChangeStatus], None] | None:
    """With ``-o json``, what prints a failed change's status (``settle``'s ``failed``)."""
    if output != "json":
        return None
    return lambda status: print_status(status, output)


change_required = click.option("--change", "change", required=True, help="The change id.")
