"""Compare-and-swap on node files, through the CLI on lab nodes over real SSH and Ansible.

An operator edits a node's kubelet config after preflight read it and before the node's batch
(``method: inplace``): that node gets nothing written, only our cordon is undone, the edit is kept,
and the change stops with exit 3 naming node, file, expected and found sha256. A rollback of a
node whose file was edited after our write is refused naming the file, and ``--force``
overwrites it; ``rollout_kubelet_force=true`` in the inventory overwrites nothing, through
``ansible-playbook`` or over plain ssh (only ``--force`` does).

Runtime (2-core machine, warm lab binaries): about 2-3 min for the module.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab, pytest.mark.timeout(300)]

CONFIG = "var/lib/kubelet/config.yaml"


def _setup(lab: Lab, lab_nodes: Any, tmp_path: Path) -> tuple[list[str], Path, Path]:
    names = lab_nodes(2).names
    inv = ck.inventory(lab, names, names[:1], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"), max_unavailable=1)
    plan.write_text(plan.read_text() + "method: inplace\n")
    return names, inv, plan


def _canary_applied(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> tuple[str, Path, Path, dict[str, str], str, Path, bytes]:
    """``apply --canary`` on the first of two nodes: (the canary, inventory, state dir, env,
    change id, the canary's kubelet config path, its bytes before the change)."""
    names, inv, plan = _setup(lab, lab_nodes, tmp_path)
    first = names[0]
    state = tmp_path / "state"
    env = ck.env(lab, state)
    config = lab.machines.node_root(first) / CONFIG
    before = config.read_bytes()
    r = ck.cli(
        ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"], env
    )
    assert r.returncode == 0, r.stderr
    return first, inv, state, env, json.loads(r.stdout)["change"], config, before


def _edit_after_our_write(config: Path) -> bytes:
    """Append a line to the node's file (an operator's edit after the change wrote it)."""
    with open(config, "ab") as f:
        f.write(b"maxPods: 77\n")
    return config.read_bytes()


def test_an_edit_between_preflight_and_the_batch_is_kept_and_stops_the_change(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    names, inv, plan = _setup(lab, lab_nodes, tmp_path)
    first, last = names
    state = tmp_path / "state"
    env = ck.env(lab, state)
    config = lab.machines.node_root(last) / CONFIG
    preflight = hashlib.sha256(config.read_bytes()).hexdigest()
    proc = ck.start_cli(["apply", "--plan", str(plan), "-i", str(inv), "--yes", "-o", "json"], env)
    try:
        # batch 1 (the canary) has begun: preflight read every node's files long ago
        ck.wait_for(lambda: ck.journal_has(state, first, "drain", "begin"), 120, "batch 1")
        with open(config, "ab") as f:
            f.write(b"maxPods: 77\n")  # the operator's edit
        edited = config.read_bytes()
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate(timeout=10)

    assert proc.returncode == 3, err
    found = hashlib.sha256(edited).hexdigest()
    for part in (f"node {last}", f"/{CONFIG}", f"expected sha256 {preflight}", f"found {found}"):
        assert part in err, (part, err)
    assert config.read_bytes() == edited  # the edit is kept, nothing written
    assert not ck.unschedulable(lab, last)  # our cordon undone
    st = ck.states(state)
    assert st[first] == "applied" and st[last] == "restored", st
    journal = ck.latest_journal(state)
    assert journal is not None
    entries = [e for e in journal.entries() if e.node == last]
    assert not any(e.step == "restore" for e in entries)  # no restore run: nothing to undo
    assert any(e.step == "apply" and e.data.get("filesWritten") is False for e in entries)


def test_rollback_refuses_a_file_edited_after_our_write_unless_forced(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    first, _, _, env, change, config, before = _canary_applied(lab, lab_nodes, tmp_path)
    edited = _edit_after_our_write(config)

    r = ck.cli(["rollback", "--change", change, "--yes"], env)
    assert r.returncode == 5, r.stderr
    assert f"/{CONFIG}" in r.stderr and "since our write" in r.stderr, r.stderr
    assert "--force" in r.stderr
    assert config.read_bytes() == edited

    r = ck.cli(["rollback", "--change", change, "--force", "--yes"], env)
    assert r.returncode == 0, r.stderr
    assert config.read_bytes() == before
    assert not ck.unschedulable(lab, first)


@pytest.mark.parametrize("path", ["playbook", "ssh"])
def test_an_inventorys_rollout_kubelet_force_forces_no_restore(
    lab: Lab, lab_nodes: Any, tmp_path: Path, path: str
) -> None:
    """``rollout_kubelet_force=true`` in the inventory overwrites nothing: the tool passes the
    journaled decision (``--force`` or not) to restore.yml as an extra variable, which beats
    every inventory variable, and over plain ssh as the module's ``force``. A host variable the
    direct path cannot take (a templated connection variable) sends the restore through
    ``ansible-playbook``."""
    first, inv, state, env, change, config, before = _canary_applied(lab, lab_nodes, tmp_path)
    text = inv.read_text().replace("[all:vars]\n", "[all:vars]\nrollout_kubelet_force=true\n")
    if path == "playbook":  # a templated connection variable: only Ansible can render it
        text = text.replace("ansible_user=root\n", "ansible_user=\"{{ 'root' }}\"\n")
    inv.write_text(text)
    edited = _edit_after_our_write(config)

    r = ck.cli(["rollback", "--change", change, "--yes"], env)
    assert r.returncode == 5, r.stderr
    assert f"/{CONFIG}" in r.stderr and "since our write" in r.stderr, r.stderr
    assert config.read_bytes() == edited  # the inventory's force overwrote nothing
    played = list(state.rglob(f"changes/{change}/restore/*.json"))
    assert bool(played) is (path == "playbook"), played  # restore.yml's payloads, or none

    r = ck.cli(["rollback", "--change", change, "--force", "--yes"], env)
    assert r.returncode == 0, r.stderr
    assert config.read_bytes() == before
    assert not ck.unschedulable(lab, first)
