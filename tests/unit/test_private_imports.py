"""No private-name import across modules in ``rollout/``: a name that starts with ``_`` is the
business of the module that defines it. Another module that needs it gets a public name (and the
defining module a reason to keep it stable), or the helper moves to where both can use it.

The walk reads every module's source (top-level imports and those inside functions, relative ones
resolved against the package) and also catches ``module._name`` attribute reads through an
imported module. Dunder names (``__version__``) are public by convention."""

from __future__ import annotations

import ast

from tests.unit.rollout_modules import rollout_modules


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _absolute(node: ast.ImportFrom, package: str) -> str:
    base = node.module or ""
    if not node.level:
        return base
    parts = package.split(".")
    parts = parts[: len(parts) - node.level + 1]
    return ".".join([*parts, *([base] if base else [])])


def private_imports(source: str, module: str, is_package: bool, mods: set[str]) -> list[str]:
    """``module:line name`` for each private name ``module`` takes from another rollout module."""
    package = module if is_package else module.rpartition(".")[0]
    tree = ast.parse(source)
    found: list[str] = []
    aliases: dict[str, str] = {}  # local name -> rollout module it is bound to
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in mods:
                    aliases[a.asname or a.name.partition(".")[0]] = (
                        a.name if a.asname else a.name.partition(".")[0]
                    )
        elif isinstance(node, ast.ImportFrom):
            base = _absolute(node, package)
            if not (base == "rollout" or base.startswith("rollout.")) or base == module:
                continue
            for a in node.names:
                if f"{base}.{a.name}" in mods:
                    aliases[a.asname or a.name] = f"{base}.{a.name}"
                elif _private(a.name):
                    found.append(f"{module}:{node.lineno} {base}.{a.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and _private(node.attr)
            and isinstance(node.value, ast.Name)
            and aliases.get(node.value.id, module) != module
        ):
            found.append(f"{module}:{node.lineno} {aliases[node.value.id]}.{node.attr}")
    return found


def test_the_walker_sees_every_form() -> None:
    mods = {"rollout", "rollout.a", "rollout.a.b", "rollout.a.c"}
    src = (
        "from rollout.a.b import _x, y\n"
        "from .c import _z\n"
        "from . import c as cc\n"
        "import rollout.a.b\n"
        "def f():\n"
        "    from rollout.a.c import _w\n"
        "    return cc._v, rollout.a.b, y._ok\n"
        "from rollout import __version__\n"
    )
    assert private_imports(src, "rollout.a.d", False, mods) == [
        "rollout.a.d:1 rollout.a.b._x",
        "rollout.a.d:2 rollout.a.c._z",
        "rollout.a.d:6 rollout.a.c._w",
        "rollout.a.d:7 rollout.a.c._v",
    ]
    assert private_imports("from rollout.a.b import y\n", "rollout.a.d", False, mods) == []


def test_no_module_imports_another_modules_private_names() -> None:
    mods = rollout_modules()
    found = [
        hit
        for m, f in sorted(mods.items())
        for hit in private_imports(
            f.read_text(encoding="utf-8"), m, f.name == "__init__.py", set(mods)
        )
    ]
    assert found == [], "\n".join(found)


def test_no_module_re_exports_another_modules_names() -> None:
    """An ``__all__`` lists only what its module defines: a name imported from another rollout
    module and listed there is a re-export shim, and its callers should name the home."""
    shims = []
    for name, f in rollout_modules().items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        imported = {
            a.asname or a.name
            for n in tree.body
            if isinstance(n, ast.ImportFrom) and (n.level or (n.module or "").startswith("rollout"))
            for a in n.names
        }
        for n in tree.body:
            if isinstance(n, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in n.targets
            ):
                listed = {e.value for e in ast.walk(n.value) if isinstance(e, ast.Constant)}
                shims += [f"{name}.{x}" for x in sorted(listed & imported)]
    assert shims == []


def test_no_module_re_exports_a_name_by_a_redundant_alias() -> None:
    """``from rollout.x import A as A`` is the other re-export idiom (PEP 484's explicit
    re-export): ``rollout.models`` re-exported ``Verdict`` from ``rollout.verdicts`` that way."""
    found = []
    for name, f in rollout_modules().items():
        for n in ast.walk(ast.parse(f.read_text(encoding="utf-8"))):
            if isinstance(n, ast.ImportFrom) and (
                n.level or (n.module or "").startswith("rollout")
            ):
                found += [f"{name}:{n.lineno} {a.name}" for a in n.names if a.asname == a.name]
    assert found == []
