# ruff: noqa: E501  (the rows quote the kubelet's messages whole)
"""One row per lint rule: the config that trips it and the kubelet's exact message."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.kubelet.facts import GPU, NodeFacts, NUMANode
from rollout.kubelet.findings import Severity
from rollout.kubelet.validation import startup_errors, validate

E, W = Severity.ERROR, Severity.WARNING

TWO_NODES = NodeFacts(
    online_cpus=frozenset(range(8)),
    numa_nodes=(
        NUMANode(0, frozenset(range(4)), 64 * 2**30),
        NUMANode(1, frozenset(range(4, 8)), 64 * 2**30),
    ),
    sockets=2,
    gpus=(GPU("0000:3b:00.0", 0),),
)
NINE_NODES = NodeFacts(
    online_cpus=frozenset(range(18)),
    numa_nodes=tuple(NUMANode(i, frozenset({2 * i, 2 * i + 1})) for i in range(9)),
)
ONE_NODE_TWO_SOCKETS = NodeFacts(
    online_cpus=frozenset(range(4)), numa_nodes=(NUMANode(0, frozenset(range(4))),), sockets=2
)


def cfg(**fields: Any) -> dict[str, Any]:
    """A valid static + single-numa-node config, with ``fields`` overriding it (None deletes)."""
    base: dict[str, Any] = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "cpuManagerPolicy": "static",
        "reservedSystemCPUs": "0,4",
        "topologyManagerPolicy": "single-numa-node",
        "topologyManagerScope": "pod",
    }
    base.update(fields)
    return {k: v for k, v in base.items() if v is not None}


OPT = "cpuManagerPolicyOptions"
TOPT = "topologyManagerPolicyOptions"
AL2_CGROUPS = {"systemReservedCgroup": "/system", "kubeReservedCgroup": "/runtime"}

# (id, config, kubelet version, facts, severity, field, message)
ROWS: list[tuple[str, dict[str, Any], str | None, NodeFacts | None, Severity, str, str]] = [
    (
        "wrong type",
        cfg(cpuManagerPolicy=5),
        None,
        None,
        E,
        "cpuManagerPolicy",
        "json: cannot unmarshal number into Go struct field KubeletConfiguration.cpuManagerPolicy "
        "of type string",
    ),
    (
        "unquoted bool option",
        cfg(**{OPT: {"full-pcpus-only": True}}),
        None,
        None,
        E,
        f"{OPT}.full-pcpus-only",
        "json: cannot unmarshal bool into Go struct field KubeletConfiguration.cpuManagerPolicyOptions "
        "of type string",
    ),
    (
        "bad duration",
        cfg(cpuManagerReconcilePeriod="10 s"),
        None,
        None,
        E,
        "cpuManagerReconcilePeriod",
        'time: invalid duration "10 s"',
    ),
    (
        "unknown field",
        cfg(cpuManagerPolicyy="static"),
        None,
        None,
        W,
        "cpuManagerPolicyy",
        'unknown field "cpuManagerPolicyy" (did you mean "cpuManagerPolicy"?): the kubelet ignores it '
        "(strict decoding fails, it falls back to lenient decoding)",
    ),
    (
        "unknown field case",
        cfg(CPUManagerPolicy="static"),
        None,
        None,
        W,
        "CPUManagerPolicy",
        'unknown field "CPUManagerPolicy" (did you mean "cpuManagerPolicy"?): the kubelet ignores it '
        "(strict decoding fails, it falls back to lenient decoding)",
    ),
    (
        "gate locked",
        cfg(featureGates={"CPUManagerPolicyOptions": False}),
        "1.35",
        None,
        E,
        "featureGates.CPUManagerPolicyOptions",
        "cannot set feature gate CPUManagerPolicyOptions to false, feature is locked to true",
    ),
    (
        "gate not yet",
        cfg(featureGates={"TopologyManagerPolicyBetaOptions": True}),
        "1.25",
        None,
        E,
        "featureGates.TopologyManagerPolicyBetaOptions",
        "unrecognized feature gate: TopologyManagerPolicyBetaOptions",
    ),
    (
        "gate typo",
        cfg(featureGates={"CPUManagerPolicyAlphaOption": True}),
        None,
        None,
        W,
        "featureGates.CPUManagerPolicyAlphaOption",
        "unrecognized feature gate: CPUManagerPolicyAlphaOption (did you mean "
        '"CPUManagerPolicyAlphaOptions"?)',
    ),
    (
        "topology policy",
        cfg(topologyManagerPolicy="single-numa"),
        None,
        None,
        E,
        "topologyManagerPolicy",
        'invalid configuration: topologyManagerPolicy (--topology-manager-policy) "single-numa" must '
        'be one of: ["none" "best-effort" "restricted" "single-numa-node"]',
    ),
    (
        "topology scope",
        cfg(topologyManagerScope="Pod"),
        None,
        None,
        E,
        "topologyManagerScope",
        'invalid configuration: topologyManagerScope (--topology-manager-scope) "Pod" must be one '
        'of: "container", or "pod"',
    ),
    (
        "reserved cpus with cgroups",
        cfg(**AL2_CGROUPS),
        None,
        None,
        E,
        "reservedSystemCPUs",
        "invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with "
        "systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup "
        "(--kube-reserved-cgroup)",
    ),
    (
        "reserved cpus syntax",
        cfg(reservedSystemCPUs="0, 4"),
        None,
        None,
        E,
        "reservedSystemCPUs",
        "invalid configuration: unable to parse reservedSystemCPUs (--reserved-cpus) 0, 4, error: "
        'strconv.Atoi: parsing " 4": invalid syntax',
    ),
    (
        "enforce without cgroup",
        cfg(enforceNodeAllocatable=["pods", "kube-reserved"]),
        None,
        None,
        E,
        "enforceNodeAllocatable",
        "invalid configuration: kubeReservedCgroup (--kube-reserved-cgroup) must be specified when "
        '"kube-reserved" or "kube-reserved-compressible" included in enforceNodeAllocatable '
        "(--enforce-node-allocatable)",
    ),
    (
        "reserved memory type",
        cfg(reservedMemory=[{"numaNode": 0, "limits": {"cpu": "1"}}]),
        None,
        None,
        E,
        "reservedMemory[0]",
        'invalid configuration: the limit type "cpu" for NUMA node 0 is not supported, only '
        "[memory hugepages-<HugePageSize>] is accepted",
    ),
    (
        "reserved memory zero",
        cfg(reservedMemory=[{"numaNode": 1, "limits": {"memory": "0"}}]),
        None,
        None,
        E,
        "reservedMemory[0]",
        'invalid configuration: reserved memory may not be zero for NUMA node 1 and resource "memory"',
    ),
    (
        "reserved memory duplicate",
        cfg(
            reservedMemory=[
                {"numaNode": 0, "limits": {"memory": "1Gi"}},
                {"numaNode": 0, "limits": {"memory": "1Gi"}},
            ]
        ),
        None,
        None,
        E,
        "reservedMemory[1]",
        "invalid configuration: the reserved memory has a duplicate value for NUMA node 0 and "
        'resource "memory"',
    ),
    (
        "cannot reserve",
        cfg(kubeReserved={"nvidia.com/gpu": "1"}),
        None,
        None,
        E,
        "kubeReserved.nvidia.com/gpu",
        '--kube-reserved value failed to parse: cannot reserve "nvidia.com/gpu" resource',
    ),
    (
        "reserved not online",
        cfg(reservedSystemCPUs="0,9"),
        None,
        TWO_NODES,
        E,
        "reservedSystemCPUs",
        "reserved-cpus: 0,9 is not a subset of online-cpus: 0-7",
    ),
    (
        "numa node all reserved",
        cfg(reservedSystemCPUs="0-3"),
        None,
        TWO_NODES,
        W,
        "reservedSystemCPUs",
        "reservedSystemCPUs 0-3 reserves every CPU of NUMA node 0 (0-3): no exclusive CPU can be "
        "aligned to that node (GPUs there: 0000:3b:00.0)",
    ),
    (
        "cpu options gate off",
        cfg(**{OPT: {"full-pcpus-only": "true"}}, featureGates={"CPUManagerPolicyOptions": False}),
        "1.30",
        None,
        E,
        OPT,
        "CPU Manager policy options map[full-pcpus-only:true] require feature gates "
        '"CPUManager", "CPUManagerPolicyOptions" enabled',
    ),
    (
        "topology options gate off",
        cfg(
            **{TOPT: {"prefer-closest-numa-nodes": "true"}},
            featureGates={"TopologyManagerPolicyOptions": False},
        ),
        "1.30",
        None,
        E,
        TOPT,
        "topology manager policy options map[prefer-closest-numa-nodes:true] require feature gates "
        '"TopologyManagerPolicyOptions" enabled',
    ),
    (
        "topology option unknown",
        cfg(**{TOPT: {"prefer-closest-numa": "true"}}),
        None,
        None,
        E,
        f"{TOPT}.prefer-closest-numa",
        'unknown Topology Manager Policy option: "prefer-closest-numa"',
    ),
    (
        "topology option beta off",
        cfg(
            **{TOPT: {"max-allowable-numa-nodes": "16"}},
            featureGates={"TopologyManagerPolicyBetaOptions": False},
        ),
        "1.33",
        None,
        E,
        f"{TOPT}.max-allowable-numa-nodes",
        "Topology Manager Policy Beta-level Options not enabled, but option "
        '"max-allowable-numa-nodes" provided',
    ),
    (
        "topology option bool",
        cfg(**{TOPT: {"prefer-closest-numa-nodes": "yes"}}),
        None,
        None,
        E,
        f"{TOPT}.prefer-closest-numa-nodes",
        'bad value for option "prefer-closest-numa-nodes": strconv.ParseBool: parsing "yes": '
        "invalid syntax",
    ),
    (
        "max numa not int",
        cfg(**{TOPT: {"max-allowable-numa-nodes": "ten"}}),
        None,
        None,
        E,
        f"{TOPT}.max-allowable-numa-nodes",
        'unable to convert policy option to integer "max-allowable-numa-nodes": strconv.Atoi: '
        'parsing "ten": invalid syntax',
    ),
    (
        "max numa too small",
        cfg(**{TOPT: {"max-allowable-numa-nodes": "4"}}),
        None,
        None,
        E,
        f"{TOPT}.max-allowable-numa-nodes",
        'the minimum value of "max-allowable-numa-nodes" should not be less than 8',
    ),
    (
        "more than 8 numa nodes",
        cfg(reservedSystemCPUs="0"),
        None,
        NINE_NODES,
        E,
        "topologyManagerPolicy",
        "unsupported on machines with more than 8 NUMA Nodes",
    ),
    (
        "cpu policy case",
        cfg(cpuManagerPolicy="Static"),
        None,
        None,
        E,
        "cpuManagerPolicy",
        'unknown policy: "Static"',
    ),
    (
        "none policy with options",
        cfg(cpuManagerPolicy="none", **{OPT: {"full-pcpus-only": "true"}}),
        None,
        None,
        E,
        OPT,
        "new none policy error: None policy: received unsupported options=map[full-pcpus-only:true]",
    ),
    (
        "static without reservation",
        cfg(reservedSystemCPUs=None),
        None,
        None,
        E,
        "cpuManagerPolicy",
        "[cpumanager] the static policy requires systemreserved.cpu + kubereserved.cpu to be "
        "greater than zero",
    ),
    (
        "cpu option unknown",
        cfg(**{OPT: {"full-pcpu-only": "true"}}),
        None,
        None,
        E,
        f"{OPT}.full-pcpu-only",
        'new static policy error: unknown CPU Manager Policy option: "full-pcpu-only"',
    ),
    (
        "cpu option not yet",
        cfg(**{OPT: {"strict-cpu-reservation": "true"}}),
        "1.31",
        None,
        E,
        f"{OPT}.strict-cpu-reservation",
        'new static policy error: unknown CPU Manager Policy option: "strict-cpu-reservation"',
    ),
    (
        "cpu option alpha",
        cfg(**{OPT: {"distribute-cpus-across-cores": "true"}}),
        None,
        None,
        E,
        f"{OPT}.distribute-cpus-across-cores",
        "new static policy error: CPU Manager Policy Alpha-level Options not enabled, but option "
        '"distribute-cpus-across-cores" provided',
    ),
    (
        "cpu option beta off",
        cfg(
            **{OPT: {"distribute-cpus-across-numa": "true"}},
            featureGates={"CPUManagerPolicyBetaOptions": False},
        ),
        None,
        None,
        E,
        f"{OPT}.distribute-cpus-across-numa",
        "new static policy error: CPU Manager Policy Beta-level Options not enabled, but option "
        '"distribute-cpus-across-numa" provided',
    ),
    (
        "cpu option bad value",
        cfg(**{OPT: {"full-pcpus-only": "yes"}}),
        None,
        None,
        E,
        f"{OPT}.full-pcpus-only",
        'new static policy error: bad value for option "full-pcpus-only": strconv.ParseBool: '
        'parsing "yes": invalid syntax',
    ),
    (
        "cpu options incompatible",
        cfg(
            **{OPT: {"full-pcpus-only": "true", "distribute-cpus-across-cores": "true"}},
            featureGates={"CPUManagerPolicyAlphaOptions": True},
        ),
        None,
        None,
        E,
        OPT,
        "new static policy error: static policy options full-pcpus-only and "
        "distribute-cpus-across-cores can not be used at the same time",
    ),
    (
        "align-by-socket single-numa",
        cfg(
            **{OPT: {"align-by-socket": "true"}},
            featureGates={"CPUManagerPolicyAlphaOptions": True},
        ),
        None,
        None,
        E,
        f"{OPT}.align-by-socket",
        "new static policy error: Topolgy manager single-numa-node policy is incompatible with "
        "CPUManager align-by-socket policy option",
    ),
    (
        "align-by-socket sockets",
        cfg(
            topologyManagerPolicy="restricted",
            reservedSystemCPUs="0",
            **{OPT: {"align-by-socket": "true"}},
            featureGates={"CPUManagerPolicyAlphaOptions": True},
        ),
        None,
        ONE_NODE_TWO_SOCKETS,
        E,
        f"{OPT}.align-by-socket",
        "new static policy error: Align by socket is not compatible with hardware where number of "
        "sockets are more than number of NUMA",
    ),
    (
        "memory policy case",
        cfg(memoryManagerPolicy="static"),
        None,
        None,
        E,
        "memoryManagerPolicy",
        'unknown policy: "static"',
    ),
    (
        "reserved memory ignored",
        cfg(reservedMemory=[{"numaNode": 0, "limits": {"memory": "1Gi"}}]),
        None,
        None,
        W,
        "reservedMemory",
        'reservedMemory has no effect with memoryManagerPolicy "None"',
    ),
    (
        "memory static without reservedMemory",
        cfg(memoryManagerPolicy="Static", kubeReserved={"memory": "16Gi"}),
        None,
        None,
        E,
        "reservedMemory",
        'the total amount "0" of type "memory" is not equal to the value "16484Mi" determined by '
        "Node Allocatable feature",
    ),
    (
        "memory sum off by eviction",
        cfg(
            memoryManagerPolicy="Static",
            kubeReserved={"memory": "16Gi"},
            reservedMemory=[{"numaNode": 0, "limits": {"memory": "16548Mi"}}],
        ),
        None,
        None,
        E,
        "reservedMemory",
        'the total amount "16548Mi" of type "memory" is not equal to the value "16484Mi" determined '
        "by Node Allocatable feature",
    ),
    (
        "reserved memory numa missing",
        cfg(
            memoryManagerPolicy="Static",
            reservedMemory=[{"numaNode": 2, "limits": {"memory": "100Mi"}}],
        ),
        None,
        TWO_NODES,
        E,
        "reservedMemory[0]",
        "the reserved memory configuration references a NUMA node 2 that does not exist on this "
        "machine",
    ),
]


@pytest.mark.parametrize(
    ("config", "version", "facts", "severity", "field", "message"),
    [pytest.param(*row[1:], id=row[0]) for row in ROWS],
)
def test_rule(
    config: dict[str, Any],
    version: str | None,
    facts: NodeFacts | None,
    severity: Severity,
    field: str,
    message: str,
) -> None:
    findings = validate(config, kubelet_version=version, node_facts=facts)
    got = [(f.severity, f.field, f.message) for f in findings]
    assert (severity, field, message) in got


def test_valid_intent_is_clean() -> None:
    assert validate(cfg(), node_facts=TWO_NODES) == []


def test_memory_static_with_matching_reservation_is_clean() -> None:
    config = cfg(
        memoryManagerPolicy="Static",
        kubeReserved={"memory": "1Gi"},
        systemReserved={"memory": "1Gi"},
        reservedMemory=[
            {"numaNode": 0, "limits": {"memory": "1124Mi"}},
            {"numaNode": 1, "limits": {"memory": "1Gi"}},
        ],
    )
    assert validate(config, node_facts=TWO_NODES) == []


def test_ga_option_needs_no_gate_in_its_release() -> None:
    config = cfg(
        **{OPT: {"full-pcpus-only": "true"}}, featureGates={"CPUManagerPolicyBetaOptions": False}
    )
    assert validate(config, kubelet_version="1.33") == []
    assert validate(config, kubelet_version="1.32") != []


def test_origins_give_file_and_line() -> None:
    class Where:
        file = "/etc/kubernetes/kubelet/kubelet-config.json"
        line = 62

    findings = validate(cfg(**AL2_CGROUPS), origins={"reservedSystemCPUs": Where()})
    assert [(f.file, f.line) for f in findings] == [(Where.file, 62)]


def test_startup_errors_reports_the_validation_aggregate() -> None:
    config = cfg(topologyManagerPolicy="x", topologyManagerScope="y", cpuManagerPolicy="Static")
    errors = startup_errors(config)
    assert [e.field for e in errors] == ["topologyManagerPolicy", "topologyManagerScope"]


def test_startup_errors_stops_at_the_first_manager_error_in_kubelet_order() -> None:
    # Topology manager starts before the CPU manager, which starts before the memory manager.
    config = cfg(
        cpuManagerPolicy="Static",
        memoryManagerPolicy="static",
        **{TOPT: {"max-allowable-numa-nodes": "4"}},
    )
    errors = startup_errors(config)
    assert [e.message for e in errors] == [
        'the minimum value of "max-allowable-numa-nodes" should not be less than 8'
    ]
    assert startup_errors(cfg(cpuManagerPolicy="Static", memoryManagerPolicy="static"))[
        0
    ].message == ('unknown policy: "Static"')


def test_startup_errors_ignores_warnings() -> None:
    assert startup_errors(cfg(cpuManagerPolicyy="static")) == []


# ---------------------------------------------------------- strict-cpu-reservation, empty pool
FOUR_CPUS = NodeFacts(
    online_cpus=frozenset(range(4)), numa_nodes=(NUMANode(0, frozenset(range(4))),), sockets=1
)
STRICT = {OPT: {"strict-cpu-reservation": "true"}}
EMPTY_POOL = (
    "strict-cpu-reservation with reservedSystemCPUs 0-3 reserving every online CPU (0-3) leaves "
    "the shared pool (defaultCpuSet) empty: no CPU is allocatable to any pod, and a CPU Manager "
    'checkpoint with an empty default set is refused on restart with "default cpuset cannot be '
    'empty" (kubernetes#141196)'
)


def test_strict_reservation_of_every_online_cpu_is_an_error() -> None:
    config = cfg(reservedSystemCPUs="0-3", topologyManagerPolicy="none", **STRICT)
    findings = validate(config, node_facts=FOUR_CPUS)
    assert [(f.severity, f.field, f.message) for f in findings if f.field.startswith(OPT)] == [
        (E, f"{OPT}.strict-cpu-reservation", EMPTY_POOL)
    ]
    # the kubelet itself starts on it (the pool is empty, not invalid): not a start-up error
    assert startup_errors(config, FOUR_CPUS) == []


def test_strict_reservation_counted_from_kube_and_system_reserved() -> None:
    config = cfg(
        reservedSystemCPUs=None,
        kubeReserved={"cpu": "1"},
        systemReserved={"cpu": "2500m"},
        topologyManagerPolicy="none",
        **STRICT,
    )
    [finding] = validate(config, node_facts=FOUR_CPUS)
    assert finding.severity is E
    assert "kubeReserved + systemReserved cpu (4 CPUs) reserving every online CPU (0-3)" in (
        finding.message
    )
    assert '"default cpuset cannot be empty"' in finding.message


def test_strict_reservation_names_the_file_and_line_of_the_option() -> None:
    class Where:
        file = "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/50-rollout.conf"
        line = 7

    config = cfg(reservedSystemCPUs="0-3", topologyManagerPolicy="none", **STRICT)
    [finding] = [
        f
        for f in validate(config, origins={OPT: Where()}, node_facts=FOUR_CPUS)
        if f.field.startswith(OPT)
    ]
    assert (finding.file, finding.line) == (Where.file, 7)


def test_strict_reservation_with_cpus_left_only_warns() -> None:
    config = cfg(reservedSystemCPUs="0", topologyManagerPolicy="none", **STRICT)
    findings = validate(config, node_facts=FOUR_CPUS)
    assert [(f.severity, f.field) for f in findings] == [(W, f"{OPT}.strict-cpu-reservation")]
    assert '"default cpuset cannot be empty"' in findings[0].message
    # the same reservation without the option: the reserved CPUs stay in the shared pool
    for opts in ({}, {OPT: {"strict-cpu-reservation": "false"}}):
        config = cfg(reservedSystemCPUs="0-3", topologyManagerPolicy="none", **opts)
        assert [f.severity for f in validate(config, node_facts=FOUR_CPUS)] == [W]  # NUMA node 0


# ---------------------------------------------------------- flags the 1.37 kubelet removed
class ArgsLine:
    file = "/var/snap/microk8s/current/args/kubelet"
    line = 10


@pytest.mark.parametrize("name", ["containerd", "boot_id_file", "storage-driver-db"])
def test_removed_cadvisor_flag_stops_a_137_kubelet(name: str) -> None:
    config = cfg(topologyManagerPolicy="none")
    flags = {name: ArgsLine(), "housekeeping-interval": ArgsLine()}
    findings = validate(config, kubelet_version="1.37", flags=flags)
    assert [(f.severity, f.field, f.file, f.line) for f in findings] == [
        (E, f"--{name}", ArgsLine.file, 10)
    ]
    assert findings[0].message.startswith(f"failed to parse kubelet flag: unknown flag: --{name}")
    assert startup_errors(config, kubelet_version="v1.37.2", flags=flags) == findings
    assert validate(config, kubelet_version="1.36", flags=flags) == []


# ---------------------------------------------------------- cgroup v1 hosts, failCgroupV1
V1 = NodeFacts(online_cpus=frozenset(range(8)), numa_nodes=TWO_NODES.numa_nodes, cgroup_version=1)
V2 = NodeFacts(online_cpus=frozenset(range(8)), numa_nodes=TWO_NODES.numa_nodes, cgroup_version=2)
CGROUP_V1_135 = (
    "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is "
    "unsupported and will be removed in a future release (cgroup v1 from node facts "
    "cgroupVersion (failCgroupV1 defaults to true since 1.35); set failCgroupV1: false to run on it)"
)


@pytest.mark.parametrize("version", ["1.35", "1.36", "v1.37.2"])
def test_cgroup_v1_host_without_fail_cgroup_v1_false_is_refused(version: str) -> None:
    findings = validate(cfg(), kubelet_version=version, node_facts=V1)
    assert [(f.severity, f.field, f.message) for f in findings] == [
        (E, "failCgroupV1", CGROUP_V1_135)
    ]
    assert startup_errors(cfg(), V1, kubelet_version=version) == findings


def test_cgroup_v1_host_runs_with_fail_cgroup_v1_false_or_before_135() -> None:
    assert validate(cfg(failCgroupV1=False), kubelet_version="1.35", node_facts=V1) == []
    assert validate(cfg(), kubelet_version="1.34", node_facts=V1) == []
    assert validate(cfg(), kubelet_version="1.35", node_facts=V2) == []
    assert validate(cfg(), kubelet_version="1.35", node_facts=TWO_NODES) == []  # unknown


def test_fail_cgroup_v1_true_on_134_says_maintenance_mode() -> None:
    [f] = validate(cfg(failCgroupV1=True), kubelet_version="1.34", node_facts=V1)
    assert f.message.startswith(
        "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is in "
        "maintenance mode (cgroup v1 from node facts cgroupVersion; "
    )


def test_eks_al2_is_cgroup_v1() -> None:
    [f] = validate(cfg(), kubelet_version="1.35", distribution="eks-al2")
    assert f.severity is E and f.field == "failCgroupV1"
    assert "(cgroup v1 from distribution eks-al2 (failCgroupV1 defaults to true" in f.message
    assert "EKS publishes no Amazon Linux 2 AMIs for 1.33 and later" in f.message
    # node facts win over what the distribution usually is
    assert validate(cfg(), kubelet_version="1.35", distribution="eks-al2", node_facts=V2) == []
    assert validate(cfg(), kubelet_version="1.35", distribution="eks-al2023") == []


@pytest.mark.parametrize(
    ("gate", "missing", "present"),
    [
        ("PodLevelResources", "1.31", "1.34"),
        ("PodLevelResourceManagers", "1.35", "1.36"),
        ("InPlacePodVerticalScalingExclusiveCPUs", "1.36", "1.37"),
    ],
)
def test_resource_gates_exist_from_their_release(gate: str, missing: str, present: str) -> None:
    config = cfg(featureGates={gate: True})
    [f] = validate(config, kubelet_version=missing)
    assert (f.severity, f.message) == (E, f"unrecognized feature gate: {gate}")
    assert validate(config, kubelet_version=present) == []
