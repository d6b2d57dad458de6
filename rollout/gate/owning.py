"""Reads who owns a node from the journals on disk (and the Lease), for ``rollout serve``.

Why a module of its own: the decision is pure (:func:`rollout.gate.alerting.owner_of`); this is the
I/O around it — replaying every change's journal under the state directory, reading each
change's plan for its ``onFailure`` policy, asking the cluster which change holds the Lease —
and journaling the ``trigger`` record an alert causes. The journals are a cache: ``rollout serve``
first fetches the change the alert's Node names (its ``rollout.dev/change`` label) from the
cluster record, so it needs no disk shared with the ``rollout apply`` it guards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rollout.change.record.journal import Journal, Kind, read_entries
from rollout.change.record.replay import ChangeStatus, replay
from rollout.errors import RolloutError
from rollout.gate.alerting import Owner, owner_of
from rollout.models import NodeState, Phase

LeaseReader = Callable[[], str | None]


def change_statuses(root: Path) -> list[ChangeStatus]:
    """Every change under ``root`` replayed (a journal that cannot be read is skipped)."""
    changes = root / "changes"
    if not changes.is_dir():
        return []
    out = []
    for d in sorted(changes.iterdir()):
        f = d / "journal.jsonl"
        if not f.is_file():
            continue
        try:
            out.append(replay(read_entries(f), d.name))
        except RolloutError:
            continue
    return out


def rolls_back_group(status: ChangeStatus) -> bool:
    """Whether the change's plan (its file, else the text the change recorded) rolls back the
    group on failure: a ``gate:`` section whose ``onFailure`` is ``rollback-group``, written or
    by default (an empty ``gate:`` is the gate's defaults, as ``apply`` runs it:
    ``rollout.change.plan.gate_section.GateConfig.on_failure``). False when the plan has no
    ``gate:``, or neither the file nor the recorded text is there or readable: an alert then
    rolls back only its own node, the smaller act (``tests/unit/test_gate_owning.py``)."""
    from rollout.change.plan.gate_section import OnFailure
    from rollout.change.plan.schema import recorded_plan

    try:
        plan = recorded_plan(status.info, status.change)
    except RolloutError:
        return False
    if plan is None or plan.gate is None:
        return False
    return plan.gate.on_failure is OnFailure.ROLLBACK_GROUP


class JournalOwners:
    """``rollout.gate.serve.OwnerResolver`` over the journals in ``root`` and the cluster Lease.

    Args:
        root: the state directory (``rollout.change.record.journal.state_dir()``).
        lease: returns the change id the live Lease names (None: no live Lease, or unknown).
        refresh: called with the alert's node first: ``rollout serve`` fetches the change the
            Node's ``rollout.dev/change`` label names from the cluster record into ``root``.
    """

    def __init__(
        self,
        root: Path,
        lease: LeaseReader = lambda: None,
        refresh: Callable[[str], None] = lambda node: None,
    ) -> None:
        self.root = root
        self.lease = lease
        self.refresh = refresh

    def __call__(self, node: str) -> Owner | None:
        # the change the Node names, fetched or brought up to date from the cluster record;
        # when that fails the journals here still answer, but only for a node they know: "no
        # change owns it" is a final answer (200), so a node they do not know raises instead
        # (500: Alertmanager delivers the alert again)
        try:
            self.refresh(node)
            unread: Exception | None = None
        except (RolloutError, OSError) as e:
            unread = e
        statuses = change_statuses(self.root)
        touched = [c for c in statuses if node in c.nodes]
        if unread is not None and not touched:
            raise RolloutError(
                f"cannot read the change Node {node} names from the cluster record ({unread}), "
                "and no journal here names the node"
            )
        try:
            lease_change = self.lease()
        except (RolloutError, OSError):
            lease_change = None
        policy = {c.change: rolls_back_group(c) for c in touched}
        return owner_of(node, touched, lease_change=lease_change, group_policy=policy)


def journal_recorder(root: Path) -> Callable[[str, Mapping[str, Any]], None]:
    """Appends a ``trigger`` record (phase done) to the named change's journal under ``root``,
    with no cluster and no Lease (unit tests). ``rollout serve`` writes its records through the
    change's one writer instead: ``rollout.gate.trigger.alert_server``."""

    def record(change_id: str, data: Mapping[str, Any]) -> None:
        journal = Journal.open(root, change_id)
        journal.append(Kind.TRIGGER, Phase.DONE, now=datetime.now(UTC), data=data)

    return record


def node_states(root: Path) -> dict[str, str]:
    """Each node's state in the newest change that touched it (``pending`` skipped): what
    ``rollout serve`` exports as ``rollout_node_state``."""
    out: dict[str, tuple[str, str]] = {}
    for c in change_statuses(root):
        for node, s in c.nodes.items():
            if s.state is NodeState.PENDING:
                continue
            if node not in out or out[node][0] < c.change:
                out[node] = (c.change, s.state.value)
    return {n: st for n, (_, st) in out.items()}


def export_node_states(
    root: Path, cluster: Callable[[], Mapping[str, str]] | None = None
) -> Callable[[Any], None]:
    """``make_server``'s ``before_metrics``: set ``rollout_node_state`` (and each change's
    ``gate.bench`` verdicts, ``rollout_bench_verdict``) from the journals, and
    from the Nodes' ``rollout.dev/state`` labels when ``cluster`` reads them (they win: a change
    applied from another machine is on the Node, not in these journals)."""
    states = [s.value for s in NodeState]

    def refresh(metrics: Any) -> None:
        current = node_states(root)
        if cluster is not None:
            # when the API fails the journals still answer; the next scrape tries again
            with contextlib.suppress(RolloutError, OSError):
                current.update(cluster())
        for node, state in current.items():
            metrics.set_node_state(node, state, states)
        for c in change_statuses(root):  # gate.bench decisions, per change
            stage = c.info.stage.name if c.info.stage else ""
            if c.bench is None:
                continue
            for v, check in (
                (c.bench.regression, "regression"),
                (c.bench.tightening, "aligned-advantage"),
            ):
                metrics.set_bench_verdict(c.change, stage, check, str(v.outcome))

    return refresh
