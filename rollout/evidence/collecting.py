"""Collecting a change's evidence (``rollout evidence``, and ``apply`` on its own: ``before`` at
preflight, ``after`` once the nodes are verified) and journaling what it showed.

Why here: collection is I/O over three adapters (the facts playbook, the API server, the node
proxy's ``/configz``) that the evidence layer may use (it sits above ``change``, ``kube`` and
``ansible``); the checks themselves are pure (:mod:`rollout.evidence.checks`). The collection
goes into ``evidence.json`` beside the change's journal; the journal gets an ``evidence`` entry
with the label, the nodes, the file and every check's result, which ``promote`` reads
(``rollout.change.commands.promote_change.evidence_refusal``). With the plan's ``tenancy:`` file,
each collection carries the tenancy audit too (``tenancy``: every row), and the journal entry its
verdict and counts: the audit before and after the change, beside the node data.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.change.commands.promote_change import check_failures
from rollout.change.plan.drain_rules import DrainPolicy
from rollout.change.record.entries import EvidenceRecord, evidence_data
from rollout.change.record.journal import EVIDENCE_STEP, Journal
from rollout.errors import InputError, Location
from rollout.fanout import DEFAULT_FORKS, workers
from rollout.models import Phase

if TYPE_CHECKING:
    from rollout.ansible.hosts import Inventory
    from rollout.kube.client import Api

__all__ = ["collect", "journal_evidence"]


def collect(
    label: str,
    api: Api,
    inv: Inventory,
    nodes: Sequence[str],
    target: Path,
    raw_facts: Mapping[str, Mapping[str, Any]] | None = None,
    gpu_resource: str = "nvidia.com/gpu",
    forks: int = DEFAULT_FORKS,
    keep_nodes: bool = False,
    tenancy: str | None = None,
    gpu_paths: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """Collect ``label`` for ``nodes`` (``raw_facts`` by host when already gathered, else the
    facts playbook runs, at most ``forks`` hosts at once), merge it into ``target`` (written in
    one rename) and return it. ``keep_nodes``: the file's collection of the same label keeps
    its other nodes (``promote`` adds its nodes beside the canary's); else it is replaced.
    ``tenancy``: the plan's tenancy file; its audit (:func:`tenancy_audit`) is the
    collection's ``tenancy``. ``gpu_paths``: a migration's recorded allocation-path settings;
    each node then carries its ``gpuPath`` (:mod:`rollout.evidence.gpu_paths`)."""
    from rollout.ansible.hosts import hosts_for
    from rollout.ansible.runner import AnsibleRunner
    from rollout.evidence.checks import build_collection, merge_collection, registered_devices
    from rollout.kube import proxy
    from rollout.kube.collecting import evidence_pods
    from rollout.kube.nodes import node_info, resource_api_versions, resource_claim_objects

    hosts = hosts_for(inv, list(nodes))

    def gather() -> Mapping[str, Mapping[str, Any]]:
        if raw_facts is not None:
            return raw_facts
        with tempfile.TemporaryDirectory(prefix="rollout-evidence-") as tmp:
            runner = AnsibleRunner(Path(tmp) / "runner", forks=forks)
            return runner.gather_facts(inv.path, hosts, Path(tmp) / "facts", inv.hostvars)

    def read(n: str) -> tuple[Any, Any, dict[str, Any]]:
        body = proxy.configz(api, n)
        return node_info(api, n), evidence_pods(api, n), body.get("kubeletconfig", body)

    def read_nodes() -> dict[str, tuple[Any, Any, dict[str, Any]]]:
        # the three reads of each node, at most ``forks`` nodes at once
        with ThreadPoolExecutor(max_workers=workers(len(nodes), forks)) as pool:
            return dict(zip(nodes, pool.map(read, nodes), strict=True))

    def claims() -> list[dict[str, Any]] | None:
        versions = resource_api_versions(api)
        return resource_claim_objects(api, versions) if versions else None

    # the sources are independent: the nodes' facts (ssh), their API reads, the cluster's
    # ResourceClaims and the tenancy audit run at the same time (one after the other they
    # were the sum of their waits: ``benchmarks/README.md``, node_step_bench)
    done = concurrently(
        {
            "facts": gather,
            "nodes": read_nodes,
            "claims": claims,
            **({"tenancy": lambda: tenancy_audit(tenancy, api)} if tenancy else {}),
        }
    )
    facts = {inv.node_of(h): f for h, f in done.value("facts").items() if h in hosts}
    got = done.value("nodes")
    allocatable = {n: dict(i.allocatable) for n, (i, _, _) in got.items()}
    capacity = {n: dict(i.capacity) for n, (i, _, _) in got.items()}
    pods = {n: p for n, (_, p, _) in got.items()}
    configz = {n: c for n, (_, _, c) in got.items()}
    try:
        document = json.loads(target.read_text(encoding="utf-8")) if target.is_file() else None
    except ValueError as e:
        raise InputError(f"not an evidence file: {e}", Location(file=str(target))) from e
    at = datetime.now(UTC).isoformat(timespec="seconds")
    collection = build_collection(
        label,
        at,
        facts,
        allocatable,
        pods,
        configz,
        gpu_resource,
        capacity=capacity,
        known=registered_devices(document),
    )
    _add_dra_claims(collection, pods, done)
    if gpu_paths:
        from rollout.evidence.gpu_paths import add_gpu_paths

        add_gpu_paths(api, collection, gpu_paths, document)
    if tenancy:
        collection["tenancy"] = done.value("tenancy")
    merged = merge_collection(document, collection, keep_nodes)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp_file = target.with_name(f".{target.name}.tmp")
    tmp_file.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n", encoding="utf-8")
    os.replace(tmp_file, target)
    return collection


class Concurrent:
    """What :func:`concurrently` got: each source's value or the exception it raised."""

    def __init__(self, values: dict[str, Any], errors: dict[str, BaseException]) -> None:
        self.values, self.errors = values, errors

    def value(self, name: str) -> Any:
        """The source's value; raises what the source raised."""
        if name in self.errors:
            raise self.errors[name]
        return self.values[name]


def concurrently(sources: Mapping[str, Callable[[], Any]]) -> Concurrent:
    """Run each source (no arguments) on its own thread, all at once, and wait for every one;
    a source's exception is kept for :meth:`Concurrent.value` to raise, so the caller decides
    the order in which failures are reported (as when the sources ran one after the other)."""
    values: dict[str, Any] = {}
    errors: dict[str, BaseException] = {}
    with ThreadPoolExecutor(max_workers=max(1, len(sources))) as pool:
        futures = {name: pool.submit(fn) for name, fn in sources.items()}
        for name, future in futures.items():
            try:
                values[name] = future.result()
            except Exception as e:
                errors[name] = e
    return Concurrent(values, errors)


def _add_dra_claims(
    collection: dict[str, Any],
    pods: Mapping[str, Sequence[Mapping[str, Any]]],
    done: Concurrent,
) -> None:
    """Each node's allocated ResourceClaims (``draClaims``, :mod:`rollout.evidence.dra`) when the
    API server serves ``resource.k8s.io`` (``done``'s ``claims``: None when it does not); when
    the listing failed, ``draProblem`` says why (the DRA part is then not judged, never
    passed)."""
    from rollout.evidence.dra import claims_by_node

    try:
        objects = done.value("claims")
        if objects is None:
            return
        by_node = claims_by_node(objects, pods)
    except Exception as e:  # evidence is best effort: say what is missing
        for d in collection["nodes"].values():
            d["draProblem"] = f"cannot list ResourceClaims: {e}"
        return
    for node, claims in by_node.items():
        if node in collection["nodes"]:
            collection["nodes"][node]["draClaims"] = claims


def tenancy_audit(path: str, api: Api) -> dict[str, Any]:
    """The tenancy audit of the plan's tenancy file as ``rollout tenancy audit -o json`` prints
    it, with the file (``file``); when it could not run (the file unreadable, the API server
    unreachable), ``result: not-collected`` and ``error``: never a pass."""
    from rollout.change.tenancy.audit import audit_plan_tenancy

    try:
        return {"file": path, **audit_plan_tenancy(path, api).to_json()}
    except Exception as e:  # evidence is best effort: say what is missing
        return {"file": path, "result": "not-collected", "error": str(e) or type(e).__name__}


def checks_of(collection: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every check over one collection, JSON-ready."""
    from rollout.evidence.checks import CHECKS, parse_collections

    (parsed,) = parse_collections({"collections": [collection]})
    return [fn(parsed).as_dict() for _, fn in CHECKS]


def journal_evidence(
    journal: Journal,
    label: str,
    nodes: Iterable[str],
    file: Path,
    collection: Mapping[str, Any] | None = None,
    error: str | None = None,
) -> dict[str, Any]:
    """Append the ``evidence`` entry: label, nodes, file and each check's result (or the error
    that stopped the collection); returns its data."""
    from rollout.evidence.checks import Status, overall_of

    if error is not None:
        data = evidence_data(label, nodes, str(file), str(Status.NOT_COLLECTED), error=error)
    else:
        checks = checks_of(collection or {})
        overall = str(overall_of(c["status"] for c in checks))
        tenancy = (collection or {}).get("tenancy")
        data = evidence_data(label, nodes, str(file), overall, checks, tenancy=tenancy)
    journal.append(EVIDENCE_STEP, Phase.DONE, now=datetime.now(UTC), data=data)
    return data


def describe(data: Mapping[str, Any]) -> str:
    """One line for a person: ``evidence after: pass (5 checks)`` or what failed (``data``:
    the ``evidence`` entry's payload, :func:`journal_evidence`'s)."""
    ev = EvidenceRecord.read(data)
    head = f"evidence {ev.label}: {ev.overall}"
    if ev.error:
        return f"{head}: not collected: {ev.error}"
    failed = [c for c in ev.checks if c.status == "fail"]
    t = ev.tenancy
    audit = ""
    if t:
        audit = f"; tenancy audit of {t.policy or t.file}: {t.result}" + (
            f": {t.error}" if t.error else f" ({t.checks} checks, {t.failed} failed)"
        )
    if failed:
        return head + ": " + "; ".join(check_failures(failed)) + audit
    unjudged = sum(1 for c in ev.checks if c.status == "not-judged")
    some = f", {unjudged} with nothing to judge" if unjudged else ""
    return f"{head} ({len(ev.checks)} checks{some}, {ev.file}){audit}"


class ChangeEvidence:
    """``apply``'s evidence hooks (``rollout.change.commands.evidence_hooks.EvidenceHooks``):
    collections into ``evidence.json`` beside the journal (at most ``forks`` hosts at once),
    journaled and said through ``say`` (a warning when one was not collected)."""

    def __init__(
        self,
        api: Api,
        inv: Inventory,
        forks: int = DEFAULT_FORKS,
        say: Callable[[str], None] = print,
        keep_nodes: bool = False,
        tenancy: str | None = None,
        gpu_paths: Mapping[str, Any] | None = None,
    ) -> None:
        """``keep_nodes``: collections add to the file's nodes of the same label (``promote``);
        ``tenancy``: the plan's tenancy file, audited in every collection; ``gpu_paths``: a
        migration's allocation-path settings (each node's ``gpuPath``)."""
        self.api, self.inv, self.forks, self.say = api, inv, forks, say
        self.keep_nodes = keep_nodes
        self.tenancy = tenancy
        self.gpu_paths = gpu_paths

    def open_sessions(self, nodes: Sequence[str]) -> None:
        """Open the facts sessions of ``nodes`` for a later collection (at most ``forks``;
        :func:`rollout.ansible.gathering.open_facts`): nothing is read until it runs. Best
        effort: a session that could not open leaves that node's call to open its own."""
        from rollout.ansible.gathering import open_facts
        from rollout.ansible.hosts import hosts_for

        try:
            open_facts(hosts_for(self.inv, list(nodes)), self.inv.hostvars, self.forks)
        except Exception as e:  # an optimisation: the collection opens its own sessions
            self.say(f"warning: facts sessions for the evidence not opened ahead: {e}")

    def collect(
        self, journal: Journal, label: str, nodes: list[str], raw_facts: Any = None
    ) -> tuple[Any, str | None]:
        """The collection, or None and why it failed (a failed one never stops the change)."""
        from rollout.evidence.report import EVIDENCE_FILE

        try:
            target = journal.dir / EVIDENCE_FILE
            got = collect(
                label,
                self.api,
                self.inv,
                nodes,
                target,
                raw_facts,
                forks=self.forks,
                keep_nodes=self.keep_nodes,
                tenancy=self.tenancy,
                gpu_paths=self.gpu_paths,
            )
            return got, None
        except Exception as e:
            return None, str(e) or type(e).__name__

    def after_recreate(
        self,
        journal: Journal,
        nodes: list[str],
        workloads: DrainPolicy | None = None,
        probes: bool = True,
    ) -> tuple[Any, str | None]:
        """``after-recreate``: with ``workloads`` (``--recreate-workloads``, the drain's
        policy), the operator's GPU and Guaranteed pods of ``nodes`` recreated first, one
        controller at a time (:mod:`rollout.change.commands.recreate_workloads`); with ``probes``
        (``--recreate-probes``), one device probe per node that advertises the GPU resource,
        run, deleted and run again (:mod:`rollout.evidence.recreating`), the collection taken
        while the second runs. None and why when an eviction stayed blocked, a replacement or a
        probe was rejected, or the collection failed."""
        from rollout.change.commands.recreate_workloads import KubeWorkloadPods, RecreatedWorkloads
        from rollout.change.commands.session import SystemClock
        from rollout.evidence.recreating import RecreatedProbes
        from rollout.kube.cluster import KubeCluster
        from rollout.kube.nodes import node_info

        try:
            if workloads is not None:
                RecreatedWorkloads(
                    KubeCluster(self.api),
                    KubeWorkloadPods(self.api),
                    workloads,
                    SystemClock(),
                    self.say,
                ).run(journal, nodes)
            if not probes:
                return self.collect(journal, "after-recreate", nodes)
            with_gpus = [n for n in nodes if _count(node_info(self.api, n).allocatable.get(GPU))]
            if not with_gpus:
                return None, f"no node of {', '.join(nodes)} advertises {GPU}: nothing to recreate"
            with RecreatedProbes(self.api, say=self.say).running(journal.change_id, with_gpus, GPU):
                return self.collect(journal, "after-recreate", nodes)
        except Exception as e:
            return None, str(e) or type(e).__name__

    def record(
        self, journal: Journal, label: str, nodes: list[str], collected: tuple[Any, str | None]
    ) -> None:
        """Journal the collection (or why it failed) and say it."""
        from rollout.evidence.report import EVIDENCE_FILE

        collection, error = collected
        target = journal.dir / EVIDENCE_FILE
        data = journal_evidence(journal, label, nodes, target, collection, error)
        self.say(f"warning: {describe(data)}" if error else describe(data))


GPU = "nvidia.com/gpu"


def _count(quantity: Any) -> int:
    try:
        return int(str(quantity or "0"))
    except ValueError:
        return 0
