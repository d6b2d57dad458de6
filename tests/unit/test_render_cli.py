"""``rollout render`` through click: exit codes, output, and nothing written on error."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from rollout.cli import cli
from tests.unit.render_fixtures import fixture_files, write_root


def _root(tmp_path: Path, dist: str) -> Path:
    return write_root(tmp_path / "node", fixture_files(dist))


def test_prints_files_with_node_path_headers(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli,
        [
            "render",
            "-d",
            "k3s",
            "--node-root",
            str(_root(tmp_path, "k3s")),
            "--reserved-cpus",
            "0,1",
        ],
    )
    assert r.exit_code == 0, r.output
    assert "# /var/lib/rancher/k3s/agent/etc/kubelet.conf.d/90-rollout.conf (create" in r.output
    assert 'reservedSystemCPUs: "0,1"' in r.output


def test_json_output_and_out_dir(tmp_path: Path) -> None:
    out = tmp_path / "out"
    r = CliRunner().invoke(
        cli,
        [
            "render",
            "-d",
            "kubeadm",
            "--node-root",
            str(_root(tmp_path, "kubeadm")),
            "--reserved-cpus",
            "0,32",
            "--method",
            "inplace",
            "-o",
            "json",
            "--out-dir",
            str(out),
        ],
    )
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert [f["path"] for f in doc["files"]] == ["/var/lib/kubelet/config.yaml"]
    assert doc["checkpointReset"] == ["/var/lib/kubelet/cpu_manager_state"]
    written = (out / "var/lib/kubelet/config.yaml").read_text()
    assert written == doc["files"][0]["content"]


def test_effective_prints_merged_config(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli,
        [
            "render",
            "-d",
            "eks-al2023",
            "--node-root",
            str(_root(tmp_path, "eks-al2023")),
            "--reserved-cpus",
            "0,1",
            "--effective",
        ],
    )
    assert r.exit_code == 0, r.output
    cfg = json.loads(r.stdout)
    assert cfg["maxPods"] == 17 and cfg["systemReservedCgroup"] == ""


def test_static_without_reservation_is_bad_input(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli, ["render", "-d", "rke2", "--node-root", str(_root(tmp_path, "rke2"))]
    )
    assert r.exit_code == 2
    assert "unable to determine reserved CPU resources for static policy" in r.output


def test_conflict_writes_nothing(tmp_path: Path) -> None:
    files = fixture_files("rke2")
    files["/etc/rancher/rke2/config.yaml.d/60-x.yaml"] = b'kubelet-arg: ["reserved-cpus=0-3"]\n'
    root = write_root(tmp_path / "node", files)
    out = tmp_path / "out"
    r = CliRunner().invoke(
        cli,
        [
            "render",
            "-d",
            "rke2",
            "--node-root",
            str(root),
            "--reserved-cpus",
            "0,1",
            "--out-dir",
            str(out),
        ],
    )
    assert r.exit_code == 2
    assert "60-x.yaml" in r.output and "reservedSystemCPUs" in r.output
    assert not out.exists()


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    root = write_root(tmp_path / "node", {"/var/lib/kubelet/config.yaml": b"a: 1\nb: [\n"})
    r = CliRunner().invoke(
        cli, ["render", "-d", "kubeadm", "--node-root", str(root), "--reserved-cpus", "0"]
    )
    assert r.exit_code == 2
    assert "/var/lib/kubelet/config.yaml:" in r.output and "invalid YAML" in r.output


def test_plan_unknown_key_suggests(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text("apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\nkubelt: {}\n")
    r = CliRunner().invoke(
        cli,
        ["render", "-d", "k3s", "--node-root", str(_root(tmp_path, "k3s")), "--plan", str(plan)],
    )
    assert r.exit_code == 2
    assert f"{plan}:3" in r.output and 'did you mean "kubelet"' in r.output


def test_plan_per_node_override(tmp_path: Path) -> None:
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "apiVersion: rollout.dev/v1alpha1\nkind: RolloutPlan\nmetadata: {name: canary}\n"
        'distribution: k3s\nkubelet:\n  reservedSystemCPUs: "0"\n'
        'nodes:\n  gpu-07:\n    kubelet: {reservedSystemCPUs: "0,64"}\n'
    )
    r = CliRunner().invoke(
        cli,
        [
            "render",
            "--node-root",
            str(_root(tmp_path, "k3s")),
            "--plan",
            str(plan),
            "--node",
            "gpu-07",
        ],
    )
    assert r.exit_code == 0, r.output
    assert 'reservedSystemCPUs: "0,64"' in r.output and "(canary)" in r.output


def test_unknown_set_field_warns_with_suggestion(tmp_path: Path) -> None:
    r = CliRunner().invoke(
        cli,
        [
            "render",
            "-d",
            "k3s",
            "--node-root",
            str(_root(tmp_path, "k3s")),
            "--reserved-cpus",
            "0",
            "--set",
            "maxPod=20",
        ],
    )
    assert r.exit_code == 0
    assert 'did you mean "maxPods"' in r.output
