"""The claim freeze around a migration's way back (``allocationPath.freezeClaims``) on fakes: the
rendered policy, its place in the journal (before the first node is touched, removed after the
last), idempotence, a freeze that cannot be proven in force stopping the rollback with no node
touched, and a crash after every entry of a frozen rollback ending with the freeze removed (the
lab test ``tests/lab/test_claim_freeze_lab.py`` proves the policy on the real kube-apiserver)."""

from __future__ import annotations

import contextlib
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.change.engine.orchestrator import rollback
from rollout.change.engine.resumption import resume, resume_rollback, unfinished_rollback
from rollout.change.kinds import claim_freeze as cf
from rollout.change.kinds.registry import recorded_kind
from rollout.change.plan.allocation_path_section import AllocationPath, parse_path_plan
from rollout.change.record.journal import Journal, Kind
from rollout.change.record.replay import status_of
from rollout.errors import InputError, Location
from rollout.models import NodeState
from tests.unit.fakes_change import Killed, fake_context
from tests.unit.test_allocation_path import (
    DEVICE_PLUGIN_LABEL,
    SETTINGS,
    FakeGpuCluster,
    _journal_kills_after,
    _path,
    _run,
    _setup,
)

FROZEN = replace(SETTINGS, freeze_claims=True)
NAME = "rollout-claim-freeze.gpu.example.com"
ROOT = Path(__file__).resolve().parents[2]


class FreezingCluster(FakeGpuCluster):
    """Also a ``FreezeWorld``: the objects applied are kept; a dry-run claim of a class is
    refused, in the API server's words, while a policy and its binding for it exist (after
    ``lag`` dry runs: a policy takes effect when the API server's informer has it)."""

    def __init__(self, clock: Any, lag: int = 1) -> None:
        super().__init__(clock)
        self.objects: dict[tuple[str, str], dict[str, Any]] = {}
        self.lag = lag
        self.applies = 0
        self.during: list[str] = []  # the nodes' labels written while frozen

    def apply_objects(self, objects: Any) -> None:
        self.applies += 1
        for o in objects:
            self.objects[(o["kind"], o["metadata"]["name"])] = o

    def delete_object(self, kind: str, name: str) -> bool:
        return self.objects.pop((kind, name), None) is not None

    def dry_run_create(self, obj: Any) -> str | None:
        if self.lag:
            self.lag -= 1
            return None
        cls = obj["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"]
        name = cf.name_of(cls)
        if ("ValidatingAdmissionPolicyBinding", name) not in self.objects:
            return None
        msg = self.objects[("ValidatingAdmissionPolicy", name)]["spec"]["validations"][0]
        return (
            f'resourceclaims.resource.k8s.io "x" is forbidden: ValidatingAdmissionPolicy '
            f"'{name}' with binding '{name}' denied request: {msg['message']}"
        )

    def patch_labels(self, node: str, expect: Any, labels: Any) -> None:
        if self.objects:
            self.during.append(node)
        super().patch_labels(node, expect, labels)


def _frozen_setup(tmp_path: Path, lag: int = 1) -> tuple[Any, FreezingCluster]:
    ctx, plain = _setup(tmp_path)
    cluster = FreezingCluster(plain.clock, lag)
    ctx.cluster = cluster
    return ctx, cluster


def _freeze_entries(journal: Journal) -> list[str]:
    return [
        f"{e.data['action']} {e.phase.value}"
        for e in journal.entries()
        if e.node is None and e.step == Kind.CLAIM_FREEZE
    ]


def test_the_policy_denies_creating_claims_and_templates_of_the_class_everywhere() -> None:
    policy, binding = cf.render("gpu.example.com", "20260101T000000Z-abc")
    assert policy["metadata"]["name"] == binding["metadata"]["name"] == NAME
    (rule,) = policy["spec"]["matchConstraints"]["resourceRules"]
    assert rule["operations"] == ["CREATE"]
    assert rule["resources"] == ["resourceclaims", "resourceclaimtemplates"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    (check,) = policy["spec"]["validations"]
    assert "r.exactly.deviceClassName == 'gpu.example.com'" in check["expression"]
    assert "firstAvailable" in check["expression"]  # every alternative of a request
    assert "change 20260101T000000Z-abc" in check["message"]
    assert binding["spec"] == {"policyName": NAME, "validationActions": ["Deny"]}  # all ns
    # a class name cannot end the CEL string literal
    (odd,) = cf.render("a'b", "c")[0]["spec"]["validations"]
    assert "== 'a\\'b'" in odd["expression"]


def test_the_plan_setting_defaults_off_and_must_be_a_boolean() -> None:
    base = {"groups": {"g": "dra"}, "driver": "d", "deviceClass": "c"}
    assert parse_path_plan(base, lambda f: Location(field=f)).settings.freeze_claims is False
    on = parse_path_plan({**base, "freezeClaims": True}, lambda f: Location(field=f))
    assert on.settings.freeze_claims is True
    with pytest.raises(InputError) as e:
        parse_path_plan({**base, "freezeClaims": "yes"}, lambda f: Location(field=f))
    assert "allocationPath.freezeClaims" in str(e.value) and "true or false" in str(e.value)


def test_a_frozen_rollback_freezes_before_the_first_node_and_thaws_after_the_last(
    tmp_path: Path,
) -> None:
    ctx, cluster = _frozen_setup(tmp_path)
    _run(ctx, canary_only=False, settings=FROZEN)
    assert _freeze_entries(ctx.journal) == []  # the forward move never freezes
    rollback(ctx)
    assert _freeze_entries(ctx.journal) == [
        "apply begin", "apply done", "remove begin", "remove done",
    ]  # fmt: skip
    entries = ctx.journal.entries()
    kinds = [e.step if e.node is None else f"{e.node} {e.step}" for e in entries]
    first_restore = next(i for i, e in enumerate(entries) if e.path and e.path.value == "restore")
    last_restore = max(i for i, e in enumerate(entries) if e.path and e.path.value == "restore")
    frozen = [i for i, e in enumerate(entries) if e.step == Kind.CLAIM_FREEZE]
    assert frozen[1] < first_restore and frozen[2] > last_restore, kinds
    done = next(e for e in entries if e.step == Kind.CLAIM_FREEZE and e.phase.value == "done")
    assert f"ValidatingAdmissionPolicy '{NAME}'" in done.data["refusal"]
    assert cluster.objects == {}
    assert sorted(set(cluster.during)) == ["n1", "n2"]  # every label write of the way back
    assert all(_path(cluster, n) == "device-plugin" for n in ("n1", "n2"))


def test_without_the_setting_no_policy_is_written(tmp_path: Path) -> None:
    ctx, cluster = _frozen_setup(tmp_path)
    _run(ctx, canary_only=False)
    rollback(ctx)
    assert _freeze_entries(ctx.journal) == [] and cluster.applies == 0


def test_a_freeze_never_in_force_stops_the_rollback_with_no_node_touched(tmp_path: Path) -> None:
    ctx, cluster = _frozen_setup(tmp_path, lag=10**6)
    _run(ctx, canary_only=False, settings=FROZEN)
    status = rollback(ctx)
    assert status.outcome == "rollback-failed"
    assert "claim freeze of DeviceClass gpu.example.com" in status.message
    assert "was still admitted" in status.message
    assert all(_path(cluster, n) == "dra" for n in ("n1", "n2"))  # untouched, fully on DRA
    assert not any(e.path and e.path.value == "restore" for e in ctx.journal.entries())
    # what was applied is removed at the change's end, as the journal said it was begun
    assert _freeze_entries(ctx.journal)[-1] == "remove done" and cluster.objects == {}


def test_applying_the_freeze_twice_is_one_freeze() -> None:
    from rollout.change.record.journal import Entry
    from rollout.models import Phase

    def e(action: str, phase: Phase) -> Entry:
        return Entry("t", "c", Kind.CLAIM_FREEZE, phase, data={"action": action, "policy": NAME})

    assert cf.applied([e("apply", Phase.BEGIN)]) is not None  # begun: maybe written
    assert cf.applied([e("apply", Phase.BEGIN), e("apply", Phase.FAILED)]) is not None
    done = [e("apply", Phase.BEGIN), e("apply", Phase.DONE), e("remove", Phase.BEGIN)]
    assert cf.applied(done) is not None  # a removal begun is not a removal
    assert cf.applied([*done, e("remove", Phase.DONE)]) is None


def test_a_crash_after_every_entry_of_a_frozen_rollback_ends_thawed(tmp_path: Path) -> None:
    ctx, _ = _frozen_setup(tmp_path / "count")
    _run(ctx, settings=FROZEN)
    before = len(ctx.journal.entries())
    rollback(ctx)
    total = len(ctx.journal.entries()) - before
    for k in range(1, total + 1):
        ctx, cluster = _frozen_setup(tmp_path / str(k))
        _run(ctx, settings=FROZEN)
        _journal_kills_after(ctx, k)
        with contextlib.suppress(Killed):
            rollback(ctx)
        journal = Journal.open(tmp_path / str(k), ctx.journal.change_id)
        again = fake_context(cluster, ctx.runner, journal)  # another process, the same record
        again.clock = cluster.clock
        again.verify_timeout_s = 60
        again.kind = recorded_kind(status_of(journal).info)
        pending = unfinished_rollback(journal.entries())
        if pending is not None:
            resume_rollback(again, pending)
        else:
            resume(again)
        n1 = status_of(journal).nodes["n1"]
        assert n1.state is NodeState.RESTORED, (k, n1)
        assert cluster.nodes["n1"].info.labels == {DEVICE_PLUGIN_LABEL: "true"}, k
        assert cluster.objects == {}, k  # the freeze is gone, whichever entry was the last
        assert cf.applied(journal.entries()) is None, k
        assert cluster.both == [], k


def test_the_freeze_rbac_is_its_own_manifest_and_covers_every_call() -> None:
    from rollout.kube.freeze import NEEDS

    granted = set()
    for d in yaml.safe_load_all((ROOT / "deploy" / "claim-freeze-rbac.yaml").read_text()):
        if d and d["kind"] == "ClusterRole":
            for r in d["rules"]:
                granted |= {
                    (g, res, v)
                    for g in r["apiGroups"]
                    for res in r["resources"]
                    for v in r["verbs"]
                }
    assert granted >= NEEDS


def test_a_restore_of_a_node_that_never_moved_to_dra_does_not_freeze() -> None:
    rec = {"target": AllocationPath.DEVICE_PLUGIN.value, "settings": {"freeze_claims": True}}
    assert cf.wanted([rec]) is None
    assert cf.wanted([{**rec, "target": "dra", "settings": {"freeze_claims": True,
                       "device_class": "c"}}]) == "c"  # fmt: skip
