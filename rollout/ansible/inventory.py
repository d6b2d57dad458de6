"""Reading a plain INI inventory in-process, as ``ansible-inventory --list`` would print it.

Why: ``ansible-inventory`` costs about a second of CPU (more on a busy controller) before the
first node's facts can be asked for, on every ``apply``. Most inventories are one plain INI file
(``rollout lab`` writes one; ``inventories/example.ini`` is one), whose meaning is small and fixed:
sections of hosts with ``key=value`` variables, ``[group:vars]``. :func:`read_plain` parses exactly
that subset with Ansible's own rules (``shlex`` with comments for host lines, the first ``=`` for
``:vars`` lines, ``ast.literal_eval`` for values, host variables over group variables over
``all``'s) and returns ``None`` for anything else, so the caller runs ``ansible-inventory``:
YAML, TOML, scripts, directories, hosts outside a group, host ranges or ports in host names,
``[group:children]``, ``ansible_group_priority``, ``group_vars/`` or ``host_vars/`` beside the
file, an ``ansible.cfg`` with a setting that could change how inventories or variables are read
(one that sets only how plays run and hosts are reached, :data:`_RUN_ONLY`, is no reason to
decline: the repository's own, for AWX, is one), or ``ANSIBLE_*`` settings that could.
``tests/unit/test_inventory_plain.py`` compares both on every form it accepts.
"""

from __future__ import annotations

import ast
import os
import re
import shlex
import warnings
from pathlib import Path
from typing import Any

_SECTION = re.compile(r"^\[([^:\]\s]+)(?::(\w+))?\]\s*(?:#.*)?$")
#: group names Ansible takes as they are (others it may rename or warn about)
_SAFE_GROUP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: host names we take as they are: no ranges (``[01:10]``), no ``:port``, nothing Ansible rewrites
_SAFE_HOST = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]*$")
#: ``ANSIBLE_*`` settings whose presence sends the file to ``ansible-inventory``
_SETTINGS = ("INVENTORY", "VARS", "CONFIG", "PLUGIN", "GROUP", "TRANSFORM", "HOST")
_CONFIGS = (Path("ansible.cfg"), Path.home() / ".ansible.cfg", Path("/etc/ansible/ansible.cfg"))
#: ``ansible.cfg`` settings that decide how plays run, hosts are reached and output looks, never
#: how ``ansible-inventory -i FILE --list`` reads FILE (Ansible's ``config/base.yml``): a file
#: that sets nothing else keeps the in-process read. ``inventory`` is the default source, which
#: ``-i`` replaces. Anything else (an ``[inventory]`` section, ``hash_behaviour``,
#: ``precedence``, plugin paths or lists, ``force_valid_group_names`` ...) sends the file to
#: ``ansible-inventory``.
_RUN_ONLY: dict[str, frozenset[str] | None] = {
    "defaults": frozenset(
        {
            "inventory",
            "remote_user",
            "remote_port",
            "private_key_file",
            "host_key_checking",
            "timeout",
            "transport",
            "interpreter_python",
            "forks",
            "strategy",
            "gathering",
            "gather_subset",
            "gather_timeout",
            "fact_caching",
            "fact_caching_connection",
            "fact_caching_prefix",
            "fact_caching_timeout",
            "retry_files_enabled",
            "retry_files_save_path",
            "roles_path",
            "local_tmp",
            "remote_tmp",
            "stdout_callback",
            "callbacks_enabled",
            "callback_whitelist",
            "display_skipped_hosts",
            "display_ok_hosts",
            "deprecation_warnings",
            "nocows",
            "nocolor",
            "log_path",
        }
    ),
    # every key of these sections (None): connections, become, colours, diffs, Galaxy
    "ssh_connection": None,
    "connection": None,
    "paramiko_connection": None,
    "persistent_connection": None,
    "privilege_escalation": None,
    "colors": None,
    "diff": None,
    "galaxy": None,
}


class _NotPlain(Exception):
    """The file needs Ansible itself."""


def read_plain(path: Path) -> dict[str, Any] | None:
    """``ansible-inventory -i PATH --list``'s answer for a plain INI inventory, or None when the
    file (or the environment) is outside the subset this reads (then run ``ansible-inventory``)."""
    try:
        if not _plain_setting(path):
            return None
        text = path.read_text(encoding="utf-8")
        return _parse(text)
    except (_NotPlain, OSError, UnicodeDecodeError):
        return None


def _plain_setting(path: Path) -> bool:
    """A regular, non-executable file with no extension another inventory plugin claims, no
    variable directories beside it, and no Ansible configuration that could read it otherwise."""
    if not path.is_file() or os.access(path, os.X_OK):
        return False
    if path.suffix.lower() in (".yml", ".yaml", ".json", ".toml"):
        return False
    if any((path.parent / d).exists() for d in ("group_vars", "host_vars")):
        return False
    if not all(_run_only(c) for c in _CONFIGS if c.exists()):
        return False
    return not any(k.startswith("ANSIBLE_") and any(s in k for s in _SETTINGS) for k in os.environ)


def _run_only(config: Path) -> bool:
    """``config`` (an ``ansible.cfg``) reads as INI, as Ansible reads it, and sets only
    :data:`_RUN_ONLY` settings. Every such file found counts, not only the first one that
    Ansible reads (it skips one in a world-writable directory)."""
    import configparser

    cfg = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
    try:
        cfg.read_string(config.read_text(encoding="utf-8"), str(config))
    except (OSError, UnicodeDecodeError, configparser.Error):
        return False
    if cfg.defaults():  # ``[DEFAULT]`` keys count in every section
        return False
    for section in cfg.sections():
        if section not in _RUN_ONLY:
            return False
        keys = _RUN_ONLY[section]
        if keys is not None and not set(cfg.options(section)) <= keys:
            return False
    return True


def _value(v: str) -> Any:
    """Ansible's ``_parse_value``: a Python literal where it is one, else the text."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SyntaxWarning)
            out = ast.literal_eval(v)
    except (ValueError, SyntaxError):
        return v
    except Exception as e:  # Ansible would fail here: let it say why
        raise _NotPlain(str(e)) from e
    return _coerce(out)


def _coerce(v: Any) -> Any:
    """What Ansible stores of a literal: strings, numbers, booleans, None, lists and dicts;
    anything else (bytes, complex, ``...``, sets, tuples) is left to Ansible itself."""
    if isinstance(v, list):
        return [_coerce(x) for x in v]
    if isinstance(v, dict):
        if not all(isinstance(k, str) for k in v):
            raise _NotPlain("non-string key")
        return {k: _coerce(x) for k, x in v.items()}
    if v is None or isinstance(v, str | bool | int | float):
        return v
    raise _NotPlain(f"{type(v).__name__} value")


def _parse(text: str) -> dict[str, Any]:
    group, state = "ungrouped", "hosts"
    members: dict[str, list[str]] = {"ungrouped": []}  # stays empty: such hosts are declined
    group_vars: dict[str, dict[str, Any]] = {}
    host_vars: dict[str, dict[str, Any]] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line[0] in "#;":
            continue
        if m := _SECTION.match(line):
            group, state = m.group(1), m.group(2) or "hosts"
            if state not in ("hosts", "vars") or not _SAFE_GROUP.match(group):
                raise _NotPlain(line)
            if state == "hosts":
                members.setdefault(group, [])
            continue
        if line.startswith("["):
            raise _NotPlain(line)
        if state == "vars":
            if "=" not in line:
                raise _NotPlain(line)
            k, v = (e.strip() for e in line.split("=", 1))
            if k == "ansible_group_priority":
                raise _NotPlain(k)
            group_vars.setdefault(group, {})[k] = _value(v)
            continue
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError as e:
            raise _NotPlain(line) from e
        if not tokens or not _SAFE_HOST.match(tokens[0]) or tokens[0] in ("all", "ungrouped"):
            raise _NotPlain(line)
        host = tokens[0]
        hv = host_vars.setdefault(host, {})
        for t in tokens[1:]:
            if "=" not in t:
                raise _NotPlain(line)
            k, v = t.split("=", 1)
            hv[k] = _value(v)
        if group in ("all", "ungrouped"):
            raise _NotPlain(line)  # hosts outside a group: Ansible's placement rules, not ours
        if host not in members[group]:
            members[group].append(host)
    for g in group_vars:
        if g not in members and g != "all":
            raise _NotPlain(f"[{g}:vars] of an undeclared group")
    return _listing(members, group_vars, host_vars)


def _listing(
    members: dict[str, list[str]],
    group_vars: dict[str, dict[str, Any]],
    host_vars: dict[str, dict[str, Any]],
) -> dict[str, Any]:
    """The ``--list`` shape: ``_meta.hostvars``, ``all.children`` and each non-empty group's
    hosts. A host's variables: ``all``'s, then its groups' in name order, then its own."""
    hostvars: dict[str, dict[str, Any]] = {}
    order = [h for hs in members.values() for h in hs]
    for host in dict.fromkeys(order):
        merged = dict(group_vars.get("all", {}))
        for g in sorted(g for g, hs in members.items() if host in hs):
            merged.update(group_vars.get(g, {}))
        merged.update(host_vars.get(host, {}))
        if merged:
            hostvars[host] = merged
    out: dict[str, Any] = {"_meta": {"hostvars": hostvars}}
    out["all"] = {"children": list(members)}
    for g, hs in members.items():
        if hs:
            out[g] = {"hosts": list(hs)}
    return out
