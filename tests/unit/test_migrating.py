"""``rollout migrate``'s plan and inventory reading, and what its dry run lists (pure parts)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rollout.ansible.hosts import Inventory
from rollout.change.commands.migrate_pool import PreparedMigration
from rollout.change.kinds.allocation_path import path_plan_of, targets_of, works_of
from rollout.change.kinds.allocation_preflight import PathWorld
from rollout.change.plan.allocation_path_section import AllocationPath
from rollout.change.plan.batches import make_batches
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.plan.schema import parse_plan
from rollout.change.plan.strategy import Strategy
from rollout.change.plan.windows import guard
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
        "preflight", "cordon", "drain", "release", "switch", "allocatable-zero", "start-driver",
        "verify", "uncordon",
    ]  # fmt: skip
    assert [s.split()[0] for s in b1["steps"]][3:7] == [
        "release", "stop-driver", "slices-gone", "switch",
    ]  # fmt: skip
    assert a1["evicts"] == ["ml/train"]  # DaemonSet pods stay, as kubectl drain --ignore-daemonsets


def _audit(ok: bool) -> Any:
    from rollout.change.tenancy.audit import Audit, Row

    got, by = ("refused", "") if ok else ("allowed", 'RoleBinding "ml/open"')
    row = Row("probe", "team-a", "user alice", "claim with adminAccess", "refused", got, by, ok)
    return Audit("pool", (row,), {"resource.k8s.io/v1": True})


@pytest.mark.parametrize("ok", [True, False])
def test_a_migration_of_a_pool_with_tenants_is_refused_while_its_tenancy_audit_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, ok: bool
) -> None:
    """issue 39 item 3: moving a pool to DRA runs the plan's tenancy audit in preflight; one
    that does not pass refuses the migration, naming the row, unless --force REASON, which the
    prepared migration carries for the journal (preflight-forced)."""
    from rollout.change.commands import migrate_pool
    from rollout.errors import PreflightError

    (tmp_path / "tenancy.yaml").write_text("kind: TenancyPolicy\n")
    plan = tmp_path / "plan.yaml"
    plan.write_text(PLAN + "tenancy: tenancy.yaml\n")
    inv = _inv(**{"pool-a": ("a1",), "pool-b": ("b1",), "canary": ("a1",)})
    audited: list[str] = []

    def audit(path: str, api: Any) -> Any:
        audited.append(path)
        return _audit(ok)

    monkeypatch.setattr(migrate_pool, "audit_plan_tenancy", audit)
    monkeypatch.setattr(
        migrate_pool, "read_world", lambda api, driver: PathWorld({}, {}, {}, [], [])
    )
    monkeypatch.setattr(migrate_pool, "path_refusals", lambda *a: [])
    monkeypatch.setattr("rollout.ansible.hosts.read_inventory", lambda p: inv)

    def prepare(force: str | None = None) -> Any:
        return migrate_pool.prepare_migration(
            object(), str(plan), Path("inv.ini"), True, False, dry_run=True, force=force
        )

    if ok:
        ready = prepare()
        assert ready.tenancy.result == "pass" and ready.forced == ()
        assert ready.to_dict()["tenancy"]["result"] == "pass"
    else:
        with pytest.raises(PreflightError) as e:
            prepare()
        msg = str(e.value)
        assert "tenancy audit of pool: fail" in msg
        assert (
            'claim with adminAccess: expected refused, got allowed (RoleBinding "ml/open")' in msg
        )
        assert "`--force REASON` overrides" in msg
        ready = prepare(force="change window CHG-1 approved")
        assert ready.force == "change window CHG-1 approved"
        assert ready.forced[0].startswith("tenancy audit of pool: fail")
        assert ready.to_dict()["forced"] == list(ready.forced)
    assert audited == [str(tmp_path / "tenancy.yaml")] * (1 if ok else 2)


PERCENT = PLAN.replace("maxUnavailable: 1", 'maxUnavailable: "50%"')
POOL4 = {"pool-a": ("a1", "a2", "a3", "a4"), "pool-b": ()}


def test_a_percentage_max_unavailable_is_of_the_pools_nodes_at_migrate(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """issue 38: ``maxUnavailable: 50%`` of a 4-node pool moves 2 nodes at a time, as apply
    resolves it against its change's nodes (it was resolved against one node: always 1)."""
    from rollout.change.commands import migrate_pool

    plan = tmp_path / "plan.yaml"
    plan.write_text(PERCENT)
    monkeypatch.setattr(
        migrate_pool, "read_world", lambda api, driver: PathWorld({}, {}, {}, [], [])
    )
    monkeypatch.setattr(migrate_pool, "path_refusals", lambda *a: [])
    monkeypatch.setattr("rollout.ansible.hosts.read_inventory", lambda p: _inv(**POOL4))
    ready = migrate_pool.prepare_migration(
        object(), str(plan), Path("inv.ini"), False, False, dry_run=True
    )
    assert [b.nodes for b in ready.batches] == [("a1", "a2"), ("a3", "a4")]
    assert ready.to_dict()["batches"] == [
        {"canary": False, "nodes": ["a1", "a2"]},
        {"canary": False, "nodes": ["a3", "a4"]},
    ]


def test_a_percentage_max_unavailable_is_of_the_migrations_nodes_at_promote(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The batches ``promote`` cuts for a held migration: 50% of its 4 nodes, the canary done
    or not, so the 3 left go 2 and 1 (not 1, 1, 1; nor 50% of the 3 left)."""
    from rollout.change.commands import migrate_pool, promote_change, session
    from rollout.change.record import replay
    from rollout.change.record.change_outcomes import ChangeOutcome
    from rollout.change.record.replay import ChangeStatus, NodeStatus
    from rollout.models import NodeState

    plan = parse_plan(PERCENT, "plan.yaml")
    nodes = {
        "a1": NodeStatus("a1", NodeState.APPLIED),
        **{n: NodeStatus(n, NodeState.PENDING) for n in ("a2", "a3", "a4")},
    }
    status = ChangeStatus("c1", nodes, ChangeOutcome.HELD)
    monkeypatch.setattr(replay, "replay", lambda entries, change_id: status)
    monkeypatch.setattr(promote_change, "promote_refusal", lambda s, g: None)
    monkeypatch.setattr(promote_change, "last_gate", lambda j: None)
    monkeypatch.setattr("rollout.change.plan.schema.recorded_plan", lambda info, c: plan)
    monkeypatch.setattr(session, "info_path", lambda j, key, given: Path("inv.ini"))
    monkeypatch.setattr("rollout.ansible.hosts.read_inventory", lambda p: _inv(**POOL4))
    monkeypatch.setattr(migrate_pool, "claims_consent", lambda entries: False)

    class Journal:
        change_id = "c1"

        def entries(self) -> list[Any]:
            return []

    promo = migrate_pool.prepare_migration_promotion(Journal(), None, dry_run=True)  # type: ignore[arg-type]
    assert [b.nodes for b in promo.remaining] == [("a2", "a3"), ("a4",)]
