"""One name per idea: a module basename that repeats across packages makes a newcomer open the
wrong file (issue 38). The repeats that exist are listed below as known debt, each with where it
lives; a new repeat fails this test, and a repeat that is gone must leave the list."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2] / "rollout"

# basename -> the packages that hold it today: ``cli/<command>.py`` mirroring the module of the
# idea it drives, and the lab's stand-ins named after what they stand in for.
KNOWN = {
    "cluster.py": {"lab", "kube"},
    "collecting.py": {"kube", "evidence"},
    "devices.py": {"kubelet/admission", "kube"},
    "inventory.py": {"lab", "ansible"},
    "nodes.py": {"lab", "kube"},
    "options.py": {"kubelet", "cli"},
    "payloads.py": {"gate", "ansible"},
    "tenancy.py": {"cli", "kube"},
}


def _repeats() -> dict[str, set[str]]:
    where: dict[str, set[str]] = defaultdict(set)
    for path in ROOT.rglob("*.py"):
        if path.name in {"__init__.py", "__main__.py"}:
            continue
        where[path.name].add(path.parent.relative_to(ROOT).as_posix())
    return {name: pkgs for name, pkgs in where.items() if len(pkgs) > 1}


def test_no_new_module_basename_repeats_across_packages() -> None:
    new = {n: sorted(p) for n, p in _repeats().items() if p - KNOWN.get(n, set())}
    assert not new, (
        f"module basename(s) repeated across packages: {new}; name the module after its own "
        "idea (docs/architecture.md lists the rooms)"
    )


def test_the_known_repeats_list_only_what_still_repeats() -> None:
    now = _repeats()
    gone = {n: sorted(p - now.get(n, set())) for n, p in KNOWN.items() if p - now.get(n, set())}
    assert not gone, f"no longer repeated: remove from KNOWN: {gone}"
