"""Lab fixtures: one real control plane per test run, fresh nodes and a namespace per test.

* ``lab`` (session): control plane + API relay, started once. Skipped only when the binaries are
  missing and ``CI`` is not set; in CI a missing lab is a failure.
* ``lab_nodes`` (function): a factory ``lab_nodes(count=2, distribution="kubeadm", ready=True,
  kubelet=$ROLLOUT_LAB_KUBELET or "sim", shape=None)`` (``shape``: the simulated hardware,
  ``rollout.lab.hardware.NodeShape``; default its default)
  returning :class:`Nodes` (names unique to the test, an inventory file for them); all are torn
  down (processes, namespaces, Node objects) after the test.
* ``namespace`` (function): a fresh Kubernetes namespace, deleted after the test.
* ``kube``: a ``kubernetes.client.ApiClient`` for the lab (admin).
"""

from __future__ import annotations

import itertools
import os
import re
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.binaries import find_bin_dir, missing_binaries
from rollout.lab.cluster import Lab
from rollout.lab.hardware import NodeShape
from rollout.lab.nodefiles import LabNode

IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")
# testinfra's ansible backend and the tests call ansible-inventory / ansible-playbook by name
_BIN = str(Path(sys.executable).parent)
if _BIN not in os.environ.get("PATH", "").split(os.pathsep):
    os.environ["PATH"] = _BIN + os.pathsep + os.environ.get("PATH", "")
_counter = itertools.count(1)


@dataclass(frozen=True)
class Nodes:
    """Nodes made for one test."""

    nodes: list[LabNode]
    inventory: Path

    @property
    def names(self) -> list[str]:
        return [n.name for n in self.nodes]

    def __getitem__(self, i: int) -> LabNode:
        return self.nodes[i]


@pytest.fixture(scope="session")
def lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Lab]:
    missing = missing_binaries(find_bin_dir())
    if missing:
        msg = (
            f"lab binaries missing in {find_bin_dir()}: {missing}; run tools/build-lab-binaries.sh"
        )
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    the_lab = Lab(f"pt{os.getpid()}", tmp_path_factory.mktemp("lab"))
    the_lab.start_control_plane()
    try:
        yield the_lab
    finally:
        the_lab.down()


@pytest.fixture(scope="session")
def kube(lab: Lab) -> Any:
    from kubernetes import config

    return config.new_client_from_config(config_file=str(lab.kubeconfig))


@pytest.fixture
def lab_nodes(
    lab: Lab, request: pytest.FixtureRequest, tmp_path: Path
) -> Iterator[Callable[..., Nodes]]:
    made: list[str] = []
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:20].strip("-")

    def make(
        count: int = 2,
        distribution: str = "kubeadm",
        ready: bool = True,
        kubelet: str = "",
        shape: NodeShape | None = None,
    ) -> Nodes:
        # $ROLLOUT_LAB_KUBELET=real runs every test that does not choose a kind on real kubelets
        kubelet = kubelet or os.environ.get("ROLLOUT_LAB_KUBELET", "sim")
        prefix = f"t{next(_counter)}-{slug}"
        names = [f"{prefix}-{i}" for i in range(1, count + 1)]
        made.extend(names)
        nodes = lab.machines.add_nodes(
            names, distribution.split(","), wait_ready=ready, kubelet=kubelet, shape=shape
        )
        inv = lab.machines.write_inventory(names, tmp_path / f"{prefix}.ini")
        return Nodes(nodes, inv)

    yield make
    lab.machines.remove_nodes(made)


@pytest.fixture
def namespace(kube: Any, request: pytest.FixtureRequest) -> Iterator[str]:
    from kubernetes import client

    core = client.CoreV1Api(kube)
    slug = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = f"t{next(_counter)}-{slug}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    # the ServiceAccount controller creates "default"; pods cannot be created before it exists
    # (on a loaded 2-core machine it has taken over 30 s)
    deadline = time.monotonic() + 120
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            break
        except client.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    yield name
    core.delete_namespace(name, grace_period_seconds=0)
