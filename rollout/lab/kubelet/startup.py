"""Start-up as the kubelet does it: configuration, lint's start-up errors, manager checkpoints.

The kubelet exits 1 (and systemd restarts it) when its configuration is invalid or when the CPU or
Memory manager cannot restore its checkpoint; it then logs the error twice, once where it happens
and once as ``"Failed to start ContainerManager"``. :class:`ManagerState` restores and keeps the
checkpoint files (``cpu_manager_state``, ``memory_manager_state`` and the device manager's
``device-plugins/kubelet_internal_checkpoint``, all in the kubelet's format) and the exclusive
allocations they record.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from rollout.kubelet import checkpoints as ck
from rollout.kubelet import cpuset
from rollout.kubelet import device_checkpoint as dck
from rollout.kubelet import memory_state as mck
from rollout.lab.kubelet import admission as adm
from rollout.lab.kubelet import node as nodeapi
from rollout.lab.kubelet.klog import log

DEVICE_STATE_FILE = dck.DEVICE_CHECKPOINT_FILE


class StartupError(Exception):
    """The kubelet would exit 1 here; the message lines are already logged."""


# ------------------------------------------------------------------------------- configuration
def load_config(cfg: Mapping[str, Any], root: Path) -> tuple[dict[str, Any], str, dict[str, Any]]:
    """The effective configuration, the checkpoint directory (``--root-dir``) and the flags the
    node's files pass (name -> origin), on the node."""
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
    return eff.config, eff.root_dir, dict(eff.flag_origins)


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


def kubelet_minor(cfg: Mapping[str, Any]) -> int | None:
    """The minor of the version this kubelet plays (node.json ``kubeletVersion``)."""
    m = re.match(r"v?1\.(\d+)", str(cfg.get("kubeletVersion") or ""))
    return int(m.group(1)) if m else None


def check_startup(
    cfg: Mapping[str, Any], config: Mapping[str, Any], flags: Mapping[str, Any] | None = None
) -> None:
    """Exit as the kubelet of node.json's ``kubeletVersion`` would on this config and these
    flags (e.g. a cAdvisor flag the 1.37 kubelet dropped)."""
    from rollout.kubelet import validation

    findings = validation.startup_errors(
        config,
        node_facts(cfg.get("topology") or {}),
        kubelet_version=str(cfg.get("kubeletVersion") or "") or None,
        flags=flags,
        distribution=str(cfg.get("distribution") or "") or None,
    )
    for f in findings:
        log("E", "run.go:72", "command failed", err=f"failed to run Kubelet: {f.message}")
    if findings:
        raise StartupError(findings[0].message)


def gpu_ids(topology: Mapping[str, Any]) -> dict[str, Any]:
    """node.json lists GPUs as ids or as {"id", "pciAddress"} objects: normalise to ids."""
    topo = dict(topology)
    nodes = []
    for n in topology.get("numaNodes") or ():
        n = dict(n)
        n["gpus"] = [g.get("id") if isinstance(g, dict) else str(g) for g in n.get("gpus") or ()]
        nodes.append(n)
    topo["numaNodes"] = nodes
    return topo


class ManagerState:
    """The CPU / Memory / device managers' state on disk and in memory."""

    def __init__(
        self,
        config: Mapping[str, Any],
        topology: Mapping[str, Any],
        state_dir: Path,
        root_dir: str,
        kubelet_minor: int | None = None,
    ) -> None:
        self.state_dir = state_dir
        #: the 1.37 kubelet writes and reads memory_manager_state in the V3 layout (#139626)
        self.memory_v3 = (kubelet_minor or 0) >= 37
        #: the minor whose CPU checkpoint code this kubelet plays (unset: 1.36, as for memory):
        #: 1.37 reads V4 (data) first and writes V4 (#139102), 1.36 reads the V2 fields and
        #: writes V2, both as the kubelet's own code (tests/fixtures/kubelet/checkpoints-v1.37.2)
        self.cpu_minor = kubelet_minor if (kubelet_minor or 0) >= 37 else 36
        gates = config.get("featureGates")
        self.gates: dict[str, Any] = dict(gates) if isinstance(gates, Mapping) else {}
        self.node_root_dir = root_dir
        self.policy = adm.Policy(
            cpu=str(config.get("cpuManagerPolicy") or "none"),
            topology=str(config.get("topologyManagerPolicy") or "none"),
            scope=str(config.get("topologyManagerScope") or "container"),
            memory=str(config.get("memoryManagerPolicy") or "None"),
            cpu_options={
                str(k): str(v) for k, v in (config.get("cpuManagerPolicyOptions") or {}).items()
            },
            topology_options={
                str(k): str(v)
                for k, v in (config.get("topologyManagerPolicyOptions") or {}).items()
            },
        )
        reserved = (
            nodeapi.reserved_cpus(config, topology) if self.policy.cpu == "static" else frozenset()
        )
        self.machine = adm.machine_from_topology(
            topology, reserved, nodeapi.reserved_memory(config)
        )
        opts = config.get("cpuManagerPolicyOptions") or {}
        self.strict = str(opts.get("strict-cpu-reservation", "false")).lower() == "true"
        self.allocations: dict[str, adm.Allocation] = {}

    def restore(self) -> None:
        """Restore (or create) the checkpoints; raise StartupError where the kubelet exits."""
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
                state = ck.parse_cpu(
                    path.read_text(), kubelet_minor=self.cpu_minor, gates=self.gates
                )
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
                kubelet_minor=self.cpu_minor,
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
                state = mck.parse_memory(path.read_text(), reads_v3=self.memory_v3)
            except (OSError, ck.CheckpointError) as e:
                err = mck.MEMORY_RESTORE_ERROR.format(err=str(e), path=node_path)
                self._fail(
                    "memory_manager.go:210",
                    "start memory manager error: ",
                    err,
                    "Could not initialize checkpoint manager, please drain node and "
                    "remove policy state file",
                )
                return
            expected = self._expected_memory(state.entries)
            err2 = mck.memory_start_error(node_path, self.policy.memory, state, expected)
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

    def _expected_memory(self, entries: Mapping[str, Any]) -> dict[int, mck.NUMAState]:
        base = mck.memory_machine_state(
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
            table = mck.MemoryTable(
                t.total,
                t.system_reserved,
                t.allocatable,
                used.get(n, 0),
                t.allocatable - used.get(n, 0),
            )
            out[n] = mck.NUMAState(counts.get(n, 0), {"memory": table}, s.cells)
        return out

    def _restore_devices(self) -> None:
        """Re-read the device manager's checkpoint, then write it back as the kubelet does once
        the device plugin registers (so the file exists on every started node)."""
        self._read_devices()
        self._write_devices()

    def _read_devices(self) -> None:
        """The kubelet logs and ignores a device checkpoint it cannot read (it starts with no
        assignments), so a bad file is not a start-up error here either."""
        path = self.state_dir / DEVICE_STATE_FILE
        try:
            cp = dck.parse_device(path.read_text())
        except FileNotFoundError:
            return
        except (OSError, ck.CheckpointError) as e:
            log(
                "E",
                "manager.go:351",
                "Continue after failing to read checkpoint file. Device allocation info may NOT "
                "be up-to-date",
                err=str(e),
            )
            return
        per_pod: dict[str, dict[str, tuple[str, ...]]] = {}
        for entry in cp.entries or ():
            if entry.resource == adm.GPU:
                per_pod.setdefault(entry.pod_uid, {})[entry.container] = tuple(
                    sorted(entry.devices())
                )
        for uid, ctrs in per_pod.items():
            prev = self.allocations.get(uid, adm.Allocation())
            self.allocations[uid] = adm.Allocation(prev.cpus, ctrs, prev.memory)

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
        else:
            pool, entries = frozenset(), {}
        if ck.cpu_layout_for(self.cpu_minor) == 4:
            # with InPlacePodVerticalScalingExclusiveCPUs the 1.37 kubelet keeps each container's
            # admission-time CPUs as its baseline (no resize happens here: the same CPUs)
            ippvs = self.gates.get("InPlacePodVerticalScalingExclusiveCPUs") is True
            cp = ck.cpu_checkpoint(
                self.policy.cpu, pool, entries, version=4, baselines=entries if ippvs else None
            )
            text = ck.render_cpu_v4(cp)
        else:
            text = ck.render_cpu(ck.cpu_checkpoint(self.policy.cpu, pool, entries))
        self._atomic(self.state_dir / ck.CPU_STATE_FILE, text)

    def _write_memory(self) -> None:
        if self.policy.memory != "Static":
            cp = mck.memory_checkpoint(self.policy.memory, {})
        else:
            entries = {
                uid: {
                    c: tuple(mck.MemoryBlock((n,), "memory", b) for n, b in sorted(per.items()))
                    for c, per in a.memory.items()
                }
                for uid, a in self.allocations.items()
                if a.memory
            }
            cp = mck.memory_checkpoint("Static", self._expected_memory(entries), entries)
        render = mck.render_memory_v3 if self.memory_v3 else mck.render_memory
        self._atomic(self.state_dir / ck.MEMORY_STATE_FILE, render(cp))

    def _write_devices(self) -> None:
        m = self.machine
        entries = []
        for uid, a in sorted(self.allocations.items()):
            for container, gpus in sorted(a.gpus.items()):
                by_numa: dict[int, list[str]] = {}
                for g in gpus:
                    by_numa.setdefault(m.numa_of_gpu(g), []).append(g)
                ids = {n: tuple(ids) for n, ids in by_numa.items()}
                entries.append(dck.PodDevices(uid, container, adm.GPU, ids, b""))
        registered = {adm.GPU: [g for n in m.numa for g in n.gpus]}
        cp = dck.device_checkpoint(entries, registered)
        self._atomic(self.state_dir / DEVICE_STATE_FILE, dck.render_device(cp))

    def persist(self) -> None:
        self._write_cpu()
        self._write_memory()
        self._write_devices()
