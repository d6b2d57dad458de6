"""Per-node work side by side: a bounded pool (``--forks``), failures by node, and one shared
playbook run's result per node.

Why here: the forward path, the restore path and resume fan out the same way, and a node's
failure must stay that node's (it is restored) while a signal still stops the process.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from rollout.errors import ExternalError, RolloutError
from rollout.fanout import DEFAULT_FORKS, workers
from rollout.protocols import RunResult

T = TypeVar("T")


def wrap(e: Exception) -> RolloutError:
    """A rollout error as is; anything else as an ExternalError naming its type."""
    return e if isinstance(e, RolloutError) else ExternalError(f"{type(e).__name__}: {e}")


def in_parallel(
    nodes: Sequence[str], work: Callable[[str], T], forks: int = DEFAULT_FORKS
) -> tuple[dict[str, T], dict[str, RolloutError]]:
    """Run ``work`` on each node, at most ``forks`` at once (inline for one node): results and
    failures by node. A node waits for a free worker before its work starts.

    A ``BaseException`` that is not an ``Exception`` (SIGINT, a test's stand-in for SIGKILL) is
    re-raised once every node's work has ended: it stops the process, it does not fail a node.
    """
    results: dict[str, T] = {}
    failures: dict[str, RolloutError] = {}
    if len(nodes) == 1:
        try:
            results[nodes[0]] = work(nodes[0])
        except Exception as e:
            failures[nodes[0]] = wrap(e)
        return results, failures
    if not nodes:
        return results, failures
    fatal: BaseException | None = None
    with ThreadPoolExecutor(max_workers=workers(len(nodes), forks)) as pool:
        futures = {n: pool.submit(work, n) for n in nodes}
        for n, f in futures.items():
            exc = f.exception()
            if exc is None:
                results[n] = f.result()
            elif isinstance(exc, Exception):
                failures[n] = wrap(exc)
            else:
                fatal = fatal or exc
    if fatal is not None:
        raise fatal
    return results, failures


def run_many(
    nodes: Sequence[str], run: Callable[[], Mapping[str, RunResult]]
) -> dict[str, RunResult]:
    """One shared playbook run's result for each node; a run that could not start at all (or
    that named no result for a node) fails those nodes with the reason."""
    try:
        got = dict(run())
    except Exception as e:
        err = wrap(e)
        return {n: RunResult(False, str(err)) for n in nodes}
    return {
        n: got.get(n) or RunResult(False, "the playbook reported nothing for it") for n in nodes
    }
