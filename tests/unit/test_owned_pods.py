"""The tool's pods name their creator; the next run deletes those a killed tool left
(``rollout.kube.owned_pods``), and ``ProbePods`` uses it for every pod it creates."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from typing import Any

from rollout.kube import owned_pods
from rollout.kube.probing import ProbePods, probe_manifest
from rollout.kube.rest import AnswerError
from tests.unit.fakes_change import RecordingClock


def _pod(
    name: str, annotations: dict[str, str] | None, node: str = "gpu-1", managed: str = "rollout"
) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name, "labels": {"app.kubernetes.io/managed-by": managed}}
    if annotations is not None:
        meta["annotations"] = annotations
    return {"metadata": meta, "spec": {"nodeName": node}}


def test_stamp_names_this_process_and_keeps_a_creator_already_named() -> None:
    m = probe_manifest("gpu-1", "c-1", 0)
    assert owned_pods.stamp(m) is m
    me = owned_pods.creator_of(m)
    assert me.endswith(f"@{socket.gethostname()} pid {os.getpid()}")
    assert m["metadata"]["annotations"] == {owned_pods.CREATED_BY: me}
    assert m["metadata"]["labels"]["rollout.io/probe"] == "true"  # its labels kept
    other = owned_pods.stamp(_pod("rollout-bench-a", {"a": "b"}), "ops@h pid 3")
    assert other["metadata"]["annotations"] == {"a": "b", owned_pods.CREATED_BY: "ops@h pid 3"}
    again = owned_pods.stamp(_pod("rollout-bench-a", {"rollout.io/bench-owner": "ops@h pid 9"}))
    assert owned_pods.creator_of(again) == "ops@h pid 9"  # the earlier version's key still read
    assert owned_pods.creator_of(_pod("rollout-probe-a", None)) == ""


def test_every_kind_of_the_tools_pod_is_a_leftover_when_its_creator_is_gone() -> None:
    dead = {"ops@here pid 7"}
    gone = {owned_pods.CREATED_BY: "ops@here pid 7"}
    pods = [
        _pod("rollout-probe-gpu-1-0-abc", gone),  # the gate's probe
        _pod("rollout-device-gpu-1-1-abc", gone),  # --recreate-probes' device probe
        _pod("rollout-bench-gpu-1-x", {"rollout.io/bench-owner": "ops@here pid 7"}),  # earlier
        _pod("rollout-probe-live", {owned_pods.CREATED_BY: "ops@here pid 8"}),  # still runs
        _pod("rollout-probe-unnamed", None),  # names no creator: unknown, kept
        _pod("someone-else", gone),  # not the tool's name
        _pod("rollout-probe-helm", gone, managed="helm"),  # not the tool's label
    ]
    stale, kept = owned_pods.leftovers(pods, lambda who: who in dead)
    assert [p["metadata"]["name"] for p in stale] == [
        "rollout-probe-gpu-1-0-abc",
        "rollout-device-gpu-1-1-abc",
        "rollout-bench-gpu-1-x",
    ]
    assert [p["metadata"]["name"] for p in kept] == ["rollout-probe-live", "rollout-probe-unnamed"]


def test_the_default_judge_deletes_only_a_process_of_this_host_that_is_gone() -> None:
    gone = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    here = socket.gethostname()
    pods = [
        _pod("rollout-probe-gone", {owned_pods.CREATED_BY: f"ops@{here} pid {gone}"}),
        _pod("rollout-probe-me", {owned_pods.CREATED_BY: f"ops@{here} pid {os.getpid()}"}),
        _pod("rollout-probe-there", {owned_pods.CREATED_BY: f"ops@not-{here} pid {gone}"}),
    ]
    stale, kept = owned_pods.leftovers(pods)
    assert [p["metadata"]["name"] for p in stale] == ["rollout-probe-gone"]
    assert {p["metadata"]["name"] for p in kept} == {"rollout-probe-me", "rollout-probe-there"}


class Core:
    """The API calls ``ProbePods`` makes, kept in memory: a deleted pod is gone at once."""

    def __init__(self, pods: list[dict[str, Any]] | None = None) -> None:
        self.pods = {p["metadata"]["name"]: p for p in pods or []}
        self.calls: list[str] = []

    def create_namespace(self, body: dict[str, Any]) -> None:
        raise AnswerError(409, "AlreadyExists", {})

    def create_namespaced_pod(self, ns: str, body: dict[str, Any]) -> None:
        self.calls.append(f"create {body['metadata']['name']}")
        self.pods[body["metadata"]["name"]] = body

    def delete_namespaced_pod(self, name: str, ns: str, grace_period_seconds: int) -> None:
        self.calls.append(f"delete {name}")
        if self.pods.pop(name, None) is None:
            raise AnswerError(404, "NotFound", {})

    def read_namespaced_pod(self, name: str, ns: str) -> dict[str, Any]:
        if name not in self.pods:
            raise AnswerError(404, "NotFound", {})
        return {"status": {"phase": "Running"}, **self.pods[name]}

    def list_pod_for_all_namespaces(self, field_selector: str, label_selector: str) -> Any:
        self.calls.append(f"list {label_selector}")
        return {"items": list(self.pods.values())}


class Api:
    def __init__(self, core: Core) -> None:
        self.core = core


def _gone_pid() -> str:
    return subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()


def test_launch_deletes_what_a_killed_tool_left_says_so_then_creates_named_probes() -> None:
    here = socket.gethostname()
    left = f"ops@{here} pid {_gone_pid()}"
    live = f"ops@{here} pid {os.getpid()}"
    core = Core(
        [
            _pod("rollout-device-gpu-1-1-old", {owned_pods.CREATED_BY: left}),
            _pod("rollout-probe-gpu-1-0-live", {owned_pods.CREATED_BY: live}),
        ]
    )
    said: list[str] = []
    probes = ProbePods(Api(core), say=said.append)  # type: ignore[arg-type]
    names = probes.launch("c-1", ["gpu-1"], 2)
    assert core.calls[:2] == [
        "list app.kubernetes.io/managed-by=rollout",
        "delete rollout-device-gpu-1-1-old",
    ]
    assert said == [
        "deleting device probe rollout-probes/rollout-device-gpu-1-1-old on gpu-1: "
        f"left by {left}, which no longer runs"
    ]
    assert "rollout-probe-gpu-1-0-live" in core.pods  # a live process's pod stays
    for name in names:
        assert (
            owned_pods.creator_of(core.pods[name])
            == owned_pods.stamp({})["metadata"]["annotations"][owned_pods.CREATED_BY]
        )
    probes.cleanup()
    assert set(core.pods) == {"rollout-probe-gpu-1-0-live"}


def test_probe_pods_delete_theirs_on_sigterm_from_the_first_create_until_cleanup() -> None:
    calls: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, _f: calls.append(signum))
    try:
        core = Core()
        probes = ProbePods(Api(core))  # type: ignore[arg-type]
        probes.create(probe_manifest("gpu-1", "c-1", 0))
        probes.create(probe_manifest("gpu-1", "c-1", 1))
        os.kill(os.getpid(), signal.SIGTERM)
        assert core.pods == {} and calls == [signal.SIGTERM]  # deleted, then the handler ran
        probes.cleanup()  # already gone is fine; SIGTERM acts as before again
        os.kill(os.getpid(), signal.SIGTERM)
        assert calls == [signal.SIGTERM] * 2
        assert [c for c in core.calls if c.startswith("delete")] == [
            "delete rollout-probe-gpu-1-0-c-1",
            "delete rollout-probe-gpu-1-1-c-1",
            "delete rollout-probe-gpu-1-0-c-1",
            "delete rollout-probe-gpu-1-1-c-1",
        ]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_leftover_that_stays_is_an_error_naming_it() -> None:
    import pytest

    from rollout.errors import ExternalError

    class Stays:
        namespace = "rollout-probes"

        def labelled(self, selector: str) -> list[dict[str, Any]]:
            return [_pod("rollout-probe-a", {owned_pods.CREATED_BY: "x pid 1"})]

        def delete(self, name: str) -> None:
            pass

        def status(self, name: str) -> dict[str, Any] | None:
            return {"phase": "Running"}

    clock = RecordingClock()
    with pytest.raises(
        ExternalError, match="probe pod rollout-probes/rollout-probe-a still present 120s"
    ):
        owned_pods.sweep(Stays(), lambda _m: None, lambda _o: True, clock.sleep, clock.monotonic)


def test_sigterm_while_a_creates_answer_is_on_the_way_deletes_that_pod_too() -> None:
    class Interrupted(Core):
        def create_namespaced_pod(self, ns: str, body: dict[str, Any]) -> None:
            super().create_namespaced_pod(ns, body)  # the API server has it ...
            os.kill(os.getpid(), signal.SIGTERM)  # ... and the tool is told to stop

    calls: list[int] = []
    old = signal.signal(signal.SIGTERM, lambda signum, _f: calls.append(signum))
    try:
        core = Interrupted()
        probes = ProbePods(Api(core))  # type: ignore[arg-type]
        probes.launch("c-1", ["gpu-1"], 1)
        assert core.pods == {} and calls == [signal.SIGTERM]
        probes.cleanup()
    finally:
        signal.signal(signal.SIGTERM, old)


def test_a_create_the_api_server_refused_is_not_deleted_later() -> None:
    import pytest

    from rollout.errors import ExternalError

    class Taken(Core):
        def create_namespaced_pod(self, ns: str, body: dict[str, Any]) -> None:
            raise AnswerError(409, "AlreadyExists", {})

    core = Taken([_pod("rollout-probe-gpu-1-0-c-1", None)])  # another's pod of that name
    probes = ProbePods(Api(core))  # type: ignore[arg-type]
    with pytest.raises(ExternalError, match="create probe pod on gpu-1: 409 AlreadyExists"):
        probes.create(probe_manifest("gpu-1", "c-1", 0))
    probes.cleanup()
    assert "rollout-probe-gpu-1-0-c-1" in core.pods and probes.created == []
