"""The change's record as every command opens it: the local journal (a cache), fetched from or
brought up to the cluster record when an API connection is at hand, and the mirror that writes
each later append back into the cluster (``rollout.change.record.cluster_mirror``).

Below the CLI so the change session (``rollout.change.commands.session``), ``watch`` and ``serve``
open a change the same way as the commands do."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING

from rollout.change.record.journal import Journal, state_dir
from rollout.errors import InputError, Location

if TYPE_CHECKING:
    from rollout.kube.client import Api


def to_stderr(msg: str) -> None:
    """The default for ``say``: a line on standard error."""
    print(msg, file=sys.stderr, flush=True)


def existing_journal(
    change: str | None,
    api: Api | None = None,
    lock_namespace: str = "kube-system",
    say: Callable[[str], None] = to_stderr,
) -> Journal:
    """The change's journal from the state directory; with ``api``, a change the directory lacks
    is fetched from its cluster record first
    (``rollout.change.record.cluster_mirror.fetch_change``), and one it has is brought up to the
    record (``sync_change``), so a second machine with the kubeconfig and inventory carries on where
    the first left off. ``change`` None: the latest change here or, with ``api``, in the cluster."""
    root = state_dir()
    if change is None and api is not None:
        change = _latest(api, lock_namespace, say)
    try:
        journal = Journal.open(root, change)
    except InputError:
        if api is None:
            raise
    else:
        if api is not None:  # the directory is a cache: entries another machine added first
            from rollout.change.record.cluster_mirror import sync_change

            if sync_change(api, lock_namespace, root, journal.change_id, say) == "refreshed":
                say(f"change {journal.change_id}: brought up to date from the cluster record")
        return journal
    from rollout.change.record.cluster_mirror import fetch_change

    fetched = fetch_change(api, lock_namespace, root, change)
    if fetched is None:
        raise InputError(
            f"no change {change or '(latest)'!r} under {root / 'changes'} "
            f"nor in the cluster's record (namespace {lock_namespace})",
            Location(field="--change"),
        )
    say(f"change {fetched}: fetched from the cluster record into {root / 'changes' / fetched}")
    return Journal.open(root, fetched)


def _latest(api: Api, lock_namespace: str, say: Callable[[str], None]) -> str | None:
    """The newer of the latest change here and the latest in the cluster record."""
    from rollout.change.record.journal import latest_change
    from rollout.kube.mirror import latest_change as cluster_latest

    local = latest_change(state_dir())
    try:
        remote = cluster_latest(api, lock_namespace, retry_s=2.0)
    except Exception as e:  # the local journal still answers
        say(f"warning: cannot read the cluster's change record: {e}")
        return local
    if remote is not None and (local is None or remote > local):
        return remote
    return local


def mirrored(
    journal: Journal, api: Api, lock_namespace: str, say: Callable[[str], None] = to_stderr
) -> Journal:
    """Attach the cluster mirror: each later append and backup is also written into the cluster
    (ConfigMaps in ``lock_namespace``, annotations on the Nodes); failures are warnings."""
    from rollout.change.record.cluster_mirror import ClusterMirror

    return ClusterMirror(api, lock_namespace, say).attach(journal)
