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
from rollout.ansible.runner import ENV

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
    assert direct.target("n1", {}) == direct.Target("n1", None, None, None, (), "/usr/bin/python3")


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
