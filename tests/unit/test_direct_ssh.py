"""The plain-ssh path of the node step (rollout/ansible/direct.py): which inventory hosts qualify,
the ssh command line (Ansible's master connection reused), and the module run through the same
bootstrap without Ansible on the "node" (here: a local shell instead of ssh, a systemctl stand-in
and a local /healthz). The lab's rollback tests run it over real ssh.

Runtime: about 1 s.
"""

from __future__ import annotations

import base64
import hashlib
import http.server
import os
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.ansible import direct
from rollout.ansible.settings import ENV

LAB_VARS = {
    "ansible_host": "10.1.2.3",
    "ansible_port": 22,
    "ansible_user": "root",
    "ansible_ssh_private_key_file": "/k/id",
    "ansible_ssh_common_args": "-o StrictHostKeyChecking=no -o LogLevel=ERROR",
    "ansible_python_interpreter": "/usr/bin/python3",
}


def test_plain_ssh_hosts_qualify_and_others_fall_back_to_the_playbook() -> None:
    t = direct.target("n1", LAB_VARS)
    assert t is not None
    argv = t.argv()
    assert argv[0] == "ssh" and f"ControlPath={direct.CONTROL_PATH}" in argv
    assert argv[argv.index("-p") : argv.index("-p") + 2] == ["-p", "22"]
    assert "-i" in argv and "/k/id" in argv and "root" in argv and "10.1.2.3" in argv
    assert "StrictHostKeyChecking=no" in argv
    assert argv[-1].startswith("/usr/bin/python3 -c ")
    assert direct.target("n1", {**LAB_VARS, "ansible_become": True}) is None
    assert direct.target("n1", {**LAB_VARS, "ansible_connection": "docker"}) is None
    assert direct.target("n1", {**LAB_VARS, "ansible_ssh_pass": "x"}) is None
    assert direct.target("n1", {**LAB_VARS, "ansible_host": "{{ ip }}"}) is None
    py = {"ansible_python_interpreter": "/usr/bin/python3"}
    assert direct.target("n1", py, env={}) == direct.Target(
        "n1", None, None, None, (), "/usr/bin/python3"
    )
    # no interpreter named: Ansible would discover one on the node, so the playbook runs
    # (tests/unit/test_transport_settings.py covers Ansible's environment and ansible.cfg)
    assert direct.target("n1", {}, env={}) is None


def test_ansible_and_the_direct_path_share_one_control_path() -> None:
    assert ENV["ANSIBLE_SSH_CONTROL_PATH"] == "%(directory)s/%%C"
    assert os.path.join(ENV["ANSIBLE_SSH_CONTROL_PATH_DIR"], "%C") == direct.CONTROL_PATH


@pytest.fixture
def healthz() -> Iterator[str]:
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"ok")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    server.shutdown()
    server.server_close()


def test_the_module_runs_through_the_bootstrap_without_ansible(
    tmp_path: Path, healthz: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "systemctl"
    shim.write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "log"}\n')
    shim.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    config = tmp_path / "config.yaml"
    before, ours = b"a: 1\n", b"a: 2\n"
    config.write_bytes(ours)
    # -S: no site-packages, so no Ansible: the module must run on a node without it
    t = direct.Target("local", None, None, None, (), f"{sys.executable} -S")
    remote = t.argv()[-1]  # what ssh would run on the node
    monkeypatch.setattr(direct.Target, "argv", lambda self: ["sh", "-c", remote])
    payload = {
        "change_id": "c1",
        "restore": [
            {
                "path": str(config),
                "content_b64": base64.b64encode(before).decode(),
                "sha256": hashlib.sha256(before).hexdigest(),
                "current": [hashlib.sha256(ours).hexdigest()],
                "mode": "0600",
                "owner": str(os.getuid()),
                "group": str(os.getgid()),
            }
        ],
        "service": "kubelet",
        "healthz_url": healthz,
    }
    out = direct.run_step(t, {"action": "restore", "payload": payload}, 30)
    assert out["status"] == "ok", out
    assert config.read_bytes() == before
    assert (tmp_path / "log").read_text().split("\n")[:2] == ["daemon-reload", "stop kubelet"]

    config.write_bytes(b"edited\n")
    refused = direct.run_step(t, {"action": "restore", "payload": payload}, 30)
    assert refused["refused"] and refused["mismatches"][0]["path"] == str(config)
    assert config.read_bytes() == b"edited\n"


def _local(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every direct.Target runs its remote command in a local shell instead of over ssh."""
    monkeypatch.setattr(direct.Target, "argv", lambda self: ["sh", "-c", _ORIG_ARGV(self)[-1]])


_ORIG_ARGV = direct.Target.argv


def test_apply_then_restore_over_ssh_through_the_runner(
    tmp_path: Path, healthz: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """PlaybookNodeRunner with hostvars that allow plain ssh runs the apply without Ansible: the
    file written, the payload kept next to the change for a hand re-run, the node's backup
    manifest kept on the controller; the restore puts the bytes back; an edit made after
    preflight read the file is refused and kept."""
    from rollout.ansible import payloads
    from rollout.change.engine.node_runner import PlaybookNodeRunner
    from rollout.models import NodeChange
    from rollout.protocols import RestoreFile

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "log"}\n')
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    monkeypatch.setattr(payloads, "BACKUP_ROOT", str(tmp_path / "node-backups"))
    _local(monkeypatch)
    config = tmp_path / "config.yaml"
    before, ours = b"a: 1\n", b"a: 2\n"
    config.write_bytes(before)
    me = (str(os.getuid()), str(os.getgid()))
    change = NodeChange(
        node="n1",
        host="h1",
        files={str(config): ours},
        mode={str(config): ("0600", *me)},
        before={str(config): before},
        before_meta={str(config): ("0600", *me)},
        healthz_url=healthz,
        expect={str(config): hashlib.sha256(before).hexdigest()},
    )
    hostvars = {"h1": {"ansible_python_interpreter": f"{sys.executable} -S"}}
    runner = PlaybookNodeRunner(tmp_path / "ctl", tmp_path / "inv.ini", hostvars=hostvars)
    res = runner.apply_many([change], "c1")["n1"]
    assert res.ok, res.message
    assert config.read_bytes() == ours
    assert set(res.timings) >= {"check", "backup", "write", "stop", "start", "healthz"}
    assert (tmp_path / "ctl" / "changes" / "c1" / "apply" / "h1.json").is_file()
    backup = runner.ansible.backup("c1", "h1")
    assert backup is not None and backup.files[0].content == before

    restored = runner.restore_many(
        [(change, [RestoreFile(str(config), before, "0600", *me)])], "c1"
    )
    assert restored["n1"].ok, restored["n1"].message
    assert config.read_bytes() == before

    config.write_bytes(b"edited\n")  # after preflight read it
    refused = runner.apply_many([change], "c2")["n1"]
    assert not refused.ok and refused.refused
    assert str(config) in refused.message and "expected sha256" in refused.message
    assert config.read_bytes() == b"edited\n"


def test_facts_over_ssh_are_what_the_module_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """facts_direct runs the facts module without Ansible, with the role's defaults and the
    host's overrides, and keeps <host>.json on the controller; a host that needs more than plain
    ssh makes it decline (the playbook runs instead)."""
    from rollout import assets
    from rollout.ansible.gathering import facts_direct

    _local(monkeypatch)
    config = tmp_path / "config.yaml"
    config.write_bytes(b"kind: KubeletConfiguration\n")
    hv = {
        "ansible_python_interpreter": f"{sys.executable} -S",
        "rollout_kubelet_files": [str(config)],
        "rollout_kubelet_machine_file": "",
    }
    facts = facts_direct(["h1"], {"h1": hv}, tmp_path / "facts", assets.playbooks())
    assert facts is not None
    got = facts["h1"]
    assert got["kubeletFiles"] == [str(config)]
    meta = got["kubeletFileMeta"][str(config)]
    assert meta["sha256"] == hashlib.sha256(config.read_bytes()).hexdigest()
    assert (tmp_path / "facts" / "h1.json").is_file()
    assert set(got["checkpoints"]) == {
        "cpu_manager_state",
        "memory_manager_state",
        "kubelet_internal_checkpoint",
        "dra_manager_state",
    }
    declined = facts_direct(
        ["h1"], {"h1": {**hv, "ansible_become": True}}, tmp_path / "f2", assets.playbooks()
    )
    assert declined is None


def test_facts_sessions_opened_ahead_read_the_node_only_when_the_call_runs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``open_facts`` (apply's ``after`` evidence, as the last batch begins) leaves the facts
    module waiting on the node; the facts are what the file holds when ``facts_direct`` runs
    through that session, not when it opened. At most ``forks`` open; a host that needs more
    than plain ssh opens none (the playbook will run)."""
    from rollout import assets
    from rollout.ansible.gathering import facts_direct, open_facts

    _local(monkeypatch)
    config = tmp_path / "config.yaml"
    config.write_bytes(b"a: 1\n")
    hv = {
        "ansible_python_interpreter": f"{sys.executable} -S",
        "rollout_kubelet_files": [str(config)],
        "rollout_kubelet_machine_file": "",
    }
    t = direct.target("h1", hv)
    assert t is not None
    open_facts(["h1", "h2"], {"h1": hv, "h2": hv | {"ansible_host": "h2"}}, forks=1)
    waiting = direct._started[(t, direct.FACTS)]
    assert waiting.alive() and len(direct._started) == 1  # forks=1: the first host only
    config.write_bytes(b"a: 2\n")  # the change lands after the session opened
    facts = facts_direct(["h1"], {"h1": hv}, tmp_path / "facts", assets.playbooks())
    assert facts is not None and (t, direct.FACTS) not in direct._started  # it was used
    meta = facts["h1"]["kubeletFileMeta"][str(config)]
    assert meta["sha256"] == hashlib.sha256(b"a: 2\n").hexdigest()
    open_facts(["h1"], {"h1": {**hv, "ansible_become": True}})
    assert not direct._started
    direct.cancel_started()


def test_a_started_session_acts_only_on_its_arguments(
    tmp_path: Path, healthz: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``start`` opens the node step's session ahead (the orchestrator's batch start): nothing
    happens on the node until ``run_step`` sends the arguments through it; a session ended
    without arguments (``cancel_started``) did nothing; one that died is replaced by a cold call
    that gives the same result."""
    _local(monkeypatch)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "systemctl").write_text(f'#!/bin/sh\necho "$@" >> {tmp_path / "log"}\n')
    (bin_dir / "systemctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    config = tmp_path / "config.yaml"
    before, ours = b"a: 1\n", b"a: 2\n"
    config.write_bytes(ours)
    payload = {
        "change_id": "c1",
        "restore": [
            {
                "path": str(config),
                "content_b64": base64.b64encode(before).decode(),
                "sha256": hashlib.sha256(before).hexdigest(),
                "current": [hashlib.sha256(ours).hexdigest()],
                "mode": "0600",
                "owner": str(os.getuid()),
                "group": str(os.getgid()),
            }
        ],
        "service": "kubelet",
        "healthz_url": healthz,
    }
    t = direct.Target("local", None, None, None, (), f"{sys.executable} -S")
    direct.start(t)
    direct.cancel_started()  # ended without arguments: nothing ran
    assert config.read_bytes() == ours and not (tmp_path / "log").exists()

    direct.start(t)
    waiting = direct._started[(t, direct.STEP)]
    assert waiting.alive() and config.read_bytes() == ours
    out = direct.run_step(t, {"action": "restore", "payload": payload}, 30)
    assert out["status"] == "ok", out
    assert config.read_bytes() == before and not direct._started

    config.write_bytes(ours)
    direct.start(t)
    dead = direct._started[(t, direct.STEP)]
    dead.proc.kill()
    dead.proc.wait()
    out = direct.run_step(t, {"action": "restore", "payload": payload}, 30)  # cold instead
    assert out["status"] == "ok", out
    assert config.read_bytes() == before
