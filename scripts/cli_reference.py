"""The CLI reference page, ``cli.md``, generated from the real click command tree at build time.

An MkDocs hook (``hooks:`` in ``mkdocs.yml``): every ``mkdocs build`` / ``mkdocs serve`` adds
``cli.md`` with every command's ``--help``, so the page cannot drift from the code and no
generated file is checked in. To read the page without MkDocs:

    .venv/bin/python scripts/cli_reference.py > cli.md
"""

from __future__ import annotations

import sys

import click
from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from rollout.cli import cli

WIDTH = 100

HEADER = """\
# CLI reference

Every command's `--help`, generated from the command tree when the docs are built
(`scripts/cli_reference.py`, an MkDocs hook), so it always matches the code. Every option also
reads `ROLLOUT_<OPTION>` from the environment. Exit codes: [Exit codes](exit-codes.md).
"""


def render() -> str:
    """The page's Markdown: one section per command, depth first, in the order ``--help`` lists."""
    out = [HEADER]

    def walk(cmd: click.Command, path: list[str], parent: click.Context | None) -> None:
        ctx = click.Context(
            cmd, info_name=path[-1], parent=parent, terminal_width=WIDTH, max_content_width=WIDTH
        )
        out.extend([f"## `{' '.join(path)}`", "", "```text", cmd.get_help(ctx).rstrip(), "```", ""])
        if isinstance(cmd, click.Group):
            for name in cmd.list_commands(ctx):
                sub = cmd.get_command(ctx, name)
                if sub is not None and not sub.hidden:
                    walk(sub, [*path, name], ctx)

    walk(cli, ["rollout"], None)
    return "\n".join(out).rstrip() + "\n"


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """MkDocs hook: add the generated ``cli.md`` to the site."""
    files.append(File.generated(config, "cli.md", content=render()))
    return files


if __name__ == "__main__":
    sys.stdout.write(render())
