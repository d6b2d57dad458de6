"""Crash consistency, placed deterministically: ``ROLLOUT_FAILPOINT=step:phase:node`` makes the CLI
SIGKILL itself right after writing that journal entry; then ``rollout resume`` must leave every node
fully new or fully restored (sha256 of every file a change may touch), keep the operator's cordon,
and free the Lease.

One pair of lab nodes serves every case (module scope): ``a`` schedulable, ``b`` cordoned by the
operator before anything runs (its cordon must survive everything). The plan changes both in one
canary batch. The "new" bytes of each node are taken once from an uninterrupted apply.

Cases, per command (the kill is in that command's process):

* ``apply``: after every forward entry of node ``a`` (preflight ... uncordon, begin and done), the
  change's ``begin`` and the gate's verdict;
* ``rollback`` (of an applied change): after every restore-path entry of ``a`` and the end;
* ``promote`` (canary ``a`` held, then promote ``b``): after ``b``'s cordon, backup, apply and
  verify entries;
* ``resume`` (of an apply killed in ``a``'s apply step): killed again in its own re-apply, verify
  and uncordon; a second ``resume`` settles it.

Runtime: about 40 s a case on a quiet 2-core machine (each case is an apply or promote, a resume
and a cleanup rollback, each with its playbook runs).
"""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.journal import Journal, replay
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab

FORWARD = ("preflight", "cordon", "drain", "backup", "apply", "verify", "uncordon")
RESTORE = ("cordon", "drain", "restore", "restore-verify", "uncordon")
PHASES = ("begin", "done")


@dataclass
class Pair:
    lab: Lab
    a: str
    b: str
    inventory: Path
    canary_inventory: Path
    plan: Path
    before: dict[str, dict[str, str]]
    new: dict[str, dict[str, str]]
    ns: str


def _lease(lab: Lab, ns: str) -> Any:
    code, body = lab.api.request(
        "GET", f"/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/rollout-lock"
    )
    return body if code == 200 else None


@pytest.fixture(scope="module")
def pair(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Pair]:
    tmp = tmp_path_factory.mktemp("crash")
    names = ["crash-a", "crash-b"]
    lab.add_nodes(names, ["kubeadm"], wait_ready=True)
    try:
        a, b = names
        ns = "crash-lock"
        code, out = lab.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
        assert code == 201, out
        ck.set_unschedulable(lab, b, True)  # the operator's cordon
        inv = ck.inventory(lab, names, names, tmp / "inv.ini")
        canary_inv = ck.inventory(lab, names, [a], tmp / "canary.ini")
        plan = ck.plan(tmp / "plan.yaml", dict.fromkeys(names, "kubeadm"), max_unavailable=2)
        before = {n: ck.snapshot(lab, n) for n in names}
        env = ck.env(lab, tmp / "ref")
        r = ck.cli(_apply(plan, inv, ns), env)
        assert r.returncode == 0, r.stderr
        new = {n: ck.snapshot(lab, n) for n in names}
        assert all(new[n] != before[n] for n in names)
        change = json.loads(r.stdout)["change"]
        r = ck.cli(["rollback", "--change", change, "--yes", "--lock-namespace", ns], env)
        assert r.returncode == 0, r.stderr
        assert {n: ck.snapshot(lab, n) for n in names} == before
        yield Pair(lab, a, b, inv, canary_inv, plan, before, new, ns)
    finally:
        lab.remove_nodes(names)


def _apply(plan: Path, inv: Path, ns: str, canary: bool = True) -> list[str]:
    args = ["apply", "--plan", str(plan), "-i", str(inv), "--yes", "-o", "json"]
    return [*args, *(["--canary"] if canary else []), "--lock-namespace", ns, "--progress", "off"]


def _killed(p: Pair, args: list[str], env: dict[str, str], point: str) -> None:
    r = ck.cli(args, {**env, "ROLLOUT_FAILPOINT": point})
    assert r.returncode == -signal.SIGKILL, (point, r.returncode, r.stderr[-2000:])


def _ok(args: list[str], env: dict[str, str], codes: tuple[int, ...] = (0,)) -> Any:
    r = ck.cli(args, env)
    assert r.returncode in codes, (args[0], r.returncode, r.stderr[-3000:])
    return r


def _consistent(p: Pair, state: Path, change: str) -> dict[str, str]:
    """Every node fully new or fully restored, matching its journaled state; cordons; Lease."""
    status = replay(Journal.open(state, change).entries())
    states = {}
    for n in (p.a, p.b):
        snap = ck.snapshot(p.lab, n)
        st = status.nodes[n].state.value
        states[n] = st
        if st == "applied":
            assert snap == p.new[n], (n, st)
        else:
            assert st in ("restored", "pending"), (n, st)
            assert snap == p.before[n], (n, st)
    assert not ck.unschedulable(p.lab, p.a)
    assert ck.unschedulable(p.lab, p.b)  # the operator's cordon kept
    assert _lease(p.lab, p.ns) is None
    return states


def _cleanup(p: Pair, state: Path, change: str, env: dict[str, str]) -> None:
    _ok(["rollback", "--change", change, "--yes", "--lock-namespace", p.ns], env)
    for n in (p.a, p.b):
        assert ck.snapshot(p.lab, n) == p.before[n]
    assert ck.unschedulable(p.lab, p.b) and not ck.unschedulable(p.lab, p.a)


def _resume(p: Pair, change: str, env: dict[str, str]) -> None:
    _ok(["resume", "--change", change, "-o", "json", "--lock-namespace", p.ns], env)


# Every step of the forward path is covered on one of its two entries (begin or done), plus the
# change's begin and the gate's verdict; running every entry (33 cases) costs ~30 min on this
# machine, over the CI budget.
APPLY_POINTS = [
    "change:begin",
    "preflight:done:crash-a",
    "cordon:begin:crash-a",
    "drain:begin:crash-a",
    "backup:done:crash-a",
    "apply:begin:crash-a",
    "verify:done:crash-a",
    "uncordon:begin:crash-a",
    "gate:done",
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", APPLY_POINTS)
def test_apply_killed_then_resumed(pair: Pair, tmp_path: Path, point: str) -> None:
    state = tmp_path / "state"
    env = ck.env(pair.lab, state)
    _killed(pair, _apply(pair.plan, pair.inventory, pair.ns), env, point)
    change = Journal.open(state).change_id
    _resume(pair, change, env)
    _consistent(pair, state, change)
    _cleanup(pair, state, change, env)


ROLLBACK_POINTS = [
    f"{s}:{ph}:crash-a"
    for s, ph in [("cordon", "done"), ("restore", "begin"), ("restore-verify", "begin")]
]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", ROLLBACK_POINTS)
def test_rollback_killed_then_resumed(pair: Pair, tmp_path: Path, point: str) -> None:
    state = tmp_path / "state"
    env = ck.env(pair.lab, state)
    r = _ok(_apply(pair.plan, pair.inventory, pair.ns), env)
    change = json.loads(r.stdout)["change"]
    _killed(
        pair, ["rollback", "--change", change, "--yes", "--lock-namespace", pair.ns], env, point
    )
    _resume(pair, change, env)
    states = _consistent(pair, state, change)
    assert states[pair.a] == "restored"  # a rollback once begun on a node is finished
    _cleanup(pair, state, change, env)


PROMOTE_POINTS = ["apply:begin:crash-b"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", PROMOTE_POINTS)
def test_promote_killed_then_resumed(pair: Pair, tmp_path: Path, point: str) -> None:
    state = tmp_path / "state"
    env = ck.env(pair.lab, state)
    r = _ok(_apply(pair.plan, pair.canary_inventory, pair.ns), env)
    change = json.loads(r.stdout)["change"]
    promote = ["promote", "--change", change, "--yes", "--lock-namespace", pair.ns]
    _killed(pair, [*promote, "--progress", "off"], env, point)
    _resume(pair, change, env)
    states = _consistent(pair, state, change)
    assert states[pair.a] == "applied"  # the canary untouched by the crash
    _cleanup(pair, state, change, env)


RESUME_POINTS = ["verify:begin:crash-a"]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("point", RESUME_POINTS)
def test_resume_killed_then_resumed(pair: Pair, tmp_path: Path, point: str) -> None:
    state = tmp_path / "state"
    env = ck.env(pair.lab, state)
    _killed(pair, _apply(pair.plan, pair.inventory, pair.ns), env, "apply:begin:crash-a")
    change = Journal.open(state).change_id
    resume = ["resume", "--change", change, "--lock-namespace", pair.ns, "--progress", "off"]
    _killed(pair, resume, env, point)
    _resume(pair, change, env)
    _consistent(pair, state, change)
    _cleanup(pair, state, change, env)


def test_the_cases_cover_every_step_of_the_forward_and_restore_paths() -> None:
    from rollout.models import Step

    forward = {p.split(":")[0] for p in APPLY_POINTS}
    restore = {p.split(":")[0] for p in ROLLBACK_POINTS}
    assert {s.value for s in Step} - {"restore", "restore-verify"} <= forward
    assert {"cordon", "restore", "restore-verify"} <= restore
