"""The gate's verdict vocabulary as plain data: signal states in, findings and verdicts out.

Why in the bottom layer: the verdict is produced by the gate (``rollout.gate.analysis``), read by
the change engine (``Gate.evaluate`` returns it), recorded in journals and fed by the signals in
``rollout.kube`` (which build ``SignalState``). Plain frozen dataclasses and one enum, no logic
beyond formatting, so every layer may import them without importing the gate.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from rollout.samples import NodeCounts


class Outcome(StrEnum):
    """The four verdicts (argo-rollouts' vocabulary). ``VerdictStatus`` is the same enum."""

    SUCCESSFUL = "Successful"
    INCONCLUSIVE = "Inconclusive"
    ERROR = "Error"
    FAILED = "Failed"

    @property
    def severity(self) -> int:
        return _SEVERITY[self]


_SEVERITY = {
    Outcome.SUCCESSFUL: 0,
    Outcome.INCONCLUSIVE: 1,
    Outcome.ERROR: 2,
    Outcome.FAILED: 3,
}


#: The name the orchestrator's models use for the same enum.
VerdictStatus = Outcome


@dataclass(frozen=True)
class SignalState:
    """What one signal (``api``, ``kubelet``, ``prometheus``) says at evaluation time.

    Attributes:
        name: the signal's name, used in reasons.
        counts: per canary node, over the window (the last good data if the latest read failed).
        baseline: the baseline's counts (control group over the same window, or the canary nodes
            before the change); None when there is no baseline.
        consecutive_errors: reads that failed in a row, up to now.
        last_error: the latest failure's message.
        has_data: False until the signal has delivered one good read.
        rejections_only: the signal counts rejections but not admissions (a Prometheus query):
            any rejection above the baseline fails, and no rejection is no objection (it can
            never make the gate Inconclusive; the admission count comes from the other signals).
    """

    name: str
    counts: Mapping[str, NodeCounts]
    baseline: NodeCounts | None = None
    consecutive_errors: int = 0
    last_error: str | None = None
    has_data: bool = True
    rejections_only: bool = False


@dataclass(frozen=True)
class Finding:
    """One signal's verdict, with the nodes it concerns and a reason a person can read."""

    signal: str
    outcome: Outcome
    reason: str
    nodes: tuple[str, ...] = ()


@dataclass(frozen=True)
class Verdict:
    """The gate's decision at one moment, and why.

    This is the type the orchestrator's ``Gate.evaluate`` returns (``status`` and ``reason`` are
    what it reads).

    ``failed_nodes`` are the nodes a Failed verdict rolls back under ``rollback-affected``;
    ``waiting_for`` says what an Inconclusive or Error verdict holds for.
    """

    status: Outcome
    reason: str
    at: float = 0.0
    failed_nodes: tuple[str, ...] = ()
    waiting_for: str = ""
    findings: tuple[Finding, ...] = ()
    inputs: Mapping[str, Any] = field(default_factory=dict)

    @property
    def outcome(self) -> Outcome:
        """The verdict's value (``status`` under the name the analysis code uses)."""
        return self.status

    @property
    def passed(self) -> bool:
        return self.status is Outcome.SUCCESSFUL

    @property
    def holds(self) -> bool:
        return self.status in (Outcome.INCONCLUSIVE, Outcome.ERROR)

    def as_dict(self) -> dict[str, Any]:
        return {
            "outcome": str(self.status),
            "reason": self.reason,
            "at": self.at,
            "failedNodes": list(self.failed_nodes),
            "waitingFor": self.waiting_for,
            "findings": [
                {
                    "signal": f.signal,
                    "outcome": str(f.outcome),
                    "reason": f.reason,
                    "nodes": list(f.nodes),
                }
                for f in self.findings
            ],
            "inputs": dict(self.inputs),
        }
