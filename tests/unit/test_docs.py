"""The docs: README is a landing page, the reference is an MkDocs site that builds with --strict
(a broken link or anchor fails), and the CLI reference is generated from the real command tree."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import click

from rollout.cli import cli

REPO = Path(__file__).resolve().parents[2]
MKDOCS = Path(sys.executable).parent / "mkdocs"
TWO_COMMANDS = (
    "scripts/setup && scripts/demo",
    "scripts/setup && .venv/bin/python -m pytest",
)


def build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(MKDOCS), "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def commands(
    cmd: click.Command, path: tuple[str, ...]
) -> list[tuple[tuple[str, ...], click.Command]]:
    found = [(path, cmd)]
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None
            found += commands(sub, (*path, name))
    return found


def test_readme_is_a_landing_page_with_the_two_commands() -> None:
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert len(readme.encode()) <= 12 * 1024
    for command in TWO_COMMANDS:
        assert f"\n{command}\n" in readme, command
    assert "pipx install" in readme
    for link in re.findall(r"\]\(([^)#]+)", readme):
        assert (REPO / link).exists(), f"README links to missing {link}"


def test_ci_runs_the_readmes_test_command() -> None:
    ci = (REPO / ".ci" / "run").read_text(encoding="utf-8")
    assert "scripts/setup" in ci and ".venv/bin/python -m pytest" in ci


def test_docs_build_strict_with_the_generated_cli_reference(tmp_path: Path) -> None:
    r = build(REPO / "mkdocs.yml", tmp_path / "site")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]
    page = (tmp_path / "site" / "cli" / "index.html").read_text(encoding="utf-8")
    for path, cmd in commands(cli, ("rollout",)):
        assert " ".join(path) in page, path
        for param in cmd.params:
            for opt in getattr(param, "opts", ()):
                if opt.startswith("-"):
                    assert opt in page, (path, opt)
    # the page is the code's own --help: a new option shows up with no docs edit
    assert "--keep" in page


def test_a_broken_link_fails_the_docs_build(tmp_path: Path) -> None:
    """`mkdocs build --strict` as configured really refuses a broken link and a broken anchor."""
    for name in ("nope.md", "lab.md#no-such-heading"):
        copy = tmp_path / name.replace("#", "_")
        shutil.copytree(REPO / "docs", copy / "docs")
        shutil.copy(REPO / "mkdocs.yml", copy / "mkdocs.yml")
        shutil.copytree(REPO / "scripts", copy / "scripts")
        index = copy / "docs" / "index.md"
        index.write_text(index.read_text(encoding="utf-8") + f"\n[broken]({name})\n")
        r = build(copy / "mkdocs.yml", copy / "site")
        assert r.returncode != 0, name
        assert name.split("#")[-1] in r.stdout + r.stderr, r.stderr[-2000:]
