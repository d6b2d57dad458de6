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

# Areas register their commands lazily so a missing optional area never breaks the others.
_AREAS = (
    "rollout.cli.kubelet",
    "rollout.cli.lint",
    "rollout.cli.lab",
    "rollout.cli.change",
    "rollout.cli.promote",
    "rollout.cli.resume",
    "rollout.cli.rollback",
    "rollout.cli.preview",
    "rollout.cli.gate",
    "rollout.cli.docs",
)


class _Group(click.Group):
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


for _name in _AREAS:
    try:
        _mod = importlib.import_module(_name)
    except ModuleNotFoundError as _e:
        if _e.name != _name:
            raise
        continue
    for _cmd in getattr(_mod, "COMMANDS", ()):
        cli.add_command(_cmd)


def main() -> None:
    """Console-script entry point."""
    sys.exit(cli.main(standalone_mode=True))
