"""The CLI's surface, audited over the real command tree: every command has ``-o json`` and
``--help`` with examples, every command that talks to the API takes ``--kubeconfig`` and
``--context``, the exit-code table in docs/exit-codes.md matches the code, and the JSON each
command prints (where it needs no cluster) parses."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from rollout import errors
from rollout.change.record.change_outcomes import GATE_HOLDS_EXIT
from rollout.cli import cli
from rollout.cli.fleet import DRIFT_EXIT, TWO_PATHS_EXIT

ROOT = Path(__file__).resolve().parents[2]

#: Commands that call the Kubernetes API (directly, or through the rollback they run).
TALKS_TO_API = {
    "apply", "preview", "promote", "rollback", "resume", "watch", "serve", "runbook", "evidence",
    "migrate",
    "status",  # reads the cluster's record of a change this machine has no journal for
    "report",  # the same
    "nodes",
    "bench",  # reads the Node's labels (GPU product, lab)
    "tenancy render", "tenancy audit",  # the live checks, the probes
}  # fmt: skip


def leaves(cmd: click.Command, prefix: str = "") -> list[tuple[str, click.Command]]:
    """Every leaf command, through the groups' own lookup (the top group loads its commands'
    modules lazily, so ``.commands`` is empty until asked)."""
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd)
        out = []
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            assert sub is not None, name
            out.extend(leaves(sub, f"{prefix} {name}".strip()))
        return out
    return [(prefix, cmd)]


COMMANDS = leaves(cli)
NAMES = [n for n, _ in COMMANDS]


def test_every_command_of_the_issue_is_there() -> None:
    expected = {
        "render", "lint", "lab up", "lab down", "lab status", "lab env", "lab fault", "apply",
        "rollback", "status", "resume", "watch", "serve", "runbook", "report", "evidence",
        "promote",
    }  # fmt: skip
    assert expected <= set(NAMES)


def _opts(cmd: click.Command) -> dict[str, click.Parameter]:
    return {o: p for p in cmd.params for o in getattr(p, "opts", [])}


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=NAMES)
def test_output_json_and_examples_everywhere(name: str, cmd: click.Command) -> None:
    out = _opts(cmd).get("--output")
    assert out is not None and "-o" in out.opts, f"rollout {name}: no -o/--output"
    assert isinstance(out.type, click.Choice) and "json" in out.type.choices, name
    help_text = CliRunner().invoke(cli, [*name.split(), "--help"]).output
    assert "Examples:" in help_text and f"rollout {name}" in help_text, help_text


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=NAMES)
def test_kubeconfig_and_context_where_the_api_is_used(name: str, cmd: click.Command) -> None:
    opts = _opts(cmd)
    has = "--kubeconfig" in opts and "--context" in opts
    assert has == (name in TALKS_TO_API), name


def test_documented_exit_codes_match_the_code() -> None:
    page = (ROOT / "docs" / "exit-codes.md").read_text()
    table = page.split("# Exit codes", 1)[1].split("\n## ", 1)[0]
    documented = {int(c) for c in re.findall(r"^\| (\d+) \|", table, re.M)}
    used = {
        cls.exit_code
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, errors.RolloutError)
    }
    # success; the gate holds (sys.exit in watch / apply); a node drifted, a node on two
    # allocation paths (rollout nodes)
    used |= {0, GATE_HOLDS_EXIT, DRIFT_EXIT, TWO_PATHS_EXIT}
    assert documented == used


# ------------------------------------------------------------------ JSON that needs no cluster
def _json(args: list[str]) -> object:
    r = CliRunner().invoke(cli, args)
    assert r.exit_code == 0, r.output
    return json.loads(r.stdout)


def test_lab_env_and_status_json(tmp_path: Path) -> None:
    (tmp_path / "lab.json").write_text("{}")
    env = _json(["lab", "env", "--workdir", str(tmp_path), "-o", "json"])
    assert isinstance(env, dict) and env["KUBECONFIG"].startswith(str(tmp_path))
    assert env["ROLLOUT_INVENTORY"] == str(tmp_path / "inventory.ini")
    status = _json(["lab", "status", "--workdir", str(tmp_path), "-o", "json"])
    assert status == {"name": "default", "dir": str(tmp_path), "apiserver": False, "nodes": []}


def test_runbook_json_carries_batches_windows_and_commands(tmp_path: Path) -> None:
    from tests.unit.test_runbook import INVENTORY, PLAN

    plan, inv = tmp_path / "plan.yaml", tmp_path / "inv.ini"
    plan.write_text(PLAN)
    inv.write_text(INVENTORY)
    doc = _json(["runbook", "--plan", str(plan), "-i", str(inv), "--offline", "-o", "json"])
    assert isinstance(doc, dict)
    assert doc["batches"][0] == {"nodes": ["gpu-01", "gpu-02"], "canary": True}
    assert doc["preflight"] == {"ran": False, "ok": False, "lines": []}
    assert doc["windows"][0]["tz"] == "Europe/Berlin"
    assert any(c["command"].startswith("kubectl api-resources") for c in doc["commands"])
    assert doc["gate"]["threshold"] == 0.02


def test_serve_json_startup_line(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("s3cret\n")
    args = ["serve", "--listen", "127.0.0.1:0", "--token-file", str(token), "-o", "json"]
    code = "from rollout.cli import main; main()"
    with subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE
    ) as p:
        try:
            assert p.stdout is not None
            first = json.loads(p.stdout.readline())
        finally:
            p.terminate()
            p.communicate(timeout=10)
    assert first["port"] > 0 and first["listen"] == f"127.0.0.1:{first['port']}"
    assert "POST /webhook" in first["endpoints"]


#: Commands that change nodes: each asks for confirmation, which ``--yes`` skips.
CHANGES_NODES = {"apply", "migrate", "rollback", "promote", "resume"}


@pytest.mark.parametrize("name", sorted(CHANGES_NODES))
def test_every_changing_command_takes_yes(name: str) -> None:
    cmd = dict(COMMANDS)[name]
    assert "--yes" in _opts(cmd), f"rollout {name}: no --yes"


@pytest.mark.parametrize(("name", "cmd"), COMMANDS, ids=NAMES)
def test_every_option_an_example_uses_is_taken(name: str, cmd: click.Command) -> None:
    help_text = CliRunner().invoke(cli, [*name.split(), "--help"]).output
    examples = help_text.split("Examples:", 1)[1].split("\nOptions:", 1)[0]
    opts = _opts(cmd)
    used = {
        flag
        for line in examples.splitlines()
        if line.strip().startswith(f"rollout {name} ")
        # the command's own words only: not what a pipe or `&&` runs after it
        for flag in re.findall(r"(?<!\S)(--?[A-Za-z][\w-]*)", re.split(r"\||&&|;", line)[0])
    }
    assert used, f"rollout {name}: examples name no option"
    assert used <= set(opts) | {"--help"}, f"rollout {name}: {sorted(used - set(opts))}"


def test_resume_without_yes_and_without_a_tty_refuses_before_reading_anything(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ROLLOUT_STATE_DIR", str(tmp_path))
    r = CliRunner().invoke(cli, ["resume", "--change", "nosuch", "-o", "json"])
    assert r.exit_code == 2, r.output
    assert "--yes" in r.output and "nosuch" in r.output
    assert not any(tmp_path.iterdir())  # nothing written
