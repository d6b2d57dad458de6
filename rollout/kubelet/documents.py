"""Parse one KubeletConfiguration (or config.yaml) file: values plus the line of every field.

Parsing uses PyYAML's libyaml-backed loader (render runs on thousands of nodes; the whole render
is 9x faster per node than a ruamel round trip alone, ``benchmarks/README.md``) and records, for
each dotted field, the line that set it, so lint can name file and line. Merging the layers a
kubelet reads is :mod:`rollout.kubelet.loading`.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml

from rollout.errors import Location, ParseError, read_input

_Loader: type[Any] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@dataclass(frozen=True)
class Document:
    """A parsed KubeletConfiguration (or config.yaml) file: values plus a line for each dotted
    field."""

    path: str
    data: dict[str, Any]
    lines: Mapping[str, int]


def _where(e: yaml.MarkedYAMLError) -> int | None:
    mark = e.problem_mark or e.context_mark
    return mark.line + 1 if mark else None


def parse_document(text: str, path: str, fmt: Literal["yaml", "json"] | None = None) -> Document:
    """Parse YAML or JSON text into a mapping, with the 1-based line of every dotted field.

    Raises:
        ParseError: malformed text, or a document that is not a mapping (file and line named).
    """
    if fmt == "json" or (fmt is None and text.lstrip().startswith("{")):
        try:
            data = json.loads(text) if text.strip() else {}
        except json.JSONDecodeError as e:
            raise ParseError(f"invalid JSON: {e.msg}", Location(file=path, line=e.lineno)) from e
    try:
        loader = _Loader(text)
        try:
            node = loader.get_single_node()
            if fmt != "json" and not (fmt is None and text.lstrip().startswith("{")):
                data = loader.construct_document(node) if node is not None else {}
        finally:
            loader.dispose()
    except yaml.MarkedYAMLError as e:
        raise ParseError(
            f"invalid YAML: {e.problem or e}", Location(file=path, line=_where(e))
        ) from e
    except yaml.YAMLError as e:
        raise ParseError(f"invalid YAML: {e}", Location(file=path)) from e
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ParseError(
            f"expected a mapping at the top level, got {type(data).__name__}",
            Location(file=path, line=1),
        )
    lines: dict[str, int] = {}
    if isinstance(node, yaml.MappingNode):
        _collect_lines(node, "", lines)
    return Document(path, data, lines)


def clone(v: Any) -> Any:
    """A deep copy of parsed YAML/JSON data (dicts, lists, scalars): several times faster than
    ``copy.deepcopy``, which preflight would otherwise pay a few times per node."""
    if isinstance(v, dict):
        return {k: clone(x) for k, x in v.items()}
    if isinstance(v, list):
        return [clone(x) for x in v]
    return v


@functools.lru_cache(maxsize=512)
def parsed(text: str, path: str) -> Document:
    """``parse_document`` for the readers here, which never mutate ``data``: a fleet's nodes
    mostly hold the same bytes, and preflight parses each file a few times per node (effective
    config before, render, after), so 1,000 nodes parse a handful of distinct documents."""
    return parse_document(text, path)


def _collect_lines(node: yaml.MappingNode, prefix: str, out: dict[str, int]) -> None:
    for key, value in node.value:
        if not isinstance(key, yaml.ScalarNode):
            continue
        dotted = f"{prefix}{key.value}"
        out.setdefault(dotted, key.start_mark.line + 1)
        if isinstance(value, yaml.MappingNode):
            _collect_lines(value, dotted + ".", out)
        elif isinstance(value, yaml.SequenceNode):
            for i, item in enumerate(value.value):
                out.setdefault(f"{dotted}[{i}]", item.start_mark.line + 1)
                if isinstance(item, yaml.MappingNode):
                    _collect_lines(item, f"{dotted}[{i}].", out)


def load_file(
    path: Path | str, display: str | None = None
) -> tuple[dict[str, Any], dict[str, int]]:
    """Load one KubeletConfiguration file: ``(data, line of each dotted field)``.

    Raises:
        InputError: the file is missing or unreadable. ParseError: malformed YAML/JSON.
    """
    p = Path(path)
    name = display or str(p)
    text = read_input(p, name)
    doc = parse_document(text, name, "json" if p.suffix == ".json" else None)
    return doc.data, dict(doc.lines)
