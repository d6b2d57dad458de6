"""The one bound on fan-out: how many nodes the tool works on at once (``--forks``).

Why one bound: every pool that grows with the fleet (the ssh calls of
:func:`rollout.ansible.direct.run_all`, the playbooks' ``forks``, the per-node threads of
:func:`rollout.change.engine.parallel.in_parallel`) opens processes, sockets or API connections per
node. Unbounded, facts for 1,000 hosts are 1,000 concurrent ssh processes against a default
open-file limit of 1,024. All of them take their limit from here, and a batch wider than it runs
in waves of at most that many nodes (:func:`waves`).

The default is the ``forks`` of the ``ansible.cfg`` shipped with the playbooks (50), so the tool
and ``ansible-playbook`` run by hand from ``playbooks/`` go as wide as each other
(``tests/unit/test_fanout.py`` checks the two agree).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

DEFAULT_FORKS = 50
"""The default bound, as ``playbooks/ansible.cfg`` says (``forks = 50``)."""

T = TypeVar("T")


def waves(items: Sequence[T], forks: int) -> list[list[T]]:
    """``items`` cut, in order, into consecutive waves of at most ``forks`` (pure); one wave
    when they fit, none when there are none."""
    n = max(1, int(forks))
    return [list(items[i : i + n]) for i in range(0, len(items), n)]


def workers(count: int, forks: int) -> int:
    """How many workers a pool over ``count`` items gets: at most ``forks``, at least one."""
    return max(1, min(int(count), int(forks)))
