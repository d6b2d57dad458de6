"""A staged plan (``stages:``): which stage ``apply`` runs next, and why the next one may start
or is held.

Each stage is a change of its own. ``apply`` runs the first stage that no change has promoted
(a change of that stage that ended ``completed``); it refuses

* a stage whose latest change is still ``running`` or ``held`` (promote or roll back that one
  first);
* any stage after the first unless the previous stage's promoted change journaled a
  ``bench-verdict`` whose aligned-advantage verdict is Successful
  (:func:`rollout.gate.performance.judge_tightening`): Failed (measured, no advantage),
  Inconclusive, Error or no verdict at all hold it;
* a plan whose every stage is promoted.

The record of the earlier stages is the cluster's (each change's journal, mirrored into the lock
namespace), so any machine with the kubeconfig makes the same choice. :func:`choose_stage` is
pure (``tests/unit/test_staging.py``); :func:`stage_history` reads the record.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rollout.change.plan.schema import Plan
from rollout.change.record.entries import BenchVerdict, ChangeBegin, Stage
from rollout.change.record.journal import CHANGE_STEP, Entry, Kind

if TYPE_CHECKING:
    from rollout.kube.client import Api


@dataclass(frozen=True)
class StageRun:
    """One change of a stage, as its journal tells it.

    Attributes:
        change: the change id.
        index: the stage (0-based).
        name: the stage's name when the change began.
        outcome: the change's outcome (``completed``: the stage is promoted).
        tightening: the aligned-advantage verdict of its ``bench-verdict`` entry
            (``Successful``, ``Failed``, ``Inconclusive``, ``Error``), or empty when it has none.
        reason: that verdict's reason.
    """

    change: str
    index: int
    name: str
    outcome: str
    tightening: str = ""
    reason: str = ""

    def as_dict(self) -> dict[str, Any]:
        return {
            "change": self.change,
            "index": self.index,
            "name": self.name,
            "outcome": self.outcome,
            "tightening": self.tightening,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class StageChoice:
    """The stage ``apply`` runs (``index``), or None and why not (``reason``); ``history``:
    one line per stage, what its changes did."""

    index: int | None
    reason: str
    history: tuple[str, ...] = ()


def stage_info(plan: Plan) -> Stage | None:
    """What a staged change records in its ``begin`` (``ChangeBegin.stage``)."""
    if plan.stage is None:
        return None
    return Stage(plan.name, plan.stage, plan.stages[plan.stage].name, len(plan.stages))


def _label(plan: Plan, i: int) -> str:
    return f"stage {i + 1}/{len(plan.stages)} ({plan.stages[i].name})"


def choose_stage(plan: Plan, runs: Iterable[StageRun]) -> StageChoice:
    """The stage to run next, from the plan's earlier changes (any order)."""
    ordered = sorted(runs, key=lambda r: r.change)
    history: list[str] = []
    for i, stage in enumerate(plan.stages):
        mine = [r for r in ordered if r.index == i and r.name == stage.name]
        promoted = [r for r in mine if r.outcome == "completed"]
        label = _label(plan, i)
        if promoted:
            last = promoted[-1]
            gate = f"; aligned advantage {last.tightening or 'not benched'}"
            history.append(f"{label}: promoted in change {last.change}{gate}")
            continue
        if mine and mine[-1].outcome in ("running", "held"):
            r = mine[-1]
            return StageChoice(
                None,
                f"{label} is in progress in change {r.change} ({r.outcome}): promote it "
                f"(rollout promote --change {r.change}) or roll it back first",
                tuple(history),
            )
        if i > 0:
            prev = [r for r in ordered if r.index == i - 1 and r.outcome == "completed"][-1]
            if prev.tightening != "Successful":
                why = prev.reason or "its change journaled no bench-verdict (no gate.bench)"
                verdict = prev.tightening or "none"
                return StageChoice(
                    None,
                    f"{label} held: {_label(plan, i - 1)}'s benchmark does not allow tightening "
                    f"(change {prev.change}, aligned advantage {verdict}): {why}",
                    tuple(history),
                )
        tried = f" (earlier tries: {', '.join(f'{r.change} {r.outcome}' for r in mine)})"
        go = "first stage" if i == 0 else f"{_label(plan, i - 1)} promoted, tightening allowed"
        return StageChoice(i, f"{label}: {go}{tried if mine else ''}", tuple(history))
    return StageChoice(
        None, f"every stage of plan {plan.name} is promoted; nothing to apply", tuple(history)
    )


def begin_stage(lines: Iterable[str]) -> Stage | None:
    """The ``stage`` a change's ``begin`` recorded, from its journal's lines (None: not staged,
    or no ``begin`` among them)."""
    for line in lines:
        try:
            doc = json.loads(line)
        except ValueError:
            continue
        if doc.get("step") == CHANGE_STEP and doc.get("phase") == "begin" and not doc.get("node"):
            data = doc.get("data")
            return ChangeBegin.read(data).stage if isinstance(data, Mapping) else None
    return None


def run_of(change: str, stage: Stage, entries: Sequence[Entry]) -> StageRun:
    """A staged change's :class:`StageRun` from its journal."""
    from rollout.change.record.replay import replay

    status = replay(entries, change)
    verdict = next(
        (
            BenchVerdict.read(e.data)
            for e in reversed(entries)
            if e.node is None and e.step == Kind.BENCH_VERDICT
        ),
        BenchVerdict(),
    )
    tight = verdict.tightening
    return StageRun(
        change=change,
        index=stage.index if stage.index is not None else -1,
        name=stage.name,
        outcome=str(status.outcome),
        tightening=tight.outcome or "",
        reason=tight.reason or "",
    )


def stage_history(
    api: Api, namespace: str, plan: Plan, say: Callable[[str], None]
) -> list[StageRun]:
    """The plan's staged changes in the cluster record (matched by ``metadata.name``): each
    change's first journal chunk is read, and the staged ones of this plan in full.

    Raises:
        ExternalError: the record could not be read.
    """
    from rollout.change.record.opening import existing_journal
    from rollout.kube.mirror import first_chunks

    out = []
    for change, text in sorted(first_chunks(api, namespace).items()):
        stage = begin_stage(text.splitlines())
        if stage is None or stage.plan != plan.name:
            continue
        journal = existing_journal(change, api, namespace, say)
        out.append(run_of(change, stage, journal.entries()))
    return out
