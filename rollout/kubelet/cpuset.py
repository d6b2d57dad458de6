"""The kubelet's cpuset syntax ("0-3,8,10-11"), parsed and printed the way the kubelet does.

The kubelet parses ``reservedSystemCPUs`` with ``k8s.io/utils/cpuset.Parse``; its error text is quoted
so lint and the lab kubelet say what the kubelet would say.
"""

from __future__ import annotations

from collections.abc import Iterable


class CPUSetError(ValueError):
    """A cpuset string the kubelet would refuse."""


def parse(text: str) -> frozenset[int]:
    """Parse a Linux CPU list such as ``"0-3,8"``; the empty string is the empty set.

    Raises:
        CPUSetError: with the kubelet's wording for malformed ranges.
    """
    cpus: set[int] = set()
    s = text.strip()
    if not s:
        return frozenset()
    for part in s.split(","):
        bounds = part.split("-")
        try:
            if len(bounds) == 1:
                cpus.add(_int(bounds[0]))
            elif len(bounds) == 2:
                lo, hi = _int(bounds[0]), _int(bounds[1])
                if lo > hi:
                    raise CPUSetError(
                        f'invalid range "{part}" ({lo} > {hi})'
                    )
                cpus.update(range(lo, hi + 1))
            else:
                raise CPUSetError(f'invalid range "{part}"')
        except ValueError as e:
            if isinstance(e, CPUSetError):
                raise
            raise CPUSetError(f'strconv.Atoi: parsing "{part}": invalid syntax') from e
    return frozenset(cpus)


def _int(s: str) -> int:
    s = s.strip()
    if not s.isdigit():
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
