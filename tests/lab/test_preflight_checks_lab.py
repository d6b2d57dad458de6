"""The preflight checks the design asks for, each held through the CLI against the lab: each
test fails when its check is taken out of preflight (tried: see CHANGELOG, issue 40).

* the canary group must be alike: a canary node with another GPU model (PCI device id) and one
  with another NUMA layout (4 NUMA nodes of 16 CPUs, not 2 of 32) are refused by name by
  ``apply --canary --dry-run`` (``rollout.change.plan.batches.check_homogeneous``);
* one allocation path per device, by vendor domain: a DRA driver ``gpu.nvidia.com`` publishing a
  ResourceSlice for a node whose device plugin advertises ``nvidia.com/gpu``
  (``rollout.change.preflight.device_checks.check_vendor_domain``): on a node outside the canary it
  does not block ``apply --canary``; on the canary it is refused naming the node, and ``--force
  REASON`` overrides it: the change runs and the journal holds the reason and the refusal;
* a model-serving canary in progress (``rollout.kube.canaries``), with the projects' real CRDs
  installed (vendored in ``tests/fixtures/crds/``, versions in their headers): an Argo Rollout
  Paused, a Flagger Canary Progressing, a KServe InferenceService splitting its traffic and a
  Deployment rolling out with an old pod on the canary are each named in the refusal; a finished
  Rollout and a Deployment rolling out on a node outside the canary are not;
  ``--force-serving REASON`` overrides it and the journal holds the reason and what was in
  progress; ``promote --dry-run`` then names the Deployment rolling out on the node it changes
  (and not the one on the canary, moved already) until ``--force-serving``.

Sim kubelets throughout (nothing here needs the real one); dry runs prove the refusals, one real
canary apply each proves that the override runs the change and is journaled.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.lab.cluster import Lab
from rollout.lab.hardware import NodeShape
from tests.lab import changekit as ck

pytestmark = [pytest.mark.lab]
GPU = "nvidia.com/gpu"
CRDS = Path(__file__).resolve().parents[1] / "fixtures" / "crds"
CRD_API = "/apis/apiextensions.k8s.io/v1/customresourcedefinitions"
SLICES = "/apis/resource.k8s.io/v1/resourceslices"


def _ok(got: tuple[int, Any], *codes: int) -> Any:
    code, body = got
    assert code in (codes or (200, 201)), (code, body)
    return body


@pytest.fixture(scope="module")
def crds(lab: Lab) -> Iterator[list[str]]:
    """The Argo Rollouts, Flagger and KServe CRDs, as their releases install them; deleted after
    the module (with every object of theirs)."""
    names = []
    for f in sorted(CRDS.glob("*.yaml")):
        for doc in yaml.safe_load_all(f.read_text()):
            if doc:
                _ok(lab.api.request("POST", CRD_API, doc, timeout=60), 201, 409)
                names.append(doc["metadata"]["name"])

    def established() -> bool:
        for n in names:
            code, body = lab.api.request("GET", f"{CRD_API}/{n}")
            conds = {
                c["type"]: c["status"] for c in (body.get("status") or {}).get("conditions") or ()
            }
            if code != 200 or conds.get("Established") != "True":
                return False
        return True

    ck.wait_for(established, 60, "the CRDs Established")
    try:
        yield names
    finally:
        for n in names:
            lab.api.request("DELETE", f"{CRD_API}/{n}")


def _apply(inv: Path, plan: Path, *extra: str) -> list[str]:
    return ["apply", "--plan", str(plan), "-i", str(inv), "--canary", *extra]


def _refusals(stderr: str) -> str:
    """What follows "preflight refused the change" (the refusals, not the warnings)."""
    assert "preflight refused the change" in stderr, stderr[-3000:]
    return stderr.split("preflight refused the change", 1)[1]


@pytest.mark.timeout(300)
def test_an_odd_gpu_model_or_numa_layout_in_the_canary_is_refused_by_name(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    alike = lab_nodes(2).names
    (h200,) = lab_nodes(1, shape=NodeShape(gpu_device="0x2335")).names
    (four_numa,) = lab_nodes(
        1, shape=NodeShape(sockets=4, cores_per_socket=8, gpus_per_numa=2)
    ).names
    names = [*alike, h200, four_numa]
    inv = ck.inventory(lab, names, names, tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", dict.fromkeys(names, "kubeadm"))
    env = ck.env(lab, tmp_path / "state")

    r = ck.cli(_apply(inv, plan, "--dry-run"), env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    refused = [
        line.strip()
        for line in _refusals(r.stderr).splitlines()
        if "canary group is not homogeneous" in line
    ]
    gpu = [line for line in refused if "GPU model" in line]
    numa = [line for line in refused if "NUMA layout" in line]
    assert len(gpu) == 1 and f"node {h200} has GPU model " in gpu[0], refused
    assert "0x2335" in gpu[0] and "0x2330" in gpu[0], gpu
    assert len(numa) == 1 and f"node {four_numa} has NUMA layout " in numa[0], refused
    assert not any(f"node {n} " in line for n in alike for line in refused), refused
    assert not (tmp_path / "state").exists()  # nothing journaled, nothing written
    print(f"odd canary nodes refused: {time.monotonic() - started:.1f}s")


def _slice(node: str, driver: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-{driver}"},
        "spec": {
            "driver": driver,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": "gpu-0"}],
        },
    }


@pytest.mark.timeout(300)
def test_a_device_plugin_and_a_dra_driver_of_one_vendor_are_refused_on_the_canary_and_forced(
    lab: Lab, lab_nodes: Any, tmp_path: Path
) -> None:
    started = time.monotonic()
    canary, other = lab_nodes(2).names
    inv = ck.inventory(lab, [canary, other], [canary], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", {canary: "kubeadm", other: "kubeadm"})
    env = ck.env(lab, tmp_path / "state")
    driver = "gpu.nvidia.com"
    made = []
    try:
        # a node the canary does not change: not judged by apply --canary
        made.append(_ok(lab.api.request("POST", SLICES, _slice(other, driver)))["metadata"]["name"])
        r = ck.cli(_apply(inv, plan, "--dry-run"), env)
        assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
        assert f"node {other}: device plugin resource" not in r.stderr

        made.append(
            _ok(lab.api.request("POST", SLICES, _slice(canary, driver)))["metadata"]["name"]
        )
        r = ck.cli(_apply(inv, plan, "--dry-run"), env)
        assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
        refused = _refusals(r.stderr)
        assert (
            f"node {canary}: device plugin resource {GPU}=8 and DRA driver {driver} "
            "(ResourceSlices) both manage the same devices"
        ) in refused
        assert other not in refused
        assert "`rollout apply --force REASON` overrides" in refused

        why = "lab: the DRA driver is being introduced on purpose"
        r = ck.cli(_apply(inv, plan, "--yes", "--no-evidence", "--force", why), env)
        assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
        assert f"warning: forced (--force): node {canary}: device plugin resource" in r.stderr
        assert ck.states(tmp_path / "state") == {canary: "applied", other: "pending"}
        journal = ck.latest_journal(tmp_path / "state")
        assert journal is not None
        (forced,) = [e for e in journal.entries() if e.step == "preflight-forced"]
        assert forced.data["reason"] == why
        assert [x for x in forced.data["refusals"] if "DRA driver" in x] == [
            f"node {canary}: device plugin resource {GPU}=8 and DRA driver {driver} "
            "(ResourceSlices) both manage the same devices; exactly one allocation path must "
            "own each device"
        ]
    finally:
        for name in made:
            lab.api.request("DELETE", f"{SLICES}/{name}")
    print(f"vendor-domain refusal, scope, --force: {time.monotonic() - started:.1f}s")


def _deployment(name: str, node: str) -> dict[str, Any]:
    """One pod pinned to ``node``; a new revision surges a pod before the old one goes."""
    labels = {"app": name}
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": labels},
            "strategy": {"rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "nodeSelector": {"kubernetes.io/hostname": node},
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.invalid/model-server:1",
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ],
                },
            },
        },
    }


def _roll_out_stuck(lab: Lab, ns: str, names: list[str]) -> None:
    """A new revision of each Deployment whose pod can never be scheduled (1000 CPUs): the old
    pod stays beside it, as in a release held half way."""
    base = f"/apis/apps/v1/namespaces/{ns}/deployments"
    patch = {
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "server",
                            "image": "registry.invalid/model-server:2",
                            "resources": {"requests": {"cpu": "1000", "memory": "64Mi"}},
                        }
                    ]
                }
            }
        }
    }
    for n in names:
        _ok(
            lab.api.request(
                "PATCH", f"{base}/{n}", patch, content_type="application/strategic-merge-patch+json"
            )
        )

    def rolling() -> bool:
        for n in names:
            st = _ok(lab.api.request("GET", f"{base}/{n}")).get("status") or {}
            if not (st.get("replicas", 0) == 2 and st.get("updatedReplicas", 0) == 1):
                return False
        return True

    ck.wait_for(rolling, 90, "the Deployments rolling out (old pod beside the new one)")


def _running(lab: Lab, ns: str, app: str) -> bool:
    code, body = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3D{app}")
    return code == 200 and any(p["status"].get("phase") == "Running" for p in body["items"])


def _custom(lab: Lab, ns: str, path: str, body: dict[str, Any], status: dict[str, Any]) -> None:
    """Create a custom object and set its status as its controller would (status subresource)."""
    name = body["metadata"]["name"]
    base = f"/apis/{path}"
    created = _ok(lab.api.request("POST", base.format(ns=ns), body), 201)
    _ok(
        lab.api.request("PUT", f"{base.format(ns=ns)}/{name}/status", {**created, "status": status})
    )


ROLLOUT = "argoproj.io/v1alpha1/namespaces/{ns}/rollouts"
CANARY = "flagger.app/v1beta1/namespaces/{ns}/canaries"
ISVC = "serving.kserve.io/v1beta1/namespaces/{ns}/inferenceservices"


def _rollout(name: str) -> dict[str, Any]:
    labels = {"app": name}
    return {
        "apiVersion": "argoproj.io/v1alpha1",
        "kind": "Rollout",
        "metadata": {"name": name},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [{"name": "server", "image": "registry.invalid/llm:2"}]},
            },
            "strategy": {"canary": {"steps": [{"setWeight": 20}, {"pause": {}}]}},
        },
    }


@pytest.mark.timeout(420)
@pytest.mark.usefixtures("crds")
def test_a_serving_canary_in_progress_is_refused_and_force_serving_overrides(
    lab: Lab, lab_nodes: Any, namespace: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    ns = namespace
    canary, other = lab_nodes(2).names
    inv = ck.inventory(lab, [canary, other], [canary], tmp_path / "inv.ini")
    plan = ck.plan(tmp_path / "plan.yaml", {canary: "kubeadm", other: "kubeadm"})
    env = ck.env(lab, tmp_path / "state")
    deployments = f"/apis/apps/v1/namespaces/{ns}/deployments"
    _ok(lab.api.request("POST", deployments, _deployment("llm-server", canary)), 201)
    _ok(lab.api.request("POST", deployments, _deployment("embedder", other)), 201)
    for app in ("llm-server", "embedder"):
        ck.wait_for(lambda app=app: _running(lab, ns, app), 90, f"{app} running")
    _roll_out_stuck(lab, ns, ["llm-server", "embedder"])

    _custom(lab, ns, ROLLOUT, _rollout("llm"), {"phase": "Paused", "message": "CanaryPauseStep"})
    _custom(lab, ns, ROLLOUT, _rollout("done"), {"phase": "Healthy"})
    flagger = {
        "apiVersion": "flagger.app/v1beta1",
        "kind": "Canary",
        "metadata": {"name": "ranker"},
        "spec": {
            "targetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "ranker"},
            "service": {"port": 8080},
            "analysis": {"interval": "1m", "threshold": 5, "maxWeight": 50, "stepWeight": 10},
        },
    }
    _custom(lab, ns, CANARY, flagger, {"phase": "Progressing", "canaryWeight": 10})
    isvc = {
        "apiVersion": "serving.kserve.io/v1beta1",
        "kind": "InferenceService",
        "metadata": {"name": "sklearn-iris"},
        "spec": {
            "predictor": {
                "canaryTrafficPercent": 10,
                "model": {"modelFormat": {"name": "sklearn"}, "storageUri": "gs://models/v2"},
            }
        },
    }
    split = {
        "latestCreatedRevision": "sklearn-iris-predictor-00002",
        "latestReadyRevision": "sklearn-iris-predictor-00002",
        "latestRolledoutRevision": "sklearn-iris-predictor-00001",
        "previousRolledoutRevision": "sklearn-iris-predictor-00001",
        "traffic": [
            {
                "latestRevision": True,
                "percent": 10,
                "revisionName": "sklearn-iris-predictor-00002",
                "tag": "latest",
            },
            {
                "latestRevision": False,
                "percent": 90,
                "revisionName": "sklearn-iris-predictor-00001",
                "tag": "prev",
            },
        ],
    }
    _custom(lab, ns, ISVC, isvc, {"components": {"predictor": split}})
    print(f"serving canaries set up: {time.monotonic() - started:.1f}s")

    # --capacity-warn-only: the pinned old pod fits no other node (not what is tested here)
    r = ck.cli(_apply(inv, plan, "--dry-run", "--capacity-warn-only"), env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    refused = _refusals(r.stderr)
    assert f"Argo Rollout {ns}/llm is Paused: change the device-allocation layer" in refused
    assert f"Flagger Canary {ns}/ranker is Progressing" in refused
    assert (
        f"KServe InferenceService {ns}/sklearn-iris is rolling out (predictor traffic split "
        "sklearn-iris-predictor-00002 10%, sklearn-iris-predictor-00001 90%)"
    ) in refused
    assert f"Deployment {ns}/llm-server is rolling out ({ns}/llm-server-" in refused
    assert (
        f' on {canary}): Waiting for deployment "llm-server" rollout to finish: 1 old replicas '
        "are pending termination..."
    ) in refused
    assert f"{ns}/done" not in refused  # Healthy: finished
    assert "embedder" not in refused  # rolling out on a node the canary does not change
    assert "`--force-serving REASON` overrides" in refused
    assert not (tmp_path / "state").exists()

    why = "lab: the model canaries run on nodes outside this change"
    r = ck.cli(
        _apply(inv, plan, "--yes", "--capacity-warn-only", "--force-serving", why),
        env,
    )
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert f"warning: forced (--force-serving): Argo Rollout {ns}/llm is Paused" in r.stderr
    assert ck.states(tmp_path / "state") == {canary: "applied", other: "pending"}
    journal = ck.latest_journal(tmp_path / "state")
    assert journal is not None
    (forced,) = [e for e in journal.entries() if e.step == "serving-canary-forced"]
    assert forced.data["reason"] == why
    named = sorted(x.split(" is ")[0] for x in forced.data["inProgress"])
    assert named == [
        f"Argo Rollout {ns}/llm",
        f"Deployment {ns}/llm-server",
        f"Flagger Canary {ns}/ranker",
        f"KServe InferenceService {ns}/sklearn-iris",
    ]

    # promote changes the other node: the Deployment rolling out there is named now, the one on
    # the canary (moved already) is not; --force-serving goes on
    promote = ["promote", "--change", journal.change_id, "--dry-run", "--capacity-warn-only"]
    r = ck.cli(promote, env)
    assert r.returncode == 3, (r.returncode, r.stderr[-3000:])
    refused = _refusals(r.stderr)
    assert f"Deployment {ns}/embedder is rolling out ({ns}/embedder-" in refused, refused
    assert f" on {other}): Waiting for deployment" in refused
    assert "llm-server" not in refused
    assert f"KServe InferenceService {ns}/sklearn-iris" in refused
    r = ck.cli([*promote, "--force-serving", why], env)
    assert r.returncode == 0, (r.returncode, r.stderr[-3000:])
    assert f"warning: forced (--force-serving): Deployment {ns}/embedder" in r.stderr
    for path, name in (
        (ROLLOUT, "llm"),
        (ROLLOUT, "done"),
        (CANARY, "ranker"),
        (ISVC, "sklearn-iris"),
    ):
        lab.api.request("DELETE", f"/apis/{path.format(ns=ns)}/{name}")
    for name in ("llm-server", "embedder"):
        lab.api.request("DELETE", f"{deployments}/{name}")
    print(f"serving canaries refused and forced: {time.monotonic() - started:.1f}s")
