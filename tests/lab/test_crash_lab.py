"""Crash consistency, proven deterministically through the CLI.

For every journal entry (step and phase) that ``apply --canary``, ``promote``, ``rollback`` and
``resume`` write, the command runs with ``ROLLOUT_FAILPOINT=step:phase``, which SIGKILLs it right
after that entry is fsynced (rollout/change/record/journal.py); then ``rollout resume`` runs, and:

* every node is fully on the new config (its files byte-identical to a clean run's, the kubelet
  running it) or fully as before (byte-identical files, the old config running);
* no byte is lost: every backup the journal holds is the sha256 of the file as it was before
  the change;
* the node that was cordoned before the change (seeded) is still cordoned, the others are not;
* the ``rollout-lock`` Lease is gone;
* resume finished what the interrupted command would have done: the same node states as its
  clean run (apply: the canary applied and its gate verdict journaled; promote, and a crashed
  resume of a promote: every node applied; rollback: every node restored, byte for byte, with no
  second ``rollout rollback``).

Two resumes are crashed: ``resume`` finishes a promote killed at its first node write (the node's
files may be written), ``resume-cut`` one killed when its node was drained (nothing written: the
resume undoes the cordon, then runs the node again in its batch).

The cases are chosen at collection time from :data:`WRITES`, the journal keys each command's clean
run writes (built from the step names the engine journals), so CI reports no skip;
``test_the_clean_runs_write_exactly_the_keys_of_the_table`` fails, naming the key, when the code
journals a key the table lacks (or stops writing one it names). ``ROLLOUT_CRASH_MATRIX=full``
crashes at every key of every command; the default, ``distinct``, at every distinct crash point
(see :func:`_distinct`).

One lab for the module: three sim-kubelet nodes (canary first, the last one cordoned before the
change), a plan without a gate soak (the gate entries are then the default gate's Successful
verdict) and maxUnavailable 1; between cases the nodes are put back to the case's starting point by
writing their files and restarting the kubelet directly (no playbook) where they differ, and each
case gets a fresh copy of the starting point's state directory. The cases run in an order where one
case ends where the next starts, so most put-backs restart no kubelet. Every wait is on a
condition, with generous timeouts.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from rollout.change.engine.orchestrator import GATE_STEP, REQUEST_STEP
from rollout.change.record.journal import CHANGE_STEP, EVIDENCE_STEP, FAILPOINT_ENV, Journal
from rollout.change.record.replay import replay
from rollout.lab.cluster import Lab
from rollout.models import Step, StepPath
from tests.lab import changekit as ck

pytestmark = pytest.mark.lab

LEASE = "/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/rollout-lock"
CLI_TIMEOUT = 600.0  # one command, on a loaded two-core machine
KUBELET_STATE = ("var/lib/kubelet/cpu_manager_state", "var/lib/kubelet/memory_manager_state")

# every step name the engine journals: the change-level ones, then the node steps
STEPS = (CHANGE_STEP, GATE_STEP, REQUEST_STEP, EVIDENCE_STEP, *(s.value for s in Step))
FORWARD = (Step.PREFLIGHT, Step.CORDON, Step.DRAIN, Step.BACKUP, Step.APPLY, Step.VERIFY)
RESTORE = (Step.CORDON, Step.DRAIN, Step.RESTORE, Step.RESTORE_VERIFY, Step.UNCORDON)
FWD, RST = StepPath.FORWARD.value, StepPath.RESTORE.value


def _keys_of(steps: tuple[Step | str, ...], path: str) -> dict[str, str]:
    """``step:phase`` -> path ("": change-level) for each step's begin and done."""
    return {f"{s}:{p}": path for s in steps for p in ("begin", "done")}


# The keys (``step:phase``) each command's clean run writes, with the path of the first entry of
# each (what a failpoint kills at: the first entry that matches). The lab: three nodes, canary
# the first, maxUnavailable 1, a plan without a gate soak.
START, END = {CHANGE_STEP + ":begin": ""}, {CHANGE_STEP + ":done": ""}
WRITES: dict[str, dict[str, str]] = {
    # the canary: its forward path, then the default gate's verdict, then held, then its
    # 'before' and 'after' evidence
    "apply": {
        **START,
        **_keys_of((*FORWARD, Step.UNCORDON), FWD),
        **_keys_of((GATE_STEP,), ""),
        **END,
        EVIDENCE_STEP + ":done": "",
    },
    # the two other nodes, one batch each, no gate (the plan has none), then their 'before' and
    # 'after' evidence
    "promote": {
        **START,
        **_keys_of((*FORWARD, Step.UNCORDON), FWD),
        **END,
        EVIDENCE_STEP + ":done": "",
    },
    # every node restored
    "rollback": {**START, **_keys_of(RESTORE, RST), **END},
    # a promote killed at its first write: that node's apply again, verify, uncordon, then the
    # last batch (a new change-level begin) from its preflight on
    "resume": {
        **_keys_of((Step.APPLY, Step.VERIFY, Step.UNCORDON), FWD),
        **START,
        **_keys_of(FORWARD, FWD),
        **END,
    },
    # a promote killed when its node was drained (nothing written): the cordon undone (restore
    # path), then that node and the last one run again from their preflight
    "resume-cut": {
        **_keys_of((Step.UNCORDON,), RST),
        **START,
        **_keys_of(FORWARD, FWD),
        **END,
    },
}
COMMANDS = tuple(WRITES)
# where the promote that a resume case resumes is killed first
FIRST_KILL = {"resume": "apply:begin", "resume-cut": "drain:done"}
# the stage each command starts from and the one a clean run of it ends at
STARTS = {
    "apply": "baseline",
    "rollback": "applied",
    "promote": "held",
    **dict.fromkeys(FIRST_KILL, "held"),
}
ENDS = {
    "apply": "held",
    "rollback": "baseline",
    "promote": "applied",
    **dict.fromkeys(FIRST_KILL, "applied"),
}
# what the distinct matrix crashes at although an earlier command has the same (path, key): the
# point between a resume undoing a cut node's cordon and running it again
ALWAYS = {("resume-cut", "uncordon:begin"), ("resume-cut", "uncordon:done")}


def _distinct() -> set[tuple[str, str]]:
    """Each node entry (path, step, phase) once, in the first command that writes it (apply,
    rollback, promote, resume, resume-cut); every command's own change-level entries; and
    :data:`ALWAYS`."""
    seen: set[tuple[str, str]] = set()
    out: set[tuple[str, str]] = set()
    for cmd in ("apply", "rollback", "promote", "resume", "resume-cut"):
        for key, path in WRITES[cmd].items():
            ident = (cmd, key) if key.startswith(CHANGE_STEP + ":") else (path, key)
            if ident not in seen or (cmd, key) in ALWAYS:
                out.add((cmd, key))
            seen.add(ident)
    return out


def _in_chain_order(cases: set[tuple[str, str]]) -> list[tuple[str, str]]:
    """The cases ordered so that, where it can, each starts at the stage the one before ended at
    (apply: baseline -> held, promote and the resumes: held -> applied, rollback: applied ->
    baseline): the put-back between them then restarts no kubelet. Each command's cases keep
    the order its clean run writes the keys in."""
    queues = {c: [(c, k) for k in WRITES[c] if (c, k) in cases] for c in COMMANDS}
    out: list[tuple[str, str]] = []
    stage = "applied"  # where the clean runs leave the lab
    while any(queues.values()):
        ready = [c for c in COMMANDS if queues[c] and STARTS[c] == stage]
        pick = max(ready or [c for c in COMMANDS if queues[c]], key=lambda c: len(queues[c]))
        out.append(queues[pick].pop(0))
        stage = ENDS[pick]
    return out


# ``full``: every key of every command (80 cases). ``distinct`` (the default): see _distinct
# (39 cases). Both come from the table; the clean runs check the table.
MATRIX = os.environ.get("ROLLOUT_CRASH_MATRIX", "distinct")
CASES = _in_chain_order(
    {(c, k) for c in COMMANDS for k in WRITES[c]} if MATRIX == "full" else _distinct()
)


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
    change: str = ""
    stages: dict[str, Stage] = field(default_factory=dict)  # baseline, held, applied, killed-*
    keys: dict[str, list[str]] = field(default_factory=dict)  # command -> keys, in order written
    paths: dict[str, dict[str, str]] = field(default_factory=dict)  # command -> key -> path
    clean_states: dict[str, dict[str, str]] = field(default_factory=dict)  # command -> end states

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
    root = lab.machines.node_root(node)
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
            root = lab.machines.node_root(n)
            lab.machines.stop_kubelet(n)
            for p in set(have) - set(want):
                (root / p.lstrip("/")).unlink()
            for p, content in want.items():
                target = root / p.lstrip("/")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(content)
            for rel in KUBELET_STATE:
                (root / rel).unlink(missing_ok=True)
            lab.machines.start_kubelet(n)
        if ck.unschedulable(lab, n) != stage.cordoned[n]:
            ck.set_unschedulable(lab, n, stage.cordoned[n])
    for n in w.names:
        ck.wait_for(
            lambda n=n: _policy(lab, n) == stage.policy[n],
            180,
            f"{n}'s kubelet running cpuManagerPolicy {stage.policy[n]}",
            every=0.25,
        )
    lab.machines.wait_ready(w.names, timeout=180)
    lab.api.request("DELETE", LEASE.format(ns=w.lock_ns))
    if state.exists():
        shutil.rmtree(state)
    if stage.state is not None:
        shutil.copytree(stage.state, state)
    else:
        state.mkdir(parents=True)
    _put_back_record(w, state)


def _put_back_record(w: World, state: Path) -> None:
    """The change's cluster record as the stage's journal was (the record is part of the world
    a case starts from: a command syncs its local journal up to it before acting), written with
    the mirror's own chunking."""
    from rollout.change.record.cluster_mirror import split_chunks
    from rollout.kube import mirror as km

    if not w.change:
        return
    selector = f"{km.CHANGE_KEY}%3D{w.change},{km.RECORD_KEY}%3Djournal"
    code, out = w.lab.api.request(
        "DELETE", f"/api/v1/namespaces/{w.lock_ns}/configmaps?labelSelector={selector}"
    )
    assert code == 200, out
    file = state / "changes" / w.change / "journal.jsonl"
    if not file.is_file():
        return
    for i, data in enumerate(split_chunks(file.read_bytes(), km.CHUNK_BYTES)):
        body = km.journal_chunk(w.change, i, data)
        code, out = w.lab.api.request(
            "POST", f"/api/v1/namespaces/{w.lock_ns}/configmaps", {**body, "kind": "ConfigMap"}
        )
        assert code == 201, out


def _keys(entries: list[Any]) -> list[str]:
    """``step:phase`` of the entries, in order, each once."""
    return list(dict.fromkeys(f"{e.step}:{e.phase.value}" for e in entries))


def _paths(entries: list[Any]) -> dict[str, str]:
    """``step:phase`` -> the path (forward / restore; "" change-level) of its first entry."""
    out: dict[str, str] = {}
    for e in entries:
        out.setdefault(f"{e.step}:{e.phase.value}", e.path.value if e.path else "")
    return out


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
    lab.machines.add_nodes(names, ["kubeadm"], wait_ready=True, timeout=180, kubelet="sim")
    lock_ns = f"crash-lock-{os.getpid() % 100000}"
    try:
        inv = ck.inventory(lab, names, names[:1], root / "inv.ini")
        plan = ck.plan(root / "plan.yaml", dict.fromkeys(names, "kubeadm"), max_unavailable=1)
        code, out = lab.api.request(
            "POST", "/api/v1/namespaces", {"metadata": {"name": lock_ns}, "kind": "Namespace"}
        )
        assert code == 201, out
        ck.set_unschedulable(lab, names[2], True)  # an operator's cordon from before the change
        w = World(lab, names, inv, plan, lock_ns, root)
        w.stages["baseline"] = _capture(lab, names, None, root / "unused")
        yield _clean_runs(w)
    finally:
        lab.machines.remove_nodes(names)
        lab.api.request("DELETE", f"/api/v1/namespaces/{lock_ns}")


def _record(w: World, command: str, entries: list[Any], state: Path) -> None:
    w.keys[command] = _keys(entries)
    w.paths[command] = _paths(entries)
    w.clean_states[command] = ck.states(state)


def _clean_runs(w: World) -> World:
    """Apply the canary, promote, roll back; then twice a promote killed (at its first node write,
    and once its node was drained) and resumed; nothing else crashed: the keys each command
    writes, the stages the cases start from."""
    state = w.root / "clean"
    apply = [
        *("apply", "--plan", str(w.plan), "-i", str(w.inv), "--canary", "--yes", "-o", "json"),
    ]
    r = _ok(w.run(apply, state), "clean apply --canary")
    w.change = json.loads(r.stdout)["change"]
    journal = Journal.open(state, w.change)
    _record(w, "apply", journal.entries(), state)
    w.stages["held"] = _capture(w.lab, w.names, state, w.root / "stage-held")

    n = len(journal.entries())
    _ok(w.run(["promote", "--change", w.change, "--yes", "-o", "json"], state), "clean promote")
    _record(w, "promote", journal.entries()[n:], state)
    w.stages["applied"] = _capture(w.lab, w.names, state, w.root / "stage-applied")

    n = len(journal.entries())
    _ok(w.run(["rollback", "--change", w.change, "--yes", "-o", "json"], state), "clean rollback")
    _record(w, "rollback", journal.entries()[n:], state)
    for node in w.names:
        assert _digests(_files(w.lab, node)) == _digests(w.stages["baseline"].files[node]), node

    for command, kill in FIRST_KILL.items():
        state = w.root / f"clean-{command}"
        _put_back(w, w.stages["held"], state)
        args = ["promote", "--change", w.change, "--yes"]
        _killed(w.run(args, state, kill), f"promote @ {kill}")
        w.stages[f"killed-{command}"] = _capture(w.lab, w.names, state, w.root / f"stage-{command}")
        n = len(Journal.open(state, w.change).entries())
        _ok(
            w.run(["resume", "--change", w.change, "--yes", "-o", "json"], state),
            f"clean {command}",
        )
        _record(w, command, Journal.open(state, w.change).entries()[n:], state)
        assert w.clean_states[command] == w.clean_states["promote"], command
    return w


def test_the_clean_runs_write_exactly_the_keys_of_the_table(world: World) -> None:
    """The cases are chosen from WRITES at collection time; a key the code starts (or stops) to
    journal fails here, naming it, so the table cannot drift from the code."""
    assert all(k.split(":")[0] in STEPS for c in COMMANDS for k in WRITES[c])
    for cmd in COMMANDS:
        assert world.paths[cmd] == WRITES[cmd], f"{cmd} writes {world.keys[cmd]}"
    # the enumeration is not trivial: 7 node steps x 2, change and gate begin/done
    assert len(WRITES["apply"]) == 19
    assert "gate:begin" in world.keys["apply"]  # the soak's start is a crash point too
    ids = [f"{c}-{k}" for c, k in CASES]
    assert len(ids) == len(set(ids))
    if MATRIX != "full":
        assert set(CASES) >= ALWAYS


def _check(w: World, state: Path, change: str, expect: dict[str, str] | None) -> dict[str, str]:
    """Every node fully new or fully as before, backups intact, cordons kept, the Lease gone.

    ``expect``: the node states the interrupted command would have ended with (None: any mix
    of applied and restored)."""
    journal = Journal.open(state, change)
    status = replay(journal.entries(), change)  # readable: a torn tail was repaired
    states = {n: s.state.value for n, s in status.nodes.items()}
    after = w.stages["applied"].files
    for n in w.names:
        have = _digests(_files(w.lab, n))
        st = states[n]
        assert st in ("applied", "restored", "pending"), (n, st, status.nodes[n].message)
        if st == "applied":
            assert have == _digests(after[n]), f"{n} applied but its files are not the new ones"
            assert _policy(w.lab, n) == "static", n
        else:
            assert have == _digests(w.stages["baseline"].files[n]), (
                f"{n} {st} but its files changed"
            )
            assert _policy(w.lab, n) == "none", n
        before = _digests(w.stages["baseline"].files[n])
        for b in status.nodes[n].backups:  # no byte lost: the journal holds the old bytes
            if b.existed:
                assert before.get(b.path) == b.sha256, f"{n}: {b.path}'s backup is not the old file"
                assert journal.load_backup(n, b.sha256)
            else:
                assert b.path not in before, f"{n}: {b.path} existed but was backed up as absent"
        assert ck.unschedulable(w.lab, n) is w.stages["baseline"].cordoned[n], (
            f"{n}'s cordon changed"
        )
    code, _ = w.lab.api.request("GET", LEASE.format(ns=w.lock_ns))
    assert code == 404, "the rollout-lock Lease is still there"
    if expect is not None:
        assert states == expect, "resume did not finish what the interrupted command would have"
    return states


@pytest.mark.timeout(900)
@pytest.mark.parametrize(("command", "key"), CASES, ids=[f"{c}@{k}" for c, k in CASES])
def test_kill_after_each_journal_entry(world: World, command: str, key: str) -> None:
    """``command`` killed right after it journals ``key``, then finished by ``rollout resume``.

    The id names only the killed command and the entry (``rollback@restore:begin``,
    ``resume-cut@uncordon:begin``), not the resume every case ends with, so ``-k rollback``
    selects the crashed rollbacks and ``-k resume`` the crashed resumes."""
    w = world
    state = w.root / f"case-{command}-{key.replace(':', '-')}"
    change = ["--change", w.change]
    if command == "apply":
        _put_back(w, w.stages["baseline"], state)
        args = ["apply", "--plan", str(w.plan), "-i", str(w.inv), "--canary", "--yes"]
        _killed(w.run(args, state, key), f"apply @ {key}")
        change = ["--change", Journal.open(state).change_id]  # a new change: the newest there
    elif command in ("promote", "rollback"):
        _put_back(w, w.stages[STARTS[command]], state)
        _killed(w.run([command, *change, "--yes"], state, key), f"{command} @ {key}")
    else:  # a resume of a promote killed at FIRST_KILL[command], itself killed
        _put_back(w, w.stages[f"killed-{command}"], state)
        _killed(w.run(["resume", *change, "--yes"], state, key), f"{command} @ {key}")
    _ok(w.run(["resume", *change, "--yes", "-o", "json"], state), "resume")
    cid = change[1]
    _check(w, state, cid, w.clean_states[command])
    if command == "apply":
        gates = [e for e in Journal.open(state, cid).entries() if e.step == GATE_STEP]
        assert (gates[-1].phase.value, gates[-1].data.get("status")) == ("done", "Successful")
