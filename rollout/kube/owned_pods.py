"""The pods the tool creates name the process that created them, so that one a killed tool left
behind is deleted by the next run, and a tool told to stop deletes its own first.

Why: the tool's pods (the gate's probe pods, ``--recreate-probes``' device probes: both
:mod:`rollout.kube.probing`; ``bench --mode pod``: :mod:`rollout.bench.in_pod`) are deleted in
a ``finally``, which SIGKILL skips. A pod left behind holds its CPUs (and GPU) on a node the
tool has just changed: a probe runs ``pause`` until someone deletes it, a bench pod until its
``activeDeadlineSeconds``.

How: each pod is annotated ``rollout.io/created-by: user@host pid N`` (:mod:`rollout.identity`,
as the Lease names its holder); bench pods of the earlier version carry the same words under
``rollout.io/bench-owner``, still read. Before a run creates pods in its namespace, it deletes
the tool's pods there (``app.kubernetes.io/managed-by=rollout`` and one of the tool's name
prefixes) whose creator is a process of this host that no longer exists
(:func:`rollout.kube.lease_objects.holder_is_dead_here`), says so, and waits until they are gone.
A pod of a live process, of another host, or naming no creator is never deleted. While the tool
has pods, SIGTERM deletes them before the process dies (:func:`deleted_on_term`).
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager, suppress
from types import FrameType
from typing import Any, Protocol

from rollout.errors import ExternalError
from rollout.identity import process_identity
from rollout.kube.lease_objects import holder_is_dead_here
from rollout.retrying import Poll, wait_until

__all__ = ["CREATED_BY", "creator_of", "deleted_on_term", "leftovers", "stamp", "sweep"]

CREATED_BY = "rollout.io/created-by"
"""The annotation naming the process that created the pod, ``user@host pid N``."""
EARLIER_CREATED_BY = ("rollout.io/bench-owner",)
"""The same annotation as the earlier version wrote it (bench pods only), still read."""
MANAGED_BY = "app.kubernetes.io/managed-by"
SELECTOR = f"{MANAGED_BY}=rollout"
KINDS = {
    "rollout-probe-": "probe pod",
    "rollout-device-": "device probe",
    "rollout-bench-": "bench pod",
}
"""The tool's pod name prefixes, and what each pod is called in messages."""

GONE_POLL = Poll.every(0.5)
"""How often the tool looks whether a deleted pod is gone (grace 0: within a look or two)."""
GONE_WAIT_S = 120.0


class Pods(Protocol):
    """The pods of one namespace (``rollout.kube.probing.ProbePods``)."""

    namespace: str

    def labelled(self, selector: str) -> list[dict[str, Any]]: ...

    def delete(self, name: str) -> None: ...

    def status(self, name: str) -> dict[str, Any] | None: ...


def _meta(p: Mapping[str, Any]) -> Mapping[str, Any]:
    return p.get("metadata") or {}


def stamp(manifest: dict[str, Any], creator: str | None = None) -> dict[str, Any]:
    """``manifest`` annotated with its creator (default: this process), unless it names one."""
    meta = manifest.setdefault("metadata", {})
    annotations = meta.get("annotations") or {}
    if not creator_of(manifest):
        annotations = {**annotations, CREATED_BY: creator or process_identity()}
    meta["annotations"] = annotations
    return manifest


def creator_of(p: Mapping[str, Any]) -> str:
    """The process that created a pod (``user@host pid N``; empty: not annotated)."""
    annotations = _meta(p).get("annotations") or {}
    for key in (CREATED_BY, *EARLIER_CREATED_BY):
        if annotations.get(key):
            return str(annotations[key])
    return ""


def kind_of(p: Mapping[str, Any]) -> str | None:
    """``probe pod``, ``device probe`` or ``bench pod``; None: not a pod of the tool."""
    meta = _meta(p)
    if (meta.get("labels") or {}).get(MANAGED_BY) != "rollout":
        return None
    name = str(meta.get("name") or "")
    return next((kind for prefix, kind in KINDS.items() if name.startswith(prefix)), None)


def leftovers(
    listed: Iterable[Mapping[str, Any]], dead: Callable[[str], bool] = holder_is_dead_here
) -> tuple[list[Mapping[str, Any]], list[Mapping[str, Any]]]:
    """Of the pods ``listed``, the tool's pods a killed tool left behind (to delete) and its other
    pods (never deleted): a leftover names a creator ``dead`` says is gone (default: a process of
    this host that no longer exists). A pod that is not the tool's is in neither list."""
    stale: list[Mapping[str, Any]] = []
    kept: list[Mapping[str, Any]] = []
    for p in listed:
        if kind_of(p) is None:
            continue
        creator = creator_of(p)
        (stale if creator and dead(creator) else kept).append(p)
    return stale, kept


def wait_gone(
    pods: Pods,
    name: str,
    wait_s: float = GONE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
    what: str = "pod",
) -> None:
    """Delete the pod and wait until it is gone (its CPUs and GPU free).

    Raises:
        ExternalError: still there ``wait_s`` after the delete.
    """
    pods.delete(name)
    if not wait_until(lambda: pods.status(name) is None, wait_s, GONE_POLL, sleep, monotonic):
        raise ExternalError(
            f"{what} {pods.namespace}/{name} still present {wait_s:g}s after delete"
        )


def sweep(
    pods: Pods,
    say: Callable[[str], None],
    dead: Callable[[str], bool] = holder_is_dead_here,
    sleep: Callable[[float], None] = time.sleep,
    monotonic: Callable[[], float] = time.monotonic,
) -> tuple[list[str], list[Mapping[str, Any]]]:
    """Delete the tool's pods a killed tool left in the namespace (:func:`leftovers`), saying
    each, and wait until they are gone. Returns the names deleted and the tool's other pods.

    Raises:
        ExternalError: the pods could not be listed or deleted, or one stayed.
    """
    stale, kept = leftovers(pods.labelled(SELECTOR), dead)
    names = [str(_meta(p).get("name")) for p in stale]
    for p, name in zip(stale, names, strict=True):
        where = (p.get("spec") or {}).get("nodeName") or "no node"
        say(
            f"deleting {kind_of(p)} {pods.namespace}/{name} on {where}: left by {creator_of(p)}, "
            "which no longer runs"
        )
        pods.delete(name)
    for p, name in zip(stale, names, strict=True):
        wait_gone(pods, name, sleep=sleep, monotonic=monotonic, what=str(kind_of(p)))
    return names, kept


@contextmanager
def deleted_on_term(delete: Callable[[], None], wait_s: float = 5.0) -> Iterator[None]:
    """While inside, SIGTERM first calls ``delete()`` (in a thread, waited for at most
    ``wait_s``: the interrupted main thread may hold the connection pool's lock), then acts as
    it would have without this (the default: the process dies by the signal). Nothing is
    installed off the main thread, or when SIGTERM is ignored."""
    previous = signal.getsignal(signal.SIGTERM)
    if threading.current_thread() is not threading.main_thread() or previous in (
        signal.SIG_IGN,
        None,
    ):
        yield
        return

    def quietly() -> None:
        with suppress(Exception):  # dying anyway: the next run's sweep deletes what this left
            delete()

    def on_term(signum: int, frame: FrameType | None) -> None:
        t = threading.Thread(target=quietly, name="rollout-pods-delete", daemon=True)
        t.start()
        t.join(wait_s)
        signal.signal(signal.SIGTERM, previous)
        if callable(previous):
            previous(signum, frame)
        else:
            os.kill(os.getpid(), signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
