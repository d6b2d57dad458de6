"""The command line: thin click commands that parse, call the core, and print.

This is the only place where errors become exit codes (see ``rollout.errors`` for the table).
Commands live in one module per area (``kubelet``: render/lint, ``lab``: the local cluster,
``change``: apply/status, ``promote``, ``resume``, ``rollback``, their shared adapters in
``wiring``) so that areas do not grow into one another; this module
assembles them. Every option also reads ``ROLLOUT_<OPTION>`` from the environment.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

import click

from rollout import __version__
from rollout.errors import RolloutError

# Each command's module, imported only when that command runs (or help lists it): `rollout apply`
# does not pay for the lab's or the docs' imports. tests/unit/test_cli_lazy.py checks this table
# against each module's COMMANDS.
COMMAND_MODULES = {
    "render": "rollout.cli.kubelet",
    "lint": "rollout.cli.lint",
    "lab": "rollout.cli.lab",
    "apply": "rollout.cli.change",
    "migrate": "rollout.cli.migrate",
    "status": "rollout.cli.change",
    "promote": "rollout.cli.promote",
    "resume": "rollout.cli.resume",
    "rollback": "rollout.cli.rollback",
    "preview": "rollout.cli.preview",
    "watch": "rollout.cli.gate",
    "serve": "rollout.cli.gate",
    "runbook": "rollout.cli.docs",
    "report": "rollout.cli.docs",
    "evidence": "rollout.cli.docs",
    "bench": "rollout.cli.bench",
    "nodes": "rollout.cli.fleet",
    "tenancy": "rollout.cli.tenancy",
}


class _Group(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted(n for n in COMMAND_MODULES if self.get_command(ctx, n) is not None)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        name = COMMAND_MODULES.get(cmd_name)
        if name is None:
            return None
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:
            if e.name != name:
                raise
            return None  # an optional area that is not installed
        for cmd in getattr(mod, "COMMANDS", ()):
            if cmd.name == cmd_name:
                return cmd  # type: ignore[no-any-return]
        return None

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except RolloutError as e:
            click.echo(f"error: {e}", err=True)
            ctx.exit(e.exit_code)


@click.group(
    cls=_Group,
    context_settings={"auto_envvar_prefix": "ROLLOUT", "help_option_names": ["-h", "--help"]},
)
@click.version_option(__version__, prog_name="rollout")
def cli() -> None:
    """Change the kubelet's CPU, Topology and Memory manager configuration on nodes, safely.

    \b
    Examples:
      rollout render --distribution kubeadm --node-root ./node1 --reserved-cpus 0,32
      rollout lint --distribution k3s --node-root ./node1 -o json
      rollout lab up --nodes 4 && eval "$(rollout lab env)"
      rollout apply --canary
    """


def main() -> None:
    """Console-script entry point."""
    sys.exit(cli.main(standalone_mode=True))
