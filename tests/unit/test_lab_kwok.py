"""The lab's kwok: its manifests, arguments, recorded state and bad input, without starting it."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from rollout.cli import cli
from rollout.errors import LabError
from rollout.lab import kwok as kw
from rollout.lab import labstate

ROOT = Path(__file__).resolve().parents[2]


def test_version_matches_the_wrapper_module() -> None:
    gomod = (ROOT / "tools" / "kwokbin" / "go.mod").read_text()
    assert re.search(rf"^\s+sigs\.k8s\.io/kwok {re.escape(kw.KWOK_VERSION)}\b", gomod, re.M)
    # its k8s.io modules pinned to the control plane's, so the Go build cache is shared
    k8s = (ROOT / "tools" / "k8sbin" / "K8S_VERSION").read_text().strip()
    staging = "v0." + k8s.split(".", 1)[1]
    for mod in ("api", "apimachinery", "client-go", "apiserver", "component-base"):
        assert re.search(rf"^\s+k8s\.io/{mod} {re.escape(staging)}\b", gomod, re.M), mod


def test_node_manifest_is_labelled_tainted_and_has_gpus() -> None:
    n = kw.node_manifest("lab1", "lab1-kwok7")
    labels = n["metadata"]["labels"]
    assert labels[kw.KWOK_LABEL] == "lab1" and labels["rollout.dev/lab"] == "lab1"
    assert labels["kubernetes.io/hostname"] == "lab1-kwok7"
    assert labels["nvidia.com/gpu.present"] == "true"
    assert n["spec"]["taints"] == [{"key": kw.TAINT_KEY, "value": "fake", "effect": "NoSchedule"}]
    alloc = n["status"]["allocatable"]
    assert alloc == n["status"]["capacity"]
    assert {k: alloc[k] for k in ("cpu", "memory", "nvidia.com/gpu")} == {
        "cpu": "64",
        "memory": "1Ti",
        "nvidia.com/gpu": "8",
    }


def test_deployment_is_pinned_to_its_node_and_tolerates_only_the_kwok_taint() -> None:
    d = kw.deployment_manifest("lab1", "lab1-kwok3", 10)
    assert d["metadata"]["namespace"] == kw.NAMESPACE
    assert d["spec"]["replicas"] == 10
    spec = d["spec"]["template"]["spec"]
    assert spec["nodeName"] == "lab1-kwok3"
    assert spec["nodeSelector"] == {kw.KWOK_LABEL: "lab1"}
    assert spec["tolerations"] == [
        {"key": kw.TAINT_KEY, "operator": "Exists", "effect": "NoSchedule"}
    ]
    sel = d["spec"]["selector"]["matchLabels"]
    assert sel.items() <= d["spec"]["template"]["metadata"]["labels"].items()


def test_args_manage_only_the_labs_nodes_on_loopback() -> None:
    args = kw.kwok_args("lab1", Path("/k/admin.kubeconfig"), Path("/k/stages.yaml"), 500)
    assert "--kubeconfig=/k/admin.kubeconfig" in args
    assert f"--manage-nodes-with-label-selector={kw.KWOK_LABEL}=lab1" in args
    assert "--config=/k/stages.yaml" in args
    assert "--node-ip=127.0.0.1" in args
    assert "--v=WARN" in args  # not a line per Lease renewal
    assert not any(a.startswith(("--manage-all-nodes", "--server-address")) for a in args)
    assert "--node-lease-duration-seconds=32" in args


@pytest.mark.parametrize(
    ("count", "lease", "grace"),
    [(1, 32, 32), (500, 32, 32), (1280, 32, 32), (1281, 33, 33), (2000, 50, 50), (5000, 125, 125)],
)
def test_lease_and_grace_grow_with_the_kwok_nodes(count: int, lease: int, grace: int) -> None:
    args = kw.kwok_args("lab1", Path("/k/admin.kubeconfig"), Path("/k/stages.yaml"), count)
    assert f"--node-lease-duration-seconds={lease}" in args
    kcm = kw.kcm_args(count)
    assert kcm[: len(kw.KCM_ARGS)] == kw.KCM_ARGS
    flags = [a for a in kcm if a.startswith("--node-monitor-grace-period=")]
    assert flags == [f"--node-monitor-grace-period={grace}s"]
    # kwok renews every quarter of the Lease (4% jitter): three renewals fit in the grace
    # period, so one late renewal never turns a Node NotReady
    assert lease / 4 * 1.04 * 3 < grace
    # and it renews at most about NODES_PER_LEASE_SECOND * 4 Leases a second
    assert count / (lease / 4) <= kw.NODES_PER_LEASE_SECOND * 4


def test_a_lab_without_kwok_nodes_keeps_the_controller_managers_flags() -> None:
    assert kw.kcm_args(0) == ()


def test_controller_manager_flags_of_a_kwok_lab_come_last(tmp_path: Path) -> None:
    from rollout.lab.controlplane import ControlPlane

    plain = ControlPlane(tmp_path, tmp_path)
    kwok_lab = ControlPlane(tmp_path, tmp_path, kcm_extra_args=kw.kcm_args(500))
    kwok_lab.kcm_port = plain.kcm_port
    args, plain = kwok_lab._kcm_args(), plain._kcm_args()
    assert args == [*plain, *kw.kcm_args(500)]  # the later flag wins
    assert "--node-monitor-grace-period=10s" in plain


def test_stages_cover_nodes_and_pods() -> None:
    docs = list(yaml.safe_load_all(kw.stages_text()))
    names = {d["metadata"]["name"] for d in docs if d}
    assert names == {
        "node-initialize",
        "node-heartbeat-with-lease",
        "pod-ready",
        "pod-complete",
        "pod-delete",
    }
    assert all(d["kind"] == "Stage" for d in docs if d)


def test_node_names_and_ready_count() -> None:
    assert kw.node_names("a", 3) == ["a-kwok1", "a-kwok2", "a-kwok3"]
    assert kw.node_names("a", 0) == []
    ready = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    not_ready = {"status": {"conditions": [{"type": "Ready", "status": "Unknown"}]}}
    assert kw.ready_count([ready, not_ready, {}, ready]) == 2


@pytest.mark.parametrize(("nodes", "pods"), [(-1, 10), (5, -2)])
def test_negative_counts_are_refused(nodes: int, pods: int) -> None:
    with pytest.raises(LabError, match="0 or more"):
        kw.check_counts(nodes, pods)


def test_state_round_trips_through_lab_json(tmp_path: Path) -> None:
    k = kw.KwokState(pid=4321, bin_dir="/c/kwok-v0.8.0/bin", nodes=500, pods_per_node=10)
    state = labstate.state_of(
        name="x",
        lab_dir=tmp_path,
        bin_dir=None,
        relay_pid=0,
        cp=None,
        kubeconfig=tmp_path / "kc",
        monitoring=None,
        nodes={},
        kwok=k,
    )
    assert state["kwok"] == {
        "pid": 4321,
        "binDir": "/c/kwok-v0.8.0/bin",
        "nodes": 500,
        "podsPerNode": 10,
    }
    assert labstate.load(tmp_path, state).kwok == k
    assert labstate.load(tmp_path, {**state, "kwok": None}).kwok is None


@pytest.mark.parametrize(
    "args",
    [["--kwok-nodes", "-1"], ["--kwok-nodes", "x"], ["--kwok-pods-per-node", "-1"]],
)
def test_cli_refuses_bad_counts_before_starting_anything(args: list[str], tmp_path: Path) -> None:
    r = CliRunner().invoke(cli, ["lab", "up", "--workdir", str(tmp_path / "lab"), *args])
    assert r.exit_code == 2, r.output
    assert "--kwok" in r.output
    assert not (tmp_path / "lab").exists()


def test_build_failure_is_a_lab_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rollout.lab import builds

    monkeypatch.setenv("ROLLOUT_LAB_KWOK_BIN", str(tmp_path / "none"))
    script = tmp_path / "tools" / "build-lab-kwok.sh"
    script.parent.mkdir()
    script.write_text("echo go: cannot reach the proxy >&2; exit 3\n")
    monkeypatch.setattr(builds.assets, "lab_tools", lambda: script.parent)
    with pytest.raises(LabError, match=r"build-lab-kwok\.sh failed \(exit 3\)"):
        builds.build_kwok(lambda _m: None)
