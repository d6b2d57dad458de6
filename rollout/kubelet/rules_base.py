"""The context every lint rule reads, and the stages in which the kubelet applies the rules.

The kubelet checks its configuration in stages and stops at the first stage that fails (decoding,
feature gates, ``validation.go``, ``server.go`` start-up, then the Topology, CPU and Memory
managers in that order). Each finding carries its stage so that ``startup_errors`` can report
exactly what the kubelet would die with.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Protocol

from rollout.kubelet.facts import NodeFacts
from rollout.kubelet.findings import Finding, Severity
from rollout.kubelet.options import Version, gate_enabled


class Stage(IntEnum):
    """Where in its start-up the kubelet applies a rule (warnings use the stage they relate to)."""

    DECODE = 0
    GATES = 1
    VALIDATION = 2
    SERVER = 3
    TOPOLOGY = 4
    CPU = 5
    MEMORY = 6
    #: refused although this start succeeds: the kubelet fails on a later restart, or runs with
    #: no CPU for any pod; lint and preflight report it, ``startup_errors`` does not.
    LATER = 7


class OriginLike(Protocol):
    """Where a top-level field was set (``loading.Origin`` satisfies this)."""

    @property
    def file(self) -> str | None: ...

    @property
    def line(self) -> int | None: ...


#: The kubelet's defaults (v1beta1 ``SetDefaults_KubeletConfiguration``) for the fields lint reads.
DEFAULTS: dict[str, Any] = {
    "cpuManagerPolicy": "none",
    "memoryManagerPolicy": "None",
    "topologyManagerPolicy": "none",
    "topologyManagerScope": "container",
    "evictionHard": {
        "memory.available": "100Mi",
        "nodefs.available": "10%",
        "nodefs.inodesFree": "5%",
        "imagefs.available": "15%",
        "imagefs.inodesFree": "5%",
    },
}


@dataclass
class Ctx:
    """The effective configuration plus what the rules need to know, and the findings so far."""

    config: Mapping[str, Any]
    origins: Mapping[str, OriginLike]
    version: Version
    facts: NodeFacts | None
    found: list[tuple[Stage, Finding]] = field(default_factory=list)
    bad_fields: set[str] = field(default_factory=set)
    #: the kubelet's command-line flags by name (without dashes), with where each was set
    flags: Mapping[str, OriginLike] = field(default_factory=dict)
    #: the node's distribution (``--distribution``), when lint knows it
    distribution: str | None = None

    def get(self, name: str) -> Any:
        """A field's effective value: the configured one, else the kubelet's default.

        Fields whose value has the wrong type read as their default (their error is reported once,
        at decoding); an empty string reads as the default, as the kubelet's defaulting does.
        """
        value = None if name in self.bad_fields else self.config.get(name)
        if value is None or value == "":
            return DEFAULTS.get(name, value)
        return value

    def gates(self) -> dict[str, bool]:
        raw = None if "featureGates" in self.bad_fields else self.config.get("featureGates")
        if not isinstance(raw, Mapping):
            return {}
        return {str(k): v for k, v in raw.items() if isinstance(v, bool)}

    def gate(self, name: str) -> bool:
        return gate_enabled(name, self.gates(), self.version)

    def add(
        self,
        stage: Stage,
        severity: Severity,
        fieldpath: str,
        message: str,
        at: OriginLike | None = None,
    ) -> None:
        top = fieldpath.split(".", 1)[0].split("[", 1)[0]
        origin = at if at is not None else self.origins.get(top)
        self.found.append(
            (
                stage,
                Finding(
                    severity=severity,
                    field=fieldpath,
                    message=message,
                    file=getattr(origin, "file", None),
                    line=getattr(origin, "line", None),
                ),
            )
        )

    def error(
        self, stage: Stage, fieldpath: str, message: str, at: OriginLike | None = None
    ) -> None:
        self.add(stage, Severity.ERROR, fieldpath, message, at)

    def warn(
        self, stage: Stage, fieldpath: str, message: str, at: OriginLike | None = None
    ) -> None:
        self.add(stage, Severity.WARNING, fieldpath, message, at)


def go_map(m: Mapping[str, Any]) -> str:
    """Go's ``%v`` of a ``map[string]string``: ``map[a:1 b:2]`` with sorted keys."""
    return "map[" + " ".join(f"{k}:{m[k]}" for k in sorted(m)) + "]"


def go_quote(s: str) -> str:
    """Go's ``%q`` for plain strings (double quotes, backslash escapes)."""
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"') + '"'


def parse_bool(value: Any) -> bool | None:
    """``strconv.ParseBool``: None when the kubelet would refuse the value."""
    text = str(value).lower() if isinstance(value, bool) else str(value)
    if text in ("1", "t", "T", "TRUE", "true", "True"):
        return True
    if text in ("0", "f", "F", "FALSE", "false", "False"):
        return False
    return None
