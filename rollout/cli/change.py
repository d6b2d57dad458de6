"""``rollout apply`` and ``status``: thin commands over the orchestrator.

Parse options, build the adapters (``wiring``: API client, Lease lock, playbook runner, journal),
call the core, print. ``promote``, ``resume`` and ``rollback`` live in modules of their own.
Errors become exit codes in ``rollout.cli`` (see docs/exit-codes.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import click

from rollout.change.commands.change_options import ApplyOptions
from rollout.change.commands.progress import Progress
from rollout.change.plan.drain_rules import DrainOverrides
from rollout.change.plan.schema import load_plan
from rollout.change.record.change_outcomes import GATE_HOLDS_EXIT
from rollout.change.record.journal import Journal
from rollout.change.record.opening import existing_journal
from rollout.change.record.replay import replay
from rollout.cli.wiring import (
    confirm,
    echo_err,
    finish,
    forks_option,
    inventory_path,
    json_status,
    lock_ns_option,
    print_status,
    progress_for,
    progress_option,
    verify_timeout_option,
)
from rollout.errors import InputError, Location
from rollout.gate.assembly import gate_for
from rollout.kubelet.admission.node_preview import render_text
from rollout.protocols import Gate

from .options import (
    drain_options,
    force_serving_option,
    inventory_option,
    kube_options,
    output_option,
    plan_option,
)
from .record import optional_api

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.bench.canary_gate import CanaryBench, Results
    from rollout.change.commands.apply_change import PreparedApply
    from rollout.change.commands.recreate_workloads import Selection
    from rollout.change.plan.gate_section import BenchPolicy
    from rollout.gate.analysis import Predicted

__all__ = ["COMMANDS"]


@click.command("apply")
@plan_option
@inventory_option
@click.option("--canary", is_flag=True, help="Change only the canary group, then hold.")
@click.option("--dry-run", is_flag=True, help="Print the whole plan and change nothing.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (required without a TTY).")
@click.option(
    "--disable-eviction",
    is_flag=True,
    help="Delete pods instead of evicting them: bypasses PodDisruptionBudgets.",
)
@click.option(
    "--force-window",
    metavar="REASON",
    help="Run outside the plan's change windows; the reason is journaled.",
)
@click.option(
    "--accept-predicted-rejections",
    "accept_rejections",
    is_flag=True,
    help="Go on although pods running on a node in scope are predicted rejected there under "
    "the new config (see `rollout preview`); the accepted predictions are journaled.",
)
@click.option(
    "--force",
    "force",
    metavar="REASON",
    help="Change nodes the device preflight refuses (GPUs not all advertised: device plugin "
    "down or devices unhealthy; one resource served by a device plugin and DRA), or despite a "
    "failed tenancy audit (the plan's tenancy:); the reason and the refusals are journaled.",
)
@force_serving_option
@click.option(
    "--no-evidence",
    is_flag=True,
    help="Do not collect the before/after evidence (evidence.json beside the journal); "
    "promote then refuses without --force.",
)
@click.option(
    "--recreate-probes",
    is_flag=True,
    help="Once the nodes are applied, run a device probe pod (one nvidia.com/gpu, the tool's "
    "own, in rollout-probes) on each, delete it, run it again and collect the after-recreate "
    "evidence while it runs. User pods are recreated only with --recreate-workloads.",
)
@click.option(
    "--recreate-workloads",
    is_flag=True,
    help="Once the nodes are applied and their after evidence taken, evict each node's GPU and "
    "Guaranteed pods that a controller owns (not bare pods, not DaemonSet pods), one controller "
    "at a time through the Eviction API (PodDisruptionBudgets respected, the drain timeout), "
    "wait for the replacements to run and collect the after-recreate evidence. Journaled. "
    "Without it no pod of yours is recreated.",
)
@drain_options
@lock_ns_option
@verify_timeout_option
@forks_option
@progress_option
@output_option
@kube_options
def apply_cmd(
    plan_path: str | None,
    inventory: str | None,
    canary: bool,
    dry_run: bool,
    yes: bool,
    disable_eviction: bool,
    force_window: str | None,
    accept_rejections: bool,
    force: str | None,
    force_serving: str | None,
    no_evidence: bool,
    recreate_probes: bool,
    recreate_workloads: bool,
    delete_unmanaged: bool,
    delete_emptydir_data: bool,
    capacity_warn_only: bool,
    lock_namespace: str,
    verify_timeout: float,
    forks: int,
    progress_mode: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Apply the plan's kubelet change: preflight, then per node cordon, drain, write, restart,
    verify, uncordon; any failure restores the node and stops. The nodes' evidence is collected
    before (at preflight) and after (once applied) into evidence.json beside the journal.

    \b
    Examples:
      rollout apply --canary --dry-run
      rollout apply --canary --yes -o json
      rollout apply --plan plan.yaml -i inventory.ini --yes
      rollout apply --yes --progress plain 2> apply.log
      rollout apply --canary --yes --accept-predicted-rejections
      rollout apply --yes --forks 20
      rollout apply --canary --yes --force "GPU-3 is being replaced, 7 of 8 is expected"
      rollout apply --canary --yes --force-serving "llama-70b canary is on other nodes"
      rollout apply --canary --yes --force-delete-unmanaged --delete-emptydir-data
      rollout apply --canary --yes --recreate-workloads
    """
    # not the API client (rollout.kube: the kubernetes package, 0.5 s and more of imports):
    # prepare_apply imports it once the facts calls are under way
    # (tests/unit/test_cli_lazy.py::test_apply_imports_the_api_client_after_the_facts_start)
    from rollout.change.commands.apply_change import prepare_apply, run_apply
    from rollout.evidence.collecting import ChangeEvidence

    if not plan_path:
        raise InputError("no plan: pass --plan or set ROLLOUT_PLAN", Location(field="--plan"))
    if force is not None and not force.strip():
        raise InputError("--force needs a REASON (it is journaled)", Location(field="--force"))
    if force_serving is not None and not force_serving.strip():
        raise InputError(
            "--force-serving needs a REASON (it is journaled)", Location(field="--force-serving")
        )
    plan = load_plan(plan_path)  # every section parsed: bad input fails before any I/O
    cfg = plan.gate
    require_evidence = cfg is not None and cfg.require_evidence
    policy = cfg.bench if cfg is not None else None
    if recreate_probes and no_evidence:
        raise InputError(
            "--recreate-probes collects evidence; --no-evidence contradicts it",
            Location(field="--recreate-probes"),
        )
    if recreate_workloads and no_evidence:
        raise InputError(
            "--recreate-workloads collects the after-recreate evidence; --no-evidence "
            "contradicts it",
            Location(field="--recreate-workloads"),
        )
    if require_evidence and no_evidence:
        raise InputError(
            "the plan's gate.requireEvidence needs the canary's evidence; --no-evidence "
            "contradicts it",
            Location(
                file=plan.path,
                field="gate.requireEvidence",
                line=plan.line_of("gate.requireEvidence"),
            ),
        )
    opts = ApplyOptions(
        canary=canary,
        dry_run=dry_run,
        accept_rejections=accept_rejections,
        force=force,
        force_window=force_window,
        force_serving=force_serving,
        overrides=DrainOverrides(delete_unmanaged, delete_emptydir_data, capacity_warn_only),
        disable_eviction=disable_eviction,
        require_evidence=require_evidence,
        recreate_probes=recreate_probes,
        recreate_workloads=recreate_workloads,
        lock_namespace=lock_namespace,
        verify_timeout=verify_timeout,
        forks=forks,
    )
    ready = prepare_apply(
        plan,
        lambda: inventory_path(inventory),
        lambda: _connect(kubeconfig, context),
        opts,
        echo_err,
    )
    plan = ready.plan  # a staged plan: the stage chosen
    prepared = ready.prepared
    if ready.stage is not None:
        for line in ready.stage.history:
            echo_err(line)
        echo_err(f"running {ready.stage.reason}")
    for line in prepared.report:
        echo_err(line)
    for w in prepared.warnings:
        echo_err(f"warning: {w}")
    if dry_run:
        recreating = _recreate_preview(ready.api, ready.nodes) if recreate_workloads else {}
        if output == "json":
            doc = prepared.to_dict()
            if ready.stage is not None and ready.stage.index is not None:
                doc["stage"] = {
                    "index": ready.stage.index,
                    "name": plan.stages[ready.stage.index].name,
                    "why": ready.stage.reason,
                    "history": list(ready.stage.history),
                }
            if recreate_workloads:
                doc["recreateWorkloads"] = {
                    n: {
                        "owners": {o: [_pod_key(p) for p in ps] for o, ps in sel.owners.items()},
                        "left": dict(sel.left),
                    }
                    for n, sel in recreating.items()
                }
            click.echo(json.dumps(doc, indent=2))
            return
        for i, b in enumerate(prepared.batches, 1):
            click.echo(f"batch {i}{' (canary)' if b.canary else ''}: {', '.join(b.nodes)}")
        for n in ready.nodes:
            c = prepared.changes[n]
            pods = prepared.evictions.get(n, ())
            click.echo(f"\nnode {n}: evict {', '.join(pods) or 'no pods'}")
            if c.checkpoint_reset:
                click.echo(f"  checkpoint files removed: {', '.join(c.checkpoint_reset)}")
            click.echo(prepared.diffs.get(n, "") or "  (no file changes)", nl=False)
            if n in recreating:
                click.echo(
                    "\n  --recreate-workloads, once applied: the GPU and Guaranteed pods of a "
                    "controller on it then; on it now:"
                )
                from rollout.change.commands.recreate_workloads import describe_selection

                for line in describe_selection(n, recreating[n]):
                    click.echo(line)
        click.echo("\nadmission preview:")
        click.echo(render_text(prepared.previews), nl=False)
        return
    nodes = ready.nodes
    confirm(yes, f"change {len(nodes)} node(s) ({', '.join(nodes)})")
    bench = canary_bench(ready, policy, echo_err)

    def make_gate(
        journal: Journal, inv: Inventory, predicted: Predicted | None, progress: Progress
    ) -> Gate:
        gate = gate_for(
            plan, ready.api, journal, output, inv, progress.event, ready.lock.interrupt, predicted
        )
        if bench is None:
            return gate
        from rollout.bench.canary_gate import BenchGate, journal_results

        runner, before = bench
        journal_results(journal, before, "before", runner.describe())
        group = cfg is None or str(cfg.on_failure) == "rollback-group"
        return BenchGate(gate, journal, runner, before, group, progress.event)

    hooks = ChangeEvidence(ready.api, ready.inventory, forks, echo_err, tenancy=plan.tenancy)
    done = run_apply(
        ready,
        make_gate,
        progress=progress_for(progress_mode),
        evidence=None if no_evidence else hooks,
        say=echo_err,
        failed=json_status(output),
    )
    finish(done.status, output)
    verdict = done.gate.verdict
    if verdict is not None and verdict.holds:  # Inconclusive / Error: held, say what it waits for
        echo_err(f"gate {verdict.status}: holding: waiting for {verdict.waiting_for}")
        sys.exit(GATE_HOLDS_EXIT)


def canary_bench(
    ready: PreparedApply, policy: BenchPolicy | None, say: Callable[[str], None]
) -> tuple[CanaryBench, Results] | None:
    """With the plan's ``gate.bench`` and a canary batch: the canary benched before the change
    (nothing changed yet), and the runner for the ``after`` bench. A before bench that could
    not decide (failed, binding not held, simulated without ``acceptSimulated``) refuses the
    apply here: its regression verdict would only hold the canary later.

    Raises:
        BenchError: the before bench cannot serve as the baseline (exit 1, nothing changed).
    """
    from rollout.bench.canary_gate import CanaryBench
    from rollout.bench.results import BenchError
    from rollout.gate.performance import judge_regression

    batches = ready.prepared.batches
    if policy is None or not batches or not batches[0].canary:
        return None
    canary = list(batches[0].nodes)
    runner = CanaryBench(policy, ready.inventory, ready.api, ready.prepared.raw_facts, say)
    before = runner.run(canary, "before")
    check = judge_regression(policy, before, before, canary)
    if check.holds:
        raise BenchError(f"gate.bench before the change: {check.reason}; nothing was changed")
    return runner, before


def _connect(kubeconfig: str | None, context: str | None) -> Any:
    """The API connection (``rollout.kube.client.connect``), imported when it is made."""
    from rollout.kube.client import connect

    return connect(kubeconfig, context)


def _recreate_preview(api: Any, nodes: list[str]) -> dict[str, Selection]:
    """What ``--recreate-workloads`` would recreate on each node, from its pods now."""
    from rollout.change.commands.recreate_workloads import KubeWorkloadPods, select

    pods = KubeWorkloadPods(api)
    return {n: select(pods.on_node(n)) for n in nodes}


def _pod_key(p: Mapping[str, Any]) -> str:
    meta = p.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}"


@click.command("status")
@click.option(
    "--change", "change", help="The change id (default: the latest change, in the cluster too)."
)
@lock_ns_option
@output_option
@kube_options
def status_cmd(
    change: str | None,
    lock_namespace: str,
    output: str,
    kubeconfig: str | None,
    context: str | None,
) -> None:
    """Every node's state in a change, replayed from its journal.

    A change this machine has no journal for is fetched from the cluster's record of it
    (ConfigMaps in the lock namespace) into the state directory first, so status works from any
    machine with the kubeconfig. Without --change: the latest change here or in the cluster.

    \b
    Examples:
      rollout status
      rollout status --change 20261130T214802Z-a1b2c3 -o json
    """
    api = optional_api(kubeconfig, context)
    journal = existing_journal(change, api, lock_namespace)
    print_status(replay(journal.entries(), journal.change_id), output)


COMMANDS = [apply_cmd, status_cmd]
