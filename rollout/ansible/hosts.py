"""The Ansible inventory a change runs on: its hosts, groups and host variables.

Why apart from :mod:`rollout.change.preflight.checking`: the inventory is read by more than
preflight (``rollout preview``, the runbook, a restore that ships over plain ssh), and reading it is
its own concern: ``ansible-inventory --list`` parses every inventory format, costs about a second of
CPU, and is started early so the caller can gather other facts meanwhile (:func:`start_inventory`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout.ansible.inventory import read_plain
from rollout.errors import InputError, Location


@dataclass(frozen=True)
class Inventory:
    """An Ansible inventory, as ``ansible-inventory --list`` sees it.

    Attributes:
        path: the file.
        hosts: every host, in inventory order.
        groups: group -> hosts.
        hostvars: host -> variables.
    """

    path: Path
    hosts: tuple[str, ...]
    groups: Mapping[str, tuple[str, ...]]
    hostvars: Mapping[str, Mapping[str, Any]]

    def node_of(self, host: str) -> str:
        """The Kubernetes Node name of a host (``rollout_node_name``, else the host name)."""
        return str(self.hostvars.get(host, {}).get("rollout_node_name") or host)


def read_inventory(path: Path) -> Inventory:
    """Parse an inventory with ``ansible-inventory --list`` (every inventory format works).

    Raises:
        InputError: the file is not a valid inventory, or holds no hosts.
    """
    return start_inventory(path)()


def start_inventory(path: Path) -> Callable[[], Inventory]:
    """Start ``ansible-inventory --list`` (about a second of CPU) and return what waits for it
    and parses its answer (:func:`read_inventory`), so a caller can do other work meanwhile.

    Raises:
        InputError: ``ansible-inventory`` is not installed (the returned function raises the
            other errors of :func:`read_inventory`).
    """
    if (plain := read_plain(path)) is not None:  # a plain INI file: no ansible-inventory
        return lambda: _parse_inventory(path, plain)
    exe = shutil.which("ansible-inventory", path=str(Path(sys.executable).parent)) or shutil.which(
        "ansible-inventory"
    )
    if exe is None:
        raise InputError("ansible-inventory not found", Location(file=str(path)))
    proc = subprocess.Popen(
        [exe, "-i", str(path), "--list"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "ANSIBLE_INVENTORY_UNPARSED_FAILED": "true"},
    )

    def finish() -> Inventory:
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise InputError(
                f"not a valid inventory: {stderr.strip()[-300:]}", Location(file=str(path))
            )
        return _parse_inventory(path, json.loads(stdout))

    return finish


def _parse_inventory(path: Path, data: Mapping[str, Any]) -> Inventory:
    groups: dict[str, tuple[str, ...]] = {}
    order: list[str] = []
    for name, g in data.items():
        if name == "_meta" or not isinstance(g, dict):
            continue
        hosts = tuple(g.get("hosts", ()))
        groups[name] = hosts
        order += [h for h in hosts if h not in order]
    if not order:
        raise InputError("inventory has no hosts", Location(file=str(path)))
    return Inventory(path, tuple(order), groups, data.get("_meta", {}).get("hostvars", {}))


def hosts_for(inv: Inventory, nodes: Sequence[str]) -> list[str]:
    """Inventory hosts of the given Node names."""
    by_node = {inv.node_of(h): h for h in inv.hosts}
    return [by_node[n] for n in nodes if n in by_node]
