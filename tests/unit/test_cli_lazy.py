"""The CLI imports a command's module only when that command runs; its table must name every
command each module registers, and nothing else."""

from __future__ import annotations

import importlib
import subprocess
import sys

from rollout.cli import COMMAND_MODULES, cli


def test_the_table_matches_each_modules_commands() -> None:
    registered: dict[str, str] = {}
    for module in sorted(set(COMMAND_MODULES.values())):
        for cmd in importlib.import_module(module).COMMANDS:
            registered[cmd.name] = module
    assert registered == COMMAND_MODULES


def test_help_lists_every_command() -> None:
    import click

    ctx = click.Context(cli)
    assert cli.list_commands(ctx) == sorted(COMMAND_MODULES)


def test_apply_does_not_import_the_lab_or_the_docs() -> None:
    code = (
        "import sys; from rollout.cli import cli; import click; "
        "cli.get_command(click.Context(cli), 'apply'); "
        "print(sorted(m for m in sys.modules if m.startswith(('rollout.lab', 'rollout.cli.docs'))))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
