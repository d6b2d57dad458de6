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


def test_apply_imports_the_api_client_after_the_facts_start() -> None:
    """``apply`` reaches its preflight without the kubernetes package, and preflight imports it
    once the facts calls are under way (the command had come to import it first, before the
    inventory read and the facts calls: 0.5 s quiet, more under load, ``benchmarks/README.md``,
    node_step_bench)."""
    plan = Path(__file__).resolve().parents[2] / "examples" / "plan.yaml"
    code = (
        "import sys\n"
        "from rollout.change.commands import apply_change, session\n"
        "from rollout.ansible import hosts\n"
        "seen = []\n"
        "class Facts:\n"
        "    def __init__(self, *a, **k):\n"
        "        seen.append(('facts', 'kubernetes' in sys.modules))\n"
        "    def close(self):\n"
        "        pass\n"
        "session.FactsGathering = Facts\n"
        "class Inv:\n"
        "    hosts = ()\n"
        "hosts.start_inventory = lambda path: (lambda: Inv())\n"
        "def connect():\n"
        "    print(seen, 'kubernetes' in sys.modules)\n"
        "    raise SystemExit(0)\n"
        "real = apply_change.prepare_apply\n"
        "def prepare(plan, inv, _connect, opts, say):\n"
        "    seen.append(('prepare', 'kubernetes' in sys.modules))\n"
        "    return real(plan, inv, connect, opts, say)\n"
        "apply_change.prepare_apply = prepare\n"
        "from rollout.cli import cli\n"
        f"cli(['apply', '--plan', {str(plan)!r}, '-i', {str(plan)!r}, '--yes'])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert out.returncode == 0, out.stderr
    # not before the command's preflight, not before the facts calls start, then imported
    assert out.stdout.strip() == "[('prepare', False), ('facts', False)] True", (
        out.stdout + out.stderr
    )
