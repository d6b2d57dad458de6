"""The device manager's checkpoint: format and checksum as the kubelet writes and checks them.

The three files below were written by kubernetes v1.36.3's own
``pkg/kubelet/cm/devicemanager/checkpoint`` package (``checkpoint.New(...).MarshalCheckpoint()``,
a ten-line Go program run against the module cache): two entries with NUMA keys out of order, a
nil and an empty slice, nil data, and one registered resource.
"""

from __future__ import annotations

import pytest

from rollout.kubelet.checkpoints import CheckpointError
from rollout.kubelet.device_checkpoint import (
    PodDevices,
    device_checkpoint,
    from_document,
    parse_device,
    render_device,
)

KUBELET_WRITTEN = [
    '{"Data":{"PodDeviceEntries":[{"PodUID":"pod-a","ContainerName":"cuda","ResourceName":'
    '"nvidia.com/gpu","DeviceIDs":{"0":["GPU-0"],"1":["GPU-5","GPU-4"]},"AllocResp":"CgNhYmM="},'
    '{"PodUID":"pod-b","ContainerName":"main","ResourceName":"nvidia.com/gpu","DeviceIDs":'
    '{"0":["GPU-1"]},"AllocResp":null}],"RegisteredDevices":{"example.com/nic":[],"nvidia.com/gpu":'
    '["GPU-0","GPU-1","GPU-4","GPU-5"]}},"Checksum":501050015}',
    '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":null},"Checksum":1944006890}',
    '{"Data":{"PodDeviceEntries":null,"RegisteredDevices":{"nvidia.com/gpu":["a"]}},'
    '"Checksum":536986037}',
]


@pytest.mark.parametrize("text", KUBELET_WRITTEN)
def test_kubelet_written_files_parse_and_render_byte_for_byte(text: str) -> None:
    cp = parse_device(text)
    assert cp.computed_checksum() == cp.checksum
    assert render_device(cp) == text


def test_built_checkpoint_equals_the_kubelets() -> None:
    cp = device_checkpoint(
        [
            PodDevices(
                "pod-a",
                "cuda",
                "nvidia.com/gpu",
                {1: ("GPU-5", "GPU-4"), 0: ("GPU-0",)},
                b"\n\x03abc",
            ),
            PodDevices("pod-b", "main", "nvidia.com/gpu", {0: ("GPU-1",)}, None),
        ],
        {"nvidia.com/gpu": ["GPU-0", "GPU-1", "GPU-4", "GPU-5"], "example.com/nic": []},
    )
    assert cp.checksum == 501050015
    assert render_device(cp) == KUBELET_WRITTEN[0]
    assert cp.entries is not None
    assert cp.entries[0].devices() == {"GPU-0", "GPU-4", "GPU-5"}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (KUBELET_WRITTEN[1].replace("1944006890", "1944006891"), "checkpoint is corrupted"),
        ("{not json", "Expecting property name"),
        ('{"Checksum": 1}', "no Data object"),
        ('{"Data":{"PodDeviceEntries":{}}}', "PodDeviceEntries: expected a list"),
        (
            '{"Data":{"PodDeviceEntries":[{"DeviceIDs":{"x":["a"]}}]}}',
            "NUMA keys must be integers",
        ),
        ('{"Data":{"PodDeviceEntries":[{"AllocResp":"!!"}]}}', "AllocResp: not base64"),
        ('{"Data":{"RegisteredDevices":{"r":[1]}}}', "expected a list of device IDs"),
    ],
)
def test_bad_files_are_refused_with_the_reason(text: str, message: str) -> None:
    with pytest.raises(CheckpointError, match=message):
        parse_device(text)


def test_field_names_match_case_insensitively_like_go() -> None:
    cp = from_document({"data": {"podDeviceEntries": [{"poduid": "u", "deviceids": {"1": ["g"]}}]}})
    assert cp.entries is not None
    assert cp.entries[0].pod_uid == "u"
    assert cp.entries[0].device_ids == {1: ("g",)}
