"""Payload records and the per-host outcome rules of the playbook runner (pure, no Ansible)."""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from typing import Any

import pytest

from rollout.ansible.outcomes import TaskEvent, summarize, task_event
from rollout.ansible.payloads import ApplyPayload, Backup, FileWrite, RestorePayload
from rollout.errors import InputError


@dataclass(frozen=True)
class _Rendered:
    path: str
    content: bytes
    mode: str
    owner: str


def test_file_write_from_rendered_splits_owner_and_group() -> None:
    f = FileWrite.from_rendered(_Rendered("/etc/a", b"x\n", "0600", "root:kube"))
    assert (f.owner, f.group, f.mode) == ("root", "kube", "0600")
    assert FileWrite.from_rendered(_Rendered("/etc/a", b"", "0644", "root")).group == "root"


def test_apply_payload_carries_bytes_and_their_sha256() -> None:
    content = b"kind: KubeletConfiguration\ncpuManagerPolicy: static\n"
    data = ApplyPayload("c1", (FileWrite("/etc/a", content),), "kubelet").as_json()
    (f,) = data["files"]
    assert base64.b64decode(f["content_b64"]) == content
    assert f["sha256"] == hashlib.sha256(content).hexdigest()
    assert data["backup_dir"] == "/var/lib/rollout/backups/c1"
    assert data["healthz_url"] == "http://127.0.0.1:10248/healthz"


def test_non_utf8_content_is_refused_naming_the_file() -> None:
    with pytest.raises(InputError, match="/etc/bin"):
        FileWrite("/etc/bin", b"\xff\xfe").as_json()


def _manifest(**override: Any) -> dict[str, Any]:
    old = b"cpuManagerPolicy: none\n"
    files = [
        {
            "path": "/var/lib/kubelet/config.yaml",
            "existed": True,
            "sha256": hashlib.sha256(old).hexdigest(),
            "mode": "0644",
            "owner": "root",
            "group": "root",
            "content_b64": base64.b64encode(old).decode(),
            "missingParents": [],
        },
        {
            "path": "/etc/kubernetes/kubelet.conf.d/sub/90-rollout.conf",
            "existed": False,
            "content_b64": None,
            "missingParents": [
                "/etc/kubernetes/kubelet.conf.d/sub",
                "/etc/kubernetes/kubelet.conf.d",
            ],
        },
    ]
    files[0].update(override)
    return {"changeId": "c1", "files": files}


def test_restore_payload_puts_back_bytes_and_removes_what_was_created() -> None:
    backup = Backup.from_manifest("n1", _manifest())
    data = RestorePayload.from_backup(backup, service="kubelet").as_json()
    kept, created = data["restore"]
    assert base64.b64decode(kept["content_b64"]) == b"cpuManagerPolicy: none\n"
    assert created["content_b64"] is None
    # deepest first, so rmdir can remove the tree
    assert data["remove_dirs"] == [
        "/etc/kubernetes/kubelet.conf.d/sub",
        "/etc/kubernetes/kubelet.conf.d",
    ]


def test_backup_whose_bytes_do_not_match_its_sha256_is_refused() -> None:
    with pytest.raises(InputError, match="does not match its sha256"):
        Backup.from_manifest("n1", _manifest(sha256="0" * 64), file="m.json")


def test_malformed_manifest_names_the_file() -> None:
    with pytest.raises(InputError, match=r"m\.json"):
        Backup.from_manifest("n1", {"files": []}, file="m.json")


def _ev(kind: str, host: str, task: str = "t", **res: Any) -> dict[str, Any]:
    return {"event": kind, "event_data": {"host": host, "task": task, "res": res}}


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ([_ev("runner_on_ok", "a", changed=True)], {"a": ("ok", None, None, True)}),
        (
            [
                _ev("runner_on_ok", "a"),
                _ev("runner_on_failed", "a", "Write files", msg="denied"),
                _ev("runner_on_failed", "a", "Stop with a message", msg="rollout apply failed"),
            ],
            {"a": ("failed", "Write files", "rollout apply failed", False)},
        ),
        (
            [_ev("runner_on_unreachable", "a", "Back up", msg="ssh: connect refused")],
            {"a": ("unreachable", "Back up", "ssh: connect refused", False)},
        ),
        ([], {"a": ("skipped", None, None, False)}),
        (
            [{"event": "runner_on_failed", "event_data": {"host": "a", "ignore_errors": True}}],
            {"a": ("ok", None, None, False)},
        ),
        ([{"event": "playbook_on_stats", "event_data": {}}], {"a": ("skipped", None, None, False)}),
    ],
)
def test_summarize_per_host_outcome(
    raw: list[dict[str, Any]], expected: dict[str, tuple[Any, ...]]
) -> None:
    events = [e for e in (task_event(r) for r in raw) if e is not None]
    got = summarize(events, ["a"])
    assert {h: (r.status, r.failed_task, r.message, r.changed) for h, r in got.items()} == expected


def test_the_playbook_report_names_the_failed_step_over_the_rescue_task() -> None:
    events = [TaskEvent("failed", "a", "Stop with a message naming the failed step", message="m")]
    got = summarize(events, ["a"], {"a": {"failedTask": "Start the kubelet service"}})
    assert got["a"].failed_task == "Start the kubelet service"
    assert got["a"].report == {"failedTask": "Start the kubelet service"}
