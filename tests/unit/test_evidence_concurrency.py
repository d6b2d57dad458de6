"""Evidence collection reads its independent sources at the same time: the nodes' facts (ssh),
their API reads, the cluster's ResourceClaims and the tenancy audit (one after the other, the
``after`` collection was the sum of their waits: ``benchmarks/README.md``, node_step_bench);
``apply`` collects its ``before`` evidence on a thread while it journals the consents and builds
the context and the gate, and waits for it before the first node step. Failures are reported
as when the sources ran in turn."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from rollout.ansible.hosts import Inventory
from rollout.ansible.runner import AnsibleRunner
from rollout.change.commands.apply_change import _Background
from rollout.evidence import collecting
from rollout.evidence.collecting import collect, concurrently
from rollout.kube import collecting as kube_collecting
from rollout.kube import nodes as kube_nodes
from rollout.kube import proxy
from rollout.models import NodeInfo

WAIT = 10.0  # a barrier that is never completed fails the test instead of hanging it


def _inventory(tmp: Path, hosts: tuple[str, ...]) -> Inventory:
    return Inventory(tmp / "inv.ini", hosts, {"all": hosts}, {h: {} for h in hosts})


def _info(name: str) -> NodeInfo:
    return NodeInfo(name, False, True, {"nvidia.com/gpu": "0"}, 4000, 8 << 30)


def _fake_cluster(
    monkeypatch: pytest.MonkeyPatch, barrier: threading.Barrier | None, claims: Any = None
) -> list[str]:
    """Fake API reads of each node (configz waits on ``barrier``) and a cluster whose
    ``resource.k8s.io`` is served with ``claims`` (an exception: the listing fails)."""
    calls: list[str] = []

    def configz(_api: Any, node: str) -> dict[str, Any]:
        calls.append(f"configz {node}")
        if barrier is not None:
            barrier.wait(WAIT)
        return {"kubeletconfig": {"topologyManagerPolicy": "single-numa-node"}}

    def listing(_api: Any, _versions: list[str]) -> list[dict[str, Any]]:
        if isinstance(claims, Exception):
            raise claims
        return list(claims or [])

    monkeypatch.setattr(proxy, "configz", configz)
    monkeypatch.setattr(kube_nodes, "node_info", lambda _api, n: _info(n))
    monkeypatch.setattr(kube_collecting, "evidence_pods", lambda _api, _n: [])
    monkeypatch.setattr(kube_nodes, "resource_api_versions", lambda _api: ["v1"])
    monkeypatch.setattr(kube_nodes, "resource_claim_objects", listing)
    return calls


def test_the_nodes_facts_and_their_api_reads_are_gathered_at_the_same_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The facts call (ssh) and every node's reads wait on one barrier: collect only completes
    when they run together; the collection holds both."""
    hosts = ("n1", "n2")
    barrier = threading.Barrier(1 + len(hosts))

    def gather_facts(self: Any, *_a: Any, **_k: Any) -> dict[str, dict[str, Any]]:
        barrier.wait(WAIT)
        return {h: {"numaNodes": [{"id": 0, "cpus": "0-3"}]} for h in hosts}

    monkeypatch.setattr(AnsibleRunner, "gather_facts", gather_facts)
    _fake_cluster(monkeypatch, barrier)
    target = tmp_path / "evidence.json"
    got = collect("after", object(), _inventory(tmp_path, hosts), list(hosts), target)  # type: ignore[arg-type]
    assert sorted(got["nodes"]) == ["n1", "n2"]
    assert got["nodes"]["n1"]["numa"] == {"0": "0-3"}  # from the facts
    assert got["nodes"]["n2"]["topologyManagerPolicy"] == "single-numa-node"  # from /configz
    assert json.loads(target.read_text())["collections"][0]["label"] == "after"


def test_a_failed_facts_call_fails_the_collection_as_before(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def gather_facts(self: Any, *_a: Any, **_k: Any) -> dict[str, dict[str, Any]]:
        raise RuntimeError("could not collect node facts: n1: unreachable")

    monkeypatch.setattr(AnsibleRunner, "gather_facts", gather_facts)
    _fake_cluster(monkeypatch, None)
    target = tmp_path / "evidence.json"
    with pytest.raises(RuntimeError, match="n1: unreachable"):
        collect("after", object(), _inventory(tmp_path, ("n1",)), ["n1"], target)  # type: ignore[arg-type]
    assert not target.exists()  # nothing half-written


def test_a_failed_claims_listing_is_named_on_every_node_never_a_pass(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fake_cluster(monkeypatch, None, claims=RuntimeError("forbidden"))
    got = collect(
        "before",
        object(),  # type: ignore[arg-type]
        _inventory(tmp_path, ("n1",)),
        ["n1"],
        tmp_path / "evidence.json",
        raw_facts={"n1": {"numaNodes": []}},
    )
    assert got["nodes"]["n1"]["draProblem"] == "cannot list ResourceClaims: forbidden"


def test_the_tenancy_audit_runs_beside_the_reads_and_lands_in_the_collection(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    barrier = threading.Barrier(2)  # the audit and the one node's reads
    _fake_cluster(monkeypatch, barrier)

    def audit(path: str, _api: Any) -> dict[str, Any]:
        barrier.wait(WAIT)
        return {"file": path, "result": "pass", "rows": []}

    monkeypatch.setattr(collecting, "tenancy_audit", audit)
    got = collect(
        "before",
        object(),  # type: ignore[arg-type]
        _inventory(tmp_path, ("n1",)),
        ["n1"],
        tmp_path / "evidence.json",
        raw_facts={"n1": {}},
        tenancy="tenancy.yaml",
    )
    assert got["tenancy"] == {"file": "tenancy.yaml", "result": "pass", "rows": []}


def test_concurrently_runs_every_source_at_once_and_raises_each_failure_when_asked() -> None:
    barrier = threading.Barrier(3)

    def ok(v: int) -> Any:
        return lambda: (barrier.wait(WAIT), v)[1]

    def bad() -> None:
        barrier.wait(WAIT)
        raise ValueError("b failed")

    done = concurrently({"a": ok(1), "b": bad, "c": ok(3)})
    assert done.value("a") == 1 and done.value("c") == 3
    with pytest.raises(ValueError, match="b failed"):
        done.value("b")


def test_apply_s_background_collection_starts_at_once_and_is_waited_for() -> None:
    started = threading.Event()

    def slow() -> str:
        started.set()
        time.sleep(0.2)
        return "collected"

    bg = _Background(slow)
    assert started.wait(WAIT)  # running before anyone asks for it
    assert bg.result() == "collected"  # result() waits for it to end
    assert _Background(None).result() is None

    def fails() -> None:
        raise RuntimeError("no evidence")

    with pytest.raises(RuntimeError, match="no evidence"):
        _Background(fails).result()


def test_the_after_evidence_opens_its_facts_sessions_for_the_nodes_asked_and_never_raises(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``apply`` asks, as its last batch begins, for the facts sessions of the nodes it will
    collect ``after`` evidence of: those hosts, the inventory's variables and ``--forks`` go to
    ``open_facts``; a failure to open is said as a warning and stops nothing."""
    from rollout.ansible import gathering

    inv = _inventory(tmp_path, ("a", "b", "c"))
    opened: list[tuple[list[str], int]] = []
    monkeypatch.setattr(
        gathering, "open_facts", lambda hosts, hv, forks: opened.append((list(hosts), forks))
    )
    said: list[str] = []
    evidence = collecting.ChangeEvidence(object(), inv, forks=2, say=said.append)  # type: ignore[arg-type]
    evidence.open_sessions(["c", "a"])
    assert opened == [(["c", "a"], 2)] and said == []

    def broken(hosts: Any, hv: Any, forks: int) -> None:
        raise OSError("ssh: not found")

    monkeypatch.setattr(gathering, "open_facts", broken)
    evidence.open_sessions(["a"])
    assert said == ["warning: facts sessions for the evidence not opened ahead: ssh: not found"]
