"""deploy/rbac.yaml: no wildcards, no workload writes, and every API call in rollout/kube/ covered.

The lab test (tests/lab/test_rbac.py) proves the role is enough by running the tool with it; this
one fails fast when someone adds an API call without a matching rule."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]

# client method -> (API group, resource, verb); namespaced methods are checked against Roles too.
CALLS = {
    "read_node": ("", "nodes", "get"),
    "list_node": ("", "nodes", "list"),
    "patch_node": ("", "nodes", "patch"),
    "list_pod_for_all_namespaces": ("", "pods", "list"),
    "read_namespaced_pod": ("", "pods", "get"),
    "read_namespaced_pod_log": ("", "pods/log", "get"),
    "create_namespaced_pod_eviction": ("", "pods/eviction", "create"),
    "delete_namespaced_pod": ("", "pods", "delete"),
    "create_namespaced_pod": ("", "pods", "create"),
    "create_namespace": ("", "namespaces", "create"),
    "create_namespaced_event": ("", "events", "create"),
    "list_event_for_all_namespaces": ("", "events", "list"),
    "watch_event_for_all_namespaces": ("", "events", "watch"),
    "watch_pod_for_all_namespaces": ("", "pods", "watch"),
    "connect_get_node_proxy_with_path_with_http_info": ("", "nodes/proxy", "get"),
    "connect_get_node_proxy_with_path": ("", "nodes/proxy", "get"),
    "list_namespaced_pod_disruption_budget": ("policy", "poddisruptionbudgets", "list"),
    "list_pod_disruption_budget_for_all_namespaces": ("policy", "poddisruptionbudgets", "list"),
    "read_namespaced_lease": ("coordination.k8s.io", "leases", "get"),
    "list_namespaced_lease": ("coordination.k8s.io", "leases", "list"),
    "watch_namespaced_lease": ("coordination.k8s.io", "leases", "watch"),
    "create_namespaced_lease": ("coordination.k8s.io", "leases", "create"),
    "replace_namespaced_lease": ("coordination.k8s.io", "leases", "update"),
    "patch_namespaced_lease": ("coordination.k8s.io", "leases", "patch"),
    "delete_namespaced_lease": ("coordination.k8s.io", "leases", "delete"),
    "list_namespaced_config_map": ("", "configmaps", "list"),
    "create_namespaced_config_map": ("", "configmaps", "create"),
    "replace_namespaced_config_map": ("", "configmaps", "update"),
    "get_api_versions": None,  # discovery: system:discovery
    "get_code": None,  # /version: system:public-info-viewer
    "list_cluster_custom_object": None,  # checked by plural below
    "list_deployment_for_all_namespaces": ("apps", "deployments", "list"),
    "list_stateful_set_for_all_namespaces": ("apps", "statefulsets", "list"),
    "list_daemon_set_for_all_namespaces": ("apps", "daemonsets", "list"),
    "list_replica_set_for_all_namespaces": ("apps", "replicasets", "list"),
}
CUSTOM = {
    "resourceslices": "resource.k8s.io",
    "deviceclasses": "resource.k8s.io",
    "rollouts": "argoproj.io",
    "canaries": "flagger.app",
    "inferenceservices": "serving.kserve.io",
}
WORKLOADS = {"deployments", "replicasets", "statefulsets", "daemonsets", "poddisruptionbudgets"}


def _docs() -> list[dict]:  # type: ignore[type-arg]
    return [d for d in yaml.safe_load_all((ROOT / "deploy/rbac.yaml").read_text()) if d]


def _granted() -> set[tuple[str, str, str]]:
    out = set()
    for d in _docs():
        if d["kind"] in ("ClusterRole", "Role"):
            for r in d["rules"]:
                for g in r["apiGroups"]:
                    for res in r["resources"]:
                        for v in r["verbs"]:
                            out.add((g, res, v))
    return out


def test_no_wildcards_and_no_workload_writes() -> None:
    for g, res, v in _granted():
        assert "*" not in (g, res, v)
        if res in WORKLOADS:
            assert v in ("get", "list", "watch"), (g, res, v)
    pods = {v for g, res, v in _granted() if (g, res) == ("", "pods")}
    assert not pods & {"update", "patch"}


def test_every_api_call_in_rollout_kube_is_granted() -> None:
    granted = _granted()
    source = "\n".join(p.read_text() for p in (ROOT / "rollout/kube").glob("*.py"))
    used = set(
        re.findall(r"\.(?:_?core|policy|coordination|apis|version|custom|apps)\.([a-z_]+)", source)
    )
    assert used, "no API calls found: the pattern is stale"
    for method in sorted(used):
        assert method in CALLS, f"API call {method} has no RBAC mapping in this test"
        need = CALLS[method]
        if need is not None:
            assert need in granted, f"{method} needs {need}"
    for plural, group in CUSTOM.items():
        if f'"{plural}"' in source:
            assert (group, plural, "list") in granted


def test_disable_eviction_role_is_not_bound_by_default() -> None:
    bound = {d["roleRef"]["name"] for d in _docs() if d["kind"].endswith("Binding")}
    assert "rollout-disable-eviction" not in bound
    cluster_pods = {
        v
        for d in _docs()
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "rollout"
        for r in d["rules"]
        if "pods" in r["resources"]
        for v in r["verbs"]
    }
    assert "delete" not in cluster_pods
