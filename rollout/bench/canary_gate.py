"""The plan's ``gate.bench`` on a canary: the benchmark before the change and once the canary's
pods are recreated, and the gate that decides on it.

``apply --canary`` runs :class:`CanaryBench` on the canary nodes after preflight, before anything
is changed (a bench that cannot run refuses the apply, nothing changed), and wraps the soak
gate in :class:`BenchGate`: once the soak is Successful, the canary is benched again and the
pure verdicts of :mod:`rollout.gate.performance` decide with the soak. A regression is Failed
(the canary is rolled back, a ``trigger`` with ``source: bench`` journaled); a bench that cannot
decide holds (Inconclusive / Error, exit 8). Every run and the decision are journaled (``bench``
entries labelled ``before`` / ``after``, one ``bench-verdict``), so the report, ``status`` and
the next stage of a staged plan read them (:mod:`rollout.change.commands.stages`).

Why in the evidence layer: the runs are ``rollout bench``'s (:mod:`rollout.bench.on_node`),
and the gate layer sits below this one; the engine sees only the :class:`rollout.protocols.Gate`.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Mapping, Sequence
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.bench import in_pod, on_node
from rollout.bench.results import BenchError
from rollout.change.plan.gate_section import BenchPolicy
from rollout.change.record.entries import BenchRun, trigger_data
from rollout.change.record.journal import Journal, Kind
from rollout.errors import ExternalError, InputError
from rollout.gate.performance import decision_record, judge_regression, judge_tightening
from rollout.models import Phase
from rollout.protocols import Gate
from rollout.verdicts import Outcome, Verdict

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.kube.client import Api

Results = dict[str, Mapping[str, Any] | str]
"""Per node: its bench record, or why there is none."""


def request_of(policy: BenchPolicy) -> on_node.BenchRequest:
    """``rollout bench``'s request for the plan's ``gate.bench``."""
    return on_node.BenchRequest(
        command=policy.command,
        standin=policy.standin,
        mechanism=policy.mechanism,
        timeout_s=policy.timeout_s,
        env=dict(policy.env),
    )


class CanaryBench:
    """Runs the plan's benchmark on nodes, one at a time (two bound runs per GPU model each),
    with the facts preflight gathered (``facts``, by inventory host)."""

    def __init__(
        self,
        policy: BenchPolicy,
        inv: Inventory,
        api: Api,
        facts: Mapping[str, Mapping[str, Any]],
        say: Callable[[str], None],
    ) -> None:
        self.policy, self.inv, self.api, self.facts, self.say = policy, inv, api, facts, say
        self.req = request_of(policy)

    def describe(self) -> str:
        """The command as journaled (pod mode names the pod's shape)."""
        if self.policy.pod is not None:
            return in_pod.describe(self.policy.pod, self.policy.command)
        return self.req.describe()

    def run(self, nodes: Sequence[str], label: str, change: str | None = None) -> Results:
        """Each node's record, or the error that stopped its bench (never raises for a node)."""
        out: Results = {}
        for node in nodes:
            self.say(f"bench ({label}) on {node}: {self.describe()}")
            if self.policy.pod is not None:  # mode pod: in a pod the kubelet placed
                try:
                    res = in_pod.run(
                        self.policy.pod,
                        self.policy.command,
                        self.policy.env,
                        self.inv,
                        node,
                        self.api,
                        self.policy.timeout_s,
                        change,
                        self.say,
                    )
                except (BenchError, ExternalError, InputError) as e:
                    out[node] = str(e)
                    self.say(f"bench ({label}) on {node}: failed: {e}")
                    continue
                out[node] = {**res, "label": label}
                self.say(f"bench ({label}) on {node}: {_summary(res)}")
                continue
            host = next((h for h in self.inv.hosts if self.inv.node_of(h) == node), None)
            facts = self.facts.get(host) if host is not None else None
            with tempfile.TemporaryDirectory(prefix="rollout-bench-") as tmp:
                try:
                    p = on_node.plan(self.req, self.inv, node, self.api, Path(tmp), facts)
                    res = on_node.run(self.req, p, self.inv, Path(tmp), change)
                except (BenchError, ExternalError, InputError) as e:
                    out[node] = str(e)
                    self.say(f"bench ({label}) on {node}: failed: {e}")
                    continue
            out[node] = {**res, "label": label}
            self.say(f"bench ({label}) on {node}: {_summary(res)}")
        return out


def _summary(res: Mapping[str, Any]) -> str:
    parts = [
        f"{m['gpuModel']}: P99 {m['placed']['p99Ms']:.3g} ms, bandwidth "
        f"{m['placed']['h2dGbps']:.3g} GB/s in pod {res['pod']['name']} (CPUs "
        f"{m['placed']['cpus'] or 'shared'}, {', '.join(m['placed']['devices'])})"
        for m in res.get("models") or ()
        if "placed" in m
    ] + [
        f"{m['gpuModel']}: P99 {m['local']['p99Ms']:.3g} ms aligned / "
        f"{m['remote']['p99Ms']:.3g} ms mismatched, bandwidth {m['local']['h2dGbps']:.3g} / "
        f"{m['remote']['h2dGbps']:.3g} GB/s"
        for m in res.get("models") or ()
        if "remote" in m
    ]
    sim = " (simulated)" if res.get("simulated") else ""
    return f"{res.get('status')}{sim}: " + "; ".join(parts)


def journal_results(journal: Journal, results: Results, label: str, command: str) -> None:
    """One ``bench`` entry per node: its record (labelled), or the error."""
    for node, res in results.items():
        if isinstance(res, str):
            on_node.journal_bench(journal, node, None, res, command)
            continue
        on_node.journal_bench(journal, node, {**res, "label": label})


class BenchGate:
    """The canary's gate with the plan's ``gate.bench``: the soak first, then the benchmark.

    ``before``: the canary's benches before the change (journaled when the gate first runs:
    the journal did not exist when they were taken). ``group``: a Failed verdict rolls back
    every canary node (``onFailure: rollback-group``), else only the nodes that regressed.
    """

    def __init__(
        self,
        gate: Gate,
        journal: Journal,
        bench: CanaryBench,
        before: Results,
        group: bool = True,
        progress: Callable[[str], None] | None = None,
    ) -> None:
        self.gate, self.journal, self.bench, self.before = gate, journal, bench, before
        self.group = group
        self.progress = progress or (lambda _m: None)
        self.decision: dict[str, Any] | None = None
        self._verdict: Verdict | None = None

    @property
    def verdict(self) -> Verdict | None:
        """The verdict that decided: the benchmark's when it overrode the soak's."""
        return self._verdict or self.gate.verdict

    def evaluate(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        soaked = self.gate.evaluate(change_id, nodes)
        if soaked.status is not Outcome.SUCCESSFUL:
            return soaked
        canary = list(nodes)
        policy = self.bench.policy
        after = self.bench.run(canary, "after", change_id)
        journal_results(self.journal, after, "after", self.bench.describe())
        now = datetime.now(UTC)
        regression = judge_regression(policy, self.before, after, canary, now.timestamp())
        tightening = judge_tightening(policy, after, canary, now.timestamp())
        self.decision = decision_record(policy, regression, tightening, canary)
        self.journal.append(Kind.BENCH_VERDICT, Phase.DONE, now=now, data=self.decision)
        self.progress(f"bench: {regression.status}: {regression.reason}")
        self.progress(f"bench: {tightening.status}: {tightening.reason}")
        why = f"{soaked.reason}; {regression.reason}"
        if regression.status is Outcome.FAILED:
            targets = canary if self.group else list(regression.failed_nodes)
            self._verdict = replace(
                soaked, status=Outcome.FAILED, reason=why, failed_nodes=tuple(targets)
            )
            self.journal.append(
                Kind.TRIGGER,
                Phase.DONE,
                now=now,
                data=trigger_data(change_id, "gate", targets, why, source="bench"),
            )
        elif regression.holds:
            self._verdict = replace(
                soaked, status=regression.status, reason=why, waiting_for=regression.waiting_for
            )
        else:
            self._verdict = replace(soaked, reason=why)
        return self._verdict

    def soaks_on(self) -> bool:
        return self.gate.soaks_on()

    def keep_watching(self, change_id: str, nodes: Sequence[str]) -> Verdict:
        return self.gate.keep_watching(change_id, nodes)

    def after_rollback(self, change_id: str, nodes: Sequence[str]) -> str:
        return self.gate.after_rollback(change_id, nodes)


def journaled_before(journal: Journal) -> Results:
    """The canary's ``before`` benches as the interrupted apply journaled them."""
    runs = (BenchRun.read(e.data) for e in journal.entries() if e.step == Kind.BENCH)
    return {run.node: dict(run.record) for run in runs if run.label == "before"}


def resumed_gate(
    gate: Gate,
    policy: BenchPolicy | None,
    journal: Journal,
    inv: Inventory,
    api: Api,
    group: bool,
    say: Callable[[str], None],
) -> Gate:
    """The gate ``rollout resume`` owes, as ``apply`` wired it: with the plan's ``gate.bench``
    and an apply's canary gate (not a promote's), the soak then the benchmark against the
    ``before`` benches the apply journaled (none journaled: the regression verdict is Error and
    holds, never a plain soak that passes)."""
    from rollout.change.record.replay import replay

    if policy is None or replay(journal.entries()).info.promotion:
        return gate
    runner = CanaryBench(policy, inv, api, {}, say)
    return BenchGate(gate, journal, runner, journaled_before(journal), group, say)
