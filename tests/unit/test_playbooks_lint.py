"""The playbooks pass ansible-lint (production profile) and yamllint, every role variable is
documented in defaults, and the defaults agree with the distribution table.

Runtime: about 6 s (ansible-lint dominates).
"""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import yaml

from rollout.kubelet.distributions import DISTRIBUTIONS

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
ROLE = REPO / "playbooks" / "roles" / "rollout_kubelet"
DEFAULTS = ROLE / "defaults" / "main.yml"


def _run(*cmd: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), "NO_COLOR": "1"},
    )


def test_ansible_lint_production_profile_is_clean() -> None:
    r = _run(str(BIN / "ansible-lint"), "--profile", "production", "--nocolor", "playbooks")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Profile 'production' was required, and it passed" in r.stdout + r.stderr


def test_yamllint_is_clean() -> None:
    r = _run(str(BIN / "yamllint"), "--strict", "playbooks", ".ansible-lint", ".yamllint")
    assert r.returncode == 0, r.stdout + r.stderr


def _defaults() -> dict[str, object]:
    data = yaml.safe_load(DEFAULTS.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def test_every_default_has_the_role_prefix_and_a_comment_above_it() -> None:
    lines = DEFAULTS.read_text(encoding="utf-8").splitlines()
    for name in _defaults():
        assert name.startswith("rollout_kubelet_"), name
        i = next(i for i, line in enumerate(lines) if line.startswith(f"{name}:"))
        above = lines[i - 1]
        # a variable may share the comment of the one right above it (a documented pair)
        assert above.startswith("#") or re.match(r"rollout_kubelet_\w+:", above), name


def test_every_role_variable_used_in_tasks_is_defined() -> None:
    defined = set(_defaults())
    text = ""
    for p in sorted((ROLE / "tasks").glob("*.yml")):
        text += p.read_text(encoding="utf-8")
    used = set(re.findall(r"\brollout_kubelet_\w+", text))
    registered = set(re.findall(r"register: (rollout_kubelet_\w+)", text))
    set_here = set(re.findall(r"^\s+(rollout_kubelet_\w+):\s*(?:>-)?$", text, re.M))
    set_in_tasks = registered | set_here
    undefined = used - defined - set_in_tasks
    assert not undefined, f"used in tasks but not in defaults/main.yml: {sorted(undefined)}"


def test_fetched_files_cover_every_distribution_path() -> None:
    patterns = _defaults()["rollout_kubelet_files"]
    assert isinstance(patterns, list)
    for d in DISTRIBUTIONS.values():
        paths = [d.config_file, *(f.path for f in d.flag_files), d.our_dropin, d.our_unit_dropin]
        paths += [d.nodeadm_file, *(r.path for r in d.regenerated)]
        for path in filter(None, paths):
            assert any(fnmatch.fnmatch(path, p) for p in patterns), (d.name, path)


def test_markers_name_every_distribution_and_checkpoint_dirs_cover_root_dirs() -> None:
    markers = _defaults()["rollout_kubelet_distribution_markers"]
    assert isinstance(markers, list)
    assert sorted(m["name"] for m in markers) == sorted(DISTRIBUTIONS)
    roots = _defaults()["rollout_kubelet_root_dirs"]
    assert isinstance(roots, list)
    assert {d.root_dir for d in DISTRIBUTIONS.values()} <= set(roots)
