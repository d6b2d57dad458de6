"""CPU and Topology Manager policy options and the feature gates around them, per kubelet version.

Whether the kubelet accepts ``cpuManagerPolicyOptions: {align-by-socket: "true"}`` depends on the
kubelet's version (an option is unknown before it exists, then alpha, beta, GA) and on feature gates
(``CPUManagerPolicyAlphaOptions`` ...). The kubelet only finds out when its managers start, so a
config that parses fine can still crash-loop the node. This catalogue is what lint uses to say, for
a given ``--kubelet-version``, what the kubelet would do.

Sources: k/k ``pkg/kubelet/cm/cpumanager/policy_options.go``,
``pkg/kubelet/cm/topologymanager/policy_options.go``, ``pkg/features/kube_features.go``;
``shared/domain/kubelet.md`` sections 1.4, 1.5 and 7.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from rollout.errors import InputError

Maturity = Literal["unknown", "alpha", "beta", "ga"]
Version = tuple[int, int]

#: The kubelet version lint assumes when none is given.
DEFAULT_KUBELET_VERSION: Version = (1, 35)


def parse_version(text: str) -> Version:
    """Parse ``1.35``, ``v1.35.2`` or ``1.35.0+k3s1`` into ``(1, 35)``.

    Raises:
        InputError: when the text is not a Kubernetes version.
    """
    m = re.fullmatch(r"v?(\d+)\.(\d+)(?:\.\d+)?(?:[-+].*)?", text.strip())
    if not m:
        raise InputError(f"kubelet version {text!r} is not a version like 1.35 or v1.35.2")
    return int(m.group(1)), int(m.group(2))


@dataclass(frozen=True)
class PolicyOption:
    """One policy option and the release in which it reached each maturity (None: never)."""

    name: str
    manager: Literal["cpu", "topology"]
    alpha: Version | None
    beta: Version | None
    ga: Version | None
    kind: Literal["bool", "int"] = "bool"

    def maturity(self, version: Version) -> Maturity:
        """The option's maturity in kubelet ``version``; ``unknown`` before it existed."""
        if self.ga is not None and version >= self.ga:
            return "ga"
        if self.beta is not None and version >= self.beta:
            return "beta"
        if self.alpha is not None and version >= self.alpha:
            return "alpha"
        return "unknown"


CPU_OPTIONS: dict[str, PolicyOption] = {
    o.name: o
    for o in (
        PolicyOption("full-pcpus-only", "cpu", (1, 22), (1, 23), (1, 33)),
        PolicyOption("distribute-cpus-across-numa", "cpu", (1, 23), (1, 33), None),
        PolicyOption("align-by-socket", "cpu", (1, 25), None, None),
        PolicyOption("distribute-cpus-across-cores", "cpu", (1, 31), None, None),
        PolicyOption("strict-cpu-reservation", "cpu", (1, 32), (1, 33), (1, 35)),
        PolicyOption("prefer-align-cpus-by-uncorecache", "cpu", (1, 32), (1, 34), (1, 36)),
    )
}

TOPOLOGY_OPTIONS: dict[str, PolicyOption] = {
    o.name: o
    for o in (
        PolicyOption("prefer-closest-numa-nodes", "topology", (1, 26), (1, 28), (1, 32)),
        PolicyOption("max-allowable-numa-nodes", "topology", None, (1, 31), (1, 35), kind="int"),
    )
}

#: CPU options the kubelet refuses together, in the order NewStaticPolicyOptions checks them.
CPU_INCOMPATIBLE: tuple[tuple[str, str], ...] = (
    ("full-pcpus-only", "distribute-cpus-across-cores"),
    ("distribute-cpus-across-numa", "distribute-cpus-across-cores"),
    ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-cores"),
    ("prefer-align-cpus-by-uncorecache", "distribute-cpus-across-numa"),
)

#: The NUMA node limit of the Topology Manager without ``max-allowable-numa-nodes``.
DEFAULT_MAX_ALLOWABLE_NUMA_NODES = 8


@dataclass(frozen=True)
class FeatureGate:
    """A gate's default per release: ``stages`` holds ``(since, default, locked)``, ascending."""

    name: str
    stages: tuple[tuple[Version, bool, bool], ...]

    def at(self, version: Version) -> tuple[bool, bool] | None:
        """``(default, locked)`` in ``version``, or None when the gate does not exist yet."""
        current: tuple[bool, bool] | None = None
        for since, default, locked in self.stages:
            if version >= since:
                current = (default, locked)
        return current


GATES: dict[str, FeatureGate] = {
    g.name: g
    for g in (
        FeatureGate(
            "CPUManager", (((1, 8), False, False), ((1, 10), True, False), ((1, 26), True, True))
        ),
        FeatureGate(
            "CPUManagerPolicyOptions",
            (((1, 22), False, False), ((1, 23), True, False), ((1, 33), True, True)),
        ),
        FeatureGate("CPUManagerPolicyAlphaOptions", (((1, 23), False, False),)),
        FeatureGate("CPUManagerPolicyBetaOptions", (((1, 23), True, False),)),
        FeatureGate(
            "TopologyManager",
            (((1, 16), False, False), ((1, 18), True, False), ((1, 27), True, True)),
        ),
        FeatureGate(
            "TopologyManagerPolicyOptions",
            (((1, 26), False, False), ((1, 28), True, False), ((1, 32), True, True)),
        ),
        FeatureGate("TopologyManagerPolicyAlphaOptions", (((1, 26), False, False),)),
        FeatureGate(
            "TopologyManagerPolicyBetaOptions", (((1, 26), False, False), ((1, 28), True, False))
        ),
        FeatureGate(
            "MemoryManager",
            (((1, 21), False, False), ((1, 22), True, False), ((1, 32), True, True)),
        ),
        # KEP-2837: beta and on since 1.34 (#132999)
        FeatureGate("PodLevelResources", (((1, 32), False, False), ((1, 34), True, False))),
        # KEP-5526: alpha 1.36 (#134768); beta in 1.37 but off by default (#141209)
        FeatureGate("PodLevelResourceManagers", (((1, 36), False, False),)),
        # KEP-5554: alpha 1.37, off (not in the 1.37 rc.0 notes: verify on the binary)
        FeatureGate("InPlacePodVerticalScalingExclusiveCPUs", (((1, 37), False, False),)),
    )
}

#: Gates the feature-gate machinery treats specially: they switch every alpha / beta gate.
SPECIAL_GATES = ("AllAlpha", "AllBeta")


def gate_enabled(name: str, gates: dict[str, bool], version: Version) -> bool:
    """Whether gate ``name`` is on in ``version`` given the configured ``featureGates``.

    ``AllAlpha`` / ``AllBeta`` switch the gates of that stage that are not set explicitly.
    """
    if name in gates:
        return gates[name]
    gate = GATES.get(name)
    state = gate.at(version) if gate else None
    if state is None:
        return False
    default, locked = state
    if locked:
        return default
    stage = "beta" if default else "alpha"
    if name.endswith("AlphaOptions"):
        stage = "alpha"
    if stage == "alpha" and "AllAlpha" in gates:
        return gates["AllAlpha"]
    if stage == "beta" and "AllBeta" in gates:
        return gates["AllBeta"]
    return default
