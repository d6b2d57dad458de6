"""The change's record as the commands see it: the local journal (a cache), fetched from or
brought up to the cluster record when an API connection is at hand, and the mirror that writes
each later append back into the cluster (``rollout.change.mirroring``).

A module of its own so every command that reads a change (status, report, evidence, watch,
serve, rollback, resume, promote) opens it the same way without importing the apply wiring."""

from __future__ import annotations

from typing import Any

import click

from rollout.change.journal import Journal, state_dir
from rollout.errors import InputError, Location


def echo(msg: str) -> None:
    click.echo(msg, err=True)


def optional_api(kubeconfig: str | None, context: str | None) -> Any:
    """An API connection when a kubeconfig loads, else None (the local journals still answer)."""
    from rollout.kube.client import connect

    try:
        return connect(kubeconfig, context)
    except InputError:
        return None


def existing_journal(
    change: str | None, api: Any = None, lock_namespace: str = "kube-system"
) -> Journal:
    """The change's journal from the state directory; with ``api``, a change the directory lacks
    is fetched from its cluster record first (``rollout.change.mirroring.fetch_change``), and one
    it has is brought up to the record (``sync_change``), so a second machine with the
    kubeconfig and inventory carries on where the first left off. ``change`` None: the latest
    change here or, with ``api``, in the cluster."""
    root = state_dir()
    if change is None and api is not None:
        change = _latest(api, lock_namespace)
    try:
        journal = Journal.open(root, change)
    except InputError:
        if api is None:
            raise
    else:
        if api is not None:  # the directory is a cache: entries another machine added first
            from rollout.change.mirroring import sync_change

            if sync_change(api, lock_namespace, root, journal.change_id, echo) == "refreshed":
                echo(f"change {journal.change_id}: brought up to date from the cluster record")
        return journal
    from rollout.change.mirroring import fetch_change

    fetched = fetch_change(api, lock_namespace, root, change)
    if fetched is None:
        raise InputError(
            f"no change {change or '(latest)'!r} under {root / 'changes'} "
            f"nor in the cluster's record (namespace {lock_namespace})",
            Location(field="--change"),
        )
    echo(f"change {fetched}: fetched from the cluster record into {root / 'changes' / fetched}")
    return Journal.open(root, fetched)


def _latest(api: Any, lock_namespace: str) -> str | None:
    """The newer of the latest change here and the latest in the cluster record."""
    from rollout.change.journal import latest_change
    from rollout.kube.mirror import latest_change as cluster_latest

    local = latest_change(state_dir())
    try:
        remote = cluster_latest(api, lock_namespace, retry_s=2.0)
    except Exception as e:  # the local journal still answers
        echo(f"warning: cannot read the cluster's change record: {e}")
        return local
    if remote is not None and (local is None or remote > local):
        return remote
    return local


def mirrored(journal: Journal, api: Any, lock_namespace: str) -> Journal:
    """Attach the cluster mirror: each later append and backup is also written into the cluster
    (ConfigMaps in ``lock_namespace``, annotations on the Nodes); failures are warnings."""
    from rollout.change.mirroring import ClusterMirror

    return ClusterMirror(api, lock_namespace, echo).attach(journal)
