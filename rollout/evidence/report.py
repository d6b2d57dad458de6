"""The evidence report of one change, built from its journal (and collected node data).

Why from the journal: the report must say what was run, not what someone remembers. Everything in
it is derived from the change's journal entries — every node's state over time, each gate
decision with the counts it saw, each file with its hash before and after — plus the evidence
checks over the node data collected around the change (``rollout.evidence.checks``). Building the
report
is pure (entries and collections in, a :class:`Report` out); rendering is Jinja2 into Markdown, one
self-contained HTML page with inline SVG, or JSON.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path as FsPath
from typing import Any

from rollout.change.kinds.kubelet_record import NodeRecord
from rollout.change.record.entries import (
    BenchRun,
    BenchVerdict,
    ChangeBegin,
    GateRecord,
    NodeStep,
    Recovery,
    VerdictRecord,
)
from rollout.change.record.journal import CHANGE_STEP, Entry, Journal, Kind
from rollout.change.record.replay import NodeStatus, apply_entry, replay
from rollout.errors import InputError, Location
from rollout.evidence.checks import Check, Collection, evaluate, overall, parse_collections
from rollout.evidence.svg import rejection_chart, state_timeline
from rollout.evidence.templating import render_template
from rollout.models import Phase

EVIDENCE_FILE = "evidence.json"


@dataclass(frozen=True)
class NodeEvent:
    """One journaled node step, with the node's state right after it."""

    ts: str
    node: str
    step: str
    phase: str
    path: str
    state: str
    message: str = ""


@dataclass(frozen=True)
class GateDecision:
    """A gate decision as journaled, with the counts behind it (when the gate recorded them).

    Attributes:
        source: ``gate`` (the orchestrator's seam), ``verdict`` (the soak gate, with inputs) or
            ``recovery`` (after an automatic rollback: whether the rejected owners run again).
        rate: rejections / admissions over the canary nodes, for the signal with the highest rate
            (None when the entry carries no counts).
    """

    ts: str
    source: str
    status: str
    reason: str
    nodes: tuple[str, ...] = ()
    admissions: int | None = None
    rejections: int | None = None
    rate: float | None = None
    threshold: float | None = None
    signal: str = ""


@dataclass(frozen=True)
class FileChange:
    """A node file the change wrote or removed, with its sha256 before and after."""

    node: str
    path: str
    existed: bool
    before_sha256: str
    after_sha256: str
    mode: str = ""


@dataclass(frozen=True)
class Report:
    """Everything the report shows."""

    change: str
    outcome: str
    message: str
    started: str
    ended: str
    info: ChangeBegin
    nodes: Mapping[str, str]
    events: tuple[NodeEvent, ...]
    decisions: tuple[GateDecision, ...]
    files: tuple[FileChange, ...]
    checks: tuple[Check, ...]
    evidence_source: str
    window: Mapping[str, Any] = field(default_factory=dict)
    bench: tuple[Mapping[str, Any], ...] = ()
    bench_verdict: BenchVerdict | None = None
    tenancy: tuple[Mapping[str, Any], ...] = ()

    @property
    def evidence_status(self) -> str:
        return str(overall(self.checks))

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready (``rollout report -o json``)."""
        return {
            "change": self.change,
            "outcome": self.outcome,
            "message": self.message,
            "started": self.started,
            "ended": self.ended,
            "window": dict(self.window),
            "promotion": self.info.promotion.data() if self.info.promotion else None,
            "nodes": dict(self.nodes),
            "timeline": [vars(e) for e in self.events],
            "gateDecisions": [{**vars(d), "nodes": list(d.nodes)} for d in self.decisions],
            "files": [vars(f) for f in self.files],
            "evidence": {
                "source": self.evidence_source,
                "status": self.evidence_status,
                "checks": [c.as_dict() for c in self.checks],
            },
            "bench": [dict(b) for b in self.bench],
            "stage": self.info.stage.data() if self.info.stage else None,
            "benchVerdict": self.bench_verdict.summary() if self.bench_verdict else None,
            "tenancy": [dict(t) for t in self.tenancy],
        }


def _counts(verdict: VerdictRecord) -> tuple[str, int, int] | None:
    """(signal, admissions, rejections) of the signal with the highest rejection rate."""
    best: tuple[float, str, int, int] | None = None
    for name, adm, rej in verdict.signals():
        rate = rej / adm if adm else 0.0
        if best is None or rate > best[0]:
            best = (rate, name, adm, rej)
    return None if best is None else (best[1], best[2], best[3])


def _decision(e: Entry) -> GateDecision | None:
    if e.step == Kind.GATE:
        if e.phase is not Phase.DONE:
            return None  # the soak began; the verdict is the done entry
        g = GateRecord.read(e.data)
        return GateDecision(e.ts, "gate", g.status, g.reason, g.nodes)
    if e.step == Kind.RECOVERY:  # after an automatic rollback: do the rejected owners run again?
        r = Recovery.read(e.data)
        down, up = r.not_running, r.running
        said = [f"Running again: {', '.join(up)}"] if up else []
        said += [f"NOT Running after {r.waited:g}s: {', '.join(down)}"] if down else []
        status = "workload NOT running" if down else "workload running"
        return GateDecision(e.ts, "recovery", status, "; ".join(said))
    if e.step != Kind.VERDICT:
        return None
    v = VerdictRecord.read(e.data)
    counts = _counts(v)
    signal, adm, rej = counts if counts else ("", None, None)
    rate = (rej / adm if adm else 0.0) if adm is not None and rej is not None else None
    return GateDecision(
        ts=e.ts,
        source="verdict",
        status=v.status,
        reason=v.reason,
        nodes=v.nodes,
        admissions=adm,
        rejections=rej,
        rate=rate,
        threshold=v.threshold,
        signal=signal,
    )


def build_report(
    entries: Sequence[Entry],
    collections: Sequence[Collection] = (),
    evidence_source: str = "not collected",
    bench: Sequence[Mapping[str, Any]] = (),
) -> Report:
    """The report of a change (pure).

    Args:
        entries: the change's journal entries, in order.
        collections: node data collected before / after / after the pods were recreated.
        evidence_source: where the collections came from, for the report ("not collected").
        bench: ``rollout bench`` records from the evidence file; the journal's ``bench``
            entries (the last per node, a failed one included) take precedence.
    """
    status = replay(entries)
    states: dict[str, NodeStatus] = {n: NodeStatus(node=n) for n in status.nodes}
    events, decisions = [], []
    window: dict[str, Any] = {}
    files: dict[tuple[str, str], FileChange] = {}
    # per node and label (gate.bench journals a "before" and an "after" run of each canary)
    benched: dict[tuple[str, str], Mapping[str, Any]] = {
        (str(b.get("node")), str(b.get("label") or "")): b for b in bench
    }
    for e in entries:
        if e.node is None and e.step == Kind.BENCH:
            run = BenchRun.read(e.data)
            benched[(run.node, run.label)] = run.record
            continue
        if e.node is None:
            if e.step == CHANGE_STEP and e.phase is Phase.BEGIN:
                begin = ChangeBegin.read(e.data)
                window = dict(begin.window) if begin.window is not None else window
            dec = _decision(e)
            if dec is not None:
                decisions.append(dec)
            continue
        s = apply_entry(states.get(e.node, NodeStatus(node=e.node)), e)
        states[e.node] = s
        events.append(
            NodeEvent(
                e.ts, e.node, e.step, e.phase.value, (e.path.value if e.path else "forward"),
                s.state.value, NodeStep(e.data).message,
            )
        )  # fmt: skip
        if e.step == "backup" and e.phase.value == "done":
            step = NodeStep(e.data)
            after = {f.path: f for f in NodeRecord.read(step.record).files}
            for b in step.backups:
                a = after.get(b.path)
                files[(e.node, b.path)] = FileChange(
                    node=e.node,
                    path=b.path,
                    existed=b.existed,
                    before_sha256=b.sha256,
                    after_sha256=a.sha256 if a else "",
                    mode=a.mode if a else b.mode,
                )
    return Report(
        change=status.change,
        outcome=status.outcome,
        message=status.message,
        started=entries[0].ts if entries else "",
        ended=entries[-1].ts if entries else "",
        info=status.info,
        nodes={n: s.state.value for n, s in status.nodes.items()},
        events=tuple(events),
        decisions=tuple(decisions),
        files=tuple(files[k] for k in sorted(files)),
        checks=tuple(evaluate(collections)),
        evidence_source=evidence_source,
        window=window,
        bench=tuple(benched.values()),
        bench_verdict=status.bench,
        tenancy=tenancy_audits(collections),
    )


def tenancy_audits(collections: Sequence[Collection]) -> tuple[Mapping[str, Any], ...]:
    """The tenancy audit of each collection that took one (before, after, ...): the audit as
    ``rollout tenancy audit -o json`` prints it, with the collection's ``label`` and ``at``."""
    return tuple(
        {**c.tenancy, "label": c.label, "at": c.at} for c in collections if c.tenancy is not None
    )


def _seconds(ts: str, t0: datetime) -> float:
    return (datetime.fromisoformat(ts) - t0).total_seconds()


def state_spans(report: Report) -> tuple[dict[str, list[tuple[float, float, str]]], float]:
    """Per node, (start, end, state) spans in seconds since the change began, and the end."""
    if not report.started:
        return {n: [] for n in report.nodes}, 0.0
    t0 = datetime.fromisoformat(report.started)
    t_end = _seconds(report.ended, t0)
    spans: dict[str, list[tuple[float, float, str]]] = {n: [] for n in report.nodes}
    current: dict[str, tuple[float, str]] = {n: (0.0, "pending") for n in report.nodes}
    for ev in report.events:
        t = _seconds(ev.ts, t0)
        start, state = current.get(ev.node, (0.0, "pending"))
        if ev.state != state:
            spans.setdefault(ev.node, []).append((start, t, state))
            current[ev.node] = (t, ev.state)
    for node, (start, state) in current.items():
        spans.setdefault(node, []).append((start, max(t_end, start), state))
    return spans, t_end


def rate_points(report: Report) -> tuple[list[tuple[float, float]], float | None]:
    """(seconds, rate) of every gate verdict with counts, and the threshold they were judged by."""
    if not report.started:
        return [], None
    t0 = datetime.fromisoformat(report.started)
    points = [(_seconds(d.ts, t0), d.rate) for d in report.decisions if d.rate is not None]
    thresholds = [d.threshold for d in report.decisions if d.threshold is not None]
    return [(t, r) for t, r in points if r is not None], (thresholds[-1] if thresholds else None)


def render(report: Report, fmt: str, default_threshold: float = 0.05) -> str:
    """The report as ``markdown``, ``html`` (self-contained, inline SVG) or ``json``."""
    if fmt == "json":
        return json.dumps(report.as_dict(), indent=2, sort_keys=True)
    ctx: dict[str, Any] = {"r": report}
    if fmt == "html":
        spans, t_end = state_spans(report)
        points, threshold = rate_points(report)
        ctx["rate_svg"] = rejection_chart(
            points, threshold if threshold is not None else default_threshold
        )
        ctx["timeline_svg"] = state_timeline(spans, t_end)
        return render_template("report.html.j2", ctx, html=True)
    return render_template("report.md.j2", ctx)


def load_report(journal: Journal, evidence_file: FsPath | None = None) -> Report:
    """Read a change's journal and its evidence (``--evidence FILE``, else ``evidence.json`` in
    the change directory, else none) and build the report.

    Raises:
        InputError: the journal or the evidence file is unreadable (file named).
    """
    path = evidence_file or journal.dir / EVIDENCE_FILE
    collections: tuple[Collection, ...] = ()
    bench: list[Mapping[str, Any]] = []
    source = "not collected"
    if evidence_file is not None or path.is_file():
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except OSError as e:
            raise InputError(f"cannot read evidence: {e}", Location(file=str(path))) from e
        except json.JSONDecodeError as e:
            raise InputError(
                f"invalid JSON: {e.msg}", Location(file=str(path), line=e.lineno)
            ) from e
        if not isinstance(raw, Mapping):
            raise InputError("must be a JSON object with 'collections'", Location(file=str(path)))
        collections = parse_collections(raw)
        bench = [b for b in raw.get("bench") or () if isinstance(b, Mapping)]
        source = str(path)
    return build_report(journal.entries(), collections, source, bench)
