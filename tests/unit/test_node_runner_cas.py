"""The controller's side of the compare-and-swap: preflight records what it read (bytes, sha256,
mode, owner from the facts module), the apply payload carries those digests as expectations and
the node's own mode and owner, and a refusal comes back naming node, file, expected and found."""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path

import pytest

from rollout.ansible.hosts import Inventory
from rollout.ansible.outcomes import HostResult
from rollout.ansible.payloads import ABSENT
from rollout.change.engine.node_runner import _apply_payload, _result
from rollout.change.plan.schema import load_plan
from rollout.change.preflight.node_change import node_change, node_files_of
from rollout.errors import InputError
from rollout.lab.inventory import LAB_INTENT
from rollout.models import NodeChange

CONFIG = "/var/lib/kubelet/config.yaml"
TEXT = b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"


def _facts(data: bytes = TEXT, sha: str | None = None) -> dict[str, object]:
    return {
        "distribution": "kubeadm",
        "onlineCPUs": "0-63",
        "sockets": 2,
        "threadsPerCore": 2,
        "numaNodes": [{"id": 0, "cpus": "0-15,32-47"}, {"id": 1, "cpus": "16-31,48-63"}],
        "gpus": [],
        "kubeletFiles": [CONFIG],
        "kubeletFileMeta": {
            CONFIG: {
                "sha256": sha or hashlib.sha256(data).hexdigest(),
                "mode": "0600",
                "owner": "kube",
                "group": "adm",
                "content_b64": base64.b64encode(data).decode(),
            }
        },
    }


def test_preflight_records_digests_and_keeps_the_nodes_mode_and_owner(tmp_path: Path) -> None:
    plan_file = tmp_path / "plan.yaml"
    plan_file.write_text(
        "\n".join(
            [
                "apiVersion: rollout.dev/v1alpha1",
                "kind: RolloutPlan",
                "metadata:",
                "  name: t",
                *list(LAB_INTENT),
                "strategy:",
                "  canaryGroup: canary",
                "method: inplace",
            ]
        )
        + "\n"
    )
    inv = Inventory(tmp_path / "inv", ("n1",), {"canary": ("n1",)}, {})
    change, _, errors, _ = node_change(load_plan(plan_file), inv, "n1", _facts(), tmp_path)
    assert not errors
    assert change.expect[CONFIG] == hashlib.sha256(TEXT).hexdigest()
    assert change.mode[CONFIG] == ("0600", "kube", "adm")  # the node's, not 0644 root:root
    assert change.before_meta[CONFIG] == ("0600", "kube", "adm")
    assert change.before[CONFIG] == TEXT
    payload = _apply_payload(change, "c1").as_json()
    f = next(f for f in payload["files"] if f["path"] == CONFIG)
    assert f["expect"] == hashlib.sha256(TEXT).hexdigest()
    assert (f["mode"], f["owner"], f["group"]) == ("0600", "kube", "adm")


def test_facts_whose_bytes_do_not_match_their_digest_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="do not match their sha256"):
        node_files_of(_facts(sha="0" * 64), tmp_path)


def test_a_path_preflight_did_not_find_is_expected_absent() -> None:
    change = NodeChange(node="n1", host="n1", files={"/etc/new.conf": b"x\n"}, before={})
    assert _apply_payload(change, "c1").files[0].expect == ABSENT


def test_a_refusal_names_node_file_expected_and_found() -> None:
    report = {
        "refused": True,
        "mismatches": [{"path": CONFIG, "expected": "aa", "found": "bb"}],
    }
    r = _result(HostResult("h1", "failed", report=report), "apply playbook", "n1")
    assert r.refused and not r.ok
    assert r.message == (
        "node n1: file(s) changed on the node since preflight read them, nothing written: "
        f"{CONFIG}: "
        "expected sha256 aa, found bb"
    )


def test_a_restore_refusal_says_since_our_write_and_how_to_force() -> None:
    report = {
        "refused": True,
        "action": "restore",
        "mismatches": [{"path": CONFIG, "expected": "aa", "found": "bb"}],
    }
    r = _result(HostResult("h1", "failed", report=report), "restore over ssh", "n1")
    assert r.refused and "since our write" in r.message and CONFIG in r.message
    assert r.message.endswith("(rollout rollback --force overwrites them)")
