"""What lint needs to know about a node's hardware: online CPUs, NUMA nodes, SMT siblings, GPUs.

Some kubelet start-up failures depend on the machine, not on the configuration alone: reserved
CPUs that are not online, more than 8 NUMA nodes without ``max-allowable-numa-nodes``, a
``reservedMemory`` entry for a NUMA node that does not exist. The facts playbook collects these
from sysfs and writes them in the format below; ``rollout lint --node-facts FILE`` reads it.

File format (JSON or YAML; field names camelCase; CPU lists in the kernel's cpulist syntax)::

    {
      "onlineCPUs": "0-63",                 # required: /sys/devices/system/cpu/online
      "sockets": 2,                         # optional: distinct physical_package_id values
      "numaNodes": [                        # required (may be empty on non-NUMA machines)
        {"id": 0,                           #   /sys/devices/system/node/nodeN
         "cpus": "0-15,32-47",              #   nodeN/cpulist
         "memoryBytes": 270443700224},      #   optional: MemTotal of nodeN/meminfo, in bytes
        {"id": 1, "cpus": "16-31,48-63", "memoryBytes": 270443700224}
      ],
      "smtSiblings": ["0,32", "1,33"],      # optional: distinct cpuN/topology/thread_siblings_list
      "gpus": [                             # optional
        {"id": "0000:3b:00.0", "numaNode": 0}   # PCI address; device/numa_node (-1: none)
      ],
      "cgroupVersion": 2                    # optional: 2 when /sys/fs/cgroup is cgroup2fs, else 1
    }

A ``numaNode`` of ``-1`` (what sysfs reports on a single-node machine) is stored as None.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.errors import InputError, Location, ParseError
from rollout.kubelet import cpuset


@dataclass(frozen=True)
class NUMANode:
    """One NUMA node: its id, CPUs and (optionally) total memory in bytes."""

    id: int
    cpus: frozenset[int]
    memory_bytes: int | None = None


@dataclass(frozen=True)
class GPU:
    """A GPU (or other PCI accelerator) and the NUMA node it hangs off, if any."""

    id: str
    numa_node: int | None = None


@dataclass(frozen=True)
class NodeFacts:
    """The hardware facts of one node."""

    online_cpus: frozenset[int]
    numa_nodes: tuple[NUMANode, ...] = ()
    smt_siblings: tuple[frozenset[int], ...] = ()
    sockets: int | None = None
    gpus: tuple[GPU, ...] = ()
    cgroup_version: int | None = None

    @property
    def memory_bytes(self) -> int | None:
        """Total memory over all NUMA nodes, or None when any node's memory is unknown."""
        if not self.numa_nodes or any(n.memory_bytes is None for n in self.numa_nodes):
            return None
        return sum(n.memory_bytes or 0 for n in self.numa_nodes)


def node_facts_from_dict(data: Mapping[str, Any], *, file: str | None = None) -> NodeFacts:
    """Build NodeFacts from the documented format.

    Raises:
        InputError: naming the file and field of a missing or malformed value.
    """

    def bad(field: str, why: str) -> InputError:
        return InputError(why, Location(file=file, field=field))

    def cpus(value: Any, field: str) -> frozenset[int]:
        if isinstance(value, int) and not isinstance(value, bool):
            value = str(value)
        if not isinstance(value, str):
            raise bad(field, f'must be a CPU list string such as "0-3,8", not {value!r}')
        try:
            return cpuset.parse(value)
        except cpuset.CPUSetError as e:
            raise bad(field, str(e)) from e

    def integer(value: Any, field: str, *, optional: bool = False) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise bad(field, f"must be an integer, not {value!r}")
        return value

    if not isinstance(data, Mapping):
        raise bad("", "node facts must be a mapping with onlineCPUs and numaNodes")
    if "onlineCPUs" not in data:
        raise bad("onlineCPUs", "is required")
    online = cpus(data["onlineCPUs"], "onlineCPUs")
    nodes = []
    raw_nodes = data.get("numaNodes") or []
    if not isinstance(raw_nodes, list):
        raise bad("numaNodes", "must be a list")
    for i, n in enumerate(raw_nodes):
        f = f"numaNodes[{i}]"
        if not isinstance(n, Mapping) or "id" not in n:
            raise bad(f, "must be a mapping with id and cpus")
        nid = integer(n["id"], f + ".id")
        assert nid is not None
        nodes.append(
            NUMANode(
                id=nid,
                cpus=cpus(n.get("cpus", ""), f + ".cpus"),
                memory_bytes=integer(n.get("memoryBytes"), f + ".memoryBytes", optional=True),
            )
        )
    siblings = []
    for i, s in enumerate(data.get("smtSiblings") or []):
        siblings.append(cpus(s, f"smtSiblings[{i}]"))
    gpus = []
    for i, g in enumerate(data.get("gpus") or []):
        f = f"gpus[{i}]"
        if not isinstance(g, Mapping) or "id" not in g:
            raise bad(f, "must be a mapping with id and numaNode")
        numa = integer(g.get("numaNode"), f + ".numaNode", optional=True)
        gpus.append(GPU(id=str(g["id"]), numa_node=None if numa is None or numa < 0 else numa))
    cgroup = integer(data.get("cgroupVersion"), "cgroupVersion", optional=True)
    if cgroup not in (None, 1, 2):
        raise bad("cgroupVersion", f"must be 1 or 2, not {cgroup!r}")
    return NodeFacts(
        online_cpus=online,
        numa_nodes=tuple(sorted(nodes, key=lambda n: n.id)),
        smt_siblings=tuple(siblings),
        sockets=integer(data.get("sockets"), "sockets", optional=True),
        gpus=tuple(gpus),
        cgroup_version=cgroup,
    )


def load_node_facts(path: str | Path) -> NodeFacts:
    """Read a node-facts file (JSON or YAML).

    Raises:
        InputError: the file is missing or a field is malformed.
        ParseError: the file is not valid JSON or YAML (with the line).
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as e:
        raise InputError(f"cannot read node facts: {e.strerror}", Location(file=str(p))) from e
    data: Any
    if text.lstrip().startswith("{"):
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ParseError(e.msg, Location(file=str(p), line=e.lineno)) from e
    else:
        from ruamel.yaml import YAML
        from ruamel.yaml.error import MarkedYAMLError

        try:
            data = YAML(typ="safe").load(text)
        except MarkedYAMLError as e:
            mark = e.problem_mark
            line = mark.line + 1 if mark is not None else None
            raise ParseError(str(e.problem), Location(file=str(p), line=line)) from e
    return node_facts_from_dict(data, file=str(p))
