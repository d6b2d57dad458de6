"""Crash consistency, proven deterministically through the CLI.

For every journal entry (step and phase) that ``apply --canary``, ``promote``, ``rollback`` and
``resume`` write, the command runs with ``ROLLOUT_FAILPOINT=step:phase``, which SIGKILLs it right
after that entry is fsynced (rollout/change/journal.py); then ``rollout resume`` runs, and:

* every node is fully on the new config (its files byte-identical to a clean run's, the kubelet
  running it) or fully as before (byte-identical files, the old config running);
* no byte is lost: every backup the journal holds is the sha256 of the file as it was before
  the change; after a crashed rollback, a second ``rollout rollback`` puts every node back byte
  for byte;
* the node that was cordoned before the change (seeded) is still cordoned, the others are not;
* the ``rollout-lock`` Lease is gone;
* for apply and promote (and a crashed resume of a promote), resume finished what the command
  would have done: the same node states as the clean run, the canary's gate verdict journaled.

The entries are enumerated from a clean run's journals (apply, promote, rollback, and a resume of a
promote killed at its first write), so a new journal step is crashed at automatically; the cases
are named ``<command>-<step>:<phase>`` over every step the code knows, and a key the clean run
writes that no case names fails ``test_every_entry_of_a_clean_run_has_a_case``.

One lab for the module: three sim-kubelet nodes (canary first, the last one cordoned before the
change), a plan without a gate soak (the gate entries are then the default gate's Successful
verdict) and maxUnavailable 1; between cases the nodes are put back to the case's starting point by
writing their files and restarting the kubelet directly (no playbook), and each case gets a fresh
copy of the clean run's state directory. Every wait is on a condition, with generous timeouts.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from rollout.change.journal import CHANGE_STEP, FAILPOINT_ENV, Journal, replay
from rollout.change.orchestrator import GATE_STEP
from rollout.lab.cluster import Lab
from rollout.models import Step
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab

LEASE = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/rollout-lock"
CLI_TIMEOUT = 600.0  # one command, on a loaded two-core machine
COMMANDS = ("apply", "promote", "rollback", "resume")
# every step name the code journals: the node steps, then the change-level ones
STEPS = (CHANGE_STEP, GATE_STEP, *(s.value for s in Step), "verdict", "trigger", "request")
CASES = [
    (cmd, f"{step}:{phase}")
    for cmd, step, phase in itertools.product(COMMANDS, STEPS, ("begin", "done"))
]
KUBELET_STATE = ("var/lib/kubelet/cpu_manager_state", "var/lib/kubelet/memory_manager_state")


@dataclass
class Stage:
    """The world at a point of the clean run: node files (bytes), cordons, running policy, and
    the state directory (journal, backups) as the clean run left it."""

    files: dict[str, dict[str, bytes]]
    cordoned: dict[str, bool]
    policy: dict[str, str]
    state: Path | None


@dataclass
class World:
    lab: Lab
    names: list[str]
    inv: Path
    plan: Path
    lock_ns: str
    root: Path
    change: str
    baseline: Stage
    held: Stage
    applied: Stage
    keys: dict[str, list[str]]  # command -> "step:phase" in the order the clean run wrote them
    paths: dict[str, dict[str, str]]  # command -> "step:phase" -> path of its first entry
    clean_states: dict[str, dict[str, str]]  # command -> node states it ends with

    def env(self, state: Path, failpoint: str | None = None) -> dict[str, str]:
        e = ck.env(self.lab, state)
        e.pop(FAILPOINT_ENV, None)
        if failpoint:
            e[FAILPOINT_ENV] = failpoint
        return e

    def run(self, args: list[str], state: Path, failpoint: str | None = None) -> Any:
        full = [*args, "--lock-namespace", self.lock_ns]
        return ck.cli(full, self.env(state, failpoint), timeout=CLI_TIMEOUT)


def _files(lab: Lab, node: str) -> dict[str, bytes]:
    """The bytes of every watched node file (what a change may touch)."""
    root = lab.node_root(node)
    out: dict[str, bytes] = {}
    for d in ck.WATCHED_DIRS:
        base = root / d
        if base.is_dir():
            for p in sorted(base.rglob("*")):
                if p.is_file() and not p.is_symlink():
                    out["/" + str(p.relative_to(root))] = p.read_bytes()
    for f in ck.WATCHED_FILES:
        p = root / f
        if p.is_file():
            out["/" + f] = p.read_bytes()
    return out


def _digests(files: dict[str, bytes]) -> dict[str, str]:
    return {p: hashlib.sha256(b).hexdigest() for p, b in files.items()}


def _policy(lab: Lab, node: str) -> str | None:
    try:
        return str(ck.configz(lab, node).get("cpuManagerPolicy"))
    except (AssertionError, ValueError, OSError):
        return None  # the kubelet is restarting


def _capture(lab: Lab, names: list[str], state: Path | None, keep: Path) -> Stage:
    copy = None
    if state is not None:
        copy = keep
        shutil.copytree(state, copy, ignore=shutil.ignore_patterns("ansible"))
    return Stage(
        files={n: _files(lab, n) for n in names},
        cordoned={n: ck.unschedulable(lab, n) for n in names},
        policy={n: str(_policy(lab, n)) for n in names},
        state=copy,
    )


def _put_back(w: World, stage: Stage, state: Path) -> None:
    """Make the lab what ``stage`` was, without rollout: node files written back, the kubelet
    restarted where its files or running policy differ (manager checkpoints removed, as a change
    does), cordons set, the Lease deleted; ``state`` becomes a fresh copy of the stage's state."""
    lab = w.lab
    for n in w.names:
        want = stage.files[n]
        have = _files(lab, n)
        restart = have != want or _policy(lab, n) != stage.policy[n]
        if restart:
            root = lab.node_root(n)
            lab.stop_kubelet(n)
            for p in set(have) - set(want):
                (root / p.lstrip("/")).unlink()
            for p, content in want.items():
                target = root / p.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            for rel in KUBELET_STATE:
                (root / rel).unlink(missing_ok=True)
            lab.start_kubelet(n)
        if ck.unschedulable(lab, n) != stage.cordoned[n]:
            ck.set_unschedulable(lab, n, stage.cordoned[n])
    for n in w.names:
        ck.wait_for(
            lambda n=n: _policy(lab, n) == stage.policy[n],
            180,
            f"{n}'s kubelet running cpuManagerPolicy {stage.policy[n]}",
            every=0.25,
        )
    lab.wait_ready(w.names, timeout=180)
    lab.api.request("DELETE", LEASE.format(ns=w.lock_ns))
    if state.exists():
        shutil.rmtree(state)
    if stage.state is not None:
        shutil.copytree(stage.state, state)
    else:
        state.mkdir(parents=True)


def _keys(entries: list[Any]) -> list[str]:
    """``step:phase`` of the entries, in order, each once."""
    return list(dict.fromkeys(f"{e.step}:{e.phase.value}" for e in entries))


def _paths(entries: list[Any]) -> dict[str, str]:
    """``step:phase`` -> the path (forward / restore; "" change-level) of its first entry."""
    out: dict[str, str] = {}
    for e in entries:
        out.setdefault(f"{e.step}:{e.phase.value}", e.path.value if e.path else "")
    return out


# ``full``: every entry of every command (61 cases in the lab: about 55 min on a loaded two-core
# machine). ``distinct`` (the default): each node entry (path, step, phase) once, in the first
# command that writes it (apply, then rollback, promote, resume), and every command's own
# change-level entries (about 33 cases). Both are enumerated from the clean run.
MATRIX = os.environ.get("ROLLOUT_CRASH_MATRIX", "distinct")


def _selected(w: World, command: str, key: str) -> bool:
    if MATRIX == "full":
        return key in w.keys[command]
    seen: set[tuple[str, str]] = set()
    for cmd in ("apply", "rollback", "promote", "resume"):
        for k in w.keys[cmd]:
            ident = (cmd, k) if k.startswith(CHANGE_STEP + ":") else (w.paths[cmd][k], k)
            if ident in seen:
                continue
            seen.add(ident)
            if (cmd, k) == (command, key):
                return True
    return False


def _ok(r: Any, what: str) -> Any:
    assert r.returncode == 0, f"{what} exited {r.returncode}\n{r.stderr[-4000:]}"
    return r


def _killed(r: Any, what: str) -> None:
    assert r.returncode == -signal.SIGKILL, (
        f"{what} was not killed at its failpoint (exit {r.returncode})\n{r.stderr[-4000:]}"
    )


@pytest.fixture(scope="module")
def world(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root = tmp_path_factory.mktemp("crash")
    names = [f"crash{os.getpid() % 100000}-{i}" for i in (1, 2, 3)]
    lab.add_nodes(names, ["kubeadm"], wait_ready=True, timeout=180, kubelet="sim")
    try:
        inv = ck.inventory(lab, names, names[:1], root / "inv.ini")
        plan = ck.plan(root / "plan.yaml", dict.fromkeys(names, "kubeadm"), max_unavailable=1)
        lock_ns = f"crash-lock-{os.getpid() % 100000}"
        code, out = lab.api.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": lock_ns}, "kind": "Namespace"}
        )
        assert code == 201, out
        ck.set_unschedulable(lab, names[2], True)  # an operator's cordon from before the change
        baseline = _capture(lab, names, None, root / "unused")
        w = World(
            lab, names, inv, plan, lock_ns, root, "", baseline, baseline, baseline, {}, {}, {}
        )
        yield _clean_run(w)
    finally:
        lab.remove_nodes(names)
        lab.api.request("DELETE", f"/api/v1/namespaces/crash-lock-{os.getpid() % 100000}")


def _clean_run(w: World) -> World:
    """Apply the canary, promote, roll back, and resume a promote killed at its first node write,
    without crashing anything else: the keys each command writes, the stages in between."""
    state = w.root / "clean"
    apply = [
        *("apply", "--plan", str(w.plan), "-i", str(w.inv), "--canary", "--yes", "-o", "json"),
    ]
    r = _ok(w.run(apply, state), "clean apply --canary")
    w.change = json.loads(r.stdout)["change"]
    journal = Journal.open(state, w.change)
    n_apply = len(journal.entries())
    w.keys["apply"] = _keys(journal.entries())
    w.paths["apply"] = _paths(journal.entries())
    w.clean_states["apply"] = ck.states(state)
    w.held = _capture(w.lab, w.names, state, w.root / "stage-held")

    _ok(w.run(["promote", "--change", w.change, "--yes", "-o", "json"], state), "clean promote")
    n_promote = len(journal.entries())
    w.keys["promote"] = _keys(journal.entries()[n_apply:])
    w.paths["promote"] = _paths(journal.entries()[n_apply:])
    w.clean_states["promote"] = ck.states(state)
    w.applied = _capture(w.lab, w.names, state, w.root / "stage-applied")

    _ok(w.run(["rollback", "--change", w.change, "--yes", "-o", "json"], state), "clean rollback")
    w.keys["rollback"] = _keys(journal.entries()[n_promote:])
    w.paths["rollback"] = _paths(journal.entries()[n_promote:])
    for n in w.names:
        assert _digests(_files(w.lab, n)) == _digests(w.baseline.files[n]), n

    state = w.root / "clean-resume"
    _put_back(w, w.held, state)
    kill = "apply:begin"
    _killed(w.run(["promote", "--change", w.change, "--yes"], state, kill), f"promote @ {kill}")
    n_killed = len(Journal.open(state, w.change).entries())
    _ok(w.run(["resume", "--change", w.change, "-o", "json"], state), "clean resume")
    w.keys["resume"] = _keys(Journal.open(state, w.change).entries()[n_killed:])
    w.paths["resume"] = _paths(Journal.open(state, w.change).entries()[n_killed:])
    w.clean_states["resume"] = ck.states(state)
    assert w.clean_states["resume"] == w.clean_states["promote"]
    return w


def test_every_entry_of_a_clean_run_has_a_case(world: World) -> None:
    """The enumeration is not trivial, and a step the code starts to journal that no case names
    (a new change-level entry kind) fails here, naming it."""
    named = {(cmd, key) for cmd, key in CASES}
    for cmd in COMMANDS:
        keys = world.keys[cmd]
        missing = [k for k in keys if (cmd, k) not in named]
        assert not missing, f"{cmd} writes {missing}: add the step to STEPS"
    assert len(world.keys["apply"]) >= 16, world.keys["apply"]  # 7 node steps x 2, change, gate
    assert len(world.keys["promote"]) >= 15, world.keys["promote"]
    assert len(world.keys["rollback"]) >= 10, world.keys["rollback"]
    assert len(world.keys["resume"]) >= 10, world.keys["resume"]
    assert "gate:begin" in world.keys["apply"]  # the soak's start is a crash point too


def _check(w: World, state: Path, change: str, expect: dict[str, str] | None) -> dict[str, str]:
    """Every node fully new or fully as before, backups intact, cordons kept, the Lease gone.

    ``expect``: the node states the interrupted command would have ended with (None: any mix
    of applied and restored)."""
    journal = Journal.open(state, change)
    status = replay(journal.entries(), change)  # readable: a torn tail was repaired
    states = {n: s.state.value for n, s in status.nodes.items()}
    after = w.applied.files
    for n in w.names:
        have = _digests(_files(w.lab, n))
        st = states[n]
        assert st in ("applied", "restored", "pending"), (n, st, status.nodes[n].message)
        if st == "applied":
            assert have == _digests(after[n]), f"{n} applied but its files are not the new ones"
            assert _policy(w.lab, n) == "static", n
        else:
            assert have == _digests(w.baseline.files[n]), f"{n} {st} but its files changed"
            assert _policy(w.lab, n) == "none", n
        before = _digests(w.baseline.files[n])
        for b in status.nodes[n].backups:  # no byte lost: the journal holds the old bytes
            if b.existed:
                assert before.get(b.path) == b.sha256, f"{n}: {b.path}'s backup is not the old file"
                assert journal.load_backup(n, b.sha256)
            else:
                assert b.path not in before, f"{n}: {b.path} existed but was backed up as absent"
        assert ck.unschedulable(w.lab, n) is w.baseline.cordoned[n], f"{n}'s cordon changed"
    code, _ = w.lab.api.request("GET", LEASE.format(ns=w.lock_ns))
    assert code == 404, "the rollout-lock Lease is still there"
    if expect is not None:
        assert states == expect, "resume did not finish what the interrupted command would have"
    return states


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("command", "key"), CASES, ids=[f"{c}-{k}" for c, k in CASES])
def test_kill_after_each_journal_entry_then_resume(world: World, command: str, key: str) -> None:
    if key not in world.keys[command]:
        pytest.skip(f"a clean {command} does not write {key}")
    if not _selected(world, command, key):
        pytest.skip(
            f"crashed at in an earlier command (ROLLOUT_CRASH_MATRIX=full runs it: {MATRIX})"
        )
    w = world
    state = w.root / f"case-{command}-{key.replace(':', '-')}"
    change = ["--change", w.change]
    if command == "apply":
        _put_back(w, w.baseline, state)
        args = ["apply", "--plan", str(w.plan), "-i", str(w.inv), "--canary", "--yes"]
        _killed(w.run(args, state, key), f"apply @ {key}")
        change = ["--change", Journal.open(state).change_id]  # a new change: the newest there
    elif command == "promote":
        _put_back(w, w.held, state)
        _killed(w.run(["promote", *change, "--yes"], state, key), f"promote @ {key}")
    elif command == "rollback":
        _put_back(w, w.applied, state)
        _killed(w.run(["rollback", *change, "--yes"], state, key), f"rollback @ {key}")
    else:
        _put_back(w, w.held, state)
        first = "apply:begin"
        _killed(w.run(["promote", *change, "--yes"], state, first), f"promote @ {first}")
        _killed(w.run(["resume", *change], state, key), f"resume @ {key}")
    _ok(w.run(["resume", *change, "-o", "json"], state), "resume")
    cid = change[1]
    if command == "apply":
        _check(w, state, cid, w.clean_states["apply"])
        gates = [e for e in Journal.open(state, cid).entries() if e.step == GATE_STEP]
        assert (gates[-1].phase.value, gates[-1].data.get("status")) == ("done", "Successful")
        return
    if command == "rollback":
        _check(w, state, cid, None)
        _ok(w.run(["rollback", *change, "--yes"], state), "rollback after resume")
        states = _check(w, state, cid, None)
        assert set(states.values()) == {"restored"}  # every byte back
        return
    _check(w, state, cid, w.clean_states[command])
