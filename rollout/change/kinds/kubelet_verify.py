"""Proving a node healthy after a kubelet restart: the running config, not the file on disk.

Why: a kubelet that started is not a kubelet that took our settings (a drop-in may override it, a
flag may win), and a kubelet that took them may not have re-registered its devices yet
(``UnexpectedAdmissionError`` storms, kubernetes #133382). So a node passes only when ``/healthz``
says ok, the Node is Ready, ``/configz`` through the node proxy shows the expected policy, scope
and reservation, every device resource is back to its value from before the change, and every DRA
driver's ResourceSlices for the node are back: the kubelet deletes all of a node's slices at its
start (``DRAPluginManager``: "better to not advertise any local resources") and the driver
publishes them again about 30 s later (the resourceslice controller's ``DefaultSyncDelay``), so a
node uncordoned before that shows no DRA devices. The same check, with the previous settings,
proves a restore.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from rollout.change.plan.capacity import device_resources
from rollout.errors import NodeOperationError, RolloutError
from rollout.kubelet.cpuset import CPUSetError, parse
from rollout.protocols import Clock, Cluster
from rollout.retrying import Poll, wait_until

WATCHED = (
    "cpuManagerPolicy",
    "topologyManagerPolicy",
    "topologyManagerScope",
    "reservedSystemCPUs",
    "memoryManagerPolicy",
    "reservedMemory",
    "cpuManagerPolicyOptions",
    "topologyManagerPolicyOptions",
)
"""The settings we compare in ``/configz``: those this tool changes."""

_CPUSET_KEYS = ("reservedSystemCPUs",)


def config_subset(configz: Mapping[str, Any], keys: tuple[str, ...] = WATCHED) -> dict[str, Any]:
    """The watched settings from a ``/configz`` body (``{"kubeletconfig": {...}}`` or flat)."""
    cfg = configz.get("kubeletconfig", configz)
    if not isinstance(cfg, Mapping):
        return {}
    return {k: cfg[k] for k in keys if k in cfg}


def _same(key: str, want: Any, got: Any) -> bool:
    if key in _CPUSET_KEYS and isinstance(want, str) and isinstance(got, str):
        try:
            return parse(want) == parse(got)
        except CPUSetError:
            return want == got
    if want in (None, "", {}, []) and got in (None, "", {}, []):
        return True
    return json.dumps(want, sort_keys=True) == json.dumps(got, sort_keys=True)


def config_mismatches(expected: Mapping[str, Any], configz: Mapping[str, Any]) -> list[str]:
    """What differs between the expected settings and a ``/configz`` body (pure)."""
    got = config_subset(configz, tuple(expected))
    out = []
    for key, want in expected.items():
        if not _same(key, want, got.get(key)):
            out.append(f"/configz shows {key}={got.get(key)!r}, expected {want!r}")
    return out


def device_mismatches(before: Mapping[str, str], now: Mapping[str, str]) -> list[str]:
    """Device resources not back to their pre-change allocatable (pure)."""
    current = device_resources(now)
    return [
        f"allocatable {k}={current.get(k, '0')!r}, was {v!r} before the change"
        for k, v in sorted(before.items())
        if current.get(k, "0") != v
    ]


WIPE_GRACE_S = 20.0
"""How long verify waits for the kubelet to wipe the node's ResourceSlices before it takes the
slices from before the restart as current (a kubelet that does not wipe them; v1.36's wipes them
in a background goroutine seconds after it starts, which may be after ``/healthz`` is ok)."""


def slice_mismatches(
    before: Mapping[str, Mapping[str, int]],
    now: Mapping[str, Mapping[str, int]],
    waited_s: float,
) -> list[str]:
    """DRA drivers whose ResourceSlices for the node are not back (pure): fewer devices listed
    than before the change, or still the very slices from before the kubelet restart (the
    kubelet wipes them at its start) while verify has waited less than :data:`WIPE_GRACE_S`.

    Args:
        before, now: driver -> slice uid -> device count, before the change and now.
        waited_s: how long verify has been waiting.
    """
    out = []
    for driver, slices in sorted(before.items()):
        want = sum(slices.values())
        if want <= 0:
            continue
        have = now.get(driver) or {}
        got = sum(have.values())
        if got < want:
            out.append(
                f"ResourceSlices of DRA driver {driver} list {got} device(s) for the node, "
                f"{want} before the change (the kubelet wipes them at its start; the driver "
                "publishes them again about 30 s later)"
            )
        elif set(have) & set(slices) and waited_s < WIPE_GRACE_S:
            out.append(
                f"ResourceSlices of DRA driver {driver} are still those from before the kubelet "
                "restart (the kubelet wipes them at its start)"
            )
    return out


def verify(
    cluster: Cluster,
    node: str,
    expected: Mapping[str, Any],
    devices_before: Mapping[str, str],
    clock: Clock,
    timeout_s: float,
    poll_s: float = 0.25,
    slices_before: Mapping[str, Mapping[str, int]] | None = None,
) -> None:
    """Wait until the node is healthy with the expected config, or raise naming what is off.

    ``poll_s``: the wait between two looks (three API reads each); a batch waits for its slowest
    node's verify, so a look that misses the node by a moment should not cost half a second.
    ``slices_before``: the node's ResourceSlices before the change (driver -> uid -> devices;
    :func:`slice_mismatches`); None or empty: no DRA driver to wait for.

    Raises:
        NodeOperationError: still not right at the timeout; the last problems are named.
    """
    start = clock.monotonic()
    problems: list[str] = []

    def healthy() -> bool:
        nonlocal problems
        problems = _problems(cluster, node, expected, devices_before)
        if not problems and slices_before:
            try:
                now = cluster.dra_slices(node)
                problems = slice_mismatches(slices_before, now, clock.monotonic() - start)
            except RolloutError as e:
                problems = [str(e)]
        return not problems

    if not wait_until(healthy, timeout_s, Poll.every(poll_s), clock.sleep, clock.monotonic, start):
        raise NodeOperationError(
            f"verify of node {node} failed after {timeout_s:g}s: " + "; ".join(problems)
        )


def _problems(
    cluster: Cluster, node: str, expected: Mapping[str, Any], devices_before: Mapping[str, str]
) -> list[str]:
    try:
        if not cluster.healthz(node):
            return ["kubelet /healthz is not ok"]
        info = cluster.node(node)
        if not info.ready:
            return [f"Node {node} is not Ready"]
        problems = config_mismatches(expected, cluster.configz(node))
        return problems + device_mismatches(devices_before, info.allocatable)
    except RolloutError as e:
        return [str(e)]
