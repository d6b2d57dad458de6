"""``read_plain`` answers exactly what ``ansible-inventory --list`` answers for every inventory it
accepts, and declines (None: the caller runs ``ansible-inventory``) what it does not parse itself.

Runtime: about 5-10 s (one ansible-inventory run per accepted case).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollout.ansible.hosts import _parse_inventory
from rollout.ansible.inventory import read_plain
from rollout.lab.inventory import inventory_text

BIN = Path(sys.executable).parent
REPO = Path(__file__).resolve().parents[2]

ACCEPTED = {
    "lab": None,  # inventory_text's output, written in the test
    "example": (REPO / "inventories" / "example.ini").read_text(),
    "typed": (
        "[canary]\nn1 x='quoted value' y=\"dq\" # a comment\n"
        "[nodes]\nn1 ansible_host=10.0.0.1 b=True c=[1,2] d={'k':'v'} e=1.5 f=None\n"
        "n2 ansible_host=10.0.0.2 g=-o\n"
        "; another comment\n"
        "[nodes:vars]\nz = from nodes # trailing\nw=2\n"
        "[canary:vars]\nz=from canary\n"
        "[all:vars]\nansible_user=root\nz=from all\nansible_ssh_common_args='-o A=b -o C=d'\n"
        "n1_only=x=y\n"
    ),
    "vars_first": "[nodes:vars]\nq=1\n[nodes]\nn1\nn1 again=2\n",
    "no_vars": "[nodes]\nn1\nn2\n[empty]\n",
}

DECLINED = {
    "children": "[nodes]\nn1\n[parent:children]\nnodes\n",
    "range": "[nodes]\nn[1:3]\n",
    "port": "[nodes]\nn1:2222\n",
    "priority": "[nodes]\nn1\n[nodes:vars]\nansible_group_priority=5\n",
    "set": "[nodes]\nn1 a={1,2}\n",
    "ungrouped": "n0\n[nodes]\nn1\n",
    "undeclared": "[nodes]\nn1\n[other:vars]\na=1\n",
    "bad_section": "[nodes\nn1\n",
}


#: ``ansible.cfg`` files that set only how plays run and hosts are reached: the in-process read
#: stays, and answers what ansible-inventory answers with the file in its working directory
RUN_ONLY_CONFIGS = {
    "awx_root": (REPO / "ansible.cfg").read_text(),  # the repository's own, for AWX
    "playbooks": (REPO / "playbooks" / "ansible.cfg").read_text(),
    "empty_defaults": "[defaults]\n",
    # the default source, which -i replaces (other.ini, written in the test, has other hosts)
    "default_inventory": "[defaults]\ninventory = other.ini\nremote_user = admin\n"
    "[privilege_escalation]\nbecome = true\n",
}

#: ``ansible.cfg`` files with a setting that could change how the inventory is read
DECLINED_CONFIGS = {
    "inventory_section": "[inventory]\nenable_plugins = yaml\n",
    "hash_merge": "[defaults]\nhash_behaviour = merge\n",
    "precedence": "[defaults]\nprecedence = all_inventory, groups_inventory, all_plugins_play\n",
    "vars_plugins": "[defaults]\nvars_plugins_enabled = host_group_vars\n",
    "group_names": "[defaults]\nforce_valid_group_names = always\n",
    "DEFAULT": "[DEFAULT]\nhash_behaviour = merge\n[defaults]\nforks = 5\n",
    "not_ini": "forks = 5\n",
}


def _ansible(path: Path) -> dict[str, Any]:
    r = subprocess.run(
        [str(BIN / "ansible-inventory"), "-i", str(path), "--list"],
        capture_output=True,
        text=True,
        check=True,
        cwd=path.parent,
    )
    return dict(json.loads(r.stdout))


@pytest.mark.parametrize("name", sorted(ACCEPTED))
def test_same_answer_as_ansible_inventory(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    text = ACCEPTED[name]
    if text is None:
        from rollout.lab.nodefiles import LabNode

        nodes = [LabNode(f"s{i}", i, "kubeadm", "nsb") for i in range(1, 6)]
        text = inventory_text(nodes, tmp_path / "key")
    path = tmp_path / "inv.ini"
    path.write_text(text)
    got = read_plain(path)
    assert got is not None, f"{name} should be read in-process"
    want = _ansible(path)
    assert got["_meta"]["hostvars"] == want["_meta"]["hostvars"]
    # the Inventory rollout builds from either answer is the same (hosts in order, groups)
    assert _parse_inventory(path, got) == _parse_inventory(path, want)


@pytest.mark.parametrize("name", sorted(RUN_ONLY_CONFIGS))
def test_a_config_that_sets_only_how_plays_run_keeps_the_read(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repository's root ``ansible.cfg`` (AWX's) in the working directory once sent every
    ``apply`` run from there through ``ansible-inventory`` (~1 s of CPU before the first facts
    call; benchmarks/README.md, issue 38)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ansible.cfg").write_text(RUN_ONLY_CONFIGS[name])
    (tmp_path / "other.ini").write_text("[others]\nx1 a=1\n")
    path = tmp_path / "inv.ini"
    path.write_text(ACCEPTED["typed"])
    got = read_plain(path)
    assert got is not None, f"{name} should keep the in-process read"
    want = _ansible(path)
    assert got["_meta"]["hostvars"] == want["_meta"]["hostvars"]
    assert _parse_inventory(path, got) == _parse_inventory(path, want)


@pytest.mark.parametrize("name", sorted(DECLINED_CONFIGS))
def test_declines_beside_a_config_that_could_change_the_read(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "ansible.cfg").write_text(DECLINED_CONFIGS[name])
    path = tmp_path / "inv.ini"
    path.write_text("[nodes]\nn1\n")
    assert read_plain(path) is None


@pytest.mark.parametrize("name", sorted(DECLINED))
def test_declines_what_it_does_not_parse(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "inv.ini"
    path.write_text(DECLINED[name])
    assert read_plain(path) is None


def test_declines_beside_vars_dirs_config_or_settings(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    path = tmp_path / "inv.ini"
    path.write_text("[nodes]\nn1\n")
    assert read_plain(path) is not None
    monkeypatch.setenv("ANSIBLE_INVENTORY_ENABLED", "yaml")
    assert read_plain(path) is None
    monkeypatch.delenv("ANSIBLE_INVENTORY_ENABLED")
    for cfg in DECLINED_CONFIGS.values():
        (tmp_path / "ansible.cfg").write_text(cfg)
        assert read_plain(path) is None, cfg
    (tmp_path / "ansible.cfg").unlink()
    (tmp_path / "group_vars").mkdir()
    assert read_plain(path) is None
    (tmp_path / "group_vars").rmdir()
    path.chmod(0o755)  # an executable inventory is a script
    assert read_plain(path) is None
    yml = tmp_path / "inv.yml"
    yml.write_text("all:\n  hosts:\n    n1:\n")
    assert read_plain(yml) is None
