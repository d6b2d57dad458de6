"""No import circle in ``rollout/``: every module's imports (top-level and inside functions, the
ones a call can trigger), walked from the source, form no cycle; nor do they with the imports
guarded by ``if TYPE_CHECKING:`` (they never run, but a type-only circle is the same two ideas
cut in two: ``rollout.lab.labstate`` imported ``Lab`` to write its privates).

Why: a circle works only while each side imports the other lazily or late; the next top-level
import breaks it, and it says the two modules are one idea cut in two (``rollout/ansible/``
had ``runner`` -> ``gathering`` -> ``runner``, now through ``rollout/ansible/settings.py``)."""

from __future__ import annotations

import ast

from tests.unit.rollout_modules import rollout_modules


def _imports(tree: ast.AST, typing_too: bool = False) -> list[ast.Import | ast.ImportFrom]:
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if (
            not typing_too
            and isinstance(node, ast.If)
            and "TYPE_CHECKING" in ast.unparse(node.test)
        ):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(typing_too: bool = False) -> dict[str, set[str]]:
    mods = rollout_modules()
    graph: dict[str, set[str]] = {m: set() for m in mods}
    for m, f in mods.items():
        package = m if f.name == "__init__.py" else m.rpartition(".")[0]
        for node in _imports(ast.parse(f.read_text(encoding="utf-8")), typing_too):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*parts, *([base] if base else [])])
                targets = [base, *(f"{base}.{a.name}" for a in node.names)]
            graph[m].update(t for t in targets if t in mods and t != m)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on.add(start)
        while work:
            v, it = work[-1]
            w = next(it, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on.add(w)
                    work.append((w, iter(sorted(graph[w]))))
                elif w in on:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                comp = []
                while True:
                    x = stack.pop()
                    on.discard(x)
                    comp.append(x)
                    if x == v:
                        break
                if len(comp) > 1:
                    out.append(sorted(comp))
    return out


def test_the_walker_finds_a_circle() -> None:
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_rollout_has_no_import_circle() -> None:
    graph = import_graph()
    assert "rollout.ansible.settings" in graph["rollout.ansible.direct"]
    assert cycles(graph) == []


def test_rollout_has_no_import_circle_counting_type_only_imports() -> None:
    graph = import_graph(typing_too=True)
    assert "rollout.lab.controlplane" in graph["rollout.lab.labnodes"]  # a TYPE_CHECKING import
    assert cycles(graph) == []


def test_no_module_outside_the_cli_imports_it() -> None:
    """``rollout/cli/`` parses and prints; nothing below it imports it (a command's logic that
    another package needs lives below the CLI: ``rollout.gate.trigger`` for ``watch`` and
    ``serve``, ``rollout.change.commands.session`` for the change commands)."""
    graph = import_graph(typing_too=True)
    into_cli = sorted(
        (m, t)
        for m, targets in graph.items()
        if not (m == "rollout.cli" or m.startswith("rollout.cli."))
        for t in targets
        if t == "rollout.cli" or t.startswith("rollout.cli.")
    )
    assert into_cli == []
