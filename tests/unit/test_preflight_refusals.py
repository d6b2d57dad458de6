"""Preflight refuses (exit 3) what lint calls an error: the Kubernetes 1.34-1.37 rules reach
``prepare`` through ``rendering.node_change``, before anything is written to a node."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Any

import pytest

from rollout.ansible.hosts import Inventory
from rollout.change.plan.schema import load_plan
from rollout.change.preflight.checking import PreviewedRefusal, prepare
from rollout.models import NodeInfo, PodListing, ServingReads

CONFIG = "/var/lib/kubelet/config.yaml"
BASE = b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


class Reader:
    """Nodes ``n1`` (and more), no pods, no PDBs, no DRA: only the nodes' own rules refuse
    (a :class:`~rollout.protocols.PreflightReads` from memory)."""

    def __init__(self, names: tuple[str, ...] = ("n1",)) -> None:
        self.names = names

    def version(self) -> str:
        return "v1.37.2"

    def resource_versions(self) -> list[str]:
        return []

    def nodes(self) -> dict[str, NodeInfo]:
        return {n: NodeInfo(n, cpu_millis=4000, memory_bytes=8 * 2**30) for n in self.names}

    def pod_listing(self) -> PodListing:
        return PodListing({}, {}, {})

    def device_classes(self, versions: list[str]) -> list[dict[str, Any]]:
        return []

    def pdbs(self) -> list[Any]:
        return []

    def dra(self, versions: list[str]) -> dict[str, list[str]]:
        return {}

    def node_objects(self) -> dict[str, dict[str, Any]]:
        return {n: {"metadata": {"name": n}, "status": {}} for n in self.names}

    def controllers(self, nodes: Any = None) -> list[dict[str, Any]]:
        return []

    def serving(self) -> ServingReads:
        return ServingReads()


def facts(
    files: dict[str, bytes] | None = None, distribution: str = "kubeadm", **extra: Any
) -> dict[str, Any]:
    files = files if files is not None else {CONFIG: BASE}
    return {
        "distribution": distribution,
        "onlineCPUs": "0-3",
        "sockets": 1,
        "numaNodes": [{"id": 0, "cpus": "0-3"}],
        "gpus": [],
        "kubeletFiles": sorted(files),
        "kubeletFileMeta": {
            p: {
                "sha256": hashlib.sha256(b).hexdigest(),
                "mode": "0644",
                "owner": "root",
                "group": "root",
                "content_b64": base64.b64encode(b).decode(),
            }
            for p, b in files.items()
        },
        **extra,
    }


def plan(
    tmp_path: Path, kubelet: list[str], method: str = "inplace", strategy: tuple[str, ...] = ()
) -> Path:
    p = tmp_path / "plan.yaml"
    p.write_text(
        "\n".join(
            [
                "apiVersion: rollout.dev/v1alpha1",
                "kind: RolloutPlan",
                "metadata:",
                "  name: t",
                "kubelet:",
                *[f"  {line}" for line in kubelet],
                "strategy:",
                "  canaryGroup: canary",
                *[f"  {line}" for line in strategy],
                f"method: {method}",
            ]
        )
        + "\n"
    )
    return p


def refusal(tmp_path: Path, kubelet: list[str], raw: dict[str, Any], **kw: Any) -> str:
    inv = Inventory(tmp_path / "inv", ("n1",), {"canary": ("n1",)}, {})
    with pytest.raises(PreviewedRefusal) as e:
        prepare(
            load_plan(plan(tmp_path, kubelet, **kw)), inv, Reader(), {"n1": raw}, tmp_path, True
        )
    assert e.value.exit_code == 3
    return str(e.value)


STRICT_ALL = [
    "cpuManagerPolicy: static",
    'reservedSystemCPUs: "0-3"',
    "cpuManagerPolicyOptions:",
    '  strict-cpu-reservation: "true"',
]


def test_strict_reservation_of_every_cpu_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path, STRICT_ALL, facts())
    assert "cpuManagerPolicyOptions.strict-cpu-reservation" in message
    assert '"default cpuset cannot be empty"' in message


MICROK8S_ARGS = "/var/snap/microk8s/current/args/kubelet"
STATIC = ["cpuManagerPolicy: static", 'reservedSystemCPUs: "0"']


def test_microk8s_containerd_flag_is_refused_for_kubelet_137(tmp_path: Path) -> None:
    args = (
        b"--kubeconfig=${SNAP_DATA}/credentials/kubelet.config\n"
        b"--container-runtime-endpoint=${SNAP_COMMON}/run/containerd.sock\n"
        b"--containerd=${SNAP_COMMON}/run/containerd.sock\n"
    )
    raw = facts({MICROK8S_ARGS: args}, "microk8s", kubeletVersion="v1.37.2")
    message = refusal(tmp_path, STATIC, raw, method="flags")
    assert (
        f"{MICROK8S_ARGS}:3: error: --containerd: failed to parse kubelet flag: unknown flag: "
        "--containerd"
    ) in message
    # the same node on 1.36 is not refused: the flag is only deprecated there
    raw = facts({MICROK8S_ARGS: args}, "microk8s", kubeletVersion="v1.36.3")
    inv = Inventory(tmp_path / "inv", ("n1",), {"canary": ("n1",)}, {})
    p = load_plan(plan(tmp_path, STATIC, method="flags"))
    assert prepare(p, inv, Reader(), {"n1": raw}, tmp_path, True).changes["n1"].files


AL2_CONFIG = "/etc/kubernetes/kubelet/kubelet-config.json"
AL2_BASE = b'{"apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration"}\n'


def test_eks_al2_node_on_kubelet_135_is_refused(tmp_path: Path) -> None:
    raw = facts({AL2_CONFIG: AL2_BASE}, "eks-al2", kubeletVersion="v1.35.4")
    message = refusal(tmp_path, STATIC, raw)
    assert (
        f"{AL2_CONFIG}: error: failCgroupV1: kubelet is configured to not run on a host using "
        "cgroup v1."
    ) in message
    # with failCgroupV1: false in the plan the same node is not refused on this rule
    inv = Inventory(tmp_path / "inv", ("n1",), {"canary": ("n1",)}, {})
    p = load_plan(plan(tmp_path, [*STATIC, "failCgroupV1: false"]))
    assert prepare(p, inv, Reader(), {"n1": raw}, tmp_path, True).changes["n1"].files


def test_facts_cgroup_version_1_is_refused_on_any_distribution(tmp_path: Path) -> None:
    raw = facts(kubeletVersion="v1.36.3", cgroupVersion=1)
    assert "failCgroupV1: kubelet is configured to not run" in refusal(tmp_path, STATIC, raw)


def test_checkpoint_gate_flipped_with_the_policy_is_refused(tmp_path: Path) -> None:
    raw = facts(kubeletVersion="v1.36.3")
    kubelet = [*STATIC, "featureGates:", "  PodLevelResourceManagers: true"]
    message = refusal(tmp_path, kubelet, raw)
    assert (
        "error: featureGates.PodLevelResourceManagers: feature gate PodLevelResourceManagers "
        "changes from false to true in the same change as cpuManagerPolicy, reservedSystemCPUs"
    ) in message
    assert f"{CONFIG}:" in message


def test_k3s_server_nodes_are_changed_one_at_a_time_and_preflight_says_so(
    tmp_path: Path,
) -> None:
    names = ("n1", "n2", "n3")
    inv = Inventory(tmp_path / "inv", names, {"canary": ("n1", "n2")}, {})
    raw = {n: facts({}, "k3s", kubeletVersion="v1.35.4") for n in names}
    p = load_plan(plan(tmp_path, STATIC, method="dropin", strategy=("maxUnavailable: 2",)))
    prepared = prepare(p, inv, Reader(names), raw, tmp_path, False)
    assert [(b.nodes, b.canary) for b in prepared.batches] == [
        (("n1",), True),
        (("n2",), True),
        (("n3",), False),
    ]
    restarts = [w for w in prepared.warnings if "restarting the kubelet restarts k3s" in w]
    assert [w.split(":", 1)[0] for w in restarts] == ["node n1", "node n2", "node n3"]
    assert all("one at a time" in w for w in restarts)


def test_a_node_whose_config_cannot_be_rendered_is_refused_with_the_reason(tmp_path: Path) -> None:
    # static with no CPU reservation: the render itself refuses; the admission preview skips the
    # node instead of failing on its missing facts (it raised KeyError before the refusal)
    message = refusal(tmp_path, ["cpuManagerPolicy: static"], facts())
    assert "node n1:" in message and "unable to determine reserved CPU resources" in message
