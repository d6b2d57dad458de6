"""Running ``rollout bench`` on a node: its facts, the ``rollout_bench`` module over plain ssh
(or ``bench.yml`` through Ansible when the host needs more than plain ssh), the record, and
where the record goes (the change's journal and ``evidence.json``, a Prometheus text file).

The pure parts (planning, the output contract, the record, the metrics text) are
:mod:`rollout.bench.results`; docs/bench.md says what is measured and what is simulated.
"""

from __future__ import annotations

import base64
import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from importlib.resources import files
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.bench.results import Target, build_result, plan_targets
from rollout.change.record.journal import Journal, Kind
from rollout.errors import ExternalError, InputError, Location
from rollout.models import Phase

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.kube.client import Api

__all__ = ["BenchRequest", "add_to_evidence", "journal_bench", "plan", "run", "write_metrics"]

#: The lab's CPU stand-in, shipped with the package (``--standin``).
STANDIN = "cpu_standin.py"


def standin_source() -> str:
    return files("rollout").joinpath("data", "bench", STANDIN).read_text(encoding="utf-8")


@dataclass(frozen=True)
class BenchRequest:
    """What the operator asked for."""

    command: str
    standin: bool
    mechanism: str = "auto"
    timeout_s: float = 600.0
    gpu: str | None = None
    remote: int | None = None
    env: Mapping[str, str] | None = None

    def describe(self) -> str:
        return f"stand-in {STANDIN} (CPU only)" if self.standin else self.command


@dataclass(frozen=True)
class BenchPlan:
    """The node, its GPU targets and the module's arguments (what ``--dry-run`` prints)."""

    node: str
    host: str
    labels: Mapping[str, str]
    targets: tuple[Target, ...]
    args: Mapping[str, Any]

    def as_dict(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "host": self.host,
            "command": self.args.get("command") or f"(stand-in {STANDIN})",
            "mechanism": self.args["mechanism"],
            "timeoutS": self.args["timeout_s"],
            "targets": [
                {
                    "gpuModel": t.model,
                    "gpu": t.gpu,
                    "cudaIndex": t.cuda_index,
                    "local": {"numaNode": t.local, "cpus": t.local_cpus},
                    "remote": {"numaNode": t.remote, "cpus": t.remote_cpus},
                }
                for t in self.targets
            ],
        }


def plan(
    req: BenchRequest,
    inv: Inventory,
    node: str,
    api: Api,
    work: Path,
    facts: Mapping[str, Any] | None = None,
) -> BenchPlan:
    """Read the node's facts (the facts module, read-only) and labels, and plan the runs.

    Raises:
        InputError: ``node`` is not in the inventory, or a GPU / NUMA node option names nothing.
        BenchError: the node cannot be benched (no GPU with a NUMA node, one NUMA node).
        ExternalError: the node's facts or its Node could not be read.
    """
    from rollout.ansible.hosts import hosts_for
    from rollout.ansible.runner import AnsibleRunner
    from rollout.kube.nodes import node_info

    hosts = hosts_for(inv, [node])
    if not hosts:
        raise InputError(
            f"node {node} is not in the inventory {inv.path}", Location(field="--node")
        )
    host = hosts[0]
    if facts is None:
        runner = AnsibleRunner(work / "runner")
        facts = runner.gather_facts(inv.path, [host], work / "facts", inv.hostvars)[host]
    labels = dict(node_info(api, node).labels)
    targets = plan_targets(facts, labels, node, req.gpu, req.remote)
    runs = [r for i, t in enumerate(targets) for r in t.runs(i)]
    for r in runs:
        r["env"] = {**(req.env or {}), **r["env"]}
    args = {
        "command": "" if req.standin else req.command,
        "standin": standin_source() if req.standin else "",
        "runs": runs,
        "mechanism": req.mechanism,
        "timeout_s": req.timeout_s,
    }
    return BenchPlan(node, host, labels, tuple(targets), args)


def _module_result(p: BenchPlan, inv: Inventory, work: Path, timeout_s: float) -> dict[str, Any]:
    """The ``rollout_bench`` module's result on the plan's host: over plain ssh when Ansible
    would reach it with plain ssh, else through ``bench.yml``."""
    from rollout.ansible import direct
    from rollout.ansible.runner import AnsibleRunner

    t = direct.target(p.host, inv.hostvars.get(p.host, {}))
    if t is not None:
        got = direct.run_step(t, p.args, timeout_s, module="rollout_bench")
        if got.get("failed"):
            how = "unreachable" if got.get("unreachable") else "failed"
            raise ExternalError(f"bench on {p.node} over ssh: {how}: {got.get('msg') or ''}")
        return got
    b64 = base64.b64encode(json.dumps(dict(p.args)).encode()).decode()
    result = AnsibleRunner(work / "runner").run(
        "bench.yml", inv.path, [p.host], {"rollout_kubelet_bench_args_b64": b64}
    )
    h = result.hosts.get(p.host)
    if h is None or h.status != "ok" or not h.report:
        why = f"{h.status}: {h.message or ''}" if h else "no result"
        raise ExternalError(f"bench.yml on {p.node}: {why}")
    return dict(h.report)


def run(
    req: BenchRequest, p: BenchPlan, inv: Inventory, work: Path, change: str | None = None
) -> dict[str, Any]:
    """Run the plan on its node and build the record (:func:`rollout.bench.results.build_result`).

    Raises:
        BenchError: a run failed, broke the output contract or had no result.
        ExternalError: the node could not be reached or the module failed.
    """
    # the module's own bound on each run, plus the ssh connection and the start-up
    limit = req.timeout_s * max(1, len(p.args["runs"])) + 120
    got = _module_result(p, inv, work, limit)
    return build_result(
        node=p.node,
        host=p.host,
        at=datetime.now(UTC).isoformat(timespec="seconds"),
        command=req.describe(),
        standin=req.standin,
        labels=p.labels,
        targets=p.targets,
        module_result=got,
        change=change,
    )


def journal_bench(
    journal: Journal,
    node: str,
    result: Mapping[str, Any] | None,
    error: str | None = None,
    command: str = "",
) -> None:
    """Append the ``bench`` entry: the record (done when it passed, else failed), or why there
    is none (failed: node, command, error)."""
    data: dict[str, Any] = (
        dict(result)
        if result is not None
        else {"node": node, "command": command, "status": "error", "error": error}
    )
    phase = Phase.DONE if result is not None and result.get("status") == "pass" else Phase.FAILED
    journal.append(Kind.BENCH, phase, now=datetime.now(UTC), data=data)


def add_to_evidence(target: Path, result: Mapping[str, Any]) -> None:
    """Add the record to ``evidence.json``'s ``bench`` list (one per node: a newer run of the
    same node replaces its older one), written in one rename."""
    try:
        doc = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else {}
    except ValueError as e:
        raise InputError(f"not an evidence file: {e}", Location(file=str(target))) from e
    if not isinstance(doc, dict):
        raise InputError("not an evidence file: not a JSON object", Location(file=str(target)))
    kept = [b for b in doc.get("bench") or () if b.get("node") != result.get("node")]
    doc["bench"] = [*kept, dict(result)]
    _write(target, json.dumps(doc, indent=2, sort_keys=True) + "\n")


def write_metrics(target: Path, results: Sequence[Mapping[str, Any]]) -> None:
    """Write the records' Prometheus text to ``target`` in one rename (node_exporter's textfile
    collector must never read half a file; name it ``*.prom`` in its directory)."""
    from rollout.bench.results import metrics_text

    _write(target, metrics_text(results))


def _write(target: Path, text: str) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
