"""The gate as the commands run it, assembled from its parts: the plan's ``gate:`` section, the
signals (API watch, kubelet counters, Prometheus), probe pods, node Events, the journal, and the
rollback policy over the soak (``rollout.gate.soaking``).

Why in the gate layer and not the CLI: ``apply``, ``promote``, ``resume`` and ``watch`` build the
same gate, and the change session (a layer below) receives it as a factory.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from rollout.change.engine.orchestrator import NoGate, node_pool
from rollout.change.plan.gate_section import GateConfig
from rollout.change.plan.schema import Plan
from rollout.change.record.journal import Journal
from rollout.change.record.replay import status_of
from rollout.gate.analysis import Predicted
from rollout.gate.soaking import RollbackPolicyGate, SoakGate
from rollout.interrupt import Interrupt
from rollout.models import Phase
from rollout.protocols import Gate

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.kube.client import Api


def gate_progress(output: str, to: Callable[[str], None] | None) -> Callable[[str], None]:
    """Where the soak's progress lines go: nowhere unless ``output`` is ``text``; to ``to``
    when given (``apply``'s live progress), else standard error."""
    if output != "text":
        return lambda _m: None
    if to is not None:
        return lambda m: to(f"gate: {m}")
    return lambda m: print(f"gate: {m}", file=sys.stderr, flush=True)


def build_soak_gate(
    cfg: GateConfig,
    api: Api,
    *,
    since: float,
    record: Any,
    control: Sequence[str] = (),
    metrics: Any = None,
    output: str = "text",
    progress: Callable[[str], None] | None = None,
    predicted: Predicted | None = None,
    interrupt: Interrupt | None = None,
) -> Any:
    """The real gate, as ``rollout watch`` and ``rollout apply`` both run it.

    Signals: the API (pod watch per node + kubelet Warning events; its ``wait`` is the gate's
    ``sleep``, so a rejection wakes the gate at once), the kubelet's counters through the node
    proxy, and Prometheus when configured. Probe pods when ``cfg.probes``; Events on each node;
    every verdict to ``record`` (the change's journal).

    Args:
        cfg: the gate configuration.
        api: the ``rollout.kube.client.connect`` result.
        since: the change's start (pods created before it are baseline, not samples).
        record: the journal recorder ``(kind, data)``.
        control: control-group nodes (baseline ``control-group``).
        metrics: a ``rollout.gate.serve.GateMetrics`` or None.
        output: ``text`` prints one progress line per evaluation on stderr.
        progress: where those lines go instead (``apply``'s live progress), when given.
        predicted: (node, owner) pairs the admission preview predicted rejected (``apply``,
            ``resume``, ``promote``); None for ``rollout watch``, which runs no preview.

    Returns:
        A ``rollout.gate.soaking.SoakGate``.
    """
    from rollout.kube.probing import NodeEvents, ProbePods
    from rollout.kube.scraping import KubeletSignal, NodeProxyFetcher
    from rollout.kube.watching import ApiSignal

    api_signal = ApiSignal(api, since=since, window=cfg.window)
    signals: list[Any] = [api_signal, KubeletSignal(NodeProxyFetcher(api), cfg.window)]
    if cfg.prometheus is not None:
        from rollout.gate.prometheus import PrometheusSignal

        signals.append(PrometheusSignal(cfg.prometheus))
    say = gate_progress(output, progress)
    return SoakGate(
        cfg,
        signals,
        clock=time.time,
        sleep=api_signal.wait,
        control=control,
        probes=ProbePods(api, say=say) if cfg.probes else None,
        events=NodeEvents(api),
        record=record,
        metrics=metrics,
        progress=say,
        predicted=predicted,
        interrupt=interrupt,
    )


def gate_for(
    plan: Plan,
    api: Api,
    journal: Journal,
    output: str,
    inv: Inventory,
    progress: Callable[[str], None] | None = None,
    interrupt: Interrupt | None = None,
    predicted: Predicted | None = None,
) -> Gate:
    """The gate run after the canary batch: the rejection-rate gate when the plan has a ``gate:``
    section (built as ``rollout watch`` builds it, journaling into this change), else none.

    With ``interrupt``, the soak ends the moment it is set (a rollback handed to this owner).
    ``predicted``: (node, owner) pairs the admission preview predicted rejected, so a Failed
    verdict says which rejections were expected
    (``rollout.kubelet.admission.node_preview.predicted_rejections``)."""

    cfg = plan.gate
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
        interrupt=interrupt,
    )
    from rollout.kube.workloads import owner_running, rejected_owners_on

    since = time.time()
    return RollbackPolicyGate(
        soak,
        record,
        lambda: node_pool(status_of(journal)),
        lambda owner: owner_running(api, owner),
        lambda nodes: rejected_owners_on(api, list(nodes), since),
    )
