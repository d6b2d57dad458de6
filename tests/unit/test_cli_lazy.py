"""The CLI imports a command's module only when that command runs; its table must name every
command each module registers, and nothing else."""

from __future__ import annotations

import importlib
import subprocess
import sys
from pathlib import Path

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


def test_apply_imports_the_api_client_on_a_thread() -> None:
    """``apply`` reaches its preflight without the kubernetes package: ``prepare_apply`` imports
    it on a thread while the inventory is read and the facts calls start (the command had come
    to import it first, on the main thread: 0.5 s and more before anything else began,
    ``benchmarks/README.md``, node_step_bench)."""
    plan = Path(__file__).resolve().parents[2] / "examples" / "plan.yaml"
    code = (
        "import sys\n"
        "import rollout.change.launching as launching\n"
        "def stop(*a, **k):\n"
        "    print('kubernetes' in sys.modules, 'rollout.kube.client' in sys.modules)\n"
        "    raise SystemExit(0)\n"
        "launching.prepare_apply = stop\n"
        "from rollout.cli import cli\n"
        f"cli(['apply', '--plan', {str(plan)!r}, '--yes'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False False", out.stdout + out.stderr
