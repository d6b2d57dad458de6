"""The three loaders of operator-named files (plan, tenancy file, KubeletConfiguration) refuse a
missing or unreadable file with the same message, naming the file, through ``read_input``."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from rollout.change.plan.schema import load_plan
from rollout.change.tenancy.policy import load as load_tenancy
from rollout.errors import InputError
from rollout.kubelet.documents import load_file

LOADERS: list[Callable[[Path], Any]] = [load_plan, load_tenancy, load_file]


@pytest.mark.parametrize("loader", LOADERS)
def test_a_missing_file_is_named(loader: Callable[[Path], Any], tmp_path: Path) -> None:
    missing = tmp_path / "nope.yaml"
    with pytest.raises(InputError) as err:
        loader(missing)
    assert str(err.value) == f"{missing}: no such file"


@pytest.mark.parametrize("loader", LOADERS)
def test_an_unreadable_file_is_named_with_why(
    loader: Callable[[Path], Any], tmp_path: Path
) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"name: caf\xe9\n")  # not UTF-8
    with pytest.raises(InputError) as err:
        loader(bad)
    assert str(err.value).startswith(f"{bad}: cannot read: "), err.value
    assert "utf-8" in str(err.value)


def test_the_kubelet_loader_names_the_file_as_shown(tmp_path: Path) -> None:
    with pytest.raises(InputError) as err:
        load_file(tmp_path / "x.yaml", display="node-1:/var/lib/kubelet/config.yaml")
    assert str(err.value) == "node-1:/var/lib/kubelet/config.yaml: no such file"
