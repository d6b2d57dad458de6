"""The CPU manager's ``static`` policy: exclusive CPUs, their NUMA hints, SMT alignment.

Follows ``pkg/kubelet/cm/cpumanager/policy_static.go`` and ``policy_options.go``:

* only containers of Guaranteed pods with an integer CPU request get exclusive CPUs; the pod's
  request is the larger of its app containers' sum and its largest init container;
* reserved CPUs (``reservedSystemCPUs``, or that many CPUs picked by ``takeByTopology`` from all
  CPUs when only a count is reserved) are never handed out; ``strict-cpu-reservation`` only
  removes them from the shared pool, so it changes no admission;
* hints: every NUMA mask whose free CPUs (plus CPUs an init container of the same pod hands back)
  cover the request; preferred when the mask is as small as the smallest mask whose CPUs could
  hold the request on an empty machine, or (``align-by-socket``) when it spans the fewest sockets;
* ``full-pcpus-only``: a request that is not a multiple of the threads per core, or larger than
  the free CPUs on fully free cores (reserved cores excluded), fails with ``SMTAlignmentError``;
* allocation: CPUs of the hinted NUMA nodes (or, with ``align-by-socket``, their sockets) first,
  then the rest, each through ``takeByTopology``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from rollout.kubelet.admission.cpus import (
    CPUAllocationError,
    CPUTopology,
    take_distributed,
    take_packed,
)
from rollout.kubelet.admission.topology import Hint, Mask, iterate_masks

SMT_ALIGNMENT_ERROR = "SMTAlignmentError"
KNOWN_OPTIONS = (
    "full-pcpus-only",
    "distribute-cpus-across-numa",
    "align-by-socket",
    "distribute-cpus-across-cores",
    "strict-cpu-reservation",
)


class AdmissionFailure(Exception):
    """A provider's Allocate failed: reason and message as the kubelet reports them."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message


def unexpected(err: str) -> AdmissionFailure:
    return AdmissionFailure(
        "UnexpectedAdmissionError", f"Allocate failed due to {err}, which is unexpected"
    )


@dataclass(frozen=True)
class StaticOptions:
    full_pcpus_only: bool = False
    distribute_across_numa: bool = False
    align_by_socket: bool = False
    distribute_across_cores: bool = False
    strict_reservation: bool = False


def parse_options(options: Mapping[str, str]) -> StaticOptions:
    flags: dict[str, bool] = {}
    for name, value in options.items():
        if name not in KNOWN_OPTIONS:
            raise ValueError(f'unknown CPU Manager Policy option: "{name}"')
        if value.lower() not in ("1", "t", "true", "0", "f", "false"):
            raise ValueError(f'bad value for option "{name}": invalid syntax')
        flags[name] = value.lower() in ("1", "t", "true")
    for a, b in (
        ("full-pcpus-only", "distribute-cpus-across-cores"),
        ("distribute-cpus-across-numa", "distribute-cpus-across-cores"),
    ):
        if flags.get(a) and flags.get(b):
            raise ValueError(f"static policy options {a} and {b} can not be used at the same time")
    return StaticOptions(
        flags.get("full-pcpus-only", False),
        flags.get("distribute-cpus-across-numa", False),
        flags.get("align-by-socket", False),
        flags.get("distribute-cpus-across-cores", False),
        flags.get("strict-cpu-reservation", False),
    )


@dataclass
class StaticPolicy:
    """The policy plus its state (default cpuset, assignments, CPUs to reuse)."""

    topo: CPUTopology
    opts: StaticOptions
    reserved: frozenset[int] = frozenset()
    reserved_physical: frozenset[int] = frozenset()
    default: set[int] = field(default_factory=set)
    assignments: dict[tuple[str, str], frozenset[int]] = field(default_factory=dict)
    reuse: dict[str, frozenset[int]] = field(default_factory=dict)

    @classmethod
    def create(
        cls,
        topo: CPUTopology,
        opts: StaticOptions,
        reserved_cpus: frozenset[int],
        num_reserved: int,
        topology_policy: str,
    ) -> StaticPolicy:
        if opts.align_by_socket:
            if topology_policy == "single-numa-node":
                raise ValueError(
                    "Topolgy manager single-numa-node policy is incompatible with "
                    "CPUManager align-by-socket policy option"
                )
            if topo.num_sockets > topo.num_numa:
                raise ValueError(
                    "Align by socket is not compatible with hardware where number of sockets "
                    "are more than number of NUMA"
                )
        p = cls(topo, opts)
        reserved = reserved_cpus if reserved_cpus else p.take(topo.all, num_reserved)
        if len(reserved) != num_reserved:
            raise ValueError(
                "[cpumanager] unable to reserve the required amount of CPUs "
                f"(size of {sorted(reserved)} did not equal {num_reserved})"
            )
        p.reserved = frozenset(reserved)
        p.reserved_physical = frozenset().union(
            *(topo.members("core", topo.cpus[c].core) for c in reserved)
        )
        p.default = set(topo.all - p.reserved) if opts.strict_reservation else set(topo.all)
        return p

    @property
    def group(self) -> int:
        return self.topo.cpus_per_core

    def available(self) -> frozenset[int]:
        return frozenset(self.default) - self.reserved

    def available_physical(self) -> frozenset[int]:
        return frozenset(self.default) - self.reserved_physical

    def take(self, available: frozenset[int], n: int) -> frozenset[int]:
        spread = self.opts.distribute_across_cores
        if self.opts.distribute_across_numa:
            group = self.group if self.opts.full_pcpus_only else 1
            return take_distributed(self.topo, available, n, group, spread)
        return take_packed(self.topo, available, n, spread)

    # ------------------------------------------------------------------ hints
    def hints(self, request: int, pod_uid: str) -> list[Hint] | None:
        if request == 0:
            return None
        return self._generate(self.available(), self.reuse.get(pod_uid, frozenset()), request)

    def _generate(
        self, available: frozenset[int], reusable: frozenset[int], request: int
    ) -> list[Hint]:
        numa_ids = self.topo.ids("numa")
        total = {n: len(self.topo.members("numa", n)) for n in numa_ids}
        free = dict.fromkeys(numa_ids, 0)
        for c in available:
            free[self.topo.numa_of(c)] += 1
        reuse_numa = {self.topo.numa_of(c) for c in reusable}
        min_size = len(numa_ids)
        found: list[Mask] = []
        for mask in iterate_masks(numa_ids):
            if sum(total[n] for n in mask) >= request and len(mask) < min_size:
                min_size = len(mask)
            if not reuse_numa <= mask:
                continue
            if len(reusable) + sum(free[n] for n in mask) < request:
                continue
            found.append(mask)
        return [
            Hint(
                m,
                (self.opts.align_by_socket and self._socket_aligned(m, min_size))
                or len(m) == min_size,
            )
            for m in found
        ]

    def _socket_aligned(self, mask: Mask, min_size: int) -> bool:
        per_socket = self.topo.num_numa // self.topo.num_sockets
        if per_socket == 0:
            return False
        min_sockets = (min_size + per_socket - 1) // per_socket
        return len(self.topo.sockets_of_numa(mask)) == min_sockets

    # ------------------------------------------------------------------ allocation
    def allocate(
        self, pod_uid: str, container: str, n: int, affinity: Mask | None, init: bool
    ) -> frozenset[int]:
        """Exclusive CPUs for one container (``staticPolicy.Allocate``); AdmissionFailure."""
        if n == 0:
            return frozenset()
        self._enforce_smt(n)
        reusable = self.reuse.get(pod_uid, frozenset())
        allocatable = self.available() | reusable
        result: frozenset[int] = frozenset()
        try:
            if affinity is not None:
                aligned = self._aligned(affinity, allocatable)
                result = self.take(aligned, min(n, len(aligned)))
            result = result | self.take(allocatable - result, n - len(result))
        except CPUAllocationError as e:
            raise unexpected(str(e)) from e
        self.default -= result
        self.assignments[(pod_uid, container)] = result
        self._update_reuse(pod_uid, result, init)
        return result

    def _aligned(self, affinity: Mask, allocatable: frozenset[int]) -> frozenset[int]:
        if self.opts.align_by_socket:
            sockets = self.topo.sockets_of_numa(affinity)
            return frozenset(c for c in allocatable if self.topo.cpus[c].socket in sockets)
        return frozenset(c for c in allocatable if self.topo.numa_of(c) in affinity)

    def _enforce_smt(self, n: int) -> None:
        if not self.opts.full_pcpus_only:
            return
        if n % self.group:
            raise AdmissionFailure(
                SMT_ALIGNMENT_ERROR,
                f"SMT Alignment Error: requested {n} cpus not multiple cpus per core = "
                f"{self.group}",
            )
        physical = len(self.available_physical())
        if n > physical:
            raise AdmissionFailure(
                SMT_ALIGNMENT_ERROR,
                "SMT Alignment Error: not enough free physical CPUs: available physical CPUs = "
                f"{physical}, requested CPUs = {n}, CPUs per core = {self.group}",
            )

    def _update_reuse(self, pod_uid: str, cpus: frozenset[int], init: bool) -> None:
        for uid in [u for u in self.reuse if u != pod_uid]:
            del self.reuse[uid]
        cur = self.reuse.get(pod_uid, frozenset())
        self.reuse[pod_uid] = cur | cpus if init else cur - cpus

    def release_pod(self, pod_uid: str) -> None:
        """Give back what a pod holds (``RemoveContainer`` for each of its containers)."""
        for key in [k for k in self.assignments if k[0] == pod_uid]:
            cpus = self.assignments.pop(key)
            siblings = frozenset().union(
                *(v for k, v in self.assignments.items() if k[0] == pod_uid)
            )
            self.default |= cpus - siblings
