"""What the change's engine calls back into a layer above it (``rollout.evidence``) for."""

from __future__ import annotations

from typing import Any, Protocol

from rollout.change.journal import Journal
from rollout.change.planning import DrainPolicy


class EvidenceHooks(Protocol):
    """How ``apply`` and ``promote`` collect and journal their evidence
    (``rollout.evidence.collecting.ChangeEvidence``)."""

    def collect(self, journal: Journal, label: str, nodes: list[str], raw_facts: Any = None) -> Any:
        """Collect ``label`` evidence of ``nodes`` into ``evidence.json`` beside the journal;
        never raises (a failed collection never stops the change)."""
        ...

    def record(self, journal: Journal, label: str, nodes: list[str], collected: Any) -> None:
        """Journal what a collection showed (and say it)."""
        ...

    def after_recreate(
        self,
        journal: Journal,
        nodes: list[str],
        workloads: DrainPolicy | None = None,
        probes: bool = True,
    ) -> Any:
        """Recreate the operator's workload pods of ``nodes`` (``workloads``: the drain's
        policy, ``--recreate-workloads``), a device probe on each (``probes``) and collect
        ``after-recreate`` (what :meth:`record` takes); never raises."""
        ...
