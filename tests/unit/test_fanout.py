"""The fan-out bound (``--forks``, rollout/fanout.py): every pool that grows with the fleet takes
it: the ssh calls of direct.run_all, ansible-runner's forks, the per-node threads of in_parallel,
and a batch wider than it runs in waves, the progress display saying so.

Two counts, no sleeps: the size each pool is created with (a spy on ThreadPoolExecutor: the
bound, or fewer when there are fewer items), and the calls in flight at once, counted by a fake
callable that blocks on a condition until the pool is saturated (the peak is the bound: the
work does run that wide, and no wider). The lab counts real ssh children
(tests/lab/test_fanout_lab.py).
"""

from __future__ import annotations

import configparser
import sys
import threading
import types
from collections.abc import Callable
from concurrent import futures
from pathlib import Path
from typing import Any

import pytest

from rollout import assets
from rollout.ansible import direct
from rollout.change.engine.context import Context
from rollout.change.engine.orchestrator import NoGate, run_change
from rollout.change.engine.parallel import in_parallel
from rollout.change.plan.batches import Batch
from rollout.change.record.journal import Journal
from rollout.fanout import DEFAULT_FORKS, waves, workers
from tests.unit.ending import ended
from tests.unit.fakes_change import (
    FakeCluster,
    FakeRunner,
    fake_context,
    make_change,
    make_node,
)


class Peak:
    """A fake unit of work that counts how many run at once. Each call waits (on a condition,
    5 s at most) until ``expected`` calls are in flight, or every call has started: so a pool
    of N workers is seen at N at once, and a wider pool above N."""

    def __init__(self, total: int, expected: int) -> None:
        self.total = total
        self.expected = expected
        self.active = 0
        self.started = 0
        self.peak = 0
        self.cond = threading.Condition()

    def __call__(self, *_a: Any, **_k: Any) -> dict[str, Any]:
        with self.cond:
            self.active += 1
            self.started += 1
            self.peak = max(self.peak, self.active)
            self.cond.notify_all()
            ok = self.cond.wait_for(
                lambda: self.active >= self.expected or self.started >= self.total, timeout=5
            )
            self.active -= 1
            self.cond.notify_all()
        assert ok, "the pool never reached its bound"
        return {"changed": False}


def test_the_default_is_the_shipped_ansible_cfg_forks() -> None:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(assets.playbooks() / "ansible.cfg")
    assert cfg.getint("defaults", "forks") == DEFAULT_FORKS == 50


@pytest.mark.parametrize(
    ("n", "forks", "want"),
    [
        (0, 2, []),
        (2, 2, [[0, 1]]),
        (5, 2, [[0, 1], [2, 3], [4]]),
        (3, 50, [[0, 1, 2]]),
        (3, 0, [[0], [1], [2]]),  # a bound below one still makes progress, one at a time
    ],
)
def test_waves_cut_in_order(n: int, forks: int, want: list[list[int]]) -> None:
    assert waves(list(range(n)), forks) == want
    assert [x for w in waves(list(range(n)), forks) for x in w] == list(range(n))


def test_workers_never_exceed_the_bound_nor_drop_below_one() -> None:
    assert workers(1000, 50) == 50
    assert workers(3, 50) == 3
    assert workers(0, 50) == 1


def _target(host: str) -> direct.Target:
    return direct.Target(host, None, None, None, (), "/usr/bin/python3")


@pytest.mark.parametrize("forks", [1, 3, 8])
def test_run_all_runs_at_most_forks_ssh_calls_at_once(
    forks: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    total = 20
    peak = Peak(total, forks)
    monkeypatch.setattr(direct, "run_step", peak)
    calls = {f"h{i}": (_target(f"h{i}"), {}) for i in range(total)}
    out = direct.run_all(calls, lambda _a: 1.0, forks=forks)
    assert list(out) == list(calls)  # every host answered, in order
    assert peak.started == total
    assert peak.peak == forks


def test_run_all_defaults_to_the_shipped_forks(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[int] = []
    real = futures.ThreadPoolExecutor

    def pool(max_workers: int) -> futures.ThreadPoolExecutor:
        seen.append(max_workers)
        return real(max_workers=max_workers)

    monkeypatch.setattr(direct, "ThreadPoolExecutor", pool)
    monkeypatch.setattr(direct, "run_step", lambda *_a, **_k: {})
    calls = {f"h{i}": (_target(f"h{i}"), {}) for i in range(120)}
    direct.run_all(calls, lambda _a: 1.0)
    direct.run_all(dict(list(calls.items())[:3]), lambda _a: 1.0)
    assert seen == [DEFAULT_FORKS, 3]


@pytest.mark.parametrize("forks", [1, 4])
def test_in_parallel_runs_at_most_forks_nodes_at_once(forks: int) -> None:
    nodes = [f"n{i}" for i in range(10)]
    peak = Peak(len(nodes), forks)
    results, failures = in_parallel(nodes, peak, forks)
    assert failures == {} and set(results) == set(nodes)
    assert peak.peak == forks


def test_in_parallel_pools_are_sized_by_the_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    from rollout.change.engine import parallel

    seen: list[int] = []
    real = futures.ThreadPoolExecutor

    def pool(max_workers: int) -> futures.ThreadPoolExecutor:
        seen.append(max_workers)
        return real(max_workers=max_workers)

    monkeypatch.setattr(parallel, "ThreadPoolExecutor", pool)
    nodes = [f"n{i}" for i in range(100)]
    in_parallel(nodes, lambda n: n, 7)
    in_parallel(nodes, lambda n: n)
    in_parallel(nodes[:2], lambda n: n, 7)
    assert seen == [7, DEFAULT_FORKS, 2]


def test_the_playbook_gets_forks_bounded_by_the_setting(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ansible-runner is handed ``forks`` = the number of hosts, at most the setting (it used to
    be the number of hosts, however many)."""
    from rollout.ansible.runner import AnsibleRunner

    seen: list[int] = []

    def run(**kw: Any) -> Any:
        seen.append(kw["forks"])
        return types.SimpleNamespace(status="successful", rc=0, config=None, stdout=None)

    monkeypatch.setitem(sys.modules, "ansible_runner", types.SimpleNamespace(run=run))
    hosts = [f"h{i}" for i in range(30)]
    AnsibleRunner(tmp_path, forks=8).run("apply.yml", tmp_path / "inv", hosts, {})
    AnsibleRunner(tmp_path, forks=8).run("apply.yml", tmp_path / "inv", hosts[:3], {})
    AnsibleRunner(tmp_path).run("apply.yml", tmp_path / "inv", hosts * 4, {})
    assert seen == [8, 3, DEFAULT_FORKS]


def _ctx(tmp_path: Path, nodes: list[str], forks: int, pipelined: bool) -> Context:
    cluster = FakeCluster({n: make_node(n) for n in nodes})
    runner = FakeRunner(cluster)
    if pipelined:
        runner.pipelined = True
    events: list[str] = []
    journal = Journal.create(tmp_path, "20260101T000000Z-fan")
    ctx: Context = fake_context(cluster, runner, journal, on_event=events.append, forks=forks)
    ctx.events = events  # type: ignore[attr-defined]
    return ctx


def _first_and_last(ctx: Context) -> tuple[dict[str, int], dict[str, int]]:
    first: dict[str, int] = {}
    last: dict[str, int] = {}
    for i, e in enumerate(ctx.journal.entries()):
        if e.node is not None:
            first.setdefault(e.node, i)
            last[e.node] = i
    return first, last


@pytest.mark.parametrize("pipelined", [False, True])
def test_a_batch_wider_than_forks_runs_in_waves_and_says_so(
    tmp_path: Path, pipelined: bool
) -> None:
    nodes = [f"n{i}" for i in range(5)]
    ctx = _ctx(tmp_path, nodes, forks=2, pipelined=pipelined)
    changes = {n: make_change(n) for n in nodes}
    status = run_change(ctx, changes, [Batch(tuple(nodes), False)], NoGate(), False)
    assert status.outcome == "completed"
    events: list[str] = ctx.events  # type: ignore[attr-defined]
    assert "batch 1/1: 5 node(s) in 3 waves of at most 2 (--forks 2)" in events
    assert [e for e in events if " wave " in e] == [
        "batch 1/1 wave 1/3: n0, n1",
        "batch 1/1 wave 2/3: n2, n3",
        "batch 1/1 wave 3/3: n4",
    ]
    # no node of a wave is touched before every node of the wave before it is done
    first, last = _first_and_last(ctx)
    for earlier, later in (("n0", "n2"), ("n1", "n2"), ("n2", "n4"), ("n3", "n4")):
        assert last[earlier] < first[later]
    if not pipelined:  # the shared apply run never gets more nodes than the bound
        runs: list[tuple[str, tuple[str, ...]]] = ctx.runner.runs  # type: ignore[attr-defined]
        assert [r for r in runs if r[0] == "apply"] == [
            ("apply", ("n0", "n1")),
            ("apply", ("n2", "n3")),
            ("apply", ("n4",)),
        ]


def test_a_batch_that_fits_is_one_wave_as_before(tmp_path: Path) -> None:
    nodes = ["n0", "n1"]
    ctx = _ctx(tmp_path, nodes, forks=2, pipelined=False)
    run_change(
        ctx, {n: make_change(n) for n in nodes}, [Batch(tuple(nodes), False)], NoGate(), False
    )
    events: list[str] = ctx.events  # type: ignore[attr-defined]
    assert "batch 1/1: n0, n1" in events
    assert not [e for e in events if "wave" in e]


def test_a_failed_wave_leaves_the_later_waves_untouched(tmp_path: Path) -> None:
    from rollout.models import NodeState

    nodes = [f"n{i}" for i in range(5)]
    ctx = _ctx(tmp_path, nodes, forks=2, pipelined=True)
    ctx.runner.refuse = {"n1"}  # type: ignore[attr-defined]
    ended(
        run_change(
            ctx, {n: make_change(n) for n in nodes}, [Batch(tuple(nodes), False)], NoGate(), False
        ),
        5,
        "n1",
    )
    from rollout.change.record.replay import replay

    states = {n: s.state for n, s in replay(ctx.journal.entries()).nodes.items()}
    assert states["n0"] is NodeState.APPLIED and states["n1"] is NodeState.RESTORED
    assert all(states[n] is NodeState.PENDING for n in ("n2", "n3", "n4"))
    cluster: FakeCluster = ctx.cluster  # type: ignore[assignment]
    assert not [c for c in cluster.calls if c[1] in ("n2", "n3", "n4")]


def test_a_restore_of_many_nodes_is_bounded_too(tmp_path: Path) -> None:
    """A rollback's per-node steps go through in_parallel with the context's bound."""
    from rollout.change.engine import restore

    nodes = [f"n{i}" for i in range(6)]
    ctx = _ctx(tmp_path, nodes, forks=3, pipelined=False)
    run_change(
        ctx, {n: make_change(n) for n in nodes}, [Batch(tuple(nodes), False)], NoGate(), False
    )
    seen: list[int] = []
    real: Callable[..., Any] = restore.in_parallel

    def spy(ns: Any, work: Any, forks: int = DEFAULT_FORKS) -> Any:
        seen.append(forks)
        return real(ns, work, forks)

    from rollout.change.engine.orchestrator import rollback

    mp = pytest.MonkeyPatch()
    mp.setattr(restore, "in_parallel", spy)
    try:
        status = rollback(ctx)
    finally:
        mp.undo()
    assert status.outcome == "rolled-back"
    assert seen and set(seen) == {3}


@pytest.mark.parametrize("command", ["apply", "promote", "resume", "rollback"])
def test_every_changing_command_takes_forks_from_the_option_or_the_environment(
    command: str,
) -> None:
    """``--forks`` and ``$ROLLOUT_FORKS`` on each changing command; below one is refused naming
    the option, before anything is read or touched."""
    from click.testing import CliRunner

    from rollout.cli import cli

    runner = CliRunner()
    args = [command, "--change", "x"] if command != "apply" else [command]
    for extra, env in (
        (["--forks", "0"], {}),
        ([], {"ROLLOUT_FORKS": "0"}),
    ):
        r = runner.invoke(cli, [*args, *extra], env=env)
        assert r.exit_code == 2, r.output
        assert "Invalid value for '--forks'" in r.output
    help_text = runner.invoke(cli, [command, "--help"]).output
    assert "--forks" in help_text and "ROLLOUT_FORKS" in help_text
