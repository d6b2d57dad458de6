"""The lab kubelet's pure parts: allocatable, reserved CPUs, API objects, klog lines, metrics."""

from __future__ import annotations

import datetime as dt

import pytest

from rollout.lab.kubelet import klog
from rollout.lab.kubelet import node as nodeapi
from rollout.lab.kubelet.metrics import Metrics

TOPOLOGY = {
    "threadsPerCore": 2,
    "numaNodes": [{"id": 0, "cpus": "0-15,32-47"}, {"id": 1, "cpus": "16-31,48-63"}],
}
CAPACITY = {"cpu": "64", "memory": "1073741824Ki", "pods": "110", "nvidia.com/gpu": "8"}


@pytest.mark.parametrize(
    ("config", "cpu", "memory"),
    [
        ({}, "64", "1073639424Ki"),  # only the default memory.available=100Mi
        ({"systemReserved": {"cpu": "2"}}, "62", "1073639424Ki"),
        ({"kubeReserved": {"cpu": "500m", "memory": "1Gi"}}, "63500m", "1072590848Ki"),
        ({"evictionHard": {"memory.available": "1Gi"}}, "64", "1072693248Ki"),
    ],
)
def test_allocatable(config: dict, cpu: str, memory: str) -> None:  # type: ignore[type-arg]
    got = nodeapi.allocatable(CAPACITY, config)
    assert (got["cpu"], got["memory"], got["nvidia.com/gpu"]) == (cpu, memory, "8")


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        ({"reservedSystemCPUs": "0,32"}, {0, 32}),
        ({"systemReserved": {"cpu": "2"}}, {0, 32}),  # one whole core: a CPU and its sibling
        ({"kubeReserved": {"cpu": "1"}, "systemReserved": {"cpu": "1500m"}}, {0, 32, 1}),
        ({}, set()),
    ],
)
def test_reserved_cpus(config: dict, expected: set[int]) -> None:  # type: ignore[type-arg]
    assert nodeapi.reserved_cpus(config, TOPOLOGY) == expected


def test_node_status_is_ready_with_the_kubelets_words() -> None:
    node = {"nodeName": "n1", "nodeIP": "10.213.1.2", "capacity": CAPACITY, "kubeletPort": 10250}
    st = nodeapi.node_status(node, {}, now=100.0, ready_since=50.0, boot_id="b")
    ready = next(c for c in st["conditions"] if c["type"] == "Ready")
    assert (ready["status"], ready["reason"], ready["message"]) == (
        "True",
        "KubeletReady",
        "kubelet is posting ready status",
    )
    assert st["addresses"] == [
        {"type": "InternalIP", "address": "10.213.1.2"},
        {"type": "Hostname", "address": "n1"},
    ]
    assert st["daemonEndpoints"] == {"kubeletEndpoint": {"Port": 10250}}


def test_event_and_rejected_status_match_reject_pod() -> None:
    pod = {"metadata": {"name": "p", "namespace": "ns", "uid": "u", "resourceVersion": "7"}}
    ev = nodeapi.event_object(
        pod, "n1", reason="TopologyAffinityError", message="m", now=1.5, kind="Warning"
    )
    assert ev["source"] == {"component": "kubelet", "host": "n1"}
    assert (ev["reportingComponent"], ev["reportingInstance"]) == ("kubelet", "n1")
    assert ev["involvedObject"]["uid"] == "u" and ev["type"] == "Warning"
    st = nodeapi.rejected_status("Guaranteed", "TopologyAffinityError", "Pod was rejected: m")
    assert st == {
        "status": {
            "phase": "Failed",
            "reason": "TopologyAffinityError",
            "message": "Pod was rejected: m",
            "qosClass": "Guaranteed",
        }
    }


def test_pod_ip_skips_used_addresses() -> None:
    assert nodeapi.pod_ip("10.213.4.2", ["10.244.4.2"]) == "10.244.4.3"
    assert nodeapi.pod_ip("10.213.4.2", [], "10.9.0.0/24") == "10.9.0.2"


def test_klog_line_format_and_quoting() -> None:
    t = dt.datetime(2026, 11, 30, 21, 43, 27, 123456)
    line = klog.format_line("E", "kubelet.go:1693", "Failed", t, 1234, err='policy "static"')
    assert line == (
        'E1130 21:43:27.123456    1234 kubelet.go:1693] "Failed" err="policy \\"static\\""'
    )
    assert klog.unquote(line).endswith('err="policy "static""')


def test_metrics_text() -> None:
    m = Metrics()
    m.admission(0.2, None)
    m.admission(0.3, "TopologyAffinityError")
    m.admission(0.1, "SMTAlignmentError")
    text = m.render()
    assert "kubelet_topology_manager_admission_requests_total 3\n" in text
    assert "kubelet_topology_manager_admission_errors_total 2\n" in text
    assert 'kubelet_admission_rejections_total{reason="TopologyAffinityError"} 1\n' in text
    assert 'kubelet_admission_rejections_total{reason="Other"} 1\n' in text
    assert 'kubelet_topology_manager_admission_duration_ms_bucket{le="+Inf"} 3\n' in text
