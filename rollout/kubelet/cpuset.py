"""The kubelet's cpuset syntax ("0-3,8,10-11"), parsed and printed the way the kubelet does.

The kubelet parses ``reservedSystemCPUs`` with ``k8s.io/utils/cpuset.Parse``; its error text is
quoted so lint and the lab kubelet say what the kubelet would say.
"""

from __future__ import annotations

import re
from collections.abc import Iterable


class CPUSetError(ValueError):
    """A cpuset string the kubelet would refuse."""


def parse(text: str) -> frozenset[int]:
    """Parse a Linux CPU list such as ``"0-3,8"`` exactly as ``k8s.io/utils/cpuset.Parse`` does.

    The empty string is the empty set. Like Go's ``strconv.Atoi`` no whitespace is accepted, so
    ``"0, 4"`` is refused here as the kubelet refuses it.

    Raises:
        CPUSetError: with the kubelet's wording for malformed numbers and ranges.
    """
    if text == "":
        return frozenset()
    cpus: set[int] = set()
    for part in text.split(","):
        bounds = [_atoi(b) for b in part.split("-", 1)]
        if len(bounds) == 1:
            cpus.add(bounds[0])
            continue
        lo, hi = bounds
        if lo > hi:
            raise CPUSetError(f'invalid range "{part}" ({lo} > {hi})')
        cpus.update(range(lo, hi + 1))
    return frozenset(cpus)


def _atoi(s: str) -> int:
    if not re.fullmatch(r"[+-]?[0-9]+", s):
        raise CPUSetError(f'strconv.Atoi: parsing "{s}": invalid syntax')
    return int(s)


def format_cpus(cpus: Iterable[int]) -> str:
    """Print a set of CPUs in the kubelet's canonical form: sorted, contiguous runs as ranges."""
    ordered = sorted(set(cpus))
    out: list[str] = []
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)
