"""Every module of the ``rollout`` package by dotted name, read from the source tree (the import
walkers of ``test_import_cycles`` and ``test_private_imports`` share it)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def rollout_modules() -> dict[str, Path]:
    """``rollout.a.b`` -> its file (a package by its ``__init__.py``)."""
    out = {}
    for f in (ROOT / "rollout").rglob("*.py"):
        name = ".".join(f.relative_to(ROOT).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = f
    return out
