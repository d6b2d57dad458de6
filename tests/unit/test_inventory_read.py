"""``start_inventory`` runs ``ansible-inventory`` in the background (``rollout apply`` connects to
the API server meanwhile) and reads the same Inventory ``read_inventory`` does; a bad file is an
InputError naming it when the answer is read.

Runtime: about 2-4 s (two ansible-inventory runs).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rollout.ansible.hosts import start_inventory
from rollout.errors import InputError


def test_inventory_read_in_the_background(tmp_path: Path) -> None:
    inv = tmp_path / "inv.ini"
    inv.write_text(
        "[canary]\nn1\n\n[nodes]\nn1 ansible_host=10.0.0.1\nn2 ansible_host=10.0.0.2\n\n"
        "[all:vars]\nansible_user=root\nansible_port=22\n"
    )
    reading = start_inventory(inv)
    got = reading()
    assert got.hosts == ("n1", "n2")
    assert got.groups["canary"] == ("n1",)
    assert got.hostvars["n2"]["ansible_host"] == "10.0.0.2"
    assert got.hostvars["n1"]["ansible_port"] == 22  # group vars merged, typed as Ansible does


def test_a_bad_inventory_is_an_input_error_naming_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.ini"
    bad.write_text("[nodes\nn1 ansible_host=\n")
    reading = start_inventory(bad)
    with pytest.raises(InputError) as e:
        reading()
    assert str(bad) in str(e.value.location) or str(bad) in str(e.value)
