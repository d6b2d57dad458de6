"""The house rules CI enforces: ruff (lint + format), mypy --strict on rollout/, and the
import-linter contracts (only rollout.kube imports kubernetes; only rollout.ansible imports
ansible_runner) and vulture (no dead code; vulture_whitelist.py says why each listed name is
used). ansible-lint and yamllint run in test_playbooks_lint.py."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


@pytest.mark.parametrize(
    "cmd",
    [
        ["ruff", "check", "."],
        ["ruff", "format", "--check", "."],
        ["mypy"],
        ["lint-imports"],
        ["vulture"],
    ],
    ids=["ruff", "ruff-format", "mypy-strict", "import-linter", "vulture"],
)
def test_house_tool_is_clean(cmd: list[str]) -> None:
    r = subprocess.run(
        [str(BIN / cmd[0]), *cmd[1:]], cwd=REPO, capture_output=True, text=True, timeout=600
    )
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
