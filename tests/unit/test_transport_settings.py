"""The plain-ssh transport reaches a host the way ansible-playbook would, or leaves it to the
playbook: the inventory a command is given wins over the host variables cached at apply time, and
the interpreter, user, key and become settings Ansible reads from its environment and its
``ansible.cfg`` are honoured (rollout/ansible/direct.py, rollout/change/engine/node_runner.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.ansible import direct
from rollout.ansible.hosts import read_inventory
from rollout.change.engine.node_runner import PlaybookNodeRunner

PY = "ansible_python_interpreter=/usr/bin/python3"


def _inv(path: Path, address: str, extra: str = "") -> Path:
    path.write_text(f"[nodes]\nh1 ansible_host={address} ansible_user=root {PY} {extra}\n")
    return path


@pytest.fixture(autouse=True)
def _no_ansible_settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for k in ("ANSIBLE_REMOTE_USER", "ANSIBLE_PRIVATE_KEY_FILE", "ANSIBLE_BECOME",
              "ANSIBLE_PYTHON_INTERPRETER", "ANSIBLE_CONFIG", "ANSIBLE_TRANSPORT"):  # fmt: skip
        monkeypatch.delenv(k, raising=False)
    monkeypatch.chdir(tmp_path)  # no ansible.cfg here
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setattr(direct, "_CONFIG_FILES", (Path("ansible.cfg"),), raising=False)


def test_an_inventory_given_to_a_later_command_wins_over_the_cached_host_variables(
    tmp_path: Path,
) -> None:
    """Apply cached h1's variables; the operator fixes the address during the incident and runs
    ``rollout rollback -i fixed.ini`` (or edits the same file): the restore goes to the new one."""
    root = tmp_path / "ansible"
    first = _inv(tmp_path / "inv.ini", "10.0.0.1")
    PlaybookNodeRunner(root, first, hostvars=read_inventory(first).hostvars)  # apply caches
    fixed = _inv(tmp_path / "fixed.ini", "10.0.0.9")
    targets = PlaybookNodeRunner(root, fixed)._direct_targets(["h1"])
    assert targets is not None and targets["h1"][0].host == "10.0.0.9"

    _inv(first, "10.0.0.7")  # the same file, edited in place
    targets = PlaybookNodeRunner(root, first)._direct_targets(["h1"])
    assert targets is not None and targets["h1"][0].host == "10.0.0.7"

    # an unchanged inventory still starts from the cache (no inventory read before a restore)
    cached = PlaybookNodeRunner(root, first)
    assert cached._direct_targets(["h1"]) is not None


def _target(hv: dict[str, object]) -> direct.Target | None:
    return direct.target("h1", {"ansible_host": "10.0.0.1", **hv})


def test_user_and_key_from_ansible_s_environment_when_the_host_names_none(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("ANSIBLE_REMOTE_USER", "ops")
    monkeypatch.setenv("ANSIBLE_PRIVATE_KEY_FILE", "/keys/ops")
    t = _target({"ansible_python_interpreter": "/usr/bin/python3"})
    assert t is not None and t.user == "ops" and t.key == "/keys/ops"
    assert t.argv()[t.argv().index("-i") :][:2] == ["-i", "/keys/ops"]
    assert t.argv()[t.argv().index("-l") :][:2] == ["-l", "ops"]
    # the host's own variables win, as in Ansible
    t = _target({"ansible_python_interpreter": "/usr/bin/python3", "ansible_user": "root",
                 "ansible_ssh_private_key_file": "/keys/root"})  # fmt: skip
    assert t is not None and t.user == "root" and t.key == "/keys/root"


def test_the_interpreter_is_the_one_ansible_would_use_else_the_playbook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    t = _target({"ansible_python_interpreter": "/opt/py/bin/python3.12"})
    assert t is not None and t.argv()[-1].startswith("/opt/py/bin/python3.12 -c ")
    # none named: Ansible discovers one on the node; the ssh path does not guess /usr/bin/python3
    assert _target({}) is None
    assert _target({"ansible_python_interpreter": "auto_silent"}) is None
    monkeypatch.setenv("ANSIBLE_PYTHON_INTERPRETER", "/usr/libexec/platform-python")
    t = _target({})
    assert t is not None and t.python == "/usr/libexec/platform-python"


def test_become_from_the_environment_or_ansible_cfg_sends_the_host_to_the_playbook(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    hv = {"ansible_python_interpreter": "/usr/bin/python3"}
    assert _target(hv) is not None
    monkeypatch.setenv("ANSIBLE_BECOME", "True")
    assert _target(hv) is None
    assert _target({**hv, "ansible_become": False}) is not None  # the host's own says no
    monkeypatch.setenv("ANSIBLE_BECOME", "false")
    assert _target(hv) is not None
    monkeypatch.delenv("ANSIBLE_BECOME")
    (tmp_path / "ansible.cfg").write_text("[privilege_escalation]\nbecome = yes\n")
    assert _target(hv) is None


def test_ansible_cfg_user_key_interpreter_and_connection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = tmp_path / "ansible.cfg"
    cfg.write_text(
        "[defaults]\nremote_user = deploy\nprivate_key_file = /keys/deploy\n"
        "interpreter_python = /usr/bin/python3.11\n"
    )
    t = _target({})
    assert t is not None and (t.user, t.key, t.python) == (
        "deploy", "/keys/deploy", "/usr/bin/python3.11"
    )  # fmt: skip
    monkeypatch.setenv("ANSIBLE_REMOTE_USER", "ops")  # the environment wins over the file
    t = _target({})
    assert t is not None and t.user == "ops"
    cfg.write_text("[defaults]\ntransport = paramiko\n")
    assert _target({"ansible_python_interpreter": "/usr/bin/python3"}) is None
    cfg.write_text("not an ini file [\n")  # unreadable: the playbook, which will say why
    assert _target({"ansible_python_interpreter": "/usr/bin/python3"}) is None


def test_the_kept_host_variables_still_reach_the_nodes_when_the_inventory_is_gone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ansible"
    inv = _inv(tmp_path / "inv.ini", "10.0.0.1")
    PlaybookNodeRunner(root, inv, hostvars=read_inventory(inv).hostvars)
    inv.unlink()
    targets = PlaybookNodeRunner(root, inv)._direct_targets(["h1"])
    assert targets is not None and targets["h1"][0].host == "10.0.0.1"
