"""Byte-preserving edits of machine- and hand-written config files.

A node's config.yaml is compared byte for byte on rollback and read by people during incidents, so
an
in-place edit changes only the top-level fields we own: every other line (comments, quoting, key
order,
indentation, a missing final newline) is left exactly as it was. Text edits on top-level blocks are
enough for KubeletConfiguration files, whose top level is always a block mapping; they are also ~30x
faster than a round-trip load and dump, which matters at 1,000 nodes.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

# Plain (unquoted) only if no parser can read it as anything but this string: a trailing ":" would
# make ``k: foo:`` a ScannerError and ``- foo:`` a mapping, so the last character is never ":".
_PLAIN = re.compile(r"^[A-Za-z/](?:[A-Za-z0-9_./:@-]*[A-Za-z0-9_./@-])?$")
# Characters json.dumps(ensure_ascii=False) leaves raw that a YAML reader does not give back inside
# a double-quoted scalar: outside YAML's printable set (PyYAML: "unacceptable character") or a line
# break YAML folds (NEL, LS, PS). Written as \uXXXX escapes, which JSON and YAML share.
_UNQUOTABLE = re.compile("[\x7f-\x9f\u2028\u2029\ufeff\ufffe\uffff]")
_YAML11_WORDS = "y n yes no on off true false null ~"
_YAML11_SPECIAL = frozenset(
    w2 for w in _YAML11_WORDS.split() for w2 in (w, w.capitalize(), w.upper())
)


def scalar(value: Any) -> str:
    """A YAML scalar that every YAML 1.1/1.2 parser (and sigs.k8s.io/yaml) reads back unchanged."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return json.dumps(value)
    text = str(value)
    if _PLAIN.match(text) and text not in _YAML11_SPECIAL:
        return text
    quoted = json.dumps(text, ensure_ascii=False)
    return _UNQUOTABLE.sub(lambda m: f"\\u{ord(m.group()):04x}", quoted)


def emit(key: str, value: Any, indent: int = 0, list_indent: int = 0) -> list[str]:
    """Block-style YAML lines for ``key: value`` (lists at ``list_indent`` extra spaces)."""
    pad = " " * indent
    if isinstance(value, Mapping):
        if not value:
            return [f"{pad}{scalar(key)}: {{}}"]
        out = [f"{pad}{scalar(key)}:"]
        for k, v in value.items():
            out.extend(emit(str(k), v, indent + 2, list_indent))
        return out
    if isinstance(value, list):
        if not value:
            return [f"{pad}{scalar(key)}: []"]
        out = [f"{pad}{scalar(key)}:"]
        item_pad = " " * (indent + list_indent)
        for item in value:
            if isinstance(item, Mapping) and item:
                first = True
                for k, v in item.items():
                    lines = emit(str(k), v, indent + list_indent + 2, list_indent)
                    if first:
                        lines[0] = f"{item_pad}- " + lines[0].lstrip()
                        first = False
                    out.extend(lines)
            else:
                out.append(f"{item_pad}- {scalar(item)}")
        return out
    return [f"{pad}{scalar(key)}: {scalar(value)}"]


def dump(data: Mapping[str, Any], list_indent: int = 0) -> str:
    """A whole block-style YAML document (keys in the given order)."""
    lines: list[str] = []
    for k, v in data.items():
        lines.extend(emit(str(k), v, 0, list_indent))
    return "\n".join(lines) + "\n"


_TOP_KEY = re.compile(r"""^(?:"([^"]*)"|'([^']*)'|([^\s#'"][^:#]*?))\s*:(?:\s|$)""")


def _top_key(line: str) -> str | None:
    if not line or line[0] in " \t#-":
        return None
    m = _TOP_KEY.match(line)
    if not m:
        return None
    return next(g for g in m.groups() if g is not None)


def _blocks(lines: list[str]) -> list[tuple[str, int, int]]:
    """``(key, first line, end line exclusive)`` of each top-level entry."""
    starts = [(i, k) for i, line in enumerate(lines) if (k := _top_key(line)) is not None]
    out: list[tuple[str, int, int]] = []
    for n, (i, k) in enumerate(starts):
        end = starts[n + 1][0] if n + 1 < len(starts) else len(lines)
        # comment / blank lines just above the next key belong to the next key
        while end - 1 > i and (not lines[end - 1].strip() or lines[end - 1].startswith("#")):
            end -= 1
        out.append((k, i, end))
    return out


def _list_indent(lines: list[str]) -> int:
    for i, line in enumerate(lines[:-1]):
        if _top_key(line) is not None and line.rstrip().endswith(":"):
            nxt = lines[i + 1]
            if nxt.startswith("- "):
                return 0
            if nxt.lstrip().startswith("- "):
                return len(nxt) - len(nxt.lstrip())
    return 0


def _is_sorted(keys: list[str]) -> bool:
    return len(keys) > 3 and keys == sorted(keys)


def edit_yaml(text: str, set_fields: Mapping[str, Any], delete: tuple[str, ...] = ()) -> str:
    """Set (or add) and delete top-level fields of a block-mapping YAML document; no other
    line changes.

    New keys go where a sorted file would have them (kubeadm, k3s write sorted keys), else at the
    end. A missing final newline stays missing.
    """
    final_newline = text.endswith("\n") or text == ""
    lines = text.split("\n")
    if final_newline and lines and lines[-1] == "":
        lines.pop()
    li = _list_indent(lines)
    for key in delete:
        for k, start, end in _blocks(lines):
            if k == key:
                del lines[start:end]
                break
    for key, value in set_fields.items():
        new = emit(key, value, 0, li)
        blocks = _blocks(lines)
        hit = next(((s, e) for k, s, e in blocks if k == key), None)
        if hit:
            s, e = hit
            if lines[s:e] != new:
                lines[s:e] = new
            continue
        keys = [k for k, _, _ in blocks]
        if _is_sorted(keys):
            after = [(s, e) for k, s, e in blocks if k < key]
            before = [(s, e) for k, s, e in blocks if k > key]
            if before:
                pos = before[0][0]
                # keep comment lines above the following key with that key
                while (
                    pos > 0
                    and lines[pos - 1].startswith("#")
                    and (not after or pos - 1 >= after[-1][1])
                ):
                    pos -= 1
                lines[pos:pos] = new
                continue
        lines.extend(new)
    out = "\n".join(lines)
    return out + "\n" if final_newline else out


def json_style(text: str) -> tuple[int, bool]:
    """(indent, trailing newline) of a JSON document as written by jq (2) or Go MarshalIndent
    (4)."""
    m = re.search(r"\n( +)\S", text)
    return (len(m.group(1)) if m else 2), text.endswith("\n")


def edit_json(text: str, set_fields: Mapping[str, Any], delete: tuple[str, ...] = ()) -> str:
    """Set/delete top-level fields of a JSON object, keeping key order, indent and final newline."""
    data = json.loads(text) if text.strip() else {}
    indent, newline = json_style(text) if text.strip() else (2, True)
    keys = list(data)
    sorted_keys = len(keys) > 2 and keys == sorted(keys)
    for k in delete:
        data.pop(k, None)
    for k, v in set_fields.items():
        data[k] = v
    if sorted_keys:
        data = dict(sorted(data.items()))
    out = json.dumps(data, indent=indent, ensure_ascii=False)
    return out + "\n" if newline else out


def edit_args(text: str, set_flags: Mapping[str, str]) -> str:
    """Set ``--name=value`` lines in a one-flag-per-line args file (MicroK8s); others untouched."""
    final_newline = text.endswith("\n") or text == ""
    lines = text.split("\n")
    if final_newline and lines and lines[-1] == "":
        lines.pop()
    for name, value in set_flags.items():
        quoted = f'"{value}"' if any(c in value for c in " ;<") else value
        new = f"--{name}={quoted}"
        pat = re.compile(rf"^\s*--{re.escape(name)}(?:=|\s|$)")
        idx = [i for i, line in enumerate(lines) if pat.match(line)]
        if idx:
            lines[idx[-1]] = new
            for i in reversed(idx[:-1]):
                del lines[i]
        else:
            lines.append(new)
    out = "\n".join(lines)
    return out + "\n" if final_newline else out
