"""DRA devices in ``rollout evidence`` against the lab's real kube-apiserver: ResourceClaims whose
status the test writes as the scheduler would (``status.allocation.devices.results`` and
``status.reservedFor``), for pods bound to a lab node. The API server validates both; the
evidence reads them back through the CLI, with the ServiceAccount-free lab kubeconfig.

* one device allocated to two claims, each reserved by its own pod: ``unique-device-ids`` fails,
  naming the device, both claims and their pods;
* the duplicate claim replaced by one for another device (an allocation is immutable), and a
  claim shared by both pods: it passes and counts the devices.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab]
BASE = "/apis/resource.k8s.io/v1"
DRIVER = "gpu.example.com"


def _pod(lab: Lab, ns: str, name: str, node: str) -> str:
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {"nodeName": node, "containers": [{"name": "c", "image": "registry.k8s.io/pause"}]},
    }
    code, body = lab.api.request("POST", f"/api/v1/namespaces/{ns}/pods", pod)
    assert code == 201, body
    return str(body["metadata"]["uid"])


def _claim(lab: Lab, ns: str, name: str, device: str, users: dict[str, str]) -> None:
    """A claim for one device of class ``dra-gpu``, allocated ``device`` and reserved by
    ``users`` (pod name -> uid), written as the scheduler writes it (the status subresource)."""
    spec = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "dra-gpu"}}]}}
    obj = {"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
           "metadata": {"name": name, "namespace": ns}, "spec": spec}  # fmt: skip
    path = f"{BASE}/namespaces/{ns}/resourceclaims"
    code, body = lab.api.request("GET", f"{path}/{name}")
    if code == 404:
        code, body = lab.api.request("POST", path, obj)
        assert code == 201, body
    body["status"] = {
        "allocation": {
            "devices": {
                "results": [
                    {"request": "gpu", "driver": DRIVER, "pool": "pool-a", "device": device}
                ]
            }
        },
        "reservedFor": [{"resource": "pods", "name": n, "uid": u} for n, u in users.items()],
    }
    code, got = lab.api.request("PUT", f"{path}/{name}/status", body)
    assert code == 200, got.get("message")


@pytest.mark.timeout(300)
def test_one_dra_device_in_two_claims_fails_the_evidence_naming_it(
    lab: Lab, lab_nodes: Callable[..., Any], namespace: str, tmp_path: Path
) -> None:
    nodes = lab_nodes(1)
    node = nodes.names[0]
    env = ck.env(lab, tmp_path / "state")
    uids = {p: _pod(lab, namespace, p, node) for p in ("dra-a", "dra-b")}
    _claim(lab, namespace, "claim-a", "gpu-0", {"dra-a": uids["dra-a"]})
    _claim(lab, namespace, "claim-b", "gpu-0", {"dra-b": uids["dra-b"]})

    def evidence() -> dict[str, Any]:
        args = ["evidence", "--label", "after", "-i", str(nodes.inventory), "-o", "json"]
        r = ck.cli([*args, "--out", str(tmp_path / "evidence.json")], env)
        assert r.returncode == 0, r.stderr[-3000:]
        doc: dict[str, Any] = json.loads(r.stdout)
        return doc

    doc = evidence()
    claims = doc["collection"]["nodes"][node]["draClaims"]
    assert sorted(c["claim"] for c in claims) == [f"{namespace}/claim-a", f"{namespace}/claim-b"]
    check = {c["name"]: c for c in doc["checks"]}["unique-device-ids"]
    assert check["status"] == "fail", check
    assert check["problems"] == [
        f"DRA device {DRIVER}/pool-a/gpu-0 allocated to 2 claims: "
        f"{node}: {namespace}/claim-a ({namespace}/dra-a); "
        f"{node}: {namespace}/claim-b ({namespace}/dra-b)"
    ], check

    # an allocation is immutable: the duplicate claim goes, one for another device replaces it
    code, body = lab.api.request("DELETE", f"{BASE}/namespaces/{namespace}/resourceclaims/claim-b")
    assert code == 200, body
    _claim(lab, namespace, "claim-c", "gpu-1", {"dra-b": uids["dra-b"]})
    _claim(lab, namespace, "claim-shared", "gpu-2", uids)  # one claim, two pods: no duplicate
    check = {c["name"]: c for c in evidence()["checks"]}["unique-device-ids"]
    assert check["status"] == "pass", check
    assert check["checked"] >= 3, check
