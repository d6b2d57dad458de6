"""`lab down` removes the lab's state, and never anything else.

A lab with no processes left, so only the state handling runs; the full up / down / --keep cycle
on a real lab is in tests/lab/test_installed_wheel.py."""

from __future__ import annotations

import json
from pathlib import Path

from rollout.lab.cluster import LAB_ENTRIES, OWNED_MARK, Lab


def _leftover_lab(d: Path) -> Lab:
    """A lab directory as a stopped lab leaves it: state file, etcd data, keys, logs."""
    (d / "controlplane" / "etcd" / "member").mkdir(parents=True)
    (d / "controlplane" / "etcd" / "member" / "db").write_text("old objects")
    (d / "ssh").mkdir()
    (d / "ssh" / "client_key").write_text("key")
    (d / "inventory.ini").write_text("[nodes]\n")
    (d / "relay.log").write_text("log\n")
    (d / "lab.json").write_text(json.dumps({"name": "t", "nodes": []}))
    return Lab.attach("t", d)


def test_down_removes_a_lab_directory_it_created(tmp_path: Path) -> None:
    d = tmp_path / "lab"
    d.mkdir()
    (d / OWNED_MARK).write_text("")
    _leftover_lab(d).down()
    assert not d.exists()


def test_down_keep_keeps_etcd_data_but_not_the_state_file(tmp_path: Path) -> None:
    d = tmp_path / "lab"
    d.mkdir()
    (d / OWNED_MARK).write_text("")
    _leftover_lab(d).down(keep=True)
    assert (d / "controlplane" / "etcd" / "member" / "db").read_text() == "old objects"
    assert not (d / "lab.json").exists()


def test_down_in_a_users_directory_removes_only_what_the_lab_wrote(tmp_path: Path) -> None:
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("the user's")
    lab = _leftover_lab(d)
    lab.down()
    assert sorted(p.name for p in d.iterdir()) == ["notes.txt"]
    assert "controlplane" in LAB_ENTRIES and "relay.log" in LAB_ENTRIES
