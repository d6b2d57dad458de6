"""``optional_api`` decides "no connection" without importing the Kubernetes client only when
``connect`` could not have loaded anything (``rollout/cli/record.py``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.cli.record import nothing_to_load


def test_no_file_at_any_kubeconfig_path_is_nothing_to_load(tmp_path: Path) -> None:
    env = {"KUBECONFIG": f"{tmp_path / 'a'}:{tmp_path / 'b'}"}
    assert nothing_to_load(None, None, env)


def test_one_existing_path_of_several_is_something_to_load(tmp_path: Path) -> None:
    (tmp_path / "b").write_text("apiVersion: v1\n")
    env = {"KUBECONFIG": f"{tmp_path / 'a'}:{tmp_path / 'b'}"}
    assert not nothing_to_load(None, None, env)


@pytest.mark.parametrize(
    ("kubeconfig", "context", "env"),
    [
        (None, None, {"KUBECONFIG": "/nonexistent", "KUBERNETES_SERVICE_HOST": "10.0.0.1"}),
        (None, None, {"KUBECONFIG": ""}),
    ],
)
def test_anything_connect_might_load_goes_to_connect(
    kubeconfig: str | None, context: str | None, env: dict[str, str]
) -> None:
    assert not nothing_to_load(kubeconfig, context, env)


def test_a_named_kubeconfig_is_a_list_of_paths_as_the_client_merges_it(tmp_path: Path) -> None:
    # --kubeconfig takes $KUBECONFIG as its default, so the named value is usually that list
    missing = f"{tmp_path / 'a'}:{tmp_path / 'b'}"
    assert nothing_to_load(missing, None, {})
    assert nothing_to_load(missing, "prod", {"KUBERNETES_SERVICE_HOST": "10.0.0.1"})
    (tmp_path / "b").write_text("apiVersion: v1\n")
    assert not nothing_to_load(missing, None, {})


def test_without_kubeconfig_the_home_default_decides(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    assert nothing_to_load(None, None, {})
    (tmp_path / ".kube").mkdir()
    (tmp_path / ".kube" / "config").write_text("apiVersion: v1\n")
    assert not nothing_to_load(None, None, {})
