"""``rollout migrate``'s plan and inventory reading, and what its dry run lists (pure parts)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.change.allocation_path import AllocationPath, path_plan_of, targets_of, works_of
from rollout.change.inventory import Inventory
from rollout.change.migrating import PreparedMigration
from rollout.change.plan import parse_plan
from rollout.change.planning import DrainPolicy, Strategy, make_batches
from rollout.change.windows import guard
from rollout.errors import InputError
from rollout.models import PodRef

PLAN = """\
apiVersion: rollout.dev/v1alpha1
kind: RolloutPlan
allocationPath:
  groups:
    pool-a: dra
    pool-b: device-plugin
  driver: gpu.example.com
  deviceClass: gpu.example.com
strategy:
  maxUnavailable: 1
"""


def _inv(**groups: tuple[str, ...]) -> Inventory:
    hosts = tuple(h for g in groups.values() for h in g)
    return Inventory(Path("inv.ini"), tuple(dict.fromkeys(hosts)), groups, {})


def test_the_plan_section_maps_each_group_to_its_path_in_inventory_order() -> None:
    plan = parse_plan(PLAN, "plan.yaml")
    inv = _inv(**{"pool-a": ("a1", "a2"), "pool-b": ("b1",), "canary": ("a1",)})
    targets = targets_of(inv, path_plan_of(plan), plan)
    assert targets == {
        "a1": AllocationPath.DRA,
        "a2": AllocationPath.DRA,
        "b1": AllocationPath.DEVICE_PLUGIN,
    }
    works = works_of(plan, inv, terminate_claims=True)
    assert (
        works["a1"].settings.terminate_claims and works["b1"].target is AllocationPath.DEVICE_PLUGIN
    )


def test_a_missing_section_group_or_a_node_sent_two_ways_is_refused_with_its_line() -> None:
    bare = parse_plan("apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\n", "p.yaml")
    with pytest.raises(InputError, match="no allocationPath section"):
        path_plan_of(bare)
    plan = parse_plan(PLAN, "plan.yaml")
    with pytest.raises(InputError, match=r"plan.yaml:6.*has no group 'pool-b'"):
        targets_of(_inv(**{"pool-a": ("a1",)}), path_plan_of(plan), plan)
    both = _inv(**{"pool-a": ("n1",), "pool-b": ("n1",)})
    with pytest.raises(InputError, match="node n1 is in two groups that end on different paths"):
        targets_of(both, path_plan_of(plan), plan)


def test_the_dry_run_lists_every_batch_step_and_evicted_pod() -> None:
    plan = parse_plan(PLAN, "plan.yaml")
    inv = _inv(**{"pool-a": ("a1",), "pool-b": ("b1",), "canary": ("a1",)})
    works = works_of(plan, inv)
    ready = PreparedMigration(
        plan=plan,
        path_plan=path_plan_of(plan),
        inventory=inv,
        works=works,
        batches=make_batches(list(works), ["a1"], Strategy(max_unavailable=1), False),
        pods={
            "a1": [
                PodRef("ml", "train", node="a1", uid="u"),
                PodRef("kube-system", "dp", node="a1", uid="d", daemonset=True),
            ]
        },
        drain=DrainPolicy(),
        window_check=guard((), None),
    )
    doc = ready.to_dict()
    assert doc["kind"] == "allocation-path"
    assert doc["batches"] == [{"canary": True, "nodes": ["a1"]}, {"canary": False, "nodes": ["b1"]}]
    a1, b1 = doc["nodes"]
    assert [s.split()[0] for s in a1["steps"]] == [
        "preflight", "cordon", "drain", "release", "switch", "start-driver", "verify", "uncordon",
    ]  # fmt: skip
    assert [s.split()[0] for s in b1["steps"]][3:7] == [
        "release", "stop-driver", "slices-gone", "switch",
    ]  # fmt: skip
    assert a1["evicts"] == ["ml/train"]  # DaemonSet pods stay, as kubectl drain --ignore-daemonsets
