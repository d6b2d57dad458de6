"""The allocation-path change's label write (``rollout.kube.devices.patch_labels``): a
compare-and-swap on the labels. A 409 because the kubelet wrote its Node's status in between is
read again and retried while the labels still hold the expected values (CI saw a canary stopped
by one); a label someone else changed refuses with nothing written."""

from __future__ import annotations

from typing import Any

import pytest

from rollout.errors import NodeFilesChangedError
from rollout.kube import devices
from rollout.kube.rest import AnswerError

DP = "nvidia.com/gpu.deploy.device-plugin"


class Core:
    """A Node whose resourceVersion moves ``bumps`` times between a read and the next write."""

    def __init__(self, labels: dict[str, str], bumps: int = 0) -> None:
        self.labels, self.rv, self.bumps = dict(labels), 1, bumps
        self.writes: list[dict[str, Any]] = []

    def read_node(self, name: str, **_: Any) -> dict[str, Any]:
        return {"metadata": {"labels": dict(self.labels), "resourceVersion": str(self.rv)}}

    def patch_node(self, name: str, body: dict[str, Any], **_: Any) -> None:
        if self.bumps:  # the kubelet's status update landed first
            self.bumps -= 1
            self.rv += 1
        if body["metadata"]["resourceVersion"] != str(self.rv):
            raise AnswerError(409, "Conflict")
        self.labels.update(body["metadata"]["labels"])
        self.rv += 1
        self.writes.append(body)


class Api:
    def __init__(self, core: Core) -> None:
        self.core = core


def test_a_status_update_in_between_is_retried_while_the_labels_hold() -> None:
    core = Core({DP: "true"}, bumps=2)
    devices.patch_labels(Api(core), "n1", {DP: "true"}, {DP: "false"})  # type: ignore[arg-type]
    assert core.labels == {DP: "false"} and len(core.writes) == 1


def test_a_label_changed_by_someone_else_is_refused_with_nothing_written() -> None:
    core = Core({DP: "false"})
    with pytest.raises(NodeFilesChangedError) as e:
        devices.patch_labels(Api(core), "n1", {DP: "true"}, {DP: "false"})  # type: ignore[arg-type]
    assert "expected 'true'" in str(e.value) and core.writes == []


def test_a_node_that_changes_before_every_write_stops_after_the_attempts() -> None:
    core = Core({DP: "true"}, bumps=devices.LABEL_ATTEMPTS)
    with pytest.raises(NodeFilesChangedError) as e:
        devices.patch_labels(Api(core), "n1", {DP: "true"}, {DP: "false"})  # type: ignore[arg-type]
    assert f"{devices.LABEL_ATTEMPTS} times" in str(e.value) and core.writes == []
