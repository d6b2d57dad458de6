"""Kubelet command-line flags: reading them out of each distribution's flags files, and mapping them
onto KubeletConfiguration fields.

Flags beat every file (defaults < ``--config`` < drop-ins < flags), so a flag hidden in
``KUBELET_EXTRA_ARGS`` or a k3s ``kubelet-arg`` silently wins over anything we render;
render and lint
must therefore see flags exactly as the kubelet would.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from rollout.errors import InputError, Location


@dataclass(frozen=True)
class Flag:
    """One ``--name=value`` occurrence: where it came from, for messages."""

    name: str
    value: str
    file: str
    line: int | None


def _map(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        k, sep, v = part.partition("=")
        if not sep:
            raise ValueError(f"expected KEY=VALUE, got {part!r}")
        out[k.strip()] = v.strip()
    return out


def _eviction(text: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for part in text.split(","):
        if not part.strip():
            continue
        k, sep, v = part.partition("<")
        if not sep:
            raise ValueError(f"expected SIGNAL<QUANTITY, got {part!r}")
        out[k.strip()] = v.strip()
    return out


def _gates(text: str) -> dict[str, bool]:
    out: dict[str, bool] = {}
    for k, v in _map(text).items():
        if v.lower() not in ("true", "false"):
            raise ValueError(f"invalid value of {k}: {v}, err: strconv.ParseBool")
        out[k] = v.lower() == "true"
    return out


def _reserved_memory(text: str) -> list[dict[str, Any]]:
    """``0:memory=1Gi,hugepages-1Gi=2Gi;1:memory=2Gi`` (the kubelet's --reserved-memory syntax)."""
    out: list[dict[str, Any]] = []
    for part in text.split(";"):
        if not part.strip():
            continue
        numa, sep, limits = part.partition(":")
        if not sep:
            raise ValueError(f"expected NUMA:RESOURCE=QUANTITY, got {part!r}")
        out.append({"numaNode": int(numa), "limits": _map(limits)})
    return out


def _list(text: str) -> list[str]:
    return [p.strip() for p in text.split(",") if p.strip()]


def _bool(text: str) -> bool:
    if text.lower() not in ("true", "false", "1", "0"):
        raise ValueError(f"strconv.ParseBool: parsing {text!r}: invalid syntax")
    return text.lower() in ("true", "1")


# flag name -> (KubeletConfiguration field, value parser)
FLAG_FIELDS: dict[str, tuple[str, Callable[[str], Any]]] = {
    "cpu-manager-policy": ("cpuManagerPolicy", str),
    "cpu-manager-policy-options": ("cpuManagerPolicyOptions", _map),
    "cpu-manager-reconcile-period": ("cpuManagerReconcilePeriod", str),
    "reserved-cpus": ("reservedSystemCPUs", str),
    "topology-manager-policy": ("topologyManagerPolicy", str),
    "topology-manager-scope": ("topologyManagerScope", str),
    "topology-manager-policy-options": ("topologyManagerPolicyOptions", _map),
    "memory-manager-policy": ("memoryManagerPolicy", str),
    "reserved-memory": ("reservedMemory", _reserved_memory),
    "kube-reserved": ("kubeReserved", _map),
    "system-reserved": ("systemReserved", _map),
    "kube-reserved-cgroup": ("kubeReservedCgroup", str),
    "system-reserved-cgroup": ("systemReservedCgroup", str),
    "enforce-node-allocatable": ("enforceNodeAllocatable", _list),
    "feature-gates": ("featureGates", _gates),
    "eviction-hard": ("evictionHard", _eviction),
    "max-pods": ("maxPods", int),
    "cgroup-driver": ("cgroupDriver", str),
    "cluster-dns": ("clusterDNS", _list),
    "cluster-domain": ("clusterDomain", str),
    "fail-swap-on": ("failSwapOn", _bool),
    "fail-cgroupv1": ("failCgroupV1", _bool),
    "read-only-port": ("readOnlyPort", int),
    "resolv-conf": ("resolvConf", str),
    "serialize-image-pulls": ("serializeImagePulls", _bool),
    "container-log-max-files": ("containerLogMaxFiles", int),
    "container-log-max-size": ("containerLogMaxSize", str),
    "image-gc-high-threshold": ("imageGCHighThresholdPercent", int),
    "image-gc-low-threshold": ("imageGCLowThresholdPercent", int),
    "tls-cipher-suites": ("tlsCipherSuites", _list),
    "container-runtime-endpoint": ("containerRuntimeEndpoint", str),
    "healthz-port": ("healthzPort", int),
    "healthz-bind-address": ("healthzBindAddress", str),
}

# field -> flag, for rendering MicroK8s args and naming flags in messages
FIELD_FLAGS: dict[str, str] = {field: flag for flag, (field, _) in FLAG_FIELDS.items()}


def format_flag_value(field: str, value: Any) -> str:
    """Print a configuration value in the syntax of its kubelet flag (inverse of the parsers)."""
    if field == "evictionHard":
        return ",".join(f"{k}<{v}" for k, v in value.items())
    if field == "reservedMemory":
        return ";".join(
            f"{e['numaNode']}:" + ",".join(f"{k}={v}" for k, v in e.get("limits", {}).items())
            for e in value
        )
    if isinstance(value, dict):
        return ",".join(f"{k}={_scalar(v)}" for k, v in value.items())
    if isinstance(value, list):
        return ",".join(_scalar(v) for v in value)
    return _scalar(value)


def _scalar(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return str(v)


def split_args(text: str, file: str, line: int | None) -> list[Flag]:
    """Split a shell-style argument string into flags (``--a=b``, ``--a b``)."""
    try:
        words = shlex.split(text, comments=False)
    except ValueError as e:
        raise InputError(f"cannot split flags: {e}", Location(file=file, line=line)) from e
    flags: list[Flag] = []
    i = 0
    while i < len(words):
        w = words[i]
        if w.startswith("--") or (w.startswith("-") and len(w) > 1):
            name, sep, value = w.lstrip("-").partition("=")
            if not sep and i + 1 < len(words) and not words[i + 1].startswith("-"):
                value = words[i + 1]
                i += 1
            elif not sep:
                value = "true"
            flags.append(Flag(name, value, file, line))
        i += 1
    return flags


_ENV_LINE = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$")
_SYSTEMD_ENV = re.compile(r"^\s*Environment\s*=\s*(.*)$")


def _unquote(value: str) -> str:
    value = value.strip()
    if len(value) >= 2 and value[0] == value[-1] and value[0] in "\"'":
        return value[1:-1]
    return value


def env_assignments(text: str, fmt: str) -> list[tuple[str, str, int]]:
    """``(variable, value, line)`` for each assignment in an EnvironmentFile or a unit drop-in."""
    out: list[tuple[str, str, int]] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if fmt == "systemd":
            m = _SYSTEMD_ENV.match(line)
            if not m:
                continue
            for word in shlex.split(m.group(1)):
                k, sep, v = word.partition("=")
                if sep:
                    out.append((k, v, n))
        else:
            m = _ENV_LINE.match(line)
            if m:
                out.append((m.group(1), _unquote(m.group(2)), n))
    return out


def args_file_flags(text: str, file: str, env: dict[str, str]) -> list[Flag]:
    """MicroK8s args: one flag a line, ``#`` lines skipped, quotes gone, ``${VAR}`` expanded."""
    flags: list[Flag] = []
    for n, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        expanded = re.sub(r"\$\{(\w+)\}", lambda m: env.get(m.group(1), m.group(0)), line)
        flags.extend(split_args(expanded, file, n))
    return flags


def kubelet_arg_flags(value: Any, lines: list[int | None], file: str) -> list[Flag]:
    """k3s/RKE2 ``kubelet-arg``: a list (or one string) of ``name=value`` without dashes."""
    items = value if isinstance(value, list) else [value]
    flags: list[Flag] = []
    for i, item in enumerate(items):
        line = lines[i] if i < len(lines) else (lines[0] if lines else None)
        if not isinstance(item, str):
            raise InputError(
                f"kubelet-arg entries must be strings, got {item!r}",
                Location(file=file, field="kubelet-arg", line=line),
            )
        name, _, v = item.lstrip("-").partition("=")
        flags.append(Flag(name, v, file, line))
    return flags


def apply_flags(flags: list[Flag]) -> tuple[dict[str, Any], dict[str, Flag], dict[str, str]]:
    """Turn flags into configuration fields (a later flag wins).

    Returns:
        (fields, the flag that set each field, every flag's final value by name).

    Raises:
        InputError: a flag value the kubelet's flag parser would refuse.
    """
    fields: dict[str, Any] = {}
    origin: dict[str, Flag] = {}
    raw: dict[str, str] = {}
    for f in flags:
        raw[f.name] = f.value
        spec = FLAG_FIELDS.get(f.name)
        if spec is None:
            continue
        field, parse = spec
        try:
            value = parse(f.value)
        except ValueError as e:
            raise InputError(
                f'invalid argument "{f.value}" for "--{f.name}" flag: {e}',
                Location(file=f.file, field=field, line=f.line),
            ) from e
        if field == "featureGates" and isinstance(fields.get(field), dict):
            value = {**fields[field], **value}
        fields[field] = value
        origin[field] = f
    return fields, origin, raw
