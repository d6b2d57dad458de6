"""Entry point: ``python -m rollout.lab.kubelet --node-config /etc/rollout-lab/node.json``.

Start-up mirrors the kubelet's order: load the configuration from the node's files, refuse to run
on the errors the kubelet exits with (lint's ``startup_errors``), restore the CPU and Memory
manager checkpoints (exit 1 with the kubelet's messages on a mismatch), then serve, register the
Node, keep the Lease fresh and admit pods. See the package docstring for the contract.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from rollout.lab.kubelet import admission as adm
from rollout.lab.kubelet import node as nodeapi
from rollout.lab.kubelet.apiclient import APIClient, APIError, Endpoint
from rollout.lab.kubelet.klog import log
from rollout.lab.kubelet.metrics import Metrics
from rollout.lab.kubelet.startup import (
    ManagerState,
    StartupError,
    check_startup,
    gpu_ids,
    kubelet_minor,
    load_config,
)

LEASE_DURATION = 10
LEASE_RENEW = 2.0
STATUS_EVERY = 10.0


# ------------------------------------------------------------------------------------- kubelet
class LabKubelet:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.name = str(cfg["nodeName"])
        self.root = Path(str(cfg.get("nodeRoot") or "/"))
        self.topology = gpu_ids(cfg.get("topology") or {})
        self.metrics = Metrics()
        self.lock = threading.Lock()
        self.pod_ips: dict[str, str] = {}
        self.running: dict[str, dict[str, Any]] = {}
        self.done: set[str] = set()  # uids decided (rejected or admitted)
        self.boot_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, self.name))
        self.ready_since = time.time()
        self.node_uid: str | None = None
        self.config: dict[str, Any] = {}

    # ---------------------------------------------------------------- start-up checks
    def host(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def start_checks(self) -> None:
        self.config, root_dir, flags = load_config(self.cfg, self.root)
        check_startup(self.cfg, self.config, flags)
        self.state = ManagerState(
            self.config, self.topology, self.host(root_dir), root_dir, kubelet_minor(self.cfg)
        )
        self.state.restore()

    # ---------------------------------------------------------------- HTTP endpoints
    def configz(self) -> dict[str, Any]:
        """As the kubelet serves it: the merged config after the kubelet's defaulting, with its
        apiVersion and kind (:mod:`rollout.lab.kubelet.defaults`)."""
        from rollout.lab.kubelet.defaults import defaulted

        return {"kubeletconfig": defaulted(self.config)}

    def metrics_text(self) -> str:
        return self.metrics.render()

    def pods(self) -> dict[str, Any]:
        with self.lock:
            items = list(self.running.values())
        return {"kind": "PodList", "apiVersion": "v1", "metadata": {}, "items": items}

    # ---------------------------------------------------------------- API: node and lease
    def client(self) -> APIClient:
        c = self.cfg
        url = str(c.get("apiserverURL") or "") or None
        sock = None if url else str(c.get("apiserverSocket") or "") or None
        return APIClient(
            Endpoint(
                ca=str(self.host(str(c["apiserverCA"]))),
                cert=str(self.host(str(c["clientCert"]))),
                key=str(self.host(str(c["clientKey"]))),
                socket_path=sock,
                url=url,
                server_hostname="127.0.0.1",
            )
        )

    def register(self, api: APIClient) -> None:
        body = nodeapi.node_object(self.cfg, self.config)
        try:
            created = api.post("/api/v1/nodes", body)
            self.node_uid = created["metadata"]["uid"]
            log("I", "kubelet_node_status.go:79", "Successfully registered node", node=self.name)
        except APIError as e:
            if e.status != 409:
                raise
            got = api.patch(f"/api/v1/nodes/{self.name}", {"metadata": body["metadata"]})
            self.node_uid = got["metadata"]["uid"]
        self.post_status(api)

    def post_status(self, api: APIClient) -> None:
        status = nodeapi.node_status(
            self.cfg,
            self.config,
            now=time.time(),
            ready_since=self.ready_since,
            boot_id=self.boot_id,
        )
        api.patch(f"/api/v1/nodes/{self.name}/status", {"status": status}, kind="strategic")

    def lease_loop(self, api: APIClient) -> None:
        path = f"/apis/coordination.k8s.io/v1/namespaces/{nodeapi.LEASE_NAMESPACE}/leases"
        rv: str | None = None
        last_status = 0.0
        while True:
            now = time.time()
            try:
                if rv is None:
                    try:
                        rv = api.get(f"{path}/{self.name}")["metadata"]["resourceVersion"]
                    except APIError as e:
                        if e.status != 404:
                            raise
                        body = nodeapi.lease_object(
                            self.name, self.node_uid, now=now, duration=LEASE_DURATION
                        )
                        rv = api.post(path, body)["metadata"]["resourceVersion"]
                        continue
                body = nodeapi.lease_object(
                    self.name, self.node_uid, now=now, duration=LEASE_DURATION, rv=rv
                )
                rv = api.put(f"{path}/{self.name}", body)["metadata"]["resourceVersion"]
                if now - last_status >= STATUS_EVERY:
                    self.post_status(api)
                    last_status = now
            except (APIError, OSError) as e:
                rv = None
                log("E", "controller.go:145", "Failed to update lease", err=str(e))
            time.sleep(LEASE_RENEW)

    # ---------------------------------------------------------------- pods
    def handle(self, api: APIClient, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        phase = (pod.get("status") or {}).get("phase", "Pending")
        if meta.get("deletionTimestamp"):
            self.release(uid)
            try:
                api.delete(
                    f"/api/v1/namespaces/{ns}/pods/{name}",
                    {
                        "kind": "DeleteOptions",
                        "apiVersion": "v1",
                        "gracePeriodSeconds": 0,
                        "preconditions": {"uid": uid},
                    },
                )
            except APIError as e:
                if e.status not in (404, 409):
                    raise
            return
        if phase in ("Failed", "Succeeded"):
            self.done.add(uid)
            self.release(uid)
            return
        if uid in self.done:
            return
        with self.lock:
            held_already = uid in self.state.allocations
        if phase == "Running" and held_already:
            self.done.add(uid)
            with self.lock:
                self.pod_ips[uid] = (pod.get("status") or {}).get("podIP") or ""
                self.running[uid] = pod
            return
        try:
            self.admit(api, pod)
        except (APIError, OSError):
            self.done.discard(uid)  # decide again on the next event or re-list
            raise

    def admit(self, api: APIClient, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        req = adm.pod_request(pod)
        start = time.perf_counter()
        with self.lock:
            held = [a for u, a in self.state.allocations.items() if u != uid]
        decision = adm.admit(self.state.machine, self.state.policy, held, req)
        ms = (time.perf_counter() - start) * 1000
        qos = nodeapi.qos_class(pod, req.guaranteed)
        self.done.add(uid)
        if not decision.admit:
            self.metrics.admission(ms, decision.reason)
            log(
                "I",
                "predicate.go:212",
                "Predicate failed on Pod",
                pod=f"{ns}/{name}",
                err=decision.message,
            )
            now = time.time()
            api.post(
                f"/api/v1/namespaces/{ns}/events",
                nodeapi.event_object(
                    pod,
                    self.name,
                    reason=decision.reason,
                    message=decision.message,
                    now=now,
                    kind="Warning",
                ),
            )
            api.patch(
                f"/api/v1/namespaces/{ns}/pods/{name}/status",
                nodeapi.rejected_status(qos, decision.reason, decision.status_message),
            )
            return
        self.metrics.admission(ms, None)
        with self.lock:
            self.state.allocations[uid] = decision.allocation
            ip = (pod.get("status") or {}).get("podIP") or nodeapi.pod_ip(
                str(self.cfg["nodeIP"]), self.pod_ips.values(), self.cfg.get("podCIDR")
            )
            self.pod_ips[uid] = ip
            self.state.persist()
        if (pod.get("status") or {}).get("phase") == "Running":
            # re-admitted after a restart: the containers kept running, the status stays
            got = pod
        else:
            patch = nodeapi.running_status(
                pod, node_ip=str(self.cfg["nodeIP"]), pod_ip=ip, qos=qos, now=time.time()
            )
            got = api.patch(f"/api/v1/namespaces/{ns}/pods/{name}/status", patch)
        with self.lock:
            self.running[uid] = got

    def release(self, uid: str) -> None:
        with self.lock:
            changed = self.state.allocations.pop(uid, None) is not None
            self.pod_ips.pop(uid, None)
            self.running.pop(uid, None)
            if changed:
                self.state.persist()

    def pods_loop(self, api: APIClient) -> None:
        sel = {"fieldSelector": f"spec.nodeName={self.name}"}
        rv: str | None = None
        while True:
            try:
                if rv is None:
                    lst = api.get(f"/api/v1/pods?fieldSelector=spec.nodeName%3D{self.name}")
                    rv = lst["metadata"]["resourceVersion"]
                    seen = set()
                    for p in lst.get("items") or ():
                        seen.add(p["metadata"]["uid"])
                        self.handle(api, p)
                    for uid in list(self.state.allocations):
                        if uid not in seen:
                            self.release(uid)
                for ev in api.watch("/api/v1/pods", {**sel, "resourceVersion": rv}):
                    obj = ev.get("object") or {}
                    if ev.get("type") == "ERROR":
                        rv = None
                        break
                    rv = (obj.get("metadata") or {}).get("resourceVersion", rv)
                    if ev.get("type") == "BOOKMARK":
                        continue
                    if ev.get("type") == "DELETED":
                        self.release(str(obj["metadata"]["uid"]))
                        continue
                    self.handle(api, obj)
            except (APIError, OSError, ValueError) as e:
                log("E", "config.go:153", "Failed to watch pods", err=str(e))
                rv = None
                time.sleep(1.0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rollout.lab.kubelet")
    ap.add_argument("--node-config", default="/etc/rollout-lab/node.json")
    args = ap.parse_args(argv)
    cfg = json.loads(Path(args.node_config).read_text())
    log("I", "server.go:530", "Kubelet version", kubeletVersion=cfg.get("kubeletVersion", ""))
    kubelet = LabKubelet(cfg)
    try:
        kubelet.start_checks()
    except StartupError:
        return 1
    from rollout.lab.kubelet.server import serve, serve_healthz

    hport = int(kubelet.config.get("healthzPort", 10248) or 0)
    if hport:
        serve_healthz(str(kubelet.config.get("healthzBindAddress") or "127.0.0.1"), hport)

    serve(
        str(cfg["nodeIP"]),
        int(cfg.get("kubeletPort", 10250)),
        cert=str(kubelet.host(str(cfg["servingCert"]))),
        key=str(kubelet.host(str(cfg["servingKey"]))),
        client_ca=str(kubelet.host(str(cfg["apiserverCA"]))),
        endpoints=_Endpoints(kubelet),
    )
    log("I", "server.go:1262", "Started kubelet")
    api = kubelet.client()
    while True:
        try:
            kubelet.register(api)
            break
        except (APIError, OSError) as e:
            log(
                "E",
                "kubelet_node_status.go:107",
                "Unable to register node with API server",
                err=str(e),
                node=kubelet.name,
            )
            time.sleep(1.0)
    threading.Thread(target=kubelet.lease_loop, args=(api,), daemon=True, name="lease").start()
    kubelet.pods_loop(api)
    return 0


class _Endpoints:
    def __init__(self, k: LabKubelet) -> None:
        self.k = k

    def configz(self) -> dict[str, Any]:
        return self.k.configz()

    def metrics(self) -> str:
        return self.k.metrics_text()

    def pods(self) -> dict[str, Any]:
        return self.k.pods()


if __name__ == "__main__":
    sys.exit(main())
