"""A migration's ``before`` and ``after`` evidence (``rollout migrate``), as ``apply`` collects
its own: ``before`` once the journal exists and before any node is touched, ``after`` of the
nodes the change moved, both journaled when the change ended without a failure.

Why its own module: the collection is the evidence layer's
(``rollout.change.commands.evidence_hooks``); the migration's run
(``rollout.change.commands.migrate_pool``) only calls these two functions. What the collections hold
for a migration, and the check that every healthy GPU is served after, once, through one path, is
:mod:`rollout.evidence.gpu_paths`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rollout.change.commands.evidence_hooks import EvidenceHooks
from rollout.change.record.change_outcomes import ended_exit
from rollout.change.record.journal import Journal
from rollout.change.record.replay import ChangeStatus, replay
from rollout.models import NodeState


def collect_before(evidence: EvidenceHooks | None, journal: Journal, nodes: Sequence[str]) -> Any:
    """The ``before`` collection of the nodes about to move (None without evidence); never
    raises (a failed collection is journaled at the end, never stops the change)."""
    return None if evidence is None else evidence.collect(journal, "before", list(nodes))


def record_after(
    evidence: EvidenceHooks | None,
    journal: Journal,
    nodes: Sequence[str],
    before: Any,
    status: ChangeStatus,
) -> ChangeStatus:
    """When the change ended without a failure: journal ``before``, collect and journal
    ``after`` of the nodes it moved; the status with its evidence."""
    if evidence is None or ended_exit(status.outcome, status.cause) != 0:
        return status
    evidence.record(journal, "before", list(nodes), before)
    moved = [n for n in nodes if status.nodes[n].state is NodeState.APPLIED]
    if moved:
        evidence.record(journal, "after", moved, evidence.collect(journal, "after", moved))
    return replay(journal.entries(), journal.change_id)
