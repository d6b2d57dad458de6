"""Render: the exact files a node must receive so the kubelet runs with our intent.

Pure: ``render(node files, intent) -> files``. It prefers the distribution's drop-in directory
(rollback is then "remove our file"), edits in place only where there is no drop-in layer, and
proves the result by recomputing the effective configuration: if a command-line flag, a later
drop-in or a reserved cgroup would override or refuse one of our fields, it either resolves it the
way the distribution supports or raises ``ConflictError`` naming the file, field and line.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any, Literal

import jinja2

from rollout import assets
from rollout.errors import ConflictError, InputError, Location, suggest
from rollout.kubelet import checkpoints, cpuset, yamledit
from rollout.kubelet.distributions import Distribution
from rollout.kubelet.flags import FIELD_FLAGS, format_flag_value
from rollout.kubelet.intent import Intent
from rollout.kubelet.loading import EffectiveConfig, NodeFiles, effective

_CGROUPS = ("kubeReservedCgroup", "systemReservedCgroup")


@dataclass(frozen=True)
class RenderedFile:
    """One file to place on the node."""

    path: str
    content: bytes
    mode: str
    owner: str
    action: Literal["create", "modify"]

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.content).hexdigest()


@dataclass(frozen=True)
class Rendered:
    """What a node must receive.

    Attributes:
        files: files to write (only those whose bytes change).
        removed: files rollback deletes (the ones we create).
        effective_before, effective_after: the kubelet's configuration without and with our files.
        checkpoint_reset: checkpoint files to delete before the restart (node paths).
        warnings: what we resolved on the user's behalf, in words.
        method: the method used; services: units to restart; daemon_reload: a unit file changed.
    """

    files: tuple[RenderedFile, ...]
    removed: tuple[str, ...]
    effective_before: EffectiveConfig
    effective_after: EffectiveConfig
    checkpoint_reset: tuple[str, ...]
    warnings: tuple[str, ...]
    method: str
    services: tuple[str, ...]
    daemon_reload: bool = False

    def as_dict(self) -> dict[str, Any]:
        return {
            "files": [
                {
                    "path": f.path,
                    "mode": f.mode,
                    "owner": f.owner,
                    "action": f.action,
                    "sha256": f.sha256,
                    "content": f.content.decode("utf-8"),
                }
                for f in self.files
            ],
            "removed": list(self.removed),
            "checkpointReset": list(self.checkpoint_reset),
            "warnings": list(self.warnings),
            "method": self.method,
            "services": list(self.services),
            "daemonReload": self.daemon_reload,
        }


@cache
def _template(name: str) -> jinja2.Template:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(assets.kubelet_templates())),
        keep_trailing_newline=True,
        undefined=jinja2.StrictUndefined,
        autoescape=False,
    )
    return env.get_template(name)


def _ordered(fields: Mapping[str, Any]) -> dict[str, Any]:
    return dict(sorted(fields.items()))


def _dropin_content(dist: Distribution, fields: Mapping[str, Any], plan_name: str) -> bytes:
    if dist.config_format == "json":
        body = json.dumps(
            {
                "apiVersion": "kubelet.config.k8s.io/v1beta1",
                "kind": "KubeletConfiguration",
                **_ordered(fields),
            },
            indent=4,
        )
        return _template("dropin.json.j2").render(body=body).encode()
    overrides = "earlier drop-ins and the config file; command-line flags still win"
    body = yamledit.dump(_ordered(fields)).rstrip("\n")
    return (
        _template("dropin.yaml.j2")
        .render(body=body, plan_name=plan_name, overrides=overrides)
        .encode()
    )


def _checkpoint_reset(before: EffectiveConfig, after: EffectiveConfig) -> tuple[str, ...]:
    """The checkpoint files (node paths under the kubelet's root dir) this change must remove."""
    names = checkpoints.reset_needed(before.config, after.config)
    return tuple(f"{after.root_dir}/{name}" for name in names)


def _where(before: EffectiveConfig, field: str) -> Location:
    o = before.origins.get(field)
    return Location(file=o.file if o else None, field=field, line=o.line if o else None)


def render(
    node: NodeFiles, intent: Intent, method: str | None = None, plan_name: str = "rollout"
) -> Rendered:
    """The files ``node`` must receive so its kubelet runs with ``intent``.

    Args:
        node: the node's current files (missing files: a fresh node).
        intent: the fields we own.
        method: one of the distribution's methods (default: its first).
        plan_name: written into headers of files we create.

    Raises:
        InputError: unknown method. ConflictError: a setting would be overridden or refused (file,
            field and line named). ParseError: a node file is malformed.
    """
    dist = node.distribution
    method = method or dist.default_method
    if method not in dist.methods:
        raise InputError(
            f"{dist.name} supports methods: {', '.join(dist.methods)}"
            + suggest(method, dist.methods),
            Location(field="method"),
        )
    before = effective(node)
    # Decide against the node without our own files, so rendering again gives the same bytes.
    ours_paths = [p for p in (dist.our_dropin, dist.our_unit_dropin, dist.nodeadm_file) if p]
    if before.config_dir and dist.our_dropin:
        ours_paths.append(f"{before.config_dir.rstrip('/')}/{Path(dist.our_dropin).name}")
    base = (
        effective(node.with_files(dict.fromkeys(ours_paths)))
        if any(p in node.files for p in ours_paths)
        else before
    )
    desired: dict[str, Any] = dict(intent.fields)
    delete: list[str] = []
    warnings: list[str] = list(intent.warnings)

    rsc = desired.get("reservedSystemCPUs")
    if isinstance(rsc, str) and rsc.strip():
        _resolve_cgroups(dist, method, base, desired, delete, warnings)
        count = len(cpuset.parse(rsc))
        for section in ("kubeReserved", "systemReserved"):
            cur = (base.config.get(section) or {}).get("cpu")
            origin = base.origins.get(section)
            if cur is not None and origin and origin.kind != "default" and section not in desired:
                where = f"{origin.file}:{origin.line}" if origin.line else str(origin.file)
                warnings.append(
                    f'{where}: {section}.cpu={cur} is overridden: the kubelet logs "Option '
                    "--reserved-cpus is specified, it will overwrite the cpu setting in "
                    f'KubeReserved and SystemReserved" (systemReserved.cpu becomes {count}, '
                    "kubeReserved.cpu is dropped)"
                )

    updates: dict[str, bytes] = {}
    daemon_reload = False
    if method in ("dropin", "nodeconfig"):
        config_dir = base.config_dir
        if config_dir is None and dist.name == "eks-al2023" and method == "nodeconfig":
            config_dir = dist.dropin_dir
            warnings.append(
                "this node's kubelet has no --config-dir yet: nodeadm adds it once "
                f"{dist.nodeadm_file} gives spec.kubelet.config; re-run nodeadm (or reboot) first"
            )
        if config_dir is None and dist.name == "eks-al2023":
            raise ConflictError(
                "nodeadm passes --config-dir only when NodeConfig spec.kubelet.config is "
                "non-empty, and this node has no config.json.d drop-in; use --method nodeconfig "
                "and re-run nodeadm, or give the node a spec.kubelet.config",
                Location(file=dist.dropin_dir),
            )
        if config_dir is None:
            assert dist.our_unit_dropin and dist.config_file and dist.dropin_dir
            config_dir = dist.dropin_dir
            unit = _template("kubeadm-config-dir.conf.j2").render(
                plan_name=plan_name, config_file=dist.config_file, config_dir=config_dir
            )
            updates[dist.our_unit_dropin] = unit.encode()
            daemon_reload = True
        our = f"{config_dir.rstrip('/')}/{Path(dist.our_dropin or '90-rollout.conf').name}"
        updates[our] = _dropin_content(dist, desired, plan_name)
        if method == "nodeconfig" and dist.nodeadm_file:
            body = yamledit.dump(_ordered(desired)).rstrip("\n")
            body = "\n".join("      " + line for line in body.split("\n"))
            updates[dist.nodeadm_file] = (
                _template("nodeadm-nodeconfig.yaml.j2")
                .render(plan_name=plan_name, body=body)
                .encode()
            )
    elif method == "inplace":
        assert dist.config_file
        current = node.text(dist.config_file)
        if current is None:
            body = yamledit.dump(_ordered(desired)).rstrip("\n")
            if dist.config_format == "json":
                text = yamledit.edit_json(
                    "",
                    {
                        "apiVersion": "kubelet.config.k8s.io/v1beta1",
                        "kind": "KubeletConfiguration",
                        **_ordered(desired),
                    },
                )
            else:
                text = _template("config.yaml.j2").render(body=body)
        elif dist.config_format == "json" or current.lstrip().startswith("{"):
            text = yamledit.edit_json(current, desired, tuple(delete))
        else:
            text = yamledit.edit_yaml(current, desired, tuple(delete))
        updates[dist.config_file] = text.encode()
    else:  # flags (MicroK8s)
        ff = dist.flag_files[0]
        set_flags: dict[str, str] = {}
        for k, v in _ordered(desired).items():
            flag = FIELD_FLAGS.get(k)
            if flag is None:
                raise ConflictError(
                    f"{dist.name} configures the kubelet with flags only and {k} has no "
                    "kubelet flag",
                    intent.location(k),
                )
            set_flags[flag] = format_flag_value(k, v)
        updates[ff.path] = yamledit.edit_args(node.text(ff.path) or "", set_flags).encode()

    changed = {p: b for p, b in updates.items() if node.files.get(p) != b}
    after_node = node.with_files(changed)
    after = effective(after_node)
    _verify(dist, intent, desired, after, set(updates))
    files = tuple(
        RenderedFile(
            path=p,
            content=b,
            mode="0600" if p.endswith(".conf") and "kubelet.conf.d" in p else "0644",
            owner="root:root",
            action="modify" if p in node.files else "create",
        )
        for p, b in sorted(changed.items())
    )
    return Rendered(
        files=files,
        removed=tuple(f.path for f in files if f.action == "create"),
        effective_before=before,
        effective_after=after,
        checkpoint_reset=_checkpoint_reset(before, after),
        warnings=tuple(warnings),
        method=method,
        services=dist.services,
        daemon_reload=daemon_reload or any(".service.d/" in p for p in changed),
    )


def _resolve_cgroups(
    dist: Distribution,
    method: str,
    before: EffectiveConfig,
    desired: dict[str, Any],
    delete: list[str],
    warnings: list[str],
) -> None:
    """reservedSystemCPUs cannot be combined with reserved cgroups.

    The kubelet refuses to start with "invalid configuration: can't use reservedSystemCPUs
    (--reserved-cpus) with systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup
    (--kube-reserved-cgroup)".
    """
    msg = (
        "invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with "
        "systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup "
        "(--kube-reserved-cgroup)"
    )
    for cg in _CGROUPS:
        if desired.get(cg):
            raise ConflictError(
                f"the intent sets both; the kubelet says: {msg}", Location(field=cg)
            )
        cur = before.config.get(cg)
        if not cur or cg in desired:
            continue
        origin = before.origins.get(cg)
        loc = _where(before, cg)
        if origin and origin.kind == "flag":
            raise ConflictError(
                f"--{FIELD_FLAGS[cg]}={cur} is passed on the command line and cannot be "
                f"cleared by a file; remove the flag first. The kubelet says: {msg}",
                loc,
            )
        if method == "inplace":
            delete.append(cg)
            how = f"removed {cg} ({cur!r}) from {loc.file}"
        else:
            desired[cg] = ""
            how = f'set {cg}: "" in our drop-in (it was {cur!r} in {loc.file})'
        warnings.append(
            f"{how}: the kubelet refuses reservedSystemCPUs together with reserved cgroups ({msg})"
        )


def _verify(
    dist: Distribution,
    intent: Intent,
    desired: Mapping[str, Any],
    after: EffectiveConfig,
    ours: set[str],
) -> None:
    """Every field we own must be effective with our value; otherwise name who overrides it."""
    reserved = bool(str(desired.get("reservedSystemCPUs") or "").strip())
    for k, want in desired.items():
        origin = after.origins.get(k)
        got = after.config.get(k)
        if origin is None or origin.file in ours:
            continue
        if reserved and k in ("kubeReserved", "systemReserved"):
            continue
        if got == want and origin.kind != "flag":
            continue
        if origin.kind == "flag" and got == want:
            continue  # the flag agrees; our file is still what we promise on rollback
        how = "command-line flag" if origin.kind == "flag" else "later drop-in"
        flag = FIELD_FLAGS.get(k)
        flag_txt = (
            f" (--{flag}={format_flag_value(k, got)})" if flag and origin.kind == "flag" else ""
        )
        raise ConflictError(
            f"our {k}={want!r} would be silently overridden by a {how}{flag_txt} setting {got!r}; "
            f"remove it there (or set the same value) and render again",
            Location(file=origin.file, field=k, line=origin.line),
        )
