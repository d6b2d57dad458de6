"""The plain-ssh transport reaches a host the way ansible-playbook would, or leaves it to the
playbook: the inventory a command is given wins over the host variables cached at apply time, and
the interpreter, user, key and become settings Ansible reads from its environment and its
``ansible.cfg`` are honoured (rollout/ansible/direct.py, rollout/change/shipping.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.ansible import direct
from rollout.change.inventory import read_inventory
from rollout.change.shipping import PlaybookNodeRunner

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


def test_the_kept_host_variables_still_reach_the_nodes_when_the_inventory_is_gone(
    tmp_path: Path,
) -> None:
    root = tmp_path / "ansible"
    inv = _inv(tmp_path / "inv.ini", "10.0.0.1")
    PlaybookNodeRunner(root, inv, hostvars=read_inventory(inv).hostvars)
    inv.unlink()
    targets = PlaybookNodeRunner(root, inv)._direct_targets(["h1"])
    assert targets is not None and targets["h1"][0].host == "10.0.0.1"
