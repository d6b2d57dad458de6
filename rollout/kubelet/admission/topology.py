"""The Topology Manager: NUMA hints, the hint merge of each policy, and its policy options.

Follows ``pkg/kubelet/cm/topologymanager`` (``policy.go``, ``policy_*.go``, ``numa_info.go``,
``policy_options.go``) of the lab's Kubernetes version; the facts carried over, not the code:

* a provider that returns no map at all, or an empty map, has "no preference" (``{nil, true}``);
  a resource whose list is ``None`` is also "no preference"; an *empty* list means "no possible
  affinity" (``{nil, false}``);
* every permutation of one hint per resource is merged: affinities ANDed with the default mask
  (all NUMA nodes); preferred only when every hint is preferred *and* every non-nil affinity is
  the same mask;
* the best merged hint: preferred beats non-preferred; among preferred the narrower mask wins
  (fewer NUMA nodes, then the lower bitmask value), or with ``prefer-closest-numa-nodes`` (not
  under ``single-numa-node``) the mask with the lower average NUMA distance among equal-sized
  masks; among non-preferred hints the one whose size equals the largest of the providers'
  narrowest hints wins (``BestNonPreferredAffinityCount``);
* ``single-numa-node`` first keeps only preferred hints with one NUMA node (or nil), and reports
  the default mask as nil;
* ``restricted`` and ``single-numa-node`` admit only a preferred best hint;
  ``best-effort`` admits always; ``none`` asks nobody.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

POLICIES = ("none", "best-effort", "restricted", "single-numa-node")
SCOPES = ("container", "pod")
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8

TOPOLOGY_AFFINITY_ERROR = "TopologyAffinityError"
TOPOLOGY_AFFINITY_MESSAGE = "Resources cannot be allocated with Topology locality"

Mask = frozenset[int]


@dataclass(frozen=True)
class Hint:
    """A ``TopologyHint``: a NUMA affinity (None: any) and whether it is preferred."""

    affinity: Mask | None
    preferred: bool


# What a hint provider says for one admission unit: None (no map: no preference), or per resource
# None (no preference for it) or the list of hints (empty: nothing fits).
ProviderHints = Mapping[str, Sequence[Hint] | None] | None


def mask_value(mask: Mask) -> int:
    """The bitmask as the kubelet's ``bitmask.BitMask`` integer (NUMA node i is bit i)."""
    return sum(1 << i for i in mask)


def narrower(a: Mask, b: Mask) -> bool:
    """``bitmask.IsNarrowerThan``: fewer NUMA nodes, then the lower bitmask value."""
    if len(a) == len(b):
        return mask_value(a) < mask_value(b)
    return len(a) < len(b)


def iterate_masks(ids: Sequence[int]) -> list[Mask]:
    """``bitmask.IterateBitMasks``: every non-empty subset, smallest first."""
    ordered = sorted(ids)
    return [
        frozenset(c) for k in range(1, len(ordered) + 1) for c in itertools.combinations(ordered, k)
    ]


@dataclass(frozen=True)
class TopologyOptions:
    prefer_closest_numa: bool = False
    max_allowable_numa_nodes: int = DEFAULT_MAX_ALLOWABLE_NUMA_NODES


def parse_options(options: Mapping[str, str]) -> TopologyOptions:
    """``topologyManagerPolicyOptions`` as the kubelet reads them (ValueError with its wording)."""
    closest = False
    max_nodes = DEFAULT_MAX_ALLOWABLE_NUMA_NODES
    for name, value in options.items():
        if name == "prefer-closest-numa-nodes":
            if value.lower() not in ("1", "t", "true", "0", "f", "false"):
                raise ValueError(f'bad value for option "{name}": invalid syntax')
            closest = value.lower() in ("1", "t", "true")
        elif name == "max-allowable-numa-nodes":
            try:
                max_nodes = int(value)
            except ValueError as e:
                raise ValueError(f'unable to convert policy option to integer "{name}": {e}') from e
            if max_nodes < DEFAULT_MAX_ALLOWABLE_NUMA_NODES:
                raise ValueError(
                    f'the minimum value of "{name}" should not be less than '
                    f"{DEFAULT_MAX_ALLOWABLE_NUMA_NODES}"
                )
        else:
            raise ValueError(f'unknown Topology Manager Policy option: "{name}"')
    return TopologyOptions(closest, max_nodes)


@dataclass(frozen=True)
class NUMAInfo:
    nodes: tuple[int, ...]
    distances: Mapping[int, Sequence[int]]

    @property
    def default_mask(self) -> Mask:
        return frozenset(self.nodes)

    def average_distance(self, mask: Mask) -> float:
        if not mask:
            return 0.0
        total = 0.0
        count = 0.0
        for a in sorted(mask):
            for b in sorted(mask):
                row = self.distances.get(a) or ()
                total += float(row[b]) if b < len(row) else 0.0
                count += 1
        return total / count

    def narrowest(self, m1: Mask, m2: Mask) -> Mask:
        return m1 if narrower(m1, m2) else m2

    def closest(self, m1: Mask, m2: Mask) -> Mask:
        if len(m1) != len(m2):
            return self.narrowest(m1, m2)
        d1, d2 = self.average_distance(m1), self.average_distance(m2)
        if d1 == d2:
            return m1 if mask_value(m1) < mask_value(m2) else m2
        return m1 if d1 < d2 else m2


def _filter_providers(providers: Sequence[ProviderHints]) -> list[list[Hint]]:
    out: list[list[Hint]] = []
    for hints in providers:
        if not hints:
            out.append([Hint(None, True)])
            continue
        for resource in sorted(hints):
            lst = hints[resource]
            if lst is None:
                out.append([Hint(None, True)])
            elif not lst:
                out.append([Hint(None, False)])
            else:
                out.append(list(lst))
    return out


def _narrowest_count(hints: Sequence[Hint]) -> int | None:
    best: Mask | None = None
    for h in hints:
        if h.affinity is None:
            continue
        if best is None or narrower(h.affinity, best):
            best = h.affinity
    return None if best is None else len(best)


class _Merger:
    def __init__(self, info: NUMAInfo, hints: list[list[Hint]], policy: str, opts: TopologyOptions):
        self.info = info
        self.hints = hints
        self.use_closest = policy != "single-numa-node" and opts.prefer_closest_numa
        counts = [c for c in (_narrowest_count(h) for h in hints) if c is not None]
        self.best_non_preferred = max([0, *counts])

    def _masks(self, current: Hint, candidate: Hint) -> Hint:
        assert current.affinity is not None and candidate.affinity is not None
        if candidate.affinity == current.affinity:
            return current
        pick = self.info.closest if self.use_closest else self.info.narrowest
        best = pick(current.affinity, candidate.affinity)
        return current if best == current.affinity else candidate

    def compare(self, current: Hint | None, candidate: Hint) -> Hint | None:
        assert candidate.affinity is not None
        n = self.best_non_preferred
        if not candidate.affinity:
            return current
        if current is None:
            return candidate
        assert current.affinity is not None
        if current.preferred != candidate.preferred:
            return current if current.preferred else candidate
        if current.preferred:
            return self._masks(current, candidate)
        cur, cand = len(current.affinity), len(candidate.affinity)
        if cur > n:
            return self._masks(current, candidate)
        if cur == n:
            return current if cand != n else self._masks(current, candidate)
        if cand > n:
            return current
        if cand == n:
            return candidate
        if cand > cur:
            return candidate
        if cand < cur:
            return current
        return self._masks(current, candidate)

    def merge(self) -> Hint:
        """Fold ``compare`` over every permutation's merged hint.

        The kubelet walks the full cross product; distinct partial merges are kept once here
        (the AND so far, the first non-nil affinity, preferred so far), which yields the same set
        of merged hints, and ``compare`` ranks distinct hints independently of their order.
        """
        default = self.info.default_mask
        states: set[tuple[Mask, Mask | None, bool]] = {(default, None, True)}
        for lst in self.hints:
            nxt: set[tuple[Mask, Mask | None, bool]] = set()
            for merged, first, pref in states:
                for h in lst:
                    if h.affinity is None:
                        p = pref and h.preferred
                        nxt.add((merged, first if p else None, p))
                        continue
                    f = first if first is not None else h.affinity
                    p = pref and h.preferred and h.affinity == f
                    # once not preferred, the first affinity no longer matters
                    nxt.add((merged & h.affinity, f if p else None, p))
            states = nxt
        best: Hint | None = None
        for merged, pref in sorted(
            {(m, p) for m, _f, p in states}, key=lambda s: (mask_value(s[0]), s[1])
        ):
            best = self.compare(best, Hint(merged, pref))
        return Hint(default, False) if best is None else best


def merge(
    info: NUMAInfo, policy: str, opts: TopologyOptions, providers: Sequence[ProviderHints]
) -> tuple[Hint, bool]:
    """The best hint and whether the policy admits it (``Policy.Merge``)."""
    filtered = _filter_providers(providers)
    if policy == "single-numa-node":
        filtered = [
            [h for h in lst if h.preferred and (h.affinity is None or len(h.affinity) == 1)]
            for lst in filtered
        ]
    best = _Merger(info, filtered, policy, opts).merge()
    if policy == "single-numa-node":
        if best.affinity == info.default_mask:
            best = Hint(None, best.preferred)
        return best, best.preferred
    if policy == "restricted":
        return best, best.preferred
    return best, True
