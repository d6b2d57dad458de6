"""Shared pytest configuration.

Lab tests (``@pytest.mark.lab``) need the real control plane and SSH nodes. They are skipped
only on a developer machine without the lab binaries; when ``CI`` is set they are never
skipped: a missing lab there is a failure.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
IN_CI = os.environ.get("CI", "").lower() not in ("", "0", "false")


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO
