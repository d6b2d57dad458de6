"""Read a node's kubelet files and compute the configuration the kubelet would actually run with.

The kubelet builds its configuration in layers: built-in defaults, the ``--config`` file, every
``.conf`` drop-in under ``--config-dir`` in lexical order (JSON merge patch: maps merged key-wise,
lists replaced, ``null`` deletes), then command-line flags. ``effective`` reproduces that order
so render can prove that our setting is the one that wins, and lint can name the file and line
that set a value.

Parsing one file is :mod:`rollout.kubelet.documents`; edits that must keep comments and quoting
are text edits in ``yamledit``.
"""

from __future__ import annotations

import copy
import fnmatch
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from rollout.errors import InputError, Location
from rollout.kubelet import cpuset
from rollout.kubelet.distributions import SNAP_VARS, Distribution, get
from rollout.kubelet.documents import Document, clone, parsed
from rollout.kubelet.flags import (
    Flag,
    apply_flags,
    args_file_flags,
    env_assignments,
    kubelet_arg_flags,
    split_args,
)

OriginKind = Literal["default", "file", "dropin", "flag"]

# What the kubelet uses when a field is not set anywhere (v1beta1 defaults, for the fields we care
# about).
DEFAULTS: dict[str, Any] = {
    "cpuManagerPolicy": "none",
    "cpuManagerReconcilePeriod": "10s",
    "topologyManagerPolicy": "none",
    "topologyManagerScope": "container",
    "memoryManagerPolicy": "None",
    "evictionHard": {
        "memory.available": "100Mi",
        "nodefs.available": "10%",
        "nodefs.inodesFree": "5%",
        "imagefs.available": "15%",
        "imagefs.inodesFree": "5%",
    },
    "maxPods": 110,
    "healthzPort": 10248,
    "healthzBindAddress": "127.0.0.1",
}
# Zero durations the kubelet's defaulting replaces (kubeadm writes ``0s`` for every unset duration).
_ZERO_DEFAULTS = {"cpuManagerReconcilePeriod": "10s"}


@dataclass(frozen=True)
class Origin:
    """Where a top-level field's effective value came from."""

    file: str | None
    line: int | None
    kind: OriginKind


@dataclass(frozen=True)
class NodeFiles:
    """A node's kubelet-related files, by node path (absent files are simply not in ``files``)."""

    distribution: Distribution
    files: Mapping[str, bytes]
    root: Path | None = None

    def text(self, path: str) -> str | None:
        data = self.files.get(path)
        return None if data is None else data.decode("utf-8")

    def with_files(self, updates: Mapping[str, bytes | None]) -> NodeFiles:
        """A copy with files replaced (``None`` removes a file): the node after a render is
        applied."""
        files = dict(self.files)
        for path, data in updates.items():
            if data is None:
                files.pop(path, None)
            else:
                files[path] = data
        return NodeFiles(self.distribution, dict(sorted(files.items())), self.root)

    def under(self, directory: str) -> list[str]:
        """Paths under ``directory`` (recursively), in the kubelet's WalkDir order."""
        prefix = directory.rstrip("/") + "/"
        return sorted(p for p in self.files if p.startswith(prefix))


@dataclass(frozen=True)
class EffectiveConfig:
    """The configuration the kubelet would run with, and where each top-level field came from."""

    config: dict[str, Any]
    origins: dict[str, Origin]
    flags: dict[str, str]
    distribution: str | None
    config_dir: str | None = None
    root_dir: str = "/var/lib/kubelet"
    dropins: tuple[str, ...] = ()
    notes: tuple[str, ...] = field(default=())
    #: every command-line flag by name (as written, without dashes): where it was set (last wins)
    flag_origins: dict[str, Origin] = field(default_factory=dict)

    def as_json(self) -> str:
        return json.dumps(self.config, indent=2, sort_keys=True) + "\n"


# ---------------------------------------------------------------- node files


def load_node(distribution: str | Distribution, node_root: Path | str) -> NodeFiles:
    """Read every file the distribution's kubelet reads, from ``node_root`` + node path.

    Missing files mean a fresh node. Nothing is parsed yet (``effective`` does that), except that
    files that cannot be read as UTF-8 are refused here.

    Raises:
        UnknownDistributionError, InputError: node_root is not a directory.
    """
    dist = get(distribution)
    root = Path(node_root)
    if not root.is_dir():
        raise InputError("node root is not a directory", Location(file=str(root)))
    wanted: list[str] = []
    if dist.config_file:
        wanted.append(dist.config_file)
    for ff in dist.flag_files:
        if "*" in ff.path:
            d, pattern = ff.path.rsplit("/", 1)
            host = root / d.lstrip("/")
            if host.is_dir():
                wanted.extend(
                    f"{d}/{c.name}"
                    for c in sorted(host.iterdir())
                    if fnmatch.fnmatch(c.name, pattern)
                )
        else:
            wanted.append(ff.path)
    for extra in (dist.nodeadm_file,):
        if extra:
            wanted.append(extra)
    if dist.dropin_dir:
        host = root / dist.dropin_dir.lstrip("/")
        if host.is_dir():
            for f in sorted(host.rglob("*")):
                if f.is_file():
                    wanted.append("/" + f.relative_to(root).as_posix())
    files: dict[str, bytes] = {}
    for node_path in wanted:
        host_path = root / node_path.lstrip("/")
        if host_path.is_file():
            try:
                data = host_path.read_bytes()
                data.decode("utf-8")
            except (OSError, UnicodeDecodeError) as e:
                raise InputError(f"cannot read: {e}", Location(file=node_path)) from e
            files[node_path] = data
    return NodeFiles(dist, dict(sorted(files.items())), root)


def node_from_files(
    distribution: str | Distribution, files: Mapping[str, bytes | str]
) -> NodeFiles:
    """A NodeFiles from an in-memory mapping of node path -> content (tests, benchmarks,
    planning)."""
    dist = get(distribution)
    return NodeFiles(
        dist,
        {k: (v.encode() if isinstance(v, str) else v) for k, v in sorted(files.items())},
    )


# ---------------------------------------------------------------- flags


def node_flags(node: NodeFiles) -> list[Flag]:
    """Every kubelet flag the node's flags files contribute, in command-line order."""
    dist = node.distribution
    flags: list[Flag] = []
    env_values: dict[str, tuple[str, str, int]] = {}
    env_order: list[str] = []
    for ff in dist.flag_files:
        paths = (
            [p for p in node.files if fnmatch.fnmatch(p, ff.path)] if "*" in ff.path else [ff.path]
        )
        for path in sorted(paths):
            text = node.text(path)
            if text is None:
                continue
            if ff.format in ("env", "systemd"):
                for var, value, line in env_assignments(text, ff.format):
                    if var in ff.variables:
                        env_values[var] = (value, path, line)
                        for v in ff.variables:
                            if v not in env_order:
                                env_order.append(v)
            elif ff.format == "args":
                flags.extend(args_file_flags(text, path, SNAP_VARS))
            else:
                doc = parsed(text, path)
                if "kubelet-arg" in doc.data:
                    value = doc.data["kubelet-arg"]
                    n = len(value) if isinstance(value, list) else 1
                    lines = [doc.lines.get(f"kubelet-arg[{i}]") for i in range(n)]
                    if not any(lines):
                        lines = [doc.lines.get("kubelet-arg")]
                    flags.extend(kubelet_arg_flags(value, lines, path))
    for var in env_order:
        if var in env_values:
            value, path, line = env_values[var]
            flags.extend(split_args(value, path, line))
    return flags


# ---------------------------------------------------------------- merging


def merge_patch(base: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch, as the kubelet applies drop-ins: maps merged, lists replaced."""
    if not isinstance(patch, dict):
        return clone(patch)
    result = dict(base) if isinstance(base, dict) else {}
    for k, v in patch.items():
        if v is None:
            result.pop(k, None)
        else:
            result[k] = merge_patch(result.get(k), v)
    return result


def _check_kind(doc: Document) -> None:
    for key, want in (
        ("apiVersion", "kubelet.config.k8s.io/v1beta1"),
        ("kind", "KubeletConfiguration"),
    ):
        got = doc.data.get(key)
        if got != want:
            raise InputError(
                f"{key} must be {want!r}, got {got!r}",
                Location(file=doc.path, field=key, line=doc.lines.get(key)),
            )


def apply_reserved_cpus(config: dict[str, Any]) -> str | None:
    """What the kubelet does at start when ``reservedSystemCPUs`` is set.

    It deletes ``kubeReserved.cpu`` and sets ``systemReserved.cpu`` to the number of CPUs in the
    set,
    logging the message returned here (None when nothing changes).
    """
    text = config.get("reservedSystemCPUs")
    if not isinstance(text, str) or not text.strip():
        return None
    try:
        count = len(cpuset.parse(text))
    except cpuset.CPUSetError:
        return None  # lint reports the syntax error
    kube = dict(config.get("kubeReserved") or {})
    system = dict(config.get("systemReserved") or {})
    kube.pop("cpu", None)
    system["cpu"] = str(count)
    config["kubeReserved"] = kube
    config["systemReserved"] = system
    if not kube:
        del config["kubeReserved"]
    return (
        "Option --reserved-cpus is specified, it will overwrite the cpu setting in KubeReserved "
        f"and SystemReserved: systemReserved.cpu={count}, kubeReserved.cpu removed"
    )


def _apply_defaults(config: dict[str, Any], origins: dict[str, Origin]) -> None:
    for k, v in DEFAULTS.items():
        if k not in config:
            config[k] = copy.deepcopy(v)
            origins[k] = Origin(None, None, "default")
    for k, v in _ZERO_DEFAULTS.items():
        if config.get(k) in ("0s", "0", 0):
            config[k] = v


def effective_from_config(
    cfg: Mapping[str, Any],
    *,
    file: str | None = None,
    lines: Mapping[str, int] | None = None,
    flags: list[Flag] | None = None,
    distribution: str | None = None,
) -> EffectiveConfig:
    """The effective configuration for a plain KubeletConfiguration file (``rollout lint FILE``)."""
    config = copy.deepcopy(dict(cfg))
    origins = {k: Origin(file, (lines or {}).get(k), "file") for k in config}
    raw: dict[str, str] = {}
    if flags:
        fields, forigin, raw = apply_flags(flags)
        for k, v in fields.items():
            config[k] = v
            origins[k] = Origin(forigin[k].file, forigin[k].line, "flag")
    notes = []
    note = apply_reserved_cpus(config)
    if note:
        notes.append(note)
    _apply_defaults(config, origins)
    return EffectiveConfig(
        config,
        origins,
        raw,
        distribution,
        notes=tuple(notes),
        flag_origins=flag_origins(flags or []),
    )


def flag_origins(flags: list[Flag]) -> dict[str, Origin]:
    """Where each flag was set, by name (a later occurrence wins, as in the kubelet's parser)."""
    return {f.name: Origin(f.file, f.line, "flag") for f in flags}


def effective(node: NodeFiles) -> EffectiveConfig:
    """The configuration the node's kubelet would run with.

    Raises:
        ParseError: a file is malformed. InputError: a drop-in is not a KubeletConfiguration.
    """
    dist = node.distribution
    flags = node_flags(node)
    fields, forigin, raw = apply_flags(flags)
    config_file = raw.get("config", dist.config_file if dist.config_file else None)
    config_dir = raw.get("config-dir")
    # nodeadm passes --config-dir only when it wrote a drop-in (non-empty spec.kubelet.config).
    implied = dist.dropin_always or (
        dist.name == "eks-al2023" and bool(node.under(dist.dropin_dir or "/-"))
    )
    if config_dir is None and dist.dropin_dir and implied:
        config_dir = dist.dropin_dir
    root_dir = raw.get("root-dir", dist.root_dir)

    config: dict[str, Any] = {}
    origins: dict[str, Origin] = {}
    if config_file:
        text = node.text(config_file)
        if text is not None:
            doc = parsed(text, config_file)
            config = clone(doc.data)
            origins = {k: Origin(config_file, doc.lines.get(k), "file") for k in config}
    dropins: list[str] = []
    if config_dir:
        for path in node.under(config_dir):
            if not path.endswith(".conf"):
                continue
            text = node.text(path)
            assert text is not None
            doc = parsed(text, path)
            _check_kind(doc)
            config = merge_patch(config, doc.data)
            for k in doc.data:
                origins[k] = Origin(path, doc.lines.get(k), "dropin")
            dropins.append(path)
    for k, v in fields.items():
        config[k] = v
        origins[k] = Origin(forigin[k].file, forigin[k].line, "flag")
    for k in [k for k in origins if k not in config]:
        del origins[k]
    notes = []
    note = apply_reserved_cpus(config)
    if note:
        notes.append(note)
    _apply_defaults(config, origins)
    return EffectiveConfig(
        config,
        dict(sorted(origins.items())),
        raw,
        dist.name,
        config_dir=config_dir,
        root_dir=root_dir,
        dropins=tuple(dropins),
        notes=tuple(notes),
        flag_origins=flag_origins(flags),
    )
