"""The real playbooks over a local connection (``-c local``) against this machine.

facts.yml reads this machine's real /sys and /proc; the result must be NodeFacts that lint
accepts. apply.yml then restore.yml run on files under a temporary directory, with a
``systemctl`` stand-in on PATH (this machine has no systemd; the lab uses the same kind of shim)
and a local /healthz: every file must come back byte for byte and created files must go.

Runtime: about 15-25 s on 2 cores (four ansible-playbook runs; more when the machine is busy).
"""

from __future__ import annotations

import hashlib
import http.server
import os
import stat
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from rollout.ansible.payloads import ApplyPayload, FileWrite, RestorePayload
from rollout.ansible.runner import AnsibleRunner
from rollout.kubelet.facts import node_facts_from_dict

pytestmark = pytest.mark.timeout(180)

# files written by this (non-root) test user keep their owner
ME = {"owner": str(os.getuid()), "group": str(os.getgid())}

SHIM = """#!/bin/sh
echo "$@" >> "{log}"
case "$1" in
  show) echo "Id=$2"; echo "Names=$2"; echo LoadState=loaded; echo UnitFileState=enabled
        if [ -f "{state}" ]; then echo ActiveState=active; echo SubState=running
        else echo ActiveState=inactive; echo SubState=dead; fi ;;
  start) touch "{state}" ;;
  stop) rm -f "{state}" ;;
esac
"""


@pytest.fixture
def local(tmp_path: Path) -> tuple[AnsibleRunner, Path]:
    inv = tmp_path / "inventory.ini"
    inv.write_text(
        f"localhost ansible_connection=local ansible_python_interpreter={sys.executable}\n"
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    shim = bin_dir / "systemctl"
    shim.write_text(SHIM.format(log=tmp_path / "systemctl.log", state=tmp_path / "running"))
    shim.chmod(0o755)
    (tmp_path / "running").touch()  # the kubelet is running before the change
    path = f"{bin_dir}:{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"
    return AnsibleRunner(tmp_path / "controller", envvars={"PATH": path}), inv


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
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/healthz"
    server.shutdown()
    server.server_close()


def test_facts_over_a_local_connection_are_node_facts_lint_accepts(
    local: tuple[AnsibleRunner, Path], tmp_path: Path
) -> None:
    runner, inv = local
    facts = runner.gather_facts(inv, ["localhost"], tmp_path / "facts")["localhost"]
    online = Path("/sys/devices/system/cpu/online").read_text().strip()
    parsed = node_facts_from_dict(facts, file="localhost.json")
    assert parsed.online_cpus == node_facts_from_dict({"onlineCPUs": online}).online_cpus
    assert parsed.numa_nodes and all(n.cpus <= parsed.online_cpus for n in parsed.numa_nodes)
    assert set().union(*(n.cpus for n in parsed.numa_nodes)) == parsed.online_cpus
    assert facts["threadsPerCore"] >= 1 and facts["sockets"] >= 1
    assert isinstance(facts["gpus"], list)
    assert set(facts["checkpoints"]) == {
        "cpu_manager_state",
        "memory_manager_state",
        "kubelet_internal_checkpoint",
        "dra_manager_state",
    }
    # Ansible shipped the role's module_utils (the podresources client) with the module: this
    # machine runs no kubelet, so the client says it found no socket
    assert facts["podResources"]["error"].startswith("no podresources socket"), facts
    assert (tmp_path / "facts" / "localhost.json").is_file()


def test_facts_over_ssh_equal_the_facts_playbook(
    local: tuple[AnsibleRunner, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The plain-ssh facts path (what ``rollout apply`` uses for plain-ssh hosts) reports
    exactly what facts.yml reports: same module, same role defaults."""
    from rollout import assets
    from rollout.ansible import direct
    from rollout.ansible.gathering import facts_direct

    runner, inv = local
    by_playbook = runner.gather_facts(inv, ["localhost"], tmp_path / "facts")["localhost"]
    remote = direct.Target.argv
    monkeypatch.setattr(direct.Target, "argv", lambda self: ["sh", "-c", remote(self)[-1]])
    hv = {"localhost": {"ansible_python_interpreter": sys.executable}}
    by_ssh = facts_direct(["localhost"], hv, tmp_path / "facts-ssh", assets.playbooks())
    assert by_ssh is not None
    assert by_ssh["localhost"] == by_playbook


def _tree(root: Path) -> dict[str, tuple[str, int]]:
    return {
        str(p.relative_to(root)): (
            hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir",
            stat.S_IMODE(p.stat().st_mode),
        )
        for p in sorted(root.rglob("*"))
    }


def test_apply_then_restore_puts_every_file_back_byte_for_byte(
    local: tuple[AnsibleRunner, Path], healthz: str, tmp_path: Path
) -> None:
    runner, inv = local
    node = tmp_path / "node"
    (node / "var/lib/kubelet").mkdir(parents=True)
    config = node / "var/lib/kubelet/config.yaml"
    config.write_bytes(
        b"kind: KubeletConfiguration\ncpuManagerPolicy: none\n# {{ not a template }}\n"
    )
    config.chmod(0o640)
    checkpoint = node / "var/lib/kubelet/cpu_manager_state"
    checkpoint.write_text('{"policyName":"none","defaultCpuSet":"","checksum":1}')
    before = _tree(node)
    new_config = b"kind: KubeletConfiguration\ncpuManagerPolicy: static\nreservedSystemCPUs: 0,32\n"
    dropin = node / "etc/kubernetes/kubelet.conf.d/90-rollout.conf"
    payload = ApplyPayload(
        change_id="c1",
        files=(
            FileWrite(
                str(config),
                new_config,
                mode="0640",
                expect=hashlib.sha256(config.read_bytes()).hexdigest(),
                **ME,
            ),
            FileWrite(str(dropin), b"topologyManagerPolicy: single-numa-node\n", "0600", **ME),
        ),
        service="kubelet",
        checkpoint_reset=(str(checkpoint),),
        healthz_url=healthz,
        backup_dir=str(tmp_path / "node-backup" / "c1"),
    )

    applied = runner.apply(inv, "c1", {"localhost": payload})

    host = applied.playbook.hosts["localhost"]
    assert host.status == "ok", host
    assert config.read_bytes() == new_config
    assert stat.S_IMODE(dropin.stat().st_mode) == 0o600
    assert not checkpoint.exists()
    assert host.report is not None and host.report["createdFiles"] == [str(dropin)]
    assert host.report["checkpointsRemoved"] == [str(checkpoint)]
    log = (tmp_path / "systemctl.log").read_text()
    assert log.index("stop kubelet") < log.index("start kubelet")
    backup = applied.backups["localhost"]
    assert backup is not None and [f.existed for f in backup.files] == [True, False]

    restore = RestorePayload.from_backup(
        backup,
        service="kubelet",
        healthz_url=healthz,
        written={f.path: f.sha256 for f in payload.files},
    )
    restored = runner.restore(inv, "c1", {"localhost": restore})

    assert restored.hosts["localhost"].status == "ok", restored.hosts["localhost"]
    after = _tree(node)
    del before["var/lib/kubelet/cpu_manager_state"]  # reset by apply; the kubelet rewrites it
    assert after == before


def test_a_kubelet_that_never_gets_healthy_fails_at_the_named_step(
    local: tuple[AnsibleRunner, Path], tmp_path: Path
) -> None:
    runner, inv = local
    target = tmp_path / "node" / "config.yaml"
    target.parent.mkdir()
    target.write_text("a: 1\n")
    payload = ApplyPayload(
        change_id="c2",
        files=(
            FileWrite(str(target), b"a: 2\n", expect=hashlib.sha256(b"a: 1\n").hexdigest(), **ME),
        ),
        service="kubelet",
        healthz_url="http://127.0.0.1:9/healthz",  # discard port: nothing listens
        backup_dir=str(tmp_path / "node-backup" / "c2"),
    )
    result = runner.apply(
        inv,
        "c2",
        {"localhost": payload},
        extravars={"rollout_kubelet_healthz_retries": 2, "rollout_kubelet_healthz_delay": 0},
    ).playbook

    host = result.hosts["localhost"]
    assert host.status == "failed"
    assert host.failed_task == "healthz"
    assert host.message is not None and host.message.startswith("apply failed at healthz")
    assert "did not answer ok after 2 tries" in host.message
    assert host.report is not None and host.report["status"] == "failed"
    assert host.report["written"] is True and host.report["refused"] is False


def test_an_edit_after_preflight_is_refused_over_a_real_playbook_run(
    local: tuple[AnsibleRunner, Path], tmp_path: Path
) -> None:
    runner, inv = local
    target = tmp_path / "node" / "config.yaml"
    target.parent.mkdir()
    target.write_text("a: 1\nmaxPods: 77\n")  # preflight read "a: 1\n"; then someone edited it
    payload = ApplyPayload(
        change_id="c3",
        files=(
            FileWrite(str(target), b"a: 2\n", expect=hashlib.sha256(b"a: 1\n").hexdigest(), **ME),
        ),
        service="kubelet",
        healthz_url="http://127.0.0.1:9/healthz",
        backup_dir=str(tmp_path / "node-backup" / "c3"),
    )
    host = runner.apply(inv, "c3", {"localhost": payload}).playbook.hosts["localhost"]
    assert host.status == "failed" and host.report is not None and host.report["refused"]
    assert host.report["mismatches"] == [
        {
            "path": str(target),
            "expected": hashlib.sha256(b"a: 1\n").hexdigest(),
            "found": hashlib.sha256(b"a: 1\nmaxPods: 77\n").hexdigest(),
        }
    ]
    assert target.read_text() == "a: 1\nmaxPods: 77\n"
    assert not (tmp_path / "systemctl.log").exists()  # the kubelet was not touched
