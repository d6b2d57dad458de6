"""The lab's real control plane (rollout.lab.controlplane) against the real binaries.

Skipped only when the binaries are missing *and* CI is not set; in CI a missing binary is a failure.
"""

from __future__ import annotations

import os
import ssl
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.binaries import ETCD_VERSION, K8S_VERSION, find_bin_dir, missing_binaries
from rollout.lab.controlplane import ControlPlane
from tests.lab.changekit import wait_for as _wait

REPO = Path(__file__).resolve().parents[2]
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")


def test_versions_match_build_tools() -> None:
    assert (REPO / "tools/k8sbin/K8S_VERSION").read_text().strip() == K8S_VERSION
    assert (REPO / "tools/etcdbin/ETCD_VERSION").read_text().strip() == ETCD_VERSION


@pytest.fixture(scope="module")
def bin_dir() -> Path:
    d = find_bin_dir()
    missing = missing_binaries(d)
    if missing:
        msg = f"lab binaries missing in {d}: {missing}; run tools/build-lab-binaries.sh"
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    return d


@pytest.fixture(scope="module")
def cp(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ControlPlane]:
    plane = ControlPlane(tmp_path_factory.mktemp("cp"), bin_dir)
    t0 = time.monotonic()
    plane.start()
    print(f"control plane started in {time.monotonic() - t0:.1f}s")
    try:
        yield plane
    finally:
        plane.stop()


def _client(kubeconfig: Path) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(kubeconfig))


def _core(kubeconfig: Path) -> Any:
    from kubernetes import client

    return client.CoreV1Api(_client(kubeconfig))


@pytest.mark.lab
@pytest.mark.timeout(180)
def test_version_is_real(cp: ControlPlane) -> None:
    from kubernetes import client

    v = cp.version()
    assert v["gitVersion"] == K8S_VERSION
    assert (v["major"], v["minor"]) == ("1", K8S_VERSION.split(".")[1])
    info = client.VersionApi(_client(cp.kubeconfig)).get_code()
    assert info.git_version == K8S_VERSION


@pytest.mark.lab
@pytest.mark.timeout(180)
def test_rbac_denies_anonymous_and_unauthorized(cp: ControlPlane) -> None:
    from kubernetes.client.rest import ApiException

    # no client cert: system:anonymous
    ctx = ssl.create_default_context(cafile=str(cp.ca_cert))
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(cp.apiserver_url + "/api/v1/namespaces", context=ctx, timeout=10)
    assert e.value.code == 403
    # authenticated but without any RBAC binding
    kc = cp.write_kubeconfig("alice", ["developers"])
    with pytest.raises(ApiException) as api_err:
        _core(kc).list_namespaced_pod("default")
    assert api_err.value.status == 403
    # admin can
    assert _core(cp.kubeconfig).list_namespaced_pod("default").items == []


@pytest.mark.lab
@pytest.mark.timeout(180)
def test_node_identity_can_only_register_itself(cp: ControlPlane) -> None:
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = _core(cp.node_kubeconfig("lab-n1"))

    def node(name: str) -> Any:
        return client.V1Node(metadata=client.V1ObjectMeta(name=name))

    created = core.create_node(node("lab-n1"))
    assert created.metadata.name == "lab-n1"
    with pytest.raises(ApiException) as e:
        core.create_node(node("lab-n2"))
    assert e.value.status == 403
    # and it may not touch another node's object
    _core(cp.kubeconfig).create_node(node("lab-n3"))
    with pytest.raises(ApiException) as e:
        core.patch_node("lab-n3", {"metadata": {"labels": {"x": "y"}}})
    assert e.value.status == 403
    # node list is allowed (Node authorizer), its own status update too
    core.patch_node_status("lab-n1", {"status": {"capacity": {"cpu": "4", "pods": "10"}}})
    cert, key = cp.kubelet_serving_cert("lab-n1", "10.250.0.2")
    assert cert.exists() and key.exists()


@pytest.mark.lab
@pytest.mark.timeout(180)
def test_controller_manager_runs_controllers(cp: ControlPlane) -> None:
    from kubernetes import client

    api = _client(cp.kubeconfig)
    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="kcm-check")))
    # serviceaccount controller (KCM, with per-controller SA credentials)
    _wait(
        lambda: any(
            sa.metadata.name == "default"
            for sa in core.list_namespaced_service_account("kcm-check").items
        ),
        what="default ServiceAccount",
    )
    # disruption controller: PDB status catches up (the Eviction API needs observedGeneration)
    policy = client.PolicyV1Api(api)
    policy.create_namespaced_pod_disruption_budget(
        "kcm-check",
        client.V1PodDisruptionBudget(
            metadata=client.V1ObjectMeta(name="pdb"),
            spec=client.V1PodDisruptionBudgetSpec(
                min_available=1,
                selector=client.V1LabelSelector(match_labels={"app": "x"}),
            ),
        ),
    )
    _wait(
        lambda: (
            policy.read_namespaced_pod_disruption_budget(
                "pdb", "kcm-check"
            ).status.observed_generation
            == 1
        ),
        what="PDB observedGeneration",
    )


@pytest.mark.lab
@pytest.mark.timeout(240)
def test_restart_apiserver_keeps_data(cp: ControlPlane) -> None:
    from kubernetes import client

    core = _core(cp.kubeconfig)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name="survives")))
    old_pid = cp.pids["kube-apiserver"]
    t0 = time.monotonic()
    cp.restart_apiserver()
    print(f"apiserver restarted in {time.monotonic() - t0:.1f}s")
    assert cp.pids["kube-apiserver"] != old_pid
    assert not Path(f"/proc/{old_pid}").exists()
    assert core.read_namespace("survives").metadata.name == "survives"
    assert cp.version()["gitVersion"] == K8S_VERSION


@pytest.mark.lab
@pytest.mark.timeout(240)
def test_second_address_and_teardown_leaves_no_process(bin_dir: Path, tmp_path: Path) -> None:
    # 127.0.0.2 stands in for a host-side lab address (any 127/8 address is on lo on Linux)
    plane = ControlPlane(tmp_path, bin_dir, node_network_ip="127.0.0.2")
    with plane:
        assert plane.apiserver_url.startswith("https://127.0.0.2:")
        assert plane.version()["gitVersion"] == K8S_VERSION
        pids = list(plane.pids.values())
        assert len(pids) == 4
    assert plane.pids == {}
    for pid in pids:
        assert not Path(f"/proc/{pid}").exists(), f"process {pid} survived stop()"
    plane.stop()  # idempotent


@pytest.mark.lab
@pytest.mark.timeout(120)
def test_node_proxy_refuses_loopback_node_address(cp: ControlPlane) -> None:
    """Why lab nodes need private netns addresses: the apiserver's node proxy only dials
    global-unicast addresses (pkg/registry/core/node/strategy.go isProxyableHostname)."""
    for name, ip in (("proxy-lo", "127.0.0.5"), ("proxy-priv", "10.250.99.2")):
        status, _ = cp.request("POST", "/api/v1/nodes", {"metadata": {"name": name}})
        assert status == 201
        status, body = cp.request(
            "PATCH",
            f"/api/v1/nodes/{name}/status",
            {"status": {"addresses": [{"type": "InternalIP", "address": ip}]}},
            content_type="application/merge-patch+json",
        )
        assert status == 200, body
    status, body = cp.request("GET", "/api/v1/nodes/proxy-lo/proxy/configz")
    assert status == 400 and "address not allowed" in str(body)
    # a private address is allowed (nothing listens there, so the dial itself fails instead)
    status, body = cp.request("GET", "/api/v1/nodes/proxy-priv/proxy/configz", timeout=40)
    assert "address not allowed" not in str(body)
