"""``rollout tenancy`` against the lab's real kube-apiserver (v1.36: resource.k8s.io/v1 and
ValidatingAdmissionPolicy served by default), through the CLI:

* the rendered policy applied with ``render --apply --yes``, then ``audit -o json`` tries a
  matrix of tenant requests (claims, templates, pods, namespaces, DeviceClasses,
  ResourceSlices, Nodes) as a user and as a ServiceAccount, each with its expected answer and
  the rule that gave it;
* the claims the resource-claim controller (from a template) and the scheduler (KEP-5004, an
  extended resource backed by a DeviceClass) create for a tenant's pod are judged by the same
  policy: one allowed, one refused at creation;
* the audit catches: the binding removed, a binding that lets tenants patch Nodes, a tenant
  namespace already labelled admin-access, a DeviceClass tenants may edit;
* bad input: a class that does not exist, a selector that does not compile, a namespace
  selector matching nothing: exit 2, file, field and line named, nothing rendered;
* the audit runs with only deploy/tenancy-audit-rbac.yaml.

One module, one shared world (module fixture): the lab's control plane is the session's.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.lab.cluster import Lab

pytestmark = pytest.mark.lab
ROOT = Path(__file__).resolve().parents[2]
TENANT_LABEL = "platform.example.com/tenant"
POOL_LABEL = "node-restriction.kubernetes.io/gpu-pool"
POOL_TAINT = "platform.example.com/gpu"
SELECTOR = "device.attributes['gpu.example.com'].model == 'LATEST-GPU-MODEL'"
PREFIX = "rollout-tenancy-lab"
ADMIN = "resource.kubernetes.io/admin-access"


def rollout(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    r = subprocess.run(
        [str(Path(sys.executable).parent / "rollout"), *args],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if ok:
        assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return r


@dataclass
class World:
    lab: Lab
    kube: Any
    file: Path
    ns: str
    ns_b: str
    node: str

    @property
    def kc(self) -> list[str]:
        return ["--kubeconfig", str(self.lab.kubeconfig)]

    def audit(self) -> dict[str, Any]:
        r = rollout("tenancy", "audit", "-f", str(self.file), *self.kc, "-o", "json", ok=False)
        assert r.returncode in (0, 1), r.stderr
        doc = json.loads(r.stdout)
        assert (r.returncode == 0) == (doc["result"] == "pass"), doc["result"]
        return dict(doc)


def _tenancy(ns: str, ns_b: str) -> dict[str, Any]:
    return {
        "apiVersion": "rollout.dev/v1alpha1",
        "kind": "TenancyPolicy",
        "metadata": {"name": "lab"},
        "admins": {"groups": ["platform:admins"]},
        "pool": {
            "nodeSelector": {POOL_LABEL: "a"},
            "protectedLabels": [POOL_LABEL],
            "protectedTaints": [POOL_TAINT],
        },
        "tenants": [
            {
                "name": "team-a",
                "namespaceSelector": {"matchLabels": {TENANT_LABEL: "team-a"}},
                "deviceClasses": ["gpu.example.com"],
                "selectors": [SELECTOR],
                "maxCount": 2,
                "runtimeClasses": ["nvidia"],
                # served by DRA through class er.example.com, which team-a may not claim: the
                # scheduler's claim for it is refused (render warns)
                "extendedResources": ["example.com/gpu"],
                "identities": [
                    {"user": "alice", "groups": ["team-a"]},
                    {"serviceAccount": f"{ns}/ci"},
                ],
            },
            {
                "name": "team-b",
                "namespaceSelector": {"matchLabels": {TENANT_LABEL: "team-b"}},
                "deviceClasses": ["er.example.com"],
                "maxCount": 1,
                "runtimeClasses": ["nvidia"],
                "identities": [{"user": "bob", "groups": ["team-b"]}],
            },
        ],
    }


def _create(kube: Any, doc: dict[str, Any]) -> None:
    from kubernetes import utils

    try:
        utils.create_from_dict(kube, doc)
    except utils.FailToCreateError as e:
        if any(getattr(x, "status", None) != 409 for x in e.api_exceptions):
            raise


def _tenant_role(ns: str, group: str, sa: str | None) -> list[dict[str, Any]]:
    """What a namespace tenant typically holds: pods, claims and templates in its namespace, and
    (as in dra.md 6.3) update on its own Namespace object, so the label rule is the policy's."""
    subjects: list[dict[str, Any]] = [
        {"kind": "Group", "name": group, "apiGroup": "rbac.authorization.k8s.io"}
    ]
    if sa:
        subjects.append({"kind": "ServiceAccount", "name": sa, "namespace": ns})
    return [
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "Role",
            "metadata": {"name": f"{PREFIX}-tenant", "namespace": ns},
            "rules": [
                {"apiGroups": [""], "resources": ["pods"], "verbs": ["create", "get", "list"]},
                {
                    "apiGroups": ["resource.k8s.io"],
                    "resources": ["resourceclaims", "resourceclaimtemplates"],
                    "verbs": ["create", "get", "list"],
                },
                {
                    "apiGroups": [""],
                    "resources": ["namespaces"],
                    "resourceNames": [ns],
                    "verbs": ["get", "patch", "update"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "RoleBinding",
            "metadata": {"name": f"{PREFIX}-tenant", "namespace": ns},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": f"{PREFIX}-tenant",
            },
            "subjects": subjects,
        },
    ]


def _wait_namespace_ready(kube: Any, ns: str) -> None:
    from kubernetes import client

    core = client.CoreV1Api(kube)
    deadline = time.monotonic() + 120
    while True:
        try:
            core.read_namespaced_service_account("default", ns)
            return
        except client.ApiException:
            assert time.monotonic() < deadline, f"no default ServiceAccount in {ns}"
            time.sleep(0.3)


def _objects(ns: str, ns_b: str, node: str, dra: bool = True) -> list[dict[str, Any]]:
    """The world the tenancy file describes (``dra``: with the DRA objects)."""
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": ns, "labels": {TENANT_LABEL: "team-a"}}},
        {"apiVersion": "v1", "kind": "Namespace",
         "metadata": {"name": ns_b, "labels": {TENANT_LABEL: "team-b"}}},
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": {"name": "ci", "namespace": ns}},
        {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass",
         "metadata": {"name": "nvidia"}, "handler": "nvidia"},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": "gpu.example.com"},
         "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.example.com'"}}]}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": "other.example.com"},
         "spec": {"selectors": [{"cel": {"expression": "device.driver == 'other.example.com'"}}]}},
        # KEP-5004: DRA serves example.com/gpu through this class on nodes with no allocatable
        {"apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass",
         "metadata": {"name": "er.example.com"},
         "spec": {"selectors": [{"cel": {"expression": "device.driver == 'er.example.com'"}}],
                  "extendedResourceName": "example.com/gpu"}},
        # a GPU pool node with no kubelet: the node label and taint probes patch it (dry run),
        # and the scheduler allocates the slice's devices on it
        {"apiVersion": "v1", "kind": "Node",
         "metadata": {"name": node, "labels": {POOL_LABEL: "a", "kubernetes.io/hostname": node}},
         "spec": {"taints": [{"key": POOL_TAINT, "value": "true", "effect": "NoSchedule"}]},
         "status": {"capacity": {"cpu": "8", "memory": "32Gi", "pods": "110"},
                    "allocatable": {"cpu": "8", "memory": "32Gi", "pods": "110"}}},
        {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
         "metadata": {"name": f"{node}-er"},
         "spec": {"driver": "er.example.com", "nodeName": node,
                  "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
                  "devices": [{"name": f"gpu-{i}"} for i in range(4)]}},
        *_tenant_role(ns, "team-a", "ci"),
        *_tenant_role(ns_b, "team-b", None),
    ]  # fmt: skip
    if not dra:
        docs = [d for d in docs if d["apiVersion"] != "resource.k8s.io/v1"]
    return docs


@pytest.fixture(scope="module")
def world(lab: Lab, kube: Any, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    ns, ns_b = f"{PREFIX}-a", f"{PREFIX}-b"
    node = f"{PREFIX}-gpu-0"
    docs = _objects(ns, ns_b, node)
    for d in docs:
        _create(kube, d)
    _wait_namespace_ready(kube, ns)
    _wait_namespace_ready(kube, ns_b)
    path = tmp_path_factory.mktemp("tenancy") / "tenancy.yaml"
    path.write_text(yaml.safe_dump(_tenancy(ns, ns_b), sort_keys=False))
    w = World(lab, kube, path, ns, ns_b, node)
    r = rollout("tenancy", "render", "-f", str(path), *w.kc, "--apply", "--yes", "-o", "json")
    applied = json.loads(r.stdout)["objects"]
    assert len(applied) == 14 and all(o["applied"] for o in applied), applied
    # the warning render gives for team-a's extended resource backed by a class off its list
    assert "'example.com/gpu' is backed by DeviceClass 'er.example.com'" in r.stderr
    _wait_for_policy(w)
    _wait_type_checked(w)
    yield w


def _wait_for_policy(w: World) -> None:
    """The API server loads a new policy and binding within about a second; wait until a
    forbidden claim (as alice: the admin, system:masters, is exempt) is refused by it."""
    from kubernetes import client

    api = client.CustomObjectsApi(_as(w.kube, "alice", "team-a"))
    body = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "wait"},
        "spec": {"devices": {"requests": [
            {"name": "g", "exactly": {"deviceClassName": "other.example.com"}}]}},
    }  # fmt: skip

    def refused() -> bool:
        try:
            api.create_namespaced_custom_object(
                "resource.k8s.io", "v1", w.ns, "resourceclaims", body, dry_run="All"
            )
        except client.ApiException as e:
            return "ValidatingAdmissionPolicy" in str(e.body)
        return False

    _wait("the policy takes effect", refused, 60)


def _wait_type_checked(w: World) -> None:
    """The API server type-checks each policy's CEL against its OpenAPI schema and writes the
    result in status.typeChecking: no warning for any rendered policy."""
    from kubernetes import client

    api = client.CustomObjectsApi(w.kube)

    def checked() -> list[Any]:
        items = api.list_cluster_custom_object(
            "admissionregistration.k8s.io", "v1", "validatingadmissionpolicies"
        )["items"]
        mine = [p for p in items if p["metadata"]["name"].startswith("rollout-tenancy-lab-")]
        done = [p for p in mine if "typeChecking" in (p.get("status") or {})]
        return done if len(done) == len(mine) == 7 else []

    for p in _wait("every policy type-checked", checked, 60):
        assert not p["status"]["typeChecking"].get("expressionWarnings"), p["status"]


def _rows(doc: dict[str, Any], kind: str = "probe") -> dict[tuple[str, str], dict[str, Any]]:
    return {(r["identity"], r["case"]): r for r in doc["rows"] if r["kind"] == kind}


#: case -> (expected answer, who answers: a substring of the row's "by")
MATRIX = {
    "claim allowed class, selector, count": ("allowed", ""),
    "template firstAvailable, all allowed": ("allowed", ""),
    "pod with a claim and the RuntimeClass": ("allowed", ""),
    "pod example.com/gpu: 2 with the RuntimeClass": ("allowed", ""),
    # the API server's own check (KEP-5018) runs before admission: unlabelled namespace
    "claim adminAccess": ("refused", "API server validation"),
    "claim class off the list (er.example.com)": ("refused", "claims-team-a"),
    "claim selector off the list": ("refused", "claims-team-a"),
    "claim count 3 over the cap": ("refused", "claims-team-a"),
    "claim allocationMode All": ("refused", "claims-team-a"),
    "claim device taint toleration": ("refused", "claims-team-a"),
    "claim opaque driver config": ("refused", "claims-team-a"),
    "template firstAvailable with a class off the list": ("refused", "claims-team-a"),
    "template count 3 over the cap": ("refused", "claims-team-a"),
    "pod with a claim, no RuntimeClass": ("refused", "pods-team-a"),
    "pod example.com/gpu: 1, no RuntimeClass": ("refused", "pods-team-a"),
    "pod example.com/gpu: 3 over the cap": ("refused", "pods-team-a"),
    "pod implicit name of er.example.com": ("refused", "pods-team-a"),
    "label namespace rollout-tenancy-lab-a admin-access": ("refused", "namespace-labels"),
    f"remove namespace rollout-tenancy-lab-a's label {TENANT_LABEL}": (
        "refused", "namespace-labels"),
    "edit DeviceClass gpu.example.com": ("refused", "RBAC"),
    "create a DeviceClass": ("refused", "RBAC"),
    "create a ResourceSlice": ("refused", "RBAC"),
    f"change node rollout-tenancy-lab-gpu-0's label {POOL_LABEL}": ("refused", "RBAC"),
    f"change node rollout-tenancy-lab-gpu-0's taint {POOL_TAINT}": ("refused", "RBAC"),
}  # fmt: skip


@pytest.mark.timeout(600)
def test_the_rendered_policy_holds_the_matrix_as_a_user_and_a_service_account(
    world: World,
) -> None:
    doc = world.audit()
    assert doc["result"] == "pass", [r for r in doc["rows"] if not r["ok"]]
    assert doc["server"] == {"resource.k8s.io/v1": True, "validatingadmissionpolicies": True}
    rows = _rows(doc)
    for identity in ("user alice", f"serviceaccount {world.ns}/ci", "user bob"):
        tried = {case for who, case in rows if who == identity}
        assert len(tried) >= 20, (identity, tried)
    for case, (expect, by) in MATRIX.items():
        for identity in ("user alice", f"serviceaccount {world.ns}/ci"):
            r = rows[(identity, case)]
            assert (r["expect"], r["got"]) == (expect, expect), r
            assert by in r["by"], r
    # the policies are on the server as rendered, and RBAC gives tenants none of the writes
    policy = [r for r in doc["rows"] if r["kind"] == "policy"]
    assert len(policy) == 14 and all(r["got"] == "present" for r in policy)
    rbac = [r for r in doc["rows"] if r["kind"] == "rbac"]
    assert rbac and all(r["got"] == "refused" for r in rbac)


def _events(kube: Any, ns: str, pod: str) -> list[str]:
    from kubernetes import client

    evs = client.CoreV1Api(kube).list_namespaced_event(
        ns, field_selector=f"involvedObject.name={pod}"
    )
    return [f"{e.reason}: {e.message}" for e in evs.items]


def _pod(name: str, ns: str, **spec: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "runtimeClassName": "nvidia",
        "tolerations": [{"operator": "Exists"}],
        "containers": [{"name": "main", "image": "registry.k8s.io/pause:3.10"}],
    }
    base.update(spec)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": ns},
            "spec": base}  # fmt: skip


def _as(kube: Any, user: str, group: str) -> Any:
    from kubernetes import client

    c = client.ApiClient(kube.configuration)
    c.set_default_header("Impersonate-User", user)
    c.set_default_header("Impersonate-Group", group)
    return c


def _wait(what: str, check: Any, timeout: float = 90) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got:
            return got
        assert time.monotonic() < deadline, what
        time.sleep(0.5)


@pytest.mark.timeout(300)
def test_claims_the_controller_and_the_scheduler_create_are_judged(world: World) -> None:
    """dra.md 6.4: the policy is bound by namespace, so the resource-claim controller's claims
    (from templates) and the scheduler's (KEP-5004 extended resources) are judged like the
    tenant's own."""
    from kubernetes import client

    cobj = client.CustomObjectsApi(world.kube)
    alice = _as(world.kube, "alice", "team-a")
    bob = _as(world.kube, "bob", "team-b")

    def template(name: str, ns: str, cls: str, **extra: Any) -> None:
        req = {"name": "gpu", "exactly": {"deviceClassName": cls, "count": 1, **extra}}
        body = {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaimTemplate",
            "metadata": {"name": name},
            "spec": {"spec": {"devices": {"requests": [req]}}},
        }
        # created as the admin (system:masters, exempt): a template made before the policy
        # was tightened, say
        cobj.create_namespaced_custom_object("resource.k8s.io", "v1", ns,
                                             "resourceclaimtemplates", body)  # fmt: skip

    template("ok", world.ns, "gpu.example.com",
             selectors=[{"cel": {"expression": SELECTOR}}])  # fmt: skip
    template("stale", world.ns, "other.example.com")
    claims = [{"name": "gpu"}]
    core_a = client.CoreV1Api(alice)
    for name, tpl in (("from-ok", "ok"), ("from-stale", "stale")):
        spec = {"resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": tpl}]}
        pod = _pod(name, world.ns, **spec)
        pod["spec"]["containers"][0]["resources"] = {"claims": claims}
        core_a.create_namespaced_pod(world.ns, pod)

    def claims_of(pod: str) -> list[Any]:
        items = cobj.list_namespaced_custom_object(
            "resource.k8s.io", "v1", world.ns, "resourceclaims"
        )["items"]
        owned = [(c, c["metadata"].get("ownerReferences") or []) for c in items]
        return [c for c, refs in owned if any(o.get("name") == pod for o in refs)]

    made = _wait("the controller's claim for the allowed template", lambda: claims_of("from-ok"))
    assert made[0]["spec"]["devices"]["requests"][0]["exactly"]["deviceClassName"] == (
        "gpu.example.com"
    )
    # why the policy judges CREATE only: the spec cannot change afterwards
    with pytest.raises(client.ApiException) as e:
        cobj.patch_namespaced_custom_object(
            "resource.k8s.io", "v1", world.ns, "resourceclaims", made[0]["metadata"]["name"],
            {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"count": 2}}]}}},
        )  # fmt: skip
    assert e.value.status == 422 and "immutable" in str(e.value.body), e.value.body
    refused = _wait(
        "the controller's refusal for the stale template",
        lambda: [e for e in _events(world.kube, world.ns, "from-stale")
                 if "ValidatingAdmissionPolicy" in e],
    )  # fmt: skip
    assert "claims-team-a" in refused[0] and "deviceClassName must be one of" in refused[0]
    assert claims_of("from-stale") == []

    # the scheduler: example.com/gpu has no allocatable on the node, a DeviceClass maps it, so
    # DRA serves it and the scheduler creates the claim at PreBind, in the pod's namespace
    limits = {"limits": {"example.com/gpu": "1"}}
    pod_b = _pod("er-b", world.ns_b)
    pod_b["spec"]["containers"][0]["resources"] = limits
    client.CoreV1Api(bob).create_namespaced_pod(world.ns_b, pod_b)
    pod_a = _pod("er-a", world.ns)
    pod_a["spec"]["containers"][0]["resources"] = limits
    core_a.create_namespaced_pod(world.ns, pod_a)
    core = client.CoreV1Api(world.kube)
    bound = _wait(
        "team-b's pod bound (its scheduler claim allowed)",
        lambda: core.read_namespaced_pod("er-b", world.ns_b).spec.node_name,
    )
    assert bound == world.node
    refused = _wait(
        "team-a's scheduler claim refused",
        lambda: [e for e in _events(world.kube, world.ns, "er-a")
                 if "ValidatingAdmissionPolicy" in e],
    )  # fmt: skip
    assert "claims-team-a" in refused[0] and "deviceClassName must be one of" in refused[0]
    assert core.read_namespaced_pod("er-a", world.ns).spec.node_name is None
    for ns, pod in (
        (world.ns, "from-ok"),
        (world.ns, "from-stale"),
        (world.ns, "er-a"),
        (world.ns_b, "er-b"),
    ):
        core.delete_namespaced_pod(pod, ns, grace_period_seconds=0)  # fmt: skip


def _catches(w: World, broken: str) -> list[dict[str, Any]]:
    doc = w.audit()
    assert doc["result"] == "fail", broken
    return [r for r in doc["rows"] if not r["ok"]]


@pytest.mark.timeout(300)
def test_the_audit_catches_each_breach(world: World) -> None:
    from kubernetes import client

    vap = client.AdmissionregistrationV1Api(world.kube)
    rbac = client.RbacAuthorizationV1Api(world.kube)
    core = client.CoreV1Api(world.kube)
    name = "rollout-tenancy-lab-claims-team-a"

    # 1. the claims binding removed: the forbidden claims go through, each named
    binding = vap.read_validating_admission_policy_binding(name)
    vap.delete_validating_admission_policy_binding(name)
    try:
        failed = _wait(
            "the audit sees the binding gone",
            # the API server's policy cache drops the binding a moment later: wait until the
            # audit's try as alice (the first identity) ran after that too
            lambda: [r for r in _catches(world, "binding removed")
                     if r["case"] == "claim selector off the list"
                     and r["identity"] == "user alice"],
        )  # fmt: skip
    finally:
        binding.metadata = client.V1ObjectMeta(name=name, labels=binding.metadata.labels)
        vap.create_validating_admission_policy_binding(binding)
    row = next(r for r in failed if r["identity"] == "user alice")
    assert row["got"] == "allowed"
    assert f'RoleBinding "{PREFIX}-tenant/{world.ns}"' in row["by"], row
    assert f"no ValidatingAdmissionPolicyBinding {name}" in row["detail"], row
    _wait("the restored binding holds again", lambda: world.audit()["result"] == "pass", 30)

    # 2. a binding that lets tenants patch Nodes: the RBAC row names it; the pool's protected
    # label is still held by the policy
    crole = {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole",
             "metadata": {"name": f"{PREFIX}-node-patcher"},
             "rules": [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "patch"]},
                       {"apiGroups": ["resource.k8s.io"], "resources": ["deviceclasses"],
                        "verbs": ["get", "update", "patch"]}]}  # fmt: skip
    _create(world.kube, crole)

    def bind(kind: str) -> dict[str, Any]:
        return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding",
                "metadata": {"name": f"{PREFIX}-{kind}"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                            "name": f"{PREFIX}-node-patcher"},
                "subjects": [{"kind": "Group", "name": "team-a",
                              "apiGroup": "rbac.authorization.k8s.io"}]}  # fmt: skip

    _create(world.kube, bind("nodes"))
    try:
        failed = _wait(
            "the audit sees the node binding",
            lambda: [r for r in _catches(world, "node binding") if r["kind"] == "rbac"],
        )
        nodes = next(r for r in failed if "nodes" in r["case"] and r["identity"] == "user alice")
        assert "patch" in nodes["case"], nodes
        assert f'ClusterRoleBinding "{PREFIX}-nodes"' in nodes["by"], nodes
        # 4. ... and the same binding lets tenants edit a DeviceClass: named too, while the
        # policy still refuses the edit itself
        dc = next(
            r for r in failed if "deviceclasses" in r["case"] and r["identity"] == "user alice"
        )
        assert f'ClusterRoleBinding "{PREFIX}-nodes"' in dc["by"], dc
        probes = _rows(world.audit())
        held = probes[("user alice", f"change node {world.node}'s label {POOL_LABEL}")]
        assert held["got"] == "refused" and "pool-nodes" in held["by"], held
        held = probes[("user alice", "edit DeviceClass gpu.example.com")]
        assert held["got"] == "refused" and "dra-objects" in held["by"], held
        # the service account is not in group team-a: not caught for it
        assert not [r for r in failed if r["identity"].startswith("serviceaccount")]
    finally:
        rbac.delete_cluster_role_binding(f"{PREFIX}-nodes")

    # 3. a tenant namespace already labelled admin-access (by an admin)
    core.patch_namespace(world.ns, {"metadata": {"labels": {ADMIN: "true"}}})
    try:
        failed = _catches(world, "labelled namespace")
        assert [r["case"] for r in failed] == [f"namespace {world.ns} labelled admin-access"]
        # the adminAccess claim is now refused by the policy, not the API server's own check
        row = _rows(world.audit())[("user alice", "claim adminAccess")]
        assert row["got"] == "refused" and "claims-team-a" in row["by"], row
    finally:
        core.patch_namespace(world.ns, {"metadata": {"labels": {ADMIN: None}}})
    assert world.audit()["result"] == "pass"


@pytest.mark.timeout(300)
def test_bad_input_names_file_field_and_line_and_renders_nothing(world: World) -> None:
    base = world.file.read_text()
    team_c = "platform.example.com/tenant: team-c"
    cases = [
        # (old, new, field, message, the line: found by a string on it, lines above it)
        ("- gpu.example.com", "- gpu.exmaple.com", "tenants[0].deviceClasses[0]",
         "DeviceClass 'gpu.exmaple.com' does not exist (did you mean", "gpu.exmaple.com", 0),
        (SELECTOR, "device.attributes['gpu.example.com'].model ==", "tenants[0].selectors[0]",
         "does not compile as DRA CEL; the API server says:", "model ==\n", 0),
        ("platform.example.com/tenant: team-b", team_c, "tenants[1].namespaceSelector",
         "matches no namespace", team_c, 2),
        ("- nvidia", "- nvidai", "tenants[0].runtimeClasses[0]",
         "RuntimeClass 'nvidai' does not exist", "- nvidai", 0),
    ]  # fmt: skip
    for old, new, field, message, marker, above in cases:
        text = base.replace(old, new, 1)
        assert text != base, old
        bad = world.file.with_name("bad.yaml")
        bad.write_text(text)
        line = (text + "\n").splitlines(keepends=True)
        at = next(i for i, ln in enumerate(line) if marker.rstrip("\n") in ln) + 1 - above
        r = rollout("tenancy", "render", "-f", str(bad), *world.kc, ok=False)
        assert r.returncode == 2, r.stderr
        assert r.stdout == "", "nothing rendered"
        assert f"{bad}:{at}, field '{field}': " in r.stderr and message in r.stderr, r.stderr


@pytest.mark.timeout(300)
def test_the_audit_runs_with_only_its_own_rbac_manifest(world: World, tmp_path: Path) -> None:
    from kubernetes import client

    manifest = ROOT / "deploy" / "tenancy-audit-rbac.yaml"
    _create(world.kube, {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "rollout"}})
    for doc in yaml.safe_load_all(manifest.read_text()):
        if doc:
            _create(world.kube, doc)
    token = (
        client.CoreV1Api(world.kube)
        .create_namespaced_service_account_token(
            "rollout-tenancy-audit", "rollout", {"spec": {"expirationSeconds": 3600}}
        )
        .status.token
    )
    admin = json.loads(Path(world.lab.kubeconfig).read_text())
    cfg = {
        "apiVersion": "v1", "kind": "Config", "clusters": admin["clusters"],
        "users": [{"name": "auditor", "user": {"token": token}}],
        "contexts": [{"name": "a", "context": {"cluster": admin["clusters"][0]["name"],
                                                "user": "auditor"}}],
        "current-context": "a",
    }  # fmt: skip
    kc = tmp_path / "auditor.kubeconfig"
    kc.write_text(json.dumps(cfg))
    r = rollout("tenancy", "audit", "-f", str(world.file), "--kubeconfig", str(kc), "-o", "json",
                ok=False)  # fmt: skip
    doc = json.loads(r.stdout)
    assert r.returncode == 0 and doc["result"] == "pass", [x for x in doc["rows"] if not x["ok"]]
    # the same audit without impersonation rights: nothing is reported as a pass
    rbac = client.RbacAuthorizationV1Api(world.kube)
    rbac.delete_cluster_role_binding("rollout-tenancy-audit")
    try:
        r = rollout("tenancy", "audit", "-f", str(world.file), "--kubeconfig", str(kc), "-o",
                    "json", ok=False)  # fmt: skip
        doc = json.loads(r.stdout) if r.stdout else {}
        assert r.returncode != 0 and doc.get("result") != "pass", r.stderr
    finally:
        for d in yaml.safe_load_all(manifest.read_text()):
            if d and d["kind"] == "ClusterRoleBinding":
                _create(world.kube, d)


@pytest.mark.timeout(600)
def test_apply_refuses_a_tightening_while_the_audit_fails(
    world: World, lab_nodes: Any, tmp_path: Path
) -> None:
    """The plan names the tenancy file: `apply` (dry run) audits in preflight; with the claims
    binding removed it refuses the canary (single-numa-node, the lab intent), exit 3, until
    --force REASON; restored, preflight passes. Then the canary is applied: the audit is in its
    evidence before and after (evidence.json, the journal), and `rollout report` and `rollout
    runbook` show its table, row by row."""
    from kubernetes import client

    from tests.lab import changekit as ck

    (node,) = lab_nodes(1).names
    inv = ck.inventory(world.lab, [node], [node], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", {node: "kubeadm"})
    plan.write_text(plan.read_text() + f"tenancy: {world.file}\n")
    env = ck.env(world.lab, tmp_path / "state")
    common = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--dry-run"]
    vap = client.AdmissionregistrationV1Api(world.kube)
    name = "rollout-tenancy-lab-claims-team-a"
    binding = vap.read_validating_admission_policy_binding(name)
    vap.delete_validating_admission_policy_binding(name)
    try:
        _wait("the audit sees the binding gone", lambda: world.audit()["result"] == "fail", 30)
        r = ck.cli(common, env)
        assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
        assert "tenancy audit of lab: fail" in r.stderr, r.stderr[-3000:]
        assert f"no ValidatingAdmissionPolicyBinding {name}" not in r.stderr  # rows, not details
        assert "claim selector off the list: expected refused, got allowed" in r.stderr
        assert "(the tenancy refusals above: `rollout apply --force REASON` overrides)" in r.stderr
        r = ck.cli([*common, "--force", "lab: the binding is removed on purpose"], env)
        assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
        assert "forced (--force): tenancy audit of lab: fail" in r.stdout + r.stderr
    finally:
        binding.metadata = client.V1ObjectMeta(name=name, labels=binding.metadata.labels)
        vap.create_validating_admission_policy_binding(binding)
    _wait("the restored binding holds again", lambda: world.audit()["result"] == "pass", 30)
    r = ck.cli(common, env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert "tenancy audit of lab: pass" in r.stdout + r.stderr, r.stdout[-2000:] + r.stderr[-2000:]

    r = ck.cli([*common[:-1], "--yes", "-o", "json"], env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    change = json.loads(r.stdout)["change"]
    journal = ck.latest_journal(tmp_path / "state")
    assert journal is not None and journal.change_id == change
    evidence = json.loads((journal.dir / "evidence.json").read_text())
    audits = {c["label"]: c.get("tenancy") or {} for c in evidence["collections"]}
    assert {k: (a.get("policy"), a.get("result")) for k, a in audits.items()} == {
        "before": ("lab", "pass"),
        "after": ("lab", "pass"),
    }, audits
    assert len(audits["after"]["rows"]) == len(world.audit()["rows"]) >= 20
    entries = [e.data for e in journal.entries() if e.step == "evidence"]
    assert [(d["label"], d["tenancy"]["result"]) for d in entries] == [
        ("before", "pass"),
        ("after", "pass"),
    ], entries
    (row,) = [
        x
        for x in audits["after"]["rows"]
        if (x["identity"], x["case"]) == ("user alice", "claim selector off the list")
    ]
    assert row["got"] == "refused" and "claims-team-a" in row["by"], row
    refused = (
        "| team-a | user alice | probe | claim selector off the list | refused | refused | "
        f"{row['by']} | yes |  |"
    )
    r = ck.cli(["report", "--change", change], env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "## Tenancy audit" in r.stdout and r.stdout.count(refused) == 2, r.stdout[-4000:]
    r = ck.cli(["runbook", "--plan", str(plan), "-i", str(inv)], env)
    assert r.returncode == 0, r.stderr[-3000:]
    preflight = r.stdout.split("## Preflight")[1].split("## Admission preview")[0]
    assert "Tenancy audit of lab" in preflight and refused in preflight, preflight[-4000:]
