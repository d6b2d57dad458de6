"""The kubelet's own account of what a node still holds (``rollout.kubelet.holdings``) and the
DRA manager's checkpoint (``rollout.kubelet.dra_state``), without a kubelet: the checkpoints are
those the kubelet's own package tests load (kubernetes v1.36.3
``pkg/kubelet/cm/dra/state/checkpointer_test.go``: one claim, two claims, a wrong checksum), the
device checkpoint is built by ``rollout.kubelet.device_checkpoint`` (checked against the kubelet's
elsewhere), the podresources answers are as the facts module reports them. The real kubelet's
files are read in ``tests/lab/test_migrate_lab.py``."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import pytest

from rollout.kubelet.checkpoints import CheckpointError
from rollout.kubelet.device_checkpoint import PodDevices, device_checkpoint, render_device
from rollout.kubelet.dra_state import parse_dra_state
from rollout.kubelet.holdings import claim_account, device_account

ONE_CLAIM = '{"Data":"{\\"kind\\":\\"DRACheckpoint\\",\\"apiVersion\\":\\"checkpoint.dra.kubelet.k8s.io/v1\\",\\"ClaimInfoStateList\\":[{\\"ClaimUID\\":\\"067798be-454e-4be4-9047-1aa06aea63f7\\",\\"ClaimName\\":\\"example\\",\\"Namespace\\":\\"default\\",\\"PodUIDs\\":{\\"139cdb46-f989-4f17-9561-ca10cfb509a6\\":{}},\\"DriverState\\":{\\"test-driver.cdi.k8s.io\\":{\\"Devices\\":[{\\"PoolName\\":\\"worker-1\\",\\"DeviceName\\":\\"dev-1\\",\\"ShareID\\":null,\\"RequestNames\\":[\\"test request\\"],\\"CDIDeviceIDs\\":[\\"example.com/example=cdi-example\\"]}]}}}]}","Checksum":2570581864}'  # noqa: E501 (the kubelet's bytes)
TWO_CLAIMS = '{"Data":"{\\"kind\\":\\"DRACheckpoint\\",\\"apiVersion\\":\\"checkpoint.dra.kubelet.k8s.io/v1\\",\\"ClaimInfoStateList\\":[{\\"ClaimUID\\":\\"067798be-454e-4be4-9047-1aa06aea63f7\\",\\"ClaimName\\":\\"example-1\\",\\"Namespace\\":\\"default\\",\\"PodUIDs\\":{\\"139cdb46-f989-4f17-9561-ca10cfb509a6\\":{}},\\"DriverState\\":{\\"test-driver.cdi.k8s.io\\":{\\"Devices\\":[{\\"PoolName\\":\\"worker-1\\",\\"DeviceName\\":\\"dev-1\\",\\"ShareID\\":null,\\"RequestNames\\":[\\"test request\\"],\\"CDIDeviceIDs\\":[\\"example.com/example=cdi-example\\"]}]}}},{\\"ClaimUID\\":\\"4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\\",\\"ClaimName\\":\\"example-2\\",\\"Namespace\\":\\"default\\",\\"PodUIDs\\":{\\"139cdb46-f989-4f17-9561-ca10cfb509a6\\":{}},\\"DriverState\\":{\\"test-driver.cdi.k8s.io\\":{\\"Devices\\":[{\\"PoolName\\":\\"worker-1\\",\\"DeviceName\\":\\"dev-2\\",\\"ShareID\\":null,\\"RequestNames\\":null,\\"CDIDeviceIDs\\":null}]}}}]}","Checksum":2820117767}'  # noqa: E501 (the kubelet's bytes)
BAD_CHECKSUM = '{"Data":"{\\"kind\\":\\"DRACheckpoint\\",\\"apiVersion\\":\\"checkpoint.dra.kubelet.k8s.io/v1\\",\\"Entries\\":[{\\"ClaimUID\\":\\"067798be-454e-4be4-9047-1aa06aea63f7\\",\\"ClaimName\\":\\"example-1\\",\\"Namespace\\":\\"default\\",\\"PodUIDs\\":{\\"139cdb46-f989-4f17-9561-ca10cfb509a6\\":{}},\\"DriverState\\":{\\"test-driver.cdi.k8s.io\\":{\\"Devices\\":[{\\"PoolName\\":\\"worker-1\\",\\"DeviceName\\":\\"dev-1\\",\\"RequestNames\\":[\\"test request\\"],\\"CDIDeviceIDs\\":[\\"example.com/example=cdi-example\\"]}]}}},{\\"ClaimUID\\":\\"4cf8db2d-06c0-7d70-1a51-e59b25b2c16c\\",\\"ClaimName\\":\\"example-2\\",\\"Namespace\\":\\"default\\",\\"PodUIDs\\":{\\"139cdb46-f989-4f17-9561-ca10cfb509a6\\":{}},\\"DriverState\\":{\\"test-driver.cdi.k8s.io\\":{\\"Devices\\":[{\\"PoolName\\":\\"worker-1\\",\\"DeviceName\\":\\"dev-2\\",\\"RequestNames\\":null,\\"CDIDeviceIDs\\":null}]}}}]}","Checksum":2930258365}'  # noqa: E501 (the kubelet's bytes)
DRIVER = "test-driver.cdi.k8s.io"
POD = "139cdb46-f989-4f17-9561-ca10cfb509a6"
GPU = "nvidia.com/gpu"


def test_the_dra_checkpoint_is_read_as_the_kubelet_reads_it() -> None:
    (claim,) = parse_dra_state(json.loads(ONE_CLAIM))
    assert claim.key == "default/example" and claim.uid == "067798be-454e-4be4-9047-1aa06aea63f7"
    assert claim.pod_uids == (POD,)
    assert claim.devices == {DRIVER: ("worker-1/dev-1",)}
    a, b = parse_dra_state(json.loads(TWO_CLAIMS))
    assert (a.name, b.name) == ("example-1", "example-2")
    assert b.devices == {DRIVER: ("worker-1/dev-2",)}
    with pytest.raises(CheckpointError, match="checkpoint is corrupted"):
        parse_dra_state(json.loads(BAD_CHECKSUM))  # the kubelet's own wording
    with pytest.raises(CheckpointError, match="Data, Checksum"):
        parse_dra_state({"Data": {}, "Checksum": 1})


def _facts(pods: list[dict[str, Any]] | None = None, **checkpoints: Any) -> dict[str, Any]:
    pr: dict[str, Any] = {"pods": pods} if pods is not None else {"error": "no podresources socket"}
    return {"podResources": pr, "checkpoints": checkpoints}


def _container(
    devices: Sequence[str] = (), claims: Sequence[tuple[str, str]] = ()
) -> dict[str, Any]:
    return {
        "name": "c",
        "devices": [{"resourceName": GPU, "deviceIds": list(devices)}] if devices else [],
        "dynamicResources": [
            {
                "claimName": name,
                "claimNamespace": "ml",
                "claimResources": [{"driverName": drv, "poolName": "n1", "deviceName": "gpu-0"}],
            }
            for name, drv in claims
        ],
    }


def _device_cp(*entries: tuple[str, str]) -> Any:
    cp = device_checkpoint(
        [PodDevices(uid, "c", GPU, {0: (dev,)}) for uid, dev in entries], {GPU: ("GPU-0", "GPU-1")}
    )
    return json.loads(render_device(cp))


def test_the_device_plugins_account_names_each_device_still_assigned_and_its_pod() -> None:
    pods = {"u-live": "ml/train"}
    # podresources lists a container with a GPU: held, whatever the API server says
    busy = [{"name": "train", "namespace": "ml", "containers": [_container(["GPU-1"])]}]
    a = device_account(_facts(busy, kubelet_internal_checkpoint=_device_cp()), GPU, pods)
    assert a.why_not_released() == (
        "nvidia.com/gpu GPU-1 held by pod ml/train container c (podresources)"
    )
    # the checkpoint's entry of a pod still bound to the node: held; of a gone pod: stale
    cp = _device_cp(("u-live", "GPU-0"), ("u-gone", "GPU-1"))
    a = device_account(_facts([], kubelet_internal_checkpoint=cp), GPU, pods)
    assert [str(h) for h in a.held] == [
        "nvidia.com/gpu GPU-0 held by pod ml/train container c (kubelet_internal_checkpoint)"
    ]
    assert a.stale == ("nvidia.com/gpu GPU-1 of gone pod u-gone",)
    # only stale entries, nothing listed: released, both accounts read
    a = device_account(_facts([], kubelet_internal_checkpoint=cp), GPU, {})
    assert a.why_not_released() is None and len(a.stale) == 2
    assert a.sources == ("podresources", "kubelet_internal_checkpoint")
    # fail closed: an account that cannot be read confirms nothing
    a = device_account(_facts(None, kubelet_internal_checkpoint=_device_cp()), GPU, {})
    assert a.why_not_released() == "unread: podresources: no podresources socket"
    broken = {**_device_cp(), "Checksum": 1}
    a = device_account(_facts([], kubelet_internal_checkpoint=broken), GPU, {})
    assert a.why_not_released() == "unread: kubelet_internal_checkpoint: checkpoint is corrupted"


def test_the_drivers_account_names_each_claim_still_prepared_or_in_use() -> None:
    pods = {POD: "default/user"}
    a = claim_account(_facts([], dra_manager_state=json.loads(ONE_CLAIM)), DRIVER, pods)
    assert a.why_not_released() == (
        "ResourceClaim default/example prepared (worker-1/dev-1) held by pod default/user "
        "(dra_manager_state)"
    )
    # another driver's claim is not this driver's to release
    assert claim_account(_facts([], dra_manager_state=json.loads(ONE_CLAIM)), "x", pods).held == ()
    busy = [{"name": "user", "namespace": "ml", "containers": [_container(claims=[("g", DRIVER)])]}]
    a = claim_account(_facts(busy), DRIVER, {})
    assert a.why_not_released() == (
        "ResourceClaim ml/g (n1/gpu-0) held by pod ml/user container c (podresources)"
    )
    # no dra_manager_state (the DRA manager never ran there) and nothing listed: released
    assert claim_account(_facts([]), DRIVER, {}).why_not_released() is None
    a = claim_account(_facts([], dra_manager_state=json.loads(BAD_CHECKSUM)), DRIVER, {})
    assert a.why_not_released() == "unread: dra_manager_state: checkpoint is corrupted"
