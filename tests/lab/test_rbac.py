"""deploy/rbac.yaml in the lab: the shipped role is applied to a real API server (RBAC
authorizer), a kubeconfig for ServiceAccount rollout/rollout is made from a TokenRequest, and

* the verbs outside the role are denied (SelfSubjectAccessReview as the ServiceAccount);
* ``tests/lab/test_docs_lab.py`` runs apply, rollback, report and runbook with ONLY this
  kubeconfig (fixture ``restricted_kubeconfig``), so any verb the tool needs beyond the role fails
  that test.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.lab.cluster import Lab

pytestmark = pytest.mark.lab
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"


def _apply_manifest(kube: Any) -> None:
    from kubernetes import client, utils

    for doc in yaml.safe_load_all(RBAC.read_text()):
        if not doc:
            continue
        try:
            utils.create_from_dict(kube, doc)
        except utils.FailToCreateError as e:
            if any(getattr(x, "status", None) != 409 for x in e.api_exceptions):
                raise
    # the role may have changed since an earlier test in this session created it
    rbac = client.RbacAuthorizationV1Api(kube)
    for doc in yaml.safe_load_all(RBAC.read_text()):
        if doc and doc["kind"] == "ClusterRole":
            rbac.replace_cluster_role(doc["metadata"]["name"], doc)
        elif doc and doc["kind"] == "Role":
            ns = doc["metadata"]["namespace"]
            rbac.replace_namespaced_role(doc["metadata"]["name"], ns, doc)


@pytest.fixture(scope="session")
def restricted_kubeconfig(lab: Lab, kube: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A kubeconfig for ServiceAccount rollout/rollout, bound only to deploy/rbac.yaml."""
    from kubernetes import client

    _apply_manifest(kube)
    token = (
        client.CoreV1Api(kube)
        .create_namespaced_service_account_token(
            "rollout", "rollout", {"spec": {"expirationSeconds": 3600}}
        )
        .status.token
    )
    admin = json.loads(Path(lab.kubeconfig).read_text())
    cfg = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "rollout-sa", "user": {"token": token}}],
        "contexts": [
            {
                "name": "sa",
                "context": {"cluster": admin["clusters"][0]["name"], "user": "rollout-sa"},
            }
        ],
        "current-context": "sa",
    }
    path = tmp_path_factory.mktemp("rbac") / "rollout-sa.kubeconfig"
    path.write_text(json.dumps(cfg))
    return path


def _allowed(
    api: Any, verb: str, resource: str, group: str = "", namespace: str = "", sub: str = ""
) -> bool:
    from kubernetes import client

    review = client.AuthorizationV1Api(api).create_self_subject_access_review(
        {
            "spec": {
                "resourceAttributes": {
                    "verb": verb,
                    "resource": resource,
                    "group": group,
                    "namespace": namespace,
                    "subresource": sub,
                }
            }
        }
    )
    return bool(review.status.allowed)


def test_shipped_role_grants_what_the_tool_needs_and_nothing_of_workloads(
    restricted_kubeconfig: Path,
) -> None:
    from kubernetes import config

    sa = config.new_client_from_config(config_file=str(restricted_kubeconfig))
    granted = [
        ("patch", "nodes", "", ""),
        ("get", "nodes", "", "", "proxy"),
        ("create", "pods", "", "default", "eviction"),
        ("watch", "pods", "", ""),
        ("list", "resourceslices", "resource.k8s.io", ""),
        ("list", "deviceclasses", "resource.k8s.io", ""),
        ("list", "resourceclaims", "resource.k8s.io", ""),
        ("update", "leases", "coordination.k8s.io", "kube-system"),
        ("delete", "pods", "", "rollout-probes"),
    ]
    for verb, res, group, ns, *sub in granted:
        assert _allowed(sa, verb, res, group, ns, sub[0] if sub else ""), (verb, res, ns)
    denied = [
        ("delete", "pods", "", "default"),  # only with the unbound rollout-disable-eviction role
        ("patch", "pods", "", "default"),
        ("update", "deployments", "apps", "default"),
        ("delete", "poddisruptionbudgets", "policy", "default"),
        ("update", "leases", "coordination.k8s.io", "default"),
        ("get", "secrets", "", "kube-system"),
        ("delete", "nodes", "", ""),
    ]
    for verb, res, group, ns in denied:
        assert not _allowed(sa, verb, res, group, ns), (verb, res, ns)


def test_the_serve_deployment_is_accepted_by_the_api_server(lab: Lab, kube: Any) -> None:
    """deploy/serve.yaml (Deployment and Service of ``rollout serve``) after deploy/rbac.yaml:
    the real kubectl's server-side dry run, so the API server's own validation and admission
    (the ServiceAccount, every field of the pod spec) accept it; nothing is created."""
    import subprocess

    from rollout.lab.binaries import find_bin_dir

    _apply_manifest(kube)
    manifest = RBAC.with_name("serve.yaml")
    r = subprocess.run(
        [
            str(find_bin_dir() / "kubectl"),
            "--kubeconfig",
            str(lab.kubeconfig),
            "apply",
            "--dry-run=server",
            "-o",
            "name",
            "-f",
            str(manifest),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split()) == ["deployment.apps/rollout-serve", "service/rollout-serve"]
    code, _ = lab.api.request("GET", "/apis/apps/v1/namespaces/rollout/deployments/rollout-serve")
    assert code == 404  # a dry run: nothing was created
    doc = next(d for d in yaml.safe_load_all(manifest.read_text()) if d["kind"] == "Deployment")
    (container,) = doc["spec"]["template"]["spec"]["containers"]
    assert container["args"][0] == "serve"
    env = {e["name"]: e["value"] for e in container["env"]}
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert env["ROLLOUT_STATE_DIR"] in mounts  # its own state directory, not a shared disk
    assert "/etc/rollout/token" in mounts and env["ANSIBLE_PRIVATE_KEY_FILE"].startswith(
        "/etc/rollout/ssh/"
    )
