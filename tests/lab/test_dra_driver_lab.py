"""The lab's real DRA driver (``sigs.k8s.io/dra-example-driver`` v0.4.0's kubelet plugin) beside
the real kubelet, and a node's allocation path following its labels (``rollout.lab.daemonsets``).

One real-kubelet kubeadm node for the module (8 GPUs from the fake device plugin). In file order:

* the node switched to DRA by its labels (``nvidia.com/gpu.deploy.device-plugin=false``,
  ``nvidia.com/dra-kubelet-plugin=true``, as NVIDIA's operator's DaemonSets select): the device
  plugin stops (allocatable 0, capacity kept), the driver starts and its ResourceSlice lists the
  node's 8 GPUs; a pod with a claim for 2 GPUs of class ``gpu.example.com`` is scheduled by the
  real scheduler and runs, the real kubelet having prepared the claim (its
  ``dra_manager_state``); with the class's ``extendedResourceName: nvidia.com/gpu`` a pod asking
  for ``nvidia.com/gpu: 1`` is served through DRA (KEP-5004, ``DRAExtendedResource``, which the
  lab's kube-apiserver reports enabled).
* ``rollout lab fault driver-stop``: the kubelet wipes the driver's slices about 30 s later;
  ``driver-start`` publishes them again; with the class mapping ``nvidia.com/gpu``, ``rollout
  nodes`` reports the node on the ``dra`` path, and on ``both`` (exit 10) once the device plugin
  registers again beside the driver; the labels switched back, the driver stops and the device
  plugin serves all 8 GPUs again.
* a node started on the DRA path and a canary kubelet-config change: the restarted kubelet wipes
  the node's slices, and verify waits until the driver has published them again (about 30 s)
  before the node is uncordoned (the journal's uncordon is after the new slices' creation).
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from rollout.cli.fleet import TWO_PATHS_EXIT
from rollout.lab import daemonsets as ds
from rollout.lab.cluster import Lab
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab]
GPU = "nvidia.com/gpu"
DP, DRA = ds.DEFAULT_LABELS[ds.DEVICE_PLUGIN], ds.DEFAULT_LABELS[ds.DRA_DRIVER]
RES = "/apis/resource.k8s.io/v1"


@pytest.fixture(scope="module")
def node(lab: Lab) -> Iterator[str]:
    name = "dra-real-1"
    lab.machines.add_nodes([name], ["kubeadm"], kubelet="real", timeout=120)
    try:
        yield name
    finally:
        lab.machines.remove_nodes([name])


def _label(lab: Lab, node: str, dp: str, dra: str) -> None:
    body = {"metadata": {"labels": {DP: dp, DRA: dra}}}
    code, out = lab.api.request(
        "PATCH", f"/api/v1/nodes/{node}", body, content_type="application/merge-patch+json"
    )
    assert code == 200, out


def _counts(lab: Lab, node: str) -> tuple[str, str]:
    code, body = lab.api.request("GET", f"/api/v1/nodes/{node}")
    assert code == 200, body
    st = body["status"]
    return str(st["capacity"].get(GPU, "0")), str(st["allocatable"].get(GPU, "0"))


def _create(lab: Lab, path: str, obj: dict[str, Any]) -> dict[str, Any]:
    code, body = lab.api.request("POST", path, obj)
    assert code == 201, body
    return dict(body)


def _pod(ns: str, name: str, node: str, **spec: Any) -> dict[str, Any]:
    container = {"name": "c", "image": "registry.k8s.io/pause", **spec.pop("container", {})}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "nodeSelector": {"kubernetes.io/hostname": node},
            "terminationGracePeriodSeconds": 0,
            "containers": [container],
            **spec,
        },
    }


def _running(lab: Lab, ns: str, name: str) -> dict[str, Any]:
    def get() -> dict[str, Any] | None:
        code, body = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods/{name}")
        assert code == 200, body
        return dict(body) if body["status"].get("phase") == "Running" else None

    try:
        return dict(ck.wait_for(get, 90, f"pod {name} Running", every=0.5))
    except AssertionError:
        _, ev = lab.api.request("GET", f"/api/v1/namespaces/{ns}/events")
        raise AssertionError([e.get("message") for e in ev.get("items", [])][-10:]) from None


def _delete_pods(lab: Lab, ns: str, names: list[str]) -> None:
    for n in names:
        lab.api.request("DELETE", f"/api/v1/namespaces/{ns}/pods/{n}")
    ck.wait_for(
        lambda: all(
            lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods/{n}")[0] == 404 for n in names
        ),
        90,
        "the pods gone",
        every=0.5,
    )


def _fault(lab: Lab, *args: str) -> dict[str, Any]:
    env = ck.env(lab, Path(lab.dir) / "state")
    where = ["--name", lab.name, "--workdir", str(lab.dir), "-o", "json"]
    r = ck.cli(["lab", "fault", *args, *where], env, timeout=180)
    assert r.returncode == 0, r.stderr
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


@pytest.mark.timeout(400)
def test_a_node_labelled_for_dra_runs_the_driver_and_serves_claims_and_the_extended_resource(
    lab: Lab, node: str, namespace: str
) -> None:
    root = lab.machines.node_root(node)
    assert _counts(lab, node) == ("8", "8")
    assert lab.devices.driver_slices(node) == []
    # the chart's DeviceClass exists with the lab's real nodes, without an extended resource
    code, dc = lab.api.request("GET", f"{RES}/deviceclasses/{ds.DEVICE_CLASS}")
    assert code == 200 and "extendedResourceName" not in dc["spec"], dc

    t0 = time.monotonic()
    _label(lab, node, dp="false", dra="true")
    ck.wait_for(lambda: _counts(lab, node)[1] == "0", 60, "plugin allocatable 0", every=0.25)
    devices = lab.devices.wait_slices(node, 8, timeout=60)
    switched = time.monotonic() - t0
    assert devices == [f"gpu-{i}" for i in range(8)]
    assert _counts(lab, node)[0] == "8"  # capacity stays (the kubelet's 5 min grace)
    assert (root / "var/lib/kubelet/plugins_registry/gpu.example.com-reg.sock").exists()

    # a claim for 2 GPUs: allocated by the real scheduler from this node's pool, prepared by
    # the real kubelet through the driver
    tmpl = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "two-gpus", "namespace": namespace},
        "spec": {
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "gpu", "exactly": {"deviceClassName": ds.DEVICE_CLASS, "count": 2}}
                    ]
                }
            }
        },
    }
    _create(lab, f"{RES}/namespaces/{namespace}/resourceclaimtemplates", tmpl)
    claimed = _pod(
        namespace,
        "with-claim",
        node,
        resourceClaims=[{"name": "gpus", "resourceClaimTemplateName": "two-gpus"}],
        container={"resources": {"claims": [{"name": "gpus"}]}},
    )
    _create(lab, f"/api/v1/namespaces/{namespace}/pods", claimed)
    pod = _running(lab, namespace, "with-claim")
    claim_name = pod["status"]["resourceClaimStatuses"][0]["resourceClaimName"]
    code, claim = lab.api.request(
        "GET", f"{RES}/namespaces/{namespace}/resourceclaims/{claim_name}"
    )
    assert code == 200, claim
    results = claim["status"]["allocation"]["devices"]["results"]
    assert {(r["driver"], r["pool"]) for r in results} == {(ds.DRIVER, node)}
    assert len(results) == 2
    state = (root / "var/lib/kubelet/dra_manager_state").read_text()
    assert claim["metadata"]["uid"] in state

    # KEP-5004: the extended resource through the class, the device plugin being off
    _, metrics = lab.api.request("GET", "/metrics")
    assert 'kubernetes_feature_enabled{name="DRAExtendedResource",stage="BETA"} 1' in str(metrics)
    lab.machines.device_class(GPU)
    try:
        er = _pod(
            namespace,
            "with-gpu",
            node,
            container={"resources": {"limits": {GPU: "1"}, "requests": {GPU: "1"}}},
        )
        _create(lab, f"/api/v1/namespaces/{namespace}/pods", er)
        pod = _running(lab, namespace, "with-gpu")
        ext = pod["status"].get("extendedResourceClaimStatus") or {}
        assert ext.get("resourceClaimName"), pod["status"]
        code, claim = lab.api.request(
            "GET", f"{RES}/namespaces/{namespace}/resourceclaims/{ext['resourceClaimName']}"
        )
        assert code == 200, claim
        results = claim["status"]["allocation"]["devices"]["results"]
        assert [(r["driver"], r["pool"]) for r in results] == [(ds.DRIVER, node)]
    finally:
        _delete_pods(lab, namespace, ["with-claim", "with-gpu"])
        lab.machines.device_class(None)
    print(f"labels switched to DRA, slices listing 8 GPUs after {switched:.1f}s")


@pytest.mark.timeout(400)
def test_driver_faults_nodes_paths_and_switching_back_to_the_device_plugin(
    lab: Lab, node: str, tmp_path: Path
) -> None:
    _label(lab, node, dp="false", dra="true")
    lab.devices.wait_slices(node, 8, timeout=60)
    root = lab.machines.node_root(node)

    stopped = _fault(lab, "driver-stop", node)
    assert stopped["state"] == "stopped" and stopped["changed"] is True
    t0 = time.monotonic()
    lab.devices.wait_slices(node, 0, timeout=75)  # the kubelet's wiping delay is 30 s
    wiped = time.monotonic() - t0
    assert wiped > 20, f"slices gone {wiped:.1f}s after the driver stopped: not the kubelet's wipe"

    started = _fault(lab, "driver-start", node)
    assert started["state"].startswith("running") and len(started["slices"]) == 8
    again = _fault(lab, "driver-start", node)
    assert again["changed"] is False

    # rollout nodes: one path per node, BOTH when the device plugin comes back beside DRA
    inv = lab.machines.write_inventory([node], tmp_path / "inv.ini")
    env = ck.env(lab, tmp_path / "state")
    lab.machines.device_class(GPU)
    try:
        r = ck.cli(["nodes", "-i", str(inv), "-o", "json"], env)
        assert r.returncode == 0, (r.returncode, r.stdout, r.stderr[-2000:])
        (row,) = [n for n in json.loads(r.stdout)["nodes"] if n["node"] == node]
        gpu = row["allocation"][GPU]
        assert (gpu["path"], gpu["drivers"], gpu["deviceClasses"]) == (
            "dra",
            [ds.DRIVER],
            [ds.DEVICE_CLASS],
        ), gpu
        assert gpu["allocatable"] == 0 and row["twoPaths"] == []
        _fault(lab, "plugin-start", node)  # the plugin registers again: 8 allocatable
        r = ck.cli(["nodes", "-i", str(inv)], env)
        assert r.returncode == TWO_PATHS_EXIT, (r.returncode, r.stdout, r.stderr[-2000:])
        assert f"paths {GPU}=BOTH" in r.stdout, r.stdout
        assert f"node {node}: {GPU} served by the device plugin and by DRA at once" in r.stderr
        _fault(lab, "plugin-stop", node)
    finally:
        lab.machines.device_class(None)

    # back to the device plugin: the driver stops at once, the plugin serves all 8 again
    _label(lab, node, dp="true", dra="false")
    ck.wait_for(lambda: _counts(lab, node) == ("8", "8"), 60, "allocatable 8", every=0.25)
    pidfile = root / ds.DRIVER_PID_FILE.lstrip("/")
    ck.wait_for(lambda: not pidfile.exists(), 30, "the driver stopped", every=0.25)
    log = (root / ds.AGENT_LOG.lstrip("/")).read_text()
    assert f"dra-driver: stop ({DRA}='false')" in log, log[-2000:]
    assert f"device-plugin: start ({DP}='true')" in log, log[-2000:]
    print(f"driver stopped: its slices wiped after {wiped:.1f}s")


def _slices(lab: Lab, node: str) -> list[dict[str, Any]]:
    code, body = lab.api.request(
        "GET", f"{RES}/resourceslices?fieldSelector=spec.nodeName={node},spec.driver={ds.DRIVER}"
    )
    assert code == 200, body
    return list(body.get("items") or [])


def _ts(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


@pytest.mark.timeout(500)
def test_a_kubelet_config_change_on_a_dra_node_uncordons_after_its_slices_are_back(
    lab: Lab, tmp_path: Path
) -> None:
    """The node starts on the DRA path (the device plugin never registered); the canary change
    restarts its kubelet, which wipes the node's slices; verify waits until the driver has
    published them again, and only then is the node uncordoned."""
    name = "dra-verify-1"
    lab.machines.add_nodes([name], ["kubeadm"], kubelet="real", timeout=120, path="dra")
    try:
        assert _counts(lab, name) == ("0", "0")  # never served by the device plugin
        before = {s["metadata"]["uid"] for s in _slices(lab, name)}
        assert before
        inv = ck.inventory(lab, [name], [name], tmp_path / "inv.ini")
        plan = ck.plan(tmp_path / "plan.yaml", {name: "kubeadm"})
        state = tmp_path / "state"
        args = ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"]
        seen: list[tuple[datetime, int]] = []  # (when, devices listed) while the change runs
        done = threading.Event()

        misses: list[str] = []  # reads that failed (a loaded API server): the sampler goes on

        def sample() -> None:
            while not done.is_set():
                try:
                    # a slice published without devices has no "devices" field at all
                    count = sum(len(s["spec"].get("devices") or []) for s in _slices(lab, name))
                except Exception as e:  # any failed read: note it and sample on
                    misses.append(str(e)[:200])
                    time.sleep(0.5)
                    continue
                if not seen or seen[-1][1] != count:
                    seen.append((datetime.now(UTC), count))
                time.sleep(0.5)

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        try:
            r = ck.cli([*args, "--verify-timeout", "180"], ck.env(lab, state), timeout=400)
        finally:
            done.set()
            sampler.join(timeout=10)
        ended = datetime.now(UTC)
        assert r.returncode == 0, r.stderr[-3000:]
        doc = json.loads(r.stdout)
        assert {n["node"]: n["state"] for n in doc["nodes"]}[name] == "applied", doc
        assert f"node {name}: devices of DRA driver(s) {ds.DRIVER} are DRA-managed" in r.stderr

        now = _slices(lab, name)
        assert sum(len(s["spec"]["devices"]) for s in now) == 8
        assert not before & {s["metadata"]["uid"] for s in now}, "the kubelet did not wipe them"
        journal = ck.latest_journal(state)
        assert journal is not None
        at = {
            (e.step, e.phase.value): _ts(e.ts)
            for e in journal.entries()
            if e.node == name and e.path is not None and e.path.value == "forward"
        }
        back = max(_ts(s["metadata"]["creationTimestamp"]) for s in now)
        # creationTimestamp has whole seconds: the slices were back within the second before
        assert at[("uncordon", "begin")] >= back, (at, back)
        waited = (at[("verify", "done")] - at[("verify", "begin")]).total_seconds()
        assert waited > 10, f"verify took {waited:.1f}s: it did not wait for the republish"
        wiped = next(t for t, c in seen if c == 0)
        again = next((t for t, c in seen if t > wiped and c == 8), None)
        if again is None:
            # the change ended within one look of the republish (its after evidence takes a
            # fraction of a second now): the slices read after it, created after the wipe, are
            # the republish, and uncordon began after them (asserted from creationTimestamp above)
            assert back >= wiped.replace(microsecond=0), ("no republish after the wipe", seen)
            again = min(back, ended)
        # the sampler looks every 0.5 s: it may see them a moment after verify did
        assert at[("uncordon", "begin")] >= again - timedelta(seconds=2), (seen, at, misses)
        apply_began = at[("apply", "begin")]
        print(
            f"verify on the DRA node waited {waited:.1f}s for its ResourceSlices; after the "
            f"apply began: wiped +{(wiped - apply_began).total_seconds():.1f}s, back "
            f"+{(again - apply_began).total_seconds():.1f}s, verify began "
            f"+{(at[('verify', 'begin')] - apply_began).total_seconds():.1f}s"
        )
    finally:
        lab.machines.remove_nodes([name])
