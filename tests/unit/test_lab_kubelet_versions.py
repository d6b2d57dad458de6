"""``rollout lab up --kubelet-version``: which versions the lab builds, the version skew policy,
and that a refused version changes nothing (no control plane started, no lab dir, no build)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout.cli import cli
from rollout.errors import LabError
from rollout.lab import builds, cluster, realnode
from rollout.lab.binaries import K8S_VERSION

REPO = Path(__file__).resolve().parents[2]


def test_the_labs_own_minor_is_the_control_planes_version() -> None:
    minor = ".".join(K8S_VERSION.lstrip("v").split(".")[:2])
    assert realnode.KUBELET_VERSIONS[minor] == K8S_VERSION
    assert realnode.lab_version() == K8S_VERSION
    for m, full in realnode.KUBELET_VERSIONS.items():
        assert re.fullmatch(r"v" + re.escape(m) + r"\.\d+", full), (m, full)


@pytest.mark.parametrize(
    ("spec", "want"),
    [
        (None, K8S_VERSION),
        ("", K8S_VERSION),
        ("1.34", "v1.34.4"),
        ("v1.35", "v1.35.4"),
        ("1.35.4", "v1.35.4"),
        ("v1.36.3", "v1.36.3"),
        ("1.36", "v1.36.3"),
    ],
)
def test_versions_the_lab_builds(spec: str | None, want: str) -> None:
    assert realnode.kubelet_version(spec, "v1.36.3") == want


@pytest.mark.parametrize("spec", ["1.33", "1.38", "2.0", "latest", "1.35.1", "v1.36.0", "1"])
def test_unknown_versions_are_refused_naming_the_valid_ones(spec: str) -> None:
    with pytest.raises(LabError, match=r"unknown kubelet version .*1\.34, 1\.35, 1\.36, 1\.37"):
        realnode.kubelet_version(spec, "v1.36.3")


def test_skew_policy_a_kubelet_never_newer_than_the_api_server() -> None:
    with pytest.raises(LabError, match=r"newer than the lab's control plane v1\.36\.3") as e:
        realnode.kubelet_version("1.37", "v1.36.3")
    assert "version skew policy" in str(e.value) and "1.36 or older" in str(e.value)
    # the same kubelet with a control plane of its own version (or newer) is fine
    assert realnode.kubelet_version("1.37", "v1.37.2") == "v1.37.2"
    assert realnode.kubelet_version("1.34", "v1.37.2") == "v1.34.4"  # three minors older


def test_skew_policy_at_most_three_minors_older() -> None:
    with pytest.raises(LabError, match=r"4 minor versions older .* at most 3"):
        realnode.kubelet_version("1.34", "v1.38.0")


def test_check_kubelet_kinds() -> None:
    assert builds.check_kubelet("sim", None, K8S_VERSION) is None
    assert builds.check_kubelet("real", None, K8S_VERSION) == K8S_VERSION
    assert builds.check_kubelet("real", "1.35", K8S_VERSION) == "v1.35.4"
    assert builds.check_kubelet("sim", "1.35", K8S_VERSION) == "v1.35.4"
    with pytest.raises(LabError, match="unknown kubelet 'docker'"):
        builds.check_kubelet("docker", None, K8S_VERSION)


def test_bin_dir_is_keyed_by_version(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROLLOUT_LAB_CACHE", str(tmp_path))
    monkeypatch.delenv("ROLLOUT_LAB_KUBELET_BIN", raising=False)
    assert realnode.find_kubelet_bin_dir() == tmp_path / f"kubelet-{K8S_VERSION}" / "bin"
    assert realnode.find_kubelet_bin_dir("v1.35.4") == tmp_path / "kubelet-v1.35.4" / "bin"
    # prebuilt binaries stand for the lab's version only
    monkeypatch.setenv("ROLLOUT_LAB_KUBELET_BIN", "/prebuilt")
    assert realnode.find_kubelet_bin_dir() == Path("/prebuilt")
    assert realnode.find_kubelet_bin_dir("v1.35.4") == tmp_path / "kubelet-v1.35.4" / "bin"


def test_build_passes_the_version_to_the_script(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[list[str]] = []

    class Done:
        returncode = 1
        stdout = ""
        stderr = "boom"

    def fake_run(argv: list[str], **_kw: object) -> Done:
        seen.append(argv)
        return Done()

    monkeypatch.setattr(realnode.subprocess, "run", fake_run)
    with pytest.raises(LabError, match="boom"):
        realnode.build(version="v1.35.4")
    assert seen[0][-2:] == [str(REPO / "tools/build-lab-kubelet.sh"), "v1.35.4"]


def test_the_simulated_kubelet_plays_every_version_up_to_137() -> None:
    # the sim plays a version's node side only and builds nothing: 1.37 against the lab's own
    # control plane is allowed for it (a real 1.37 kubelet is refused above)
    for minor, full in realnode.KUBELET_VERSIONS.items():
        assert builds.check_kubelet("sim", minor, K8S_VERSION) == full
    assert builds.check_kubelet("sim", "1.37", "v1.36.3") == "v1.37.2"
    with pytest.raises(LabError, match=r"unknown kubelet version '1\.38'"):
        builds.check_kubelet("sim", "1.38", K8S_VERSION)
    with pytest.raises(LabError, match=r"4 minor versions older .* at most 3"):
        builds.check_kubelet("sim", "1.34", "v1.38.0")


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--kubelet-version", "1.99"], "unknown kubelet version '1.99'"),
        (["--kubelet-version", "1.37"], "newer than the lab's control plane"),
        (["--kubelet", "sim", "--kubelet-version", "1.33"], "unknown kubelet version '1.33'"),
    ],
)
def test_cli_refuses_before_anything_starts(
    args: list[str], words: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def must_not_run(*_a: object, **_k: object) -> None:
        raise AssertionError("the refused version started something")

    monkeypatch.setattr(cluster.Lab, "start_control_plane", must_not_run)
    monkeypatch.setattr(realnode, "build", must_not_run)
    lab_dir = tmp_path / "lab"
    r = CliRunner().invoke(cli, ["lab", "up", "--nodes", "1", "--workdir", str(lab_dir), *args])
    assert r.exit_code != 0, r.output
    assert words in r.output, r.output
    assert not lab_dir.exists()
