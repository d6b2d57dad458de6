"""What the change's engine calls back into a layer above it (``rollout.evidence``) for."""

from __future__ import annotations

from typing import Any, Protocol

from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.record.journal import Journal


class EvidenceHooks(Protocol):
    """How ``apply`` and ``promote`` collect and journal their evidence
    (``rollout.evidence.collecting.ChangeEvidence``)."""

    def collect(self, journal: Journal, label: str, nodes: list[str], raw_facts: Any = None) -> Any:
        """Collect ``label`` evidence of ``nodes`` into ``evidence.json`` beside the journal;
        never raises (a failed collection never stops the change)."""
        ...

    def open_sessions(self, nodes: list[str]) -> None:
        """Open what a later :meth:`collect` of ``nodes`` connects with (their facts sessions),
        reading nothing yet; never raises."""
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


def recreate_evidence(
    evidence: EvidenceHooks,
    journal: Journal,
    applied: list[str],
    *,
    probes: bool,
    workloads: DrainPolicy | None,
) -> None:
    """The ``after-recreate`` evidence of the ``applied`` nodes, when the operator asked for
    it: ``probes`` (``--recreate-probes``, the tool's own probe pods) and ``workloads``
    (``--recreate-workloads``: the operator's pods, evicted under the drain's policy). Without
    either nothing is recreated and nothing collected
    (``tests/unit/test_recreate_workloads.py::test_without_the_flag_no_pod_is_recreated``)."""
    if not applied or not (probes or workloads is not None):
        return
    recreated = evidence.after_recreate(journal, applied, workloads=workloads, probes=probes)
    evidence.record(journal, "after-recreate", applied, recreated)
