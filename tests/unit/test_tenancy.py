"""The tenancy file, the rendered policy's shape, the audit's verdicts over fixed answers, and the
audit's RBAC manifest. The policy's behaviour against a real kube-apiserver is
tests/lab/test_tenancy_lab.py."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from click.testing import CliRunner

from rollout.change.tenancy import policy as tn
from rollout.change.tenancy.audit import Audit, Row, refused_by, run_audit
from rollout.change.tenancy.live_checks import read_facts
from rollout.cli import cli
from rollout.errors import InputError, PreflightError
from rollout.kube.tenancy import APPLY_NEEDS, NEEDS, Answer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tenancy.yaml"


def _parse(text: str) -> tn.Tenancy:
    return tn.parse(text, "t.yaml")


def test_the_example_parses_and_renders_a_policy_and_binding_each() -> None:
    t = tn.load(EXAMPLE)
    objs = tn.render(t)
    kinds = [(o["kind"], o["metadata"]["name"]) for o in objs]
    names = [n for k, n in kinds if k == "ValidatingAdmissionPolicy"]
    assert names == [
        "rollout-tenancy-gpu-claims-team-a",
        "rollout-tenancy-gpu-pods-team-a",
        "rollout-tenancy-gpu-namespace-labels",
        "rollout-tenancy-gpu-dra-objects",
        "rollout-tenancy-gpu-pool-nodes",
    ]
    bindings = {
        n: o for o in objs if o["kind"].endswith("Binding") for n in [o["metadata"]["name"]]
    }
    assert set(bindings) == set(names)
    claims = bindings["rollout-tenancy-gpu-claims-team-a"]["spec"]
    assert claims["validationActions"] == ["Deny"]
    assert claims["matchResources"]["namespaceSelector"] == {
        "matchLabels": {"platform.example.com/tenant": "team-a"}
    }
    # cluster-wide rules are bound without a selector
    assert "matchResources" not in bindings["rollout-tenancy-gpu-namespace-labels"]["spec"]
    for o in objs:
        if o["kind"] == "ValidatingAdmissionPolicy":
            assert o["spec"]["failurePolicy"] == "Fail"
            cond = o["spec"]["matchConditions"][0]["expression"]
            assert '"system:masters"' in cond and '"platform:admins"' in cond


def test_claims_are_judged_whoever_creates_them() -> None:
    """The scheduler's and the resource-claim controller's claims in a tenant namespace are not
    exempt: only administrators are (dra.md 6.4)."""
    pol = tn.claims_policy(tn.load(EXAMPLE), tn.load(EXAMPLE).tenants[0])
    text = yaml.safe_dump(pol)
    assert "kube-scheduler" not in text and "resource-claim" not in text
    rules = pol["spec"]["matchConstraints"]["resourceRules"][0]
    assert rules["resources"] == ["resourceclaims", "resourceclaimtemplates"]
    exprs = " ".join(v["expression"] for v in pol["spec"]["validations"])
    assert "firstAvailable" in exprs and "adminAccess" in exprs and "tolerations" in exprs


def test_selectors_are_cel_string_literals_that_cannot_be_escaped() -> None:
    nasty = 'a" || true || "b\\'
    lit = tn.cel_string(nasty)
    assert lit == '"a\\" || true || \\"b\\\\"'
    assert tn.cel_string("x\ny") == '"x\\ny"'


def test_the_namespace_rule_protects_admin_access_and_every_selector_key() -> None:
    t = _parse(
        EXAMPLE.read_text().replace(
            "matchLabels: {platform.example.com/tenant: team-a}",
            "matchLabels: {platform.example.com/tenant: team-a, kubernetes.io/metadata.name: x}\n"
            "      matchExpressions: [{key: tier, operator: In, values: [gpu]}]",
        )
    )
    assert t.protected_namespace_labels() == (
        tn.ADMIN_ACCESS_LABEL,
        "platform.example.com/tenant",
        "tier",
    )
    assert tn.label_selector_string(t.tenants[0].namespace_selector) == (
        "platform.example.com/tenant=team-a,kubernetes.io/metadata.name=x,tier in (gpu)"
    )


def test_pods_rule_names_dra_backed_names_and_refuses_those_off_the_list() -> None:
    t = tn.load(EXAMPLE)
    pol = tn.pods_policy(t, t.tenants[0], {"example.com/gpu": "gpu.example.com", "x/y": "other"})
    v = {x["name"]: x["expression"] for x in pol["spec"]["variables"]}
    assert v["deviceNames"] == '["example.com/gpu", "nvidia.com/gpu", "x/y"]'
    assert v["allowedNames"] == '["nvidia.com/gpu", "example.com/gpu"]'
    assert "deviceclass.resource.kubernetes.io/" in v["usesDevices"]


@pytest.mark.parametrize(
    ("edit", "field", "line", "message"),
    [
        (("maxCount: 2", "maxCount: 0"), "tenants[0].maxCount", 23, "whole number"),
        (("maxCount: 2", "maxCount: 2\n    colour: red"), "tenants[0].colour", 24, "unknown"),
        (
            ("matchLabels: {platform.example.com/tenant: team-a}", "matchLabels: {}"),
            "tenants[0].namespaceSelector",
            18,
            "at least one label",
        ),
        (("runtimeClasses: [nvidia]", "runtimeClasses: []"), "tenants[0].runtimeClasses", 24,
         "at least one"),
        (("  groups: [platform:admins]", "  groups: []"), "admins", 8, "administrators"),
        (("protectedTaints: [platform", "protectedTaints: [node.kubernetes.io/x, platform"),
         "pool.protectedTaints[0]", 15, "node controllers"),
        (("serviceAccount: team-a/ci", "serviceAccount: ci"),
         "tenants[0].identities[1].serviceAccount", 29, "namespace/name"),
    ],
)  # fmt: skip
def test_bad_input_names_file_field_and_line(
    edit: tuple[str, str], field: str, line: int, message: str
) -> None:
    text = EXAMPLE.read_text()
    assert edit[0] in text
    with pytest.raises(InputError) as e:
        _parse(text.replace(edit[0], edit[1], 1))
    assert e.value.location.file == "t.yaml"
    assert e.value.location.field == field
    assert e.value.location.line == line, str(e.value)
    assert message in str(e.value)


def test_identities_become_impersonation_targets() -> None:
    t = tn.load(EXAMPLE)
    alice, ci = t.tenants[0].identities
    assert (alice.user, alice.groups) == ("alice", ("team-a",))
    assert ci.user == "system:serviceaccount:team-a:ci"
    assert ci.groups == ("system:serviceaccounts", "system:serviceaccounts:team-a")


def test_render_offline_prints_yaml_and_apply_needs_yes(tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["tenancy", "render", "-f", str(EXAMPLE), "--offline"])
    assert r.exit_code == 0, r.output
    docs = [d for d in yaml.safe_load_all(r.stdout) if d]
    assert len(docs) == 10 and "--offline" in r.stderr
    r = CliRunner().invoke(cli, ["tenancy", "render", "-f", str(EXAMPLE), "--apply"])
    assert r.exit_code == 2 and "--yes" in r.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("maxCount: 2", "maxCount: two"))
    r = CliRunner().invoke(cli, ["tenancy", "render", "-f", str(bad), "--offline"])
    assert r.exit_code == 2 and f"{bad}:23" in r.stderr and r.stdout == ""


def test_refusals_are_named_from_the_api_servers_wording() -> None:
    vap = Answer(
        403,
        "resourceclaims \"x\" is forbidden: ValidatingAdmissionPolicy 'p' with binding 'b' "
        "denied request: tenant team-a: adminAccess is reserved",
    )
    assert refused_by(vap) == "policy p (binding b)"
    rbac = Answer(403, 'nodes "n" is forbidden: User "alice" cannot patch resource "nodes"')
    assert refused_by(rbac) == "RBAC"
    assert refused_by(Answer(422, "spec.devices.requests[0].adminAccess: Forbidden")) == (
        "API server validation"
    )


class _NoDRA:
    """An API server that serves neither resource.k8s.io/v1 nor admission policies."""

    def served(self, gv: str) -> bool:
        return False

    def get(self, path: str) -> Any:
        return {} if "runtimeclasses" in path else None

    def list(self, path: str, label_selector: str | None = None) -> list[Any]:
        if path == "/api/v1/namespaces" and label_selector == "platform.example.com/tenant=team-a":
            return [{"metadata": {"name": "ns-a"}}]
        return []

    def who_am_i(self, user: str, groups: tuple[str, ...]) -> dict[str, Any]:
        return {"username": user, "groups": [*groups, "system:authenticated"]}

    def as_tenant(self, *a: Any, **k: Any) -> Answer:
        return Answer(403, 'User "alice" cannot create resource "pods"')

    def access_review(self, *a: Any, **k: Any) -> tuple[bool, str]:
        return False, ""


def test_what_could_not_be_tried_is_said_and_never_passes() -> None:
    """An API server without resource.k8s.io/v1 or admission policies: unit-tested with a
    stand-in, because kube-apiserver v1.36 with resource.k8s.io/v1 switched off never becomes
    ready (its own ResourceSlice informer cannot list)."""
    t = tn.load(EXAMPLE)
    with pytest.raises(PreflightError, match=r"does not serve resource\.k8s\.io/v1"):
        read_facts(t, _NoDRA(), require_dra=True)  # type: ignore[arg-type]
    facts = read_facts(t, _NoDRA(), require_dra=False)  # type: ignore[arg-type]
    assert facts.namespaces == {"team-a": ("ns-a",)}
    assert "does not serve resource.k8s.io/v1" in facts.warnings[0]
    audit = run_audit(t, _NoDRA(), facts)  # type: ignore[arg-type]
    assert audit.result != "pass"
    untested = [r for r in audit.rows if r.got == "untested"]
    assert any("resource.k8s.io/v1" in r.detail for r in untested)
    assert any("validatingadmissionpolicies" in r.detail for r in untested)
    assert any("pool.nodeSelector" in r.detail for r in untested)
    # the allowed pods were refused by RBAC: named, and a failure
    assert any(r.case.startswith("pod with a claim and") and not r.ok for r in audit.rows)
    assert audit.result == "fail"
    assert Audit("x", (Row("probe", "", "", "c", "refused", "untested", "", True),), {}).result == (
        "incomplete"
    )


def _granted(path: Path) -> set[tuple[str, str, str]]:
    out = set()
    for d in yaml.safe_load_all(path.read_text()):
        if d and d["kind"] in ("ClusterRole", "Role"):
            for r in d["rules"]:
                for g in r["apiGroups"]:
                    for res in r["resources"]:
                        for v in r["verbs"]:
                            out.add((g, res, v, d["metadata"]["name"]))
    return {(g, r, v) for g, r, v, _ in out}


def test_the_audit_rbac_is_its_own_manifest_and_covers_every_call() -> None:
    audit = _granted(ROOT / "deploy" / "tenancy-audit-rbac.yaml")
    assert audit >= NEEDS and audit >= APPLY_NEEDS
    # the change engine's least-privilege role impersonates no one and writes no policy
    tool = _granted(ROOT / "deploy" / "rbac.yaml")
    assert not {x for x in tool if x[2] == "impersonate"}
    assert not {x for x in tool if x[0] == "admissionregistration.k8s.io"}


def test_preflight_refuses_a_tightening_when_the_tenancy_audit_fails(tmp_path: Path) -> None:
    """The plan's ``tenancy:`` audit in preflight: a failed one refuses a change that leaves a
    node under single-numa-node (the lab intent), ``--force`` overrides it with the refusals
    kept for the journal; a pass is one report line."""
    from rollout.change.preflight.checking import PreviewedRefusal
    from tests.unit.test_device_checks import GPU, Reader, _node, _prepare

    objects = {"n1": _node("n1", {GPU: "8"}, {GPU: "8"}), "n2": _node("n2", {GPU: "8"}, {})}
    bad = Row("probe", "team-a", "user alice", "claim adminAccess", "refused", "allowed",
              'RBAC: allowed by RoleBinding "x/ns"', False)  # fmt: skip
    failed = Audit("gpu", (bad,), {})
    with pytest.raises(PreviewedRefusal) as e:
        _prepare(tmp_path, Reader(objects), tenancy=failed)
    text = str(e.value)
    assert "tenancy audit of gpu: fail (1 checks, 1 failed, 0 not tried" in text
    assert "team-a user alice: claim adminAccess: expected refused, got allowed (RBAC" in text
    assert "(the tenancy refusals above: `rollout apply --force REASON` overrides)" in text
    prepared = _prepare(tmp_path, Reader(objects), force=True, tenancy=failed)
    assert prepared.forced[0].startswith("tenancy audit of gpu: fail")
    ok = Audit("gpu", (replace(bad, got="refused", by="RBAC", ok=True),), {})
    prepared = _prepare(tmp_path, Reader(objects), tenancy=ok)
    assert "tenancy audit of gpu: pass (1 checks)" in prepared.report
    assert prepared.forced == ()


def test_the_plan_names_its_tenancy_file_relative_to_itself(tmp_path: Path) -> None:
    from rollout.change.plan.schema import parse_plan

    plan = parse_plan("kind: RolloutPlan\ntenancy: t/tenancy.yaml\n", str(tmp_path / "p.yaml"))
    assert plan.tenancy == str(tmp_path / "t" / "tenancy.yaml")
    with pytest.raises(InputError, match="tenancy file"):
        parse_plan("kind: RolloutPlan\ntenancy: 3\n", "p.yaml")
