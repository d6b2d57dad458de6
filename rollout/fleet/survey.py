"""The fleet as it is: every node of the inventory and every Node a change marked, with what its
last change left, what runs now and how it serves its extended resources (device plugin, DRA, or
both: ``rollout nodes``, and ``rollout serve``'s drift metric).

Reads only: the Nodes' marks, status and ResourceSlices, the DeviceClasses, the changes' journals
(from the cluster record), each inventory node's files (the read-only facts playbook) and
``/configz``; ``rollout.fleet.drift`` says what differs and
``rollout.change.preflight.device_checks`` which path serves a resource (both pure).
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rollout.ansible.hosts import Inventory
from rollout.change.preflight.device_checks import AllocationPath
from rollout.change.record.opening import existing_journal, to_stderr
from rollout.fleet.drift import NodeReport, report_node

if TYPE_CHECKING:
    from rollout.kube.client import Api


def survey(
    api: Api,
    lock_namespace: str,
    inv: Inventory | None = None,
    say: Callable[[str], None] = to_stderr,
) -> list[NodeReport]:
    """Every node of ``inv`` and every Node a change marked, as :class:`NodeReport` rows (files
    read only for the inventory's nodes; without ``inv``, /configz only: ``rollout serve``'s
    drift metric)."""
    from concurrent.futures import ThreadPoolExecutor

    from rollout.change.record.replay import status_of
    from rollout.errors import RolloutError
    from rollout.fanout import DEFAULT_FORKS, workers
    from rollout.kube import mirror as km
    from rollout.kube import proxy

    marks = km.marked_nodes(api, retry_s=30.0)
    in_inv = [inv.node_of(h) for h in inv.hosts] if inv else []
    names = list(dict.fromkeys([*in_inv, *marks]))
    statuses: dict[str, Any] = {}
    for change in sorted({m["change"] for m in marks.values() if m["change"]}):
        try:
            statuses[change] = status_of(existing_journal(change, api, lock_namespace))
        except RolloutError as e:
            say(f"warning: change {change}: {e}")
    files = node_files(inv) if inv else {}
    paths = allocation_paths_of(api, names)

    def live(n: str) -> tuple[dict[str, Any] | None, str]:
        try:
            return proxy.configz(api, n), ""
        except RolloutError as e:
            return None, str(e)

    # one /configz read per node, at most DEFAULT_FORKS at once (not one after the other)
    with ThreadPoolExecutor(max_workers=workers(len(names), DEFAULT_FORKS)) as pool:
        read = dict(zip(names, pool.map(live, names), strict=True))
    reports = []
    for n in names:
        mark = marks.get(n)
        status = statuses.get(mark["change"]) if mark else None
        configz, error = read[n]
        reports.append(
            report_node(
                n,
                n in in_inv,
                mark,
                status.nodes.get(n) if status else None,
                files.get(n) if n in in_inv else None,
                configz,
                error,
                *paths.get(n, ((), ())),
            )
        )
    return reports


def allocation_paths_of(
    api: Api, names: list[str]
) -> dict[str, tuple[tuple[AllocationPath, ...], tuple[str, ...]]]:
    """How each named Node serves its extended resources (:func:`device_checks.allocation_paths`)
    and the DRA drivers with ResourceSlices on it, from the Nodes' capacity and allocatable, the
    DeviceClasses and the ResourceSlices: three listings, whatever the number of nodes."""
    from rollout.change.preflight import device_checks
    from rollout.kube import nodes as kn

    _, objects = kn.nodes_listed(api, set(names))
    versions = kn.resource_api_versions(api)
    classes = device_checks.device_classes(kn.device_class_objects(api, versions))
    drivers = kn.dra_drivers_by_node(api, versions)
    out = {}
    for n in names:
        status = (objects.get(n) or {}).get("status") or {}
        paths = device_checks.allocation_paths(
            status.get("capacity") or {},
            status.get("allocatable") or {},
            drivers.get(n, []),
            classes,
        )
        out[n] = (tuple(paths), tuple(sorted(set(drivers.get(n, [])))))
    return out


def node_files(inv: Inventory) -> dict[str, dict[str, bytes | None]]:
    """Each inventory node's kubelet files (the facts playbook, read-only)."""
    from rollout.ansible.runner import AnsibleRunner
    from rollout.change.preflight.node_change import node_files_of

    with tempfile.TemporaryDirectory(prefix="rollout-nodes-") as tmp:
        facts_dir = Path(tmp) / "facts"
        raw = AnsibleRunner(Path(tmp) / "runner").gather_facts(
            inv.path, list(inv.hosts), facts_dir, inv.hostvars
        )
        return {inv.node_of(h): node_files_of(r, facts_dir / h)[0] for h, r in raw.items()}
