"""The node step module's logic on a temporary tree (no Ansible run): the compare-and-swap
check before any write, the backup of the bytes actually replaced, atomic writes that keep the
node's mode, idempotent resume, and a restore that refuses to overwrite a file edited after our
write unless forced. systemctl and /healthz are stand-ins here; the lab tests run the real ones.

Runtime: well under 1 s.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import stat
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

MODULE = (
    Path(__file__).resolve().parents[2]
    / "playbooks/roles/rollout_kubelet/library/rollout_kubelet_step.py"
)


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rollout_kubelet_step", MODULE)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


step = _load()


def sha(b: bytes) -> str:
    return hashlib.sha256(b).hexdigest()


class FakeNode(step.Node):  # type: ignore[misc,name-defined]
    """systemctl recorded, /healthz always ok."""

    def __init__(self) -> None:
        super().__init__(
            None,
            {
                "daemon_reload": True,
                "healthz_retries": 1,
                "healthz_delay": 0,
                "healthz_timeout": 1,
                "systemctl_timeout": 5,
            },
        )
        self.calls: list[tuple[str, ...]] = []
        self.said: str | None = None

    def systemctl(self, _stepname: str, *args: str) -> None:
        self.calls.append(args)

    def kubelet_said(self, _svc: str) -> str | None:
        return self.said


@pytest.fixture(autouse=True)
def healthy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(step, "healthz", lambda *a: ("ok", 0.0))


def _file(path: Path, content: bytes, expect: str, mode: str = "0644") -> dict[str, Any]:
    return {
        "path": str(path),
        "content_b64": base64.b64encode(content).decode(),
        "sha256": sha(content),
        "expect": expect,
        "mode": mode,
        "owner": str(os.getuid()),
        "group": str(os.getgid()),
    }


def _apply_payload(
    tmp: Path, files: list[dict[str, Any]], reset: tuple[str, ...] = ()
) -> dict[str, Any]:
    return {
        "change_id": "c1",
        "files": files,
        "checkpoint_reset": list(reset),
        "service": "kubelet",
        "healthz_url": "http://127.0.0.1:9/healthz",
        "backup_dir": str(tmp / "backup" / "c1"),
    }


def _node(tmp: Path) -> tuple[Path, Path, bytes]:
    config = tmp / "var/lib/kubelet/config.yaml"
    config.parent.mkdir(parents=True)
    before = b"kind: KubeletConfiguration\ncpuManagerPolicy: none\n"
    config.write_bytes(before)
    config.chmod(0o640)
    return config, tmp / "etc/kubernetes/kubelet.conf.d/90-rollout.conf", before


def test_an_edit_after_preflight_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    config, dropin, before = _node(tmp_path)
    config.write_bytes(before + b"maxPods: 77\n")  # the operator's edit
    edited = config.read_bytes()
    node = FakeNode()
    out = step.run_step(
        node,
        "apply",
        _apply_payload(
            tmp_path,
            [
                _file(config, b"cpuManagerPolicy: static\n", sha(before)),
                _file(dropin, b"x: 1\n", step.ABSENT),
            ],
        ),
    )
    assert out["failed"] and out["refused"] and out["written"] is False
    assert out["mismatches"] == [
        {"path": str(config), "expected": sha(before), "found": sha(edited)}
    ]
    assert str(config) in out["msg"] and sha(edited) in out["msg"]
    assert config.read_bytes() == edited and not dropin.exists()
    assert not (tmp_path / "backup").exists() and node.calls == []


def test_a_file_expected_absent_that_appeared_is_refused(tmp_path: Path) -> None:
    _, dropin, _ = _node(tmp_path)
    dropin.parent.mkdir(parents=True)
    dropin.write_bytes(b"someone else's drop-in\n")
    out = step.run_step(
        FakeNode(), "apply", _apply_payload(tmp_path, [_file(dropin, b"x: 1\n", step.ABSENT)])
    )
    assert out["refused"]
    assert out["mismatches"][0]["expected"] == "absent"
    assert dropin.read_bytes() == b"someone else's drop-in\n"


def test_apply_backs_up_the_replaced_bytes_writes_and_restarts_in_order(tmp_path: Path) -> None:
    config, dropin, before = _node(tmp_path)
    checkpoint = tmp_path / "var/lib/kubelet/cpu_manager_state"
    checkpoint.write_text("{}")
    node = FakeNode()
    new = b"cpuManagerPolicy: static\n"
    out = step.run_step(
        node,
        "apply",
        _apply_payload(
            tmp_path,
            [_file(config, new, sha(before), "0640"), _file(dropin, b"x: 1\n", step.ABSENT)],
            (str(checkpoint),),
        ),
    )
    assert out["status"] == "ok", out
    assert config.read_bytes() == new and stat.S_IMODE(config.stat().st_mode) == 0o640
    assert dropin.read_bytes() == b"x: 1\n"
    assert not checkpoint.exists() and out["checkpointsRemoved"] == [str(checkpoint)]
    assert node.calls == [("daemon-reload",), ("stop", "kubelet"), ("start", "kubelet")]
    manifest = out["manifest"]
    by_path = {f["path"]: f for f in manifest["files"]}
    assert by_path[str(config)]["sha256"] == sha(before)
    assert base64.b64decode(by_path[str(config)]["content_b64"]) == before
    assert by_path[str(config)]["mode"] == "0640"
    assert by_path[str(dropin)]["existed"] is False
    assert str(tmp_path / "etc") in by_path[str(dropin)]["missingParents"]
    on_node = json.loads((tmp_path / "backup/c1/manifest.json").read_text())
    assert on_node == manifest
    assert out["createdFiles"] == [str(dropin)]
    assert set(out["timings"]) >= {"check", "backup", "write", "stop", "start", "healthz"}
    assert not list(config.parent.glob(".rollout-*"))  # no temporary file left behind


def test_a_resumed_apply_accepts_its_own_bytes_and_keeps_the_first_backup(
    tmp_path: Path,
) -> None:
    config, _, before = _node(tmp_path)
    new = b"cpuManagerPolicy: static\n"
    payload = _apply_payload(tmp_path, [_file(config, new, sha(before))])
    first = step.run_step(FakeNode(), "apply", payload)
    assert first["status"] == "ok"
    again = step.run_step(FakeNode(), "apply", payload)  # crash after the write, then resume
    assert again["status"] == "ok" and again["changedFiles"] == []
    assert again["manifest"] == first["manifest"]
    assert config.read_bytes() == new


def test_a_node_backup_that_disagrees_with_the_journal_fails_before_any_write(
    tmp_path: Path,
) -> None:
    config, _, before = _node(tmp_path)
    backup = tmp_path / "backup/c1"
    backup.mkdir(parents=True)
    other = {"path": str(config), "existed": True, "sha256": sha(b"other\n")}
    (backup / "manifest.json").write_text(json.dumps({"changeId": "c1", "files": [other]}))
    out = step.run_step(
        FakeNode(), "apply", _apply_payload(tmp_path, [_file(config, b"new\n", sha(before))])
    )
    assert out["failed"] and out["failedStep"] == "backup" and out["written"] is False
    assert config.read_bytes() == before


def test_a_symlink_is_never_replaced(tmp_path: Path) -> None:
    config, _, before = _node(tmp_path)
    link = tmp_path / "link.yaml"
    link.symlink_to(config)
    out = step.run_step(
        FakeNode(), "apply", _apply_payload(tmp_path, [_file(link, b"new\n", sha(before))])
    )
    assert out["failed"] and "is not a regular file" in out["msg"]
    assert config.read_bytes() == before


def _restore_payload(
    items: list[tuple[Path, bytes | None, bytes]],
) -> dict[str, Any]:
    return {
        "change_id": "c1",
        "restore": [
            {
                "path": str(p),
                "content_b64": base64.b64encode(orig).decode() if orig is not None else None,
                "sha256": sha(orig) if orig is not None else None,
                "current": [sha(written)],
                "mode": "0640",
                "owner": str(os.getuid()),
                "group": str(os.getgid()),
            }
            for p, orig, written in items
        ],
        "remove_dirs": [],
        "checkpoint_reset": [],
        "service": "kubelet",
        "healthz_url": "http://127.0.0.1:9/healthz",
    }


def test_restore_refuses_a_file_edited_after_our_write_unless_forced(tmp_path: Path) -> None:
    config, dropin, before = _node(tmp_path)
    ours = b"cpuManagerPolicy: static\n"
    config.write_bytes(ours + b"maxPods: 77\n")  # edited after our write
    dropin.parent.mkdir(parents=True)
    dropin.write_bytes(b"x: 1\n")
    payload = _restore_payload([(config, before, ours), (dropin, None, b"x: 1\n")])
    node = FakeNode()
    out = step.run_step(node, "restore", payload)
    assert out["refused"] and out["written"] is False and node.calls == []
    assert out["mismatches"][0]["path"] == str(config)
    assert config.read_bytes() == ours + b"maxPods: 77\n" and dropin.exists()

    forced = step.run_step(FakeNode(), "restore", payload, force=True)
    assert forced["status"] == "ok" and forced["forced"] is True
    assert config.read_bytes() == before and not dropin.exists()


def test_restore_puts_back_our_write_and_skips_what_is_already_original(tmp_path: Path) -> None:
    config, dropin, before = _node(tmp_path)
    ours = b"cpuManagerPolicy: static\n"
    config.write_bytes(ours)
    out = step.run_step(
        FakeNode(), "restore", _restore_payload([(config, before, ours), (dropin, None, b"x\n")])
    )
    assert out["status"] == "ok", out
    assert config.read_bytes() == before and stat.S_IMODE(config.stat().st_mode) == 0o640
    assert out["changedFiles"] == [str(config)] and out["removedFiles"] == []
    again = step.run_step(
        FakeNode(), "restore", _restore_payload([(config, before, ours), (dropin, None, b"x\n")])
    )
    assert again["status"] == "ok" and again["changedFiles"] == []


def test_a_kubelet_that_never_gets_healthy_names_the_step_and_says_files_were_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _, before = _node(tmp_path)

    def unhealthy(*a: object) -> tuple[str, float]:
        raise step.StepError("healthz", "the kubelet's healthz endpoint did not answer ok")

    monkeypatch.setattr(step, "healthz", unhealthy)
    out = step.run_step(
        FakeNode(), "apply", _apply_payload(tmp_path, [_file(config, b"new\n", sha(before))])
    )
    assert out["failed"] and out["failedStep"] == "healthz" and out["written"] is True
    assert out["refused"] is False
    assert "the kubelet logged" not in out["msg"]  # it logged no error


def test_a_kubelet_that_refuses_its_config_is_quoted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config, _, before = _node(tmp_path)

    def unhealthy(*a: object) -> tuple[str, float]:
        raise step.StepError("healthz", "the kubelet's healthz endpoint did not answer ok")

    monkeypatch.setattr(step, "healthz", unhealthy)
    node = FakeNode()
    node.said = '"command failed" err="failed to run Kubelet: bad"'
    out = step.run_step(
        node, "apply", _apply_payload(tmp_path, [_file(config, b"new\n", sha(before))])
    )
    assert out["failedStep"] == "healthz"
    assert out["msg"].endswith(
        'did not answer ok; the kubelet logged: "command failed" err="failed to run Kubelet: bad"'
    )


def test_last_error_reads_klog_lines_from_the_journal_or_a_log_file() -> None:
    status = "\n".join(
        [
            "● kubelet.service - kubelet",
            "     Active: activating (auto-restart)",
            'E1201 08:12:00.100000    1234 server.go:1] "first" err="old"',
            'I1201 08:12:00.200000    1234 server.go:2] "Starting"',
            "Dec 01 08:12:01 n1 kubelet[1240]: E1201 08:12:01.123456    1240 run.go:72] "
            '"command failed" err="failed to run Kubelet: could not restore state"',
            "Dec 01 08:12:01 n1 systemd[1]: kubelet.service: Main process exited",
        ]
    )
    assert step.last_error(status) == (
        '"command failed" err="failed to run Kubelet: could not restore state"'
    )
    assert step.last_error("I1201 08:12:00.200000 1 x.go:2] ok\n") is None
    assert step.last_error("") is None


def test_the_read_only_check_reports_digests_and_writes_nothing(tmp_path: Path) -> None:
    config, dropin, before = _node(tmp_path)
    node = FakeNode()
    out = step.run_step(node, "check", {"paths": [str(config), str(dropin)]})
    assert out["status"] == "ok" and out["changed"] is False
    assert out["digests"] == {str(config): sha(before), str(dropin): "absent"}
    assert node.calls == []


def test_restore_without_the_bytes_puts_back_the_nodes_own_checked_copy(tmp_path: Path) -> None:
    """The controller lost the backup (state directory and cluster record): the payload names
    only the sha256; the node step restores from the copy its apply kept, checked against it,
    and refuses, writing nothing, when that copy is missing or is other bytes."""
    config, _, before = _node(tmp_path)
    new = b"cpuManagerPolicy: static\n"
    applied = step.run_step(
        FakeNode(), "apply", _apply_payload(tmp_path, [_file(config, new, sha(before))])
    )
    assert applied["status"] == "ok" and config.read_bytes() == new
    payload = _restore_payload([(config, before, new)])
    (item,) = payload["restore"]
    item["content_b64"] = None
    item["from_node_backup"] = True
    payload["backup_dir"] = str(tmp_path / "backup" / "c1")

    wrong = json.loads(json.dumps(payload))
    wrong["restore"][0]["sha256"] = sha(b"something else\n")
    out = step.run_step(FakeNode(), "restore", wrong)
    assert out["failed"] and "is not the journal's" in out["msg"] and out["written"] is False
    missing = {**json.loads(json.dumps(payload)), "backup_dir": str(tmp_path / "nowhere")}
    out = step.run_step(FakeNode(), "restore", missing)
    assert out["failed"] and "no node backup of" in out["msg"]
    assert config.read_bytes() == new  # nothing written by either

    out = step.run_step(FakeNode(), "restore", payload)
    assert out["status"] == "ok", out
    assert config.read_bytes() == before and out["changedFiles"] == [str(config)]


def test_a_successful_apply_keeps_the_backups_of_the_last_changes_only(tmp_path: Path) -> None:
    config, _, before = _node(tmp_path)
    root = tmp_path / "backup"
    for i in range(12):  # older changes' backups (ids sort by start time)
        d = root / f"2026010{i // 10}T0{i % 10}0000Z-old"
        d.mkdir(parents=True)
        (d / "manifest.json").write_text("{}")
    (root / "not-a-backup").mkdir()
    payload = {
        **_apply_payload(tmp_path, [_file(config, b"new\n", sha(before))]),
        "keep_backups": 3,
    }
    out = step.run_step(FakeNode(), "apply", payload)
    assert out["status"] == "ok", out
    kept = sorted(p.name for p in root.iterdir())
    # this change's own (c1), the 2 newest others, and what is not a backup
    assert "c1" in kept and "not-a-backup" in kept and len(kept) == 4
    backups = [k for k in kept if k.endswith("-old")]
    assert backups == ["20260101T000000Z-old", "20260101T010000Z-old"]
    assert len(out["prunedBackups"]) == 10
