"""Entry point: ``python -m rollout.lab.kubelet --node-config /etc/rollout-lab/node.json``.

Start-up mirrors the kubelet's order: load the configuration from the node's files, refuse to run
on the errors the kubelet exits with (lint's ``startup_errors``), restore the CPU and Memory
manager checkpoints (exit 1 with the kubelet's messages on a mismatch), then serve, register the
Node, keep the Lease fresh and admit pods. See the package docstring for the contract.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout.kubelet import checkpoints as ck
from rollout.kubelet import cpuset
from rollout.lab.kubelet import admission as adm
from rollout.lab.kubelet import node as nodeapi
from rollout.lab.kubelet.apiclient import APIClient, APIError, Endpoint
from rollout.lab.kubelet.klog import log
from rollout.lab.kubelet.metrics import Metrics

LEASE_DURATION = 10
LEASE_RENEW = 2.0
STATUS_EVERY = 10.0
DEVICE_STATE_FILE = "rollout-lab-devices.json"


class StartupError(Exception):
    """The kubelet would exit 1 here; the message lines are already logged."""


# ------------------------------------------------------------------------------- configuration
def load_config(cfg: Mapping[str, Any], root: Path) -> tuple[dict[str, Any], str]:
    """The effective configuration and the checkpoint directory (``--root-dir``), on the node."""
    from rollout.errors import InputError
    from rollout.kubelet import loading

    try:
        files = loading.load_node(str(cfg["distribution"]), root)
        eff = loading.effective(files)
    except InputError as e:
        log(
            "E",
            "run.go:72",
            "command failed",
            err=f"failed to load kubelet config file, error: {e}",
        )
        raise StartupError(str(e)) from e
    for note in eff.notes:
        log("I", "server.go:651", note)
    return eff.config, eff.root_dir


def node_facts(topology: Mapping[str, Any]) -> Any:
    from rollout.kubelet.facts import GPU, NodeFacts, NUMANode

    numa = []
    gpus = []
    online: set[int] = set()
    for n in topology.get("numaNodes") or ():
        cpus = cpuset.parse(str(n.get("cpus", "")))
        online |= cpus
        numa.append(NUMANode(int(n["id"]), cpus, n.get("memoryBytes")))
        for g in n.get("gpus") or ():
            gid = g.get("pciAddress") or g.get("id") if isinstance(g, dict) else str(g)
            gpus.append(GPU(str(gid), int(n["id"])))
    return NodeFacts(
        frozenset(online), tuple(numa), sockets=topology.get("sockets"), gpus=tuple(gpus)
    )


def check_startup(cfg: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    from rollout.kubelet import validation

    findings = validation.startup_errors(
        config,
        node_facts(cfg.get("topology") or {}),
        kubelet_version=str(cfg.get("kubeletVersion") or "") or None,
    )
    for f in findings:
        log("E", "run.go:72", "command failed", err=f"failed to run Kubelet: {f.message}")
    if findings:
        raise StartupError(findings[0].message)


def _gpu_ids(topology: Mapping[str, Any]) -> dict[str, Any]:
    """node.json lists GPUs as ids or as {"id", "pciAddress"} objects: normalise to ids."""
    topo = dict(topology)
    nodes = []
    for n in topology.get("numaNodes") or ():
        n = dict(n)
        n["gpus"] = [g.get("id") if isinstance(g, dict) else str(g) for g in n.get("gpus") or ()]
        nodes.append(n)
    topo["numaNodes"] = nodes
    return topo


# ------------------------------------------------------------------------------------- kubelet
class LabKubelet:
    def __init__(self, cfg: dict[str, Any]) -> None:
        self.cfg = cfg
        self.name = str(cfg["nodeName"])
        self.root = Path(str(cfg.get("nodeRoot") or "/"))
        self.topology = _gpu_ids(cfg.get("topology") or {})
        self.metrics = Metrics()
        self.lock = threading.Lock()
        self.allocations: dict[str, adm.Allocation] = {}
        self.pod_ips: dict[str, str] = {}
        self.running: dict[str, dict[str, Any]] = {}
        self.done: set[str] = set()  # uids decided (rejected or admitted)
        self.boot_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, self.name))
        self.ready_since = time.time()
        self.node_uid: str | None = None
        self.config: dict[str, Any] = {}
        self.state_dir = Path("/var/lib/kubelet")

    # ---------------------------------------------------------------- start-up checks
    def host(self, node_path: str) -> Path:
        return self.root / node_path.lstrip("/")

    def start_checks(self) -> None:
        self.config, root_dir = load_config(self.cfg, self.root)
        self.state_dir = self.host(root_dir)
        self.node_root_dir = root_dir
        check_startup(self.cfg, self.config)
        c = self.config
        self.policy = adm.Policy(
            cpu=str(c.get("cpuManagerPolicy") or "none"),
            topology=str(c.get("topologyManagerPolicy") or "none"),
            scope=str(c.get("topologyManagerScope") or "container"),
            memory=str(c.get("memoryManagerPolicy") or "None"),
        )
        reserved = (
            nodeapi.reserved_cpus(c, self.topology) if self.policy.cpu == "static" else frozenset()
        )
        self.machine = adm.machine_from_topology(
            self.topology, reserved, nodeapi.reserved_memory(c)
        )
        opts = c.get("cpuManagerPolicyOptions") or {}
        self.strict = str(opts.get("strict-cpu-reservation", "false")).lower() == "true"
        self._restore_cpu()
        self._restore_memory()
        self._restore_devices()

    def _fail(self, where: str, prefix: str, err: str, detail: str) -> None:
        log("E", where, detail, err=err)
        log("E", "kubelet.go:1693", "Failed to start ContainerManager", err=f"{prefix}{err}")
        raise StartupError(err)

    def _restore_cpu(self) -> None:
        path = self.state_dir / ck.CPU_STATE_FILE
        node_path = f"{self.node_root_dir.rstrip('/')}/{ck.CPU_STATE_FILE}"
        m = self.machine
        if path.exists():
            try:
                state = ck.parse_cpu(path.read_text())
            except (OSError, ck.CheckpointError) as e:
                err = ck.CPU_RESTORE_ERROR.format(err=str(e), path=node_path)
                self._fail(
                    "cpu_manager.go:236",
                    "start cpu manager error: ",
                    err,
                    "Could not initialize checkpoint manager, please drain node and "
                    "remove policy state file",
                )
                return
            err2 = ck.cpu_start_error(
                node_path,
                self.policy.cpu,
                state,
                all_cpus=m.all_cpus,
                reserved=m.reserved_cpus,
                strict=self.strict,
            )
            if err2 is not None:
                if err2.startswith("could not restore"):
                    self._fail(
                        "cpu_manager.go:236",
                        "start cpu manager error: ",
                        err2,
                        "Could not initialize checkpoint manager, please drain node and "
                        "remove policy state file",
                    )
                self._fail(
                    "policy_static.go:236",
                    "start cpu manager error: ",
                    err2,
                    "Static policy invalid state, please drain node and remove policy state file",
                )
            for uid, ctrs in state.entries.items():
                self.allocations[uid] = adm.Allocation(
                    cpus={c: cpuset.parse(s) for c, s in ctrs.items()}
                )
        self._write_cpu()

    def _restore_memory(self) -> None:
        path = self.state_dir / ck.MEMORY_STATE_FILE
        node_path = f"{self.node_root_dir.rstrip('/')}/{ck.MEMORY_STATE_FILE}"
        if path.exists():
            try:
                state = ck.parse_memory(path.read_text())
            except (OSError, ck.CheckpointError) as e:
                err = ck.MEMORY_RESTORE_ERROR.format(err=str(e), path=node_path)
                self._fail(
                    "memory_manager.go:210",
                    "start memory manager error: ",
                    err,
                    "Could not initialize checkpoint manager, please drain node and "
                    "remove policy state file",
                )
                return
            expected = self._expected_memory(state.entries)
            err2 = ck.memory_start_error(node_path, self.policy.memory, state, expected)
            if err2 is not None:
                self._fail(
                    "memory_manager.go:210",
                    "start memory manager error: ",
                    err2,
                    "Could not initialize checkpoint manager, please drain node and "
                    "remove policy state file",
                )
            for uid, ctrs in state.entries.items():
                prev = self.allocations.get(uid, adm.Allocation())
                mem: dict[str, dict[int, int]] = {}
                for c, blocks in ctrs.items():
                    for b in blocks:
                        if b.type == "memory" and b.numa_affinity:
                            mem.setdefault(c, {})[b.numa_affinity[0]] = b.size
                self.allocations[uid] = adm.Allocation(prev.cpus, prev.gpus, mem)
        self._write_memory()

    def _expected_memory(self, entries: Mapping[str, Any]) -> dict[int, ck.NUMAState]:
        base = ck.memory_machine_state(
            {n.id: n.memory for n in self.machine.numa}, self.machine.reserved_memory
        )
        counts: dict[int, int] = {}
        used: dict[int, int] = {}
        for ctrs in entries.values():
            for blocks in ctrs.values():
                for b in blocks:
                    for n in b.numa_affinity:
                        counts[n] = counts.get(n, 0) + 1
                    if b.numa_affinity:
                        used[b.numa_affinity[0]] = used.get(b.numa_affinity[0], 0) + b.size
        out = {}
        for n, s in base.items():
            t = s.memory_map["memory"]
            table = ck.MemoryTable(
                t.total,
                t.system_reserved,
                t.allocatable,
                used.get(n, 0),
                t.allocatable - used.get(n, 0),
            )
            out[n] = ck.NUMAState(counts.get(n, 0), {"memory": table}, s.cells)
        return out

    def _restore_devices(self) -> None:
        path = self.state_dir / DEVICE_STATE_FILE
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            return
        for uid, ctrs in (data or {}).items():
            prev = self.allocations.get(uid, adm.Allocation())
            self.allocations[uid] = adm.Allocation(
                prev.cpus, {c: tuple(g) for c, g in ctrs.items()}, prev.memory
            )

    # ---------------------------------------------------------------- checkpoint writes
    def _atomic(self, path: Path, text: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(text)
        os.replace(tmp, path)

    def _write_cpu(self) -> None:
        m = self.machine
        entries = {
            uid: {c: cpuset.format_cpus(s) for c, s in a.cpus.items()}
            for uid, a in self.allocations.items()
            if a.cpus
        }
        if self.policy.cpu == "static":
            held = frozenset().union(*(a.all_cpus() for a in self.allocations.values()))
            pool = m.all_cpus - held - (m.reserved_cpus if self.strict else frozenset())
            cp = ck.cpu_checkpoint("static", pool, entries)
        else:
            cp = ck.cpu_checkpoint(self.policy.cpu, (), {})
        self._atomic(self.state_dir / ck.CPU_STATE_FILE, ck.render_cpu(cp))

    def _write_memory(self) -> None:
        if self.policy.memory != "Static":
            cp = ck.memory_checkpoint(self.policy.memory, {})
        else:
            entries = {
                uid: {
                    c: tuple(ck.MemoryBlock((n,), "memory", b) for n, b in sorted(per.items()))
                    for c, per in a.memory.items()
                }
                for uid, a in self.allocations.items()
                if a.memory
            }
            cp = ck.memory_checkpoint("Static", self._expected_memory(entries), entries)
        self._atomic(self.state_dir / ck.MEMORY_STATE_FILE, ck.render_memory(cp))

    def _write_devices(self) -> None:
        data = {uid: dict(a.gpus) for uid, a in self.allocations.items() if a.gpus}
        self._atomic(self.state_dir / DEVICE_STATE_FILE, json.dumps(data, sort_keys=True))

    def _persist(self) -> None:
        self._write_cpu()
        self._write_memory()
        self._write_devices()

    # ---------------------------------------------------------------- HTTP endpoints
    def configz(self) -> dict[str, Any]:
        return {"kubeletconfig": self.config}

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
            held_already = uid in self.allocations
        if phase == "Running" and held_already:
            self.done.add(uid)
            with self.lock:
                self.pod_ips[uid] = (pod.get("status") or {}).get("podIP") or ""
                self.running[uid] = pod
            return
        self.admit(api, pod)

    def admit(self, api: APIClient, pod: dict[str, Any]) -> None:
        meta = pod.get("metadata") or {}
        uid = str(meta.get("uid", ""))
        ns, name = meta.get("namespace", "default"), meta.get("name", "")
        req = adm.pod_request(pod)
        start = time.perf_counter()
        with self.lock:
            held = [a for u, a in self.allocations.items() if u != uid]
        decision = adm.admit(self.machine, self.policy, held, req)
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
            self.allocations[uid] = decision.allocation
            ip = (pod.get("status") or {}).get("podIP") or nodeapi.pod_ip(
                str(self.cfg["nodeIP"]), self.pod_ips.values(), self.cfg.get("podCIDR")
            )
            self.pod_ips[uid] = ip
            self._persist()
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
            changed = self.allocations.pop(uid, None) is not None
            self.pod_ips.pop(uid, None)
            self.running.pop(uid, None)
            if changed:
                self._persist()

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
                    for uid in list(self.allocations):
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
    from rollout.lab.kubelet.server import serve

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
