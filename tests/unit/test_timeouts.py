"""Timeouts: a hung playbook run is stopped and its unfinished hosts fail (so the orchestrator
restores their nodes), and every API call made through ``call`` carries an HTTP timeout.

The playbook test runs real ansible-runner / ansible-playbook over a local connection (~5 s)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollout.ansible.outcomes import HostResult, timed_out
from rollout.ansible.runner import PLAYBOOK_TIMEOUT_S, AnsibleRunner, playbook_timeout
from rollout.kube.client import REQUEST_TIMEOUT_S, call

pytestmark = pytest.mark.timeout(120)

HANGS = """- hosts: all
  gather_facts: false
  tasks:
    - name: a task that hangs (pause runs inside ansible-playbook, nothing outlives the test)
      ansible.builtin.pause:
        seconds: 600
"""


def test_a_hung_playbook_is_stopped_and_its_host_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    book = tmp_path / "books"
    book.mkdir()
    (book / "hang.yml").write_text(HANGS)
    inv = tmp_path / "inventory.ini"
    inv.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    monkeypatch.setenv("ROLLOUT_PLAYBOOK_TIMEOUT_S", "4")
    runner = AnsibleRunner(tmp_path / "controller", playbook_dir=book)
    result = runner.run("hang.yml", inv, ["localhost"], {})
    assert result.status == "timeout"
    assert result.elapsed_s < 60
    host = result.hosts["localhost"]
    assert host.status == "failed" and "ran past its timeout of 4s" in (host.message or "")
    # nothing of the run is left running (it would go on changing the node)
    left = subprocess.run(["pgrep", "-f", str(tmp_path)], capture_output=True, text=True)
    assert left.stdout.strip() == "", left.stdout


def test_timed_out_keeps_real_failures_and_fails_the_rest() -> None:
    results = {
        "a": HostResult("a", "ok"),
        "b": HostResult("b", "unreachable", "Gathering", "ssh: connect refused"),
        "c": HostResult("c", "skipped"),
    }
    out = timed_out(results, 30)
    assert out["a"].status == "failed" and out["a"].failed_task == "(timeout)"
    assert out["b"] == results["b"]
    assert out["c"].status == "failed"


def test_playbook_timeout_default_and_override() -> None:
    assert playbook_timeout({}) == PLAYBOOK_TIMEOUT_S == 900
    assert playbook_timeout({"ROLLOUT_PLAYBOOK_TIMEOUT_S": "60"}) == 60
    assert playbook_timeout({"ROLLOUT_PLAYBOOK_TIMEOUT_S": "-1"}) == PLAYBOOK_TIMEOUT_S
    assert playbook_timeout({"ROLLOUT_PLAYBOOK_TIMEOUT_S": "soon"}) == PLAYBOOK_TIMEOUT_S


def test_every_call_has_an_http_timeout() -> None:
    seen: list[dict[str, Any]] = []

    def api_method(*args: Any, **kwargs: Any) -> str:
        seen.append(kwargs)
        return "ok"

    assert call("read x", api_method, "x") == "ok"
    assert call("read y", api_method, "y", _request_timeout=3) == "ok"
    assert [k["_request_timeout"] for k in seen] == [REQUEST_TIMEOUT_S, 3]
