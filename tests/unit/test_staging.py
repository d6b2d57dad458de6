"""A staged plan (``stages:``): parsing, the kubelet each stage renders, and which stage
``apply`` runs next (:func:`rollout.change.commands.stages.choose_stage`, pure)."""

from __future__ import annotations

import json

import pytest

from rollout.change.commands.stages import StageRun, begin_stage, choose_stage, stage_info
from rollout.change.plan.schema import parse_plan
from rollout.change.record.entries import ChangeBegin, Stage
from rollout.errors import InputError, Location

STAGED = """\
apiVersion: rollout.dev/v1alpha1
kind: RolloutPlan
metadata:
  name: tighten
kubelet:
  cpuManagerPolicy: static
  topologyManagerScope: pod
stages:
  - name: restricted
    kubelet:
      topologyManagerPolicy: restricted
  - name: single-numa-node
    kubelet:
      topologyManagerPolicy: single-numa-node
nodes:
  gpu-1:
    kubelet:
      topologyManagerScope: container
gate:
  bench: {standin: true}
"""
PLAN = parse_plan(STAGED, "plan.yaml")


def test_each_stage_merges_its_kubelet_over_the_plans() -> None:
    assert [s.name for s in PLAN.stages] == ["restricted", "single-numa-node"]
    assert PLAN.stage is None and "topologyManagerPolicy" not in PLAN.kubelet
    second = PLAN.at_stage(1)
    assert second.stage == 1
    assert second.kubelet_for("gpu-2") == {
        "cpuManagerPolicy": "static",
        "topologyManagerScope": "pod",
        "topologyManagerPolicy": "single-numa-node",
    }
    assert second.kubelet_for("gpu-1")["topologyManagerScope"] == "container"  # node override
    stage = stage_info(second)
    assert stage == Stage("tighten", 1, "single-numa-node", 2)
    assert stage.data() == {"plan": "tighten", "index": 1, "name": "single-numa-node", "count": 2}
    # a change that recorded its stage gets the same plan back (promote, resume, rollback)
    assert PLAN.for_change(ChangeBegin.read({"stage": {"index": 1}})).kubelet == second.kubelet
    assert PLAN.for_change(ChangeBegin()).kubelet == PLAN.kubelet and stage_info(PLAN) is None
    with pytest.raises(InputError, match="no stage 3"):
        PLAN.at_stage(2)


@pytest.mark.parametrize(
    ("stages", "field", "words"),
    [
        ("stages: []\n", "stages", "non-empty list"),
        ("stages: {a: 1}\n", "stages", "non-empty list"),
        ("stages:\n  - kubelet: {a: 1}\n", "stages[0].name", "needs a name"),
        ("stages:\n  - name: a\n", "stages[0]", "kubelet fragment"),
        ("stages:\n  - name: a\n    kubelt: {}\n", "stages[0].kubelt", "kubelet"),
        (
            "stages:\n  - name: a\n    kubelet: {x: 1}\n  - name: a\n    kubelet: {x: 2}\n",
            "stages[1].name",
            "used twice",
        ),
    ],
)
def test_bad_stages_are_named_by_field_and_line(stages: str, field: str, words: str) -> None:
    text = "apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\n" + stages
    with pytest.raises(InputError, match=words) as e:
        parse_plan(text, "plan.yaml")
    assert e.value.location.field == field and e.value.location.line is not None


def test_a_staged_plan_without_gate_bench_is_refused_where_it_is_parsed() -> None:
    """More than one stage needs ``gate.bench`` (the next stage starts on its verdict): the plan's
    one parse refuses it, naming ``stages`` and its line, for every command alike."""
    no_bench = STAGED.replace("gate:\n  bench: {standin: true}\n", "")
    with pytest.raises(InputError, match=r"more than one stage needs gate\.bench") as e:
        parse_plan(no_bench, "plan.yaml")
    assert e.value.location == Location("plan.yaml", "stages", 8)
    assert str(e.value).startswith("plan.yaml:8, field 'stages': ")
    empty_gate = no_bench + "gate: {}\n"  # a gate without a bench is no better
    with pytest.raises(InputError, match="more than one stage"):
        parse_plan(empty_gate, "plan.yaml")
    one = parse_plan(no_bench.split("  - name: single-numa-node")[0], "plan.yaml")
    assert len(one.stages) == 1 and one.gate is None  # one stage needs no benchmark


def run(change: str, index: int, outcome: str, tightening: str = "", reason: str = "") -> StageRun:
    name = PLAN.stages[index].name
    return StageRun(change, index, name, outcome, tightening, reason)


@pytest.mark.parametrize(
    ("runs", "index", "words"),
    [
        ([], 0, "stage 1/2 (restricted): first stage"),
        ([run("c1", 0, "rolled-back")], 0, "earlier tries: c1 rolled-back"),
        ([run("c1", 0, "held")], None, "in progress in change c1 (held): promote it"),
        ([run("c1", 0, "running")], None, "rollout promote --change c1"),
        (
            [run("c1", 0, "completed", "Successful", "aligned P99 8 ms")],
            1,
            "stage 1/2 (restricted) promoted, tightening allowed",
        ),
        (
            [run("c1", 0, "completed", "Failed", "aligned-advantage: no aligned advantage")],
            None,
            "stage 2/2 (single-numa-node) held: stage 1/2 (restricted)'s benchmark does not "
            "allow tightening (change c1, aligned advantage Failed): aligned-advantage: no",
        ),
        ([run("c1", 0, "completed", "Inconclusive", "simulated")], None, "Inconclusive"),
        ([run("c1", 0, "completed")], None, "no bench-verdict"),
        (
            # the latest promotion decides: a later try of stage 1 that showed the advantage
            [
                run("c1", 0, "completed", "Failed", "no aligned advantage"),
                run("c2", 0, "completed", "Successful", "ok"),
            ],
            1,
            "tightening allowed",
        ),
        (
            [run("c1", 0, "completed", "Successful"), run("c2", 1, "completed", "Successful")],
            None,
            "every stage of plan tighten is promoted",
        ),
        ([run("c1", 0, "completed", "Successful"), run("c2", 1, "held")], None, "change c2"),
    ],
)
def test_choose_stage(runs: list[StageRun], index: int | None, words: str) -> None:
    got = choose_stage(PLAN, runs)
    assert got.index == index, got.reason
    assert words in got.reason


def test_a_renamed_stage_starts_over_and_history_names_each_promotion() -> None:
    other = StageRun("c1", 0, "permissive", "completed", "Successful")
    assert choose_stage(PLAN, [other]).index == 0  # not this plan's restricted stage
    got = choose_stage(PLAN, [run("c1", 0, "completed", "Successful")])
    assert got.history == (
        "stage 1/2 (restricted): promoted in change c1; aligned advantage Successful",
    )


def test_begin_stage_reads_the_first_change_begin() -> None:
    lines = [
        json.dumps({"step": "drain-overrides", "phase": "done", "data": {}}),
        "not json",
        json.dumps({"step": "change", "phase": "begin", "data": {"stage": {"index": 0}}}),
    ]
    assert begin_stage(lines) == Stage.read({"index": 0})
    assert begin_stage(lines) == Stage(plan="", index=0, name="", count=0)
    assert begin_stage([json.dumps({"step": "change", "phase": "begin", "data": {}})]) is None
