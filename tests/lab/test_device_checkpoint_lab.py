"""In the lab: the kubelet's device checkpoint is real, survives a kubelet restart, and is what
``rollout evidence`` reads.

A GPU pod is admitted; ``device-plugins/kubelet_internal_checkpoint`` on the node holds its UID
with the GPU under the NUMA node of that GPU, with the kubelet's checksum. The kubelet process is
stopped and started again (a new process restores from the file), and a second GPU pod gets a
different GPU: the first assignment was restored from the checkpoint, not forgotten.
"""

from __future__ import annotations

from typing import Any

import pytest

from rollout.kubelet.device_checkpoint import DEVICE_CHECKPOINT_FILE, parse_device
from rollout.lab.cluster import Lab
from tests.lab.changekit import wait_for
from tests.lab.test_lab_kubelet import _configure, _get, _phase, _pod, _wait_policy

pytestmark = pytest.mark.lab

GPU1 = {"cpu": "2", "memory": "64Mi", "nvidia.com/gpu": "1"}


def _assignments(lab: Lab, node: str) -> dict[str, dict[int, tuple[str, ...] | None]]:
    text = (lab.machines.node_root(node) / "var/lib/kubelet" / DEVICE_CHECKPOINT_FILE).read_text()
    cp = parse_device(text)  # raises unless the checksum is the kubelet's
    return {e.pod_uid: dict(e.device_ids or {}) for e in cp.entries or ()}


@pytest.mark.timeout(120)
def test_device_checkpoint_survives_a_kubelet_restart(
    lab: Lab, lab_nodes: Any, namespace: str
) -> None:
    (node,) = lab_nodes(1).names
    _configure(
        lab,
        node,
        {
            "cpuManagerPolicy": "static",
            "reservedSystemCPUs": "0,32",
            "topologyManagerPolicy": "single-numa-node",
        },
    )
    _wait_policy(lab, node, "single-numa-node")
    lab.machines.wait_ready([node], timeout=20)
    ns = namespace

    def run(name: str) -> str:
        code, body = lab.api.request(
            "POST", f"/api/v1/namespaces/{ns}/pods", _pod(name, node, GPU1)
        )
        assert code == 201, body
        wait_for(lambda: _phase(lab, ns, name).get("phase") == "Running", 30, f"{name} running")
        return str(_get(lab, f"/api/v1/namespaces/{ns}/pods/{name}")["metadata"]["uid"])

    first = run("gpu-a")
    before = _assignments(lab, node)
    ((numa, ids),) = before[first].items()
    assert ids is not None and len(ids) == 1

    lab.machines.stop_kubelet(node)
    lab.machines.start_kubelet(node)
    lab.machines.wait_ready([node], timeout=30)
    assert _assignments(lab, node)[first] == {numa: ids}  # restored and written back

    second = run("gpu-b")
    after = _assignments(lab, node)
    assert set(after) >= {first, second}
    (ids_b,) = after[second].values()
    assert ids_b is not None and set(ids_b).isdisjoint(ids)
