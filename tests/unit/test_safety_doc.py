"""docs/safety.md names the test that proves each guarantee: every test it names must exist, so a
renamed or deleted test cannot leave a claim without its proof."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
# `tests/x.py::test_name[case]`, `tests/x.py`, or `::test_name` (same file as the last one named)
NAMED = re.compile(r"`(tests/[\w/]+\.py)?(?:::(\w+)(\[[^\]`]*\])?)?`|`(\[[^\]`]*\])`")


def named_tests(text: str) -> list[tuple[str, str | None]]:
    """(file, test function or None) for every test reference in ``text``, in order."""
    out: list[tuple[str, str | None]] = []
    last = ""
    for m in NAMED.finditer(text):
        file, func = m.group(1), m.group(2)
        if file is None and func is None:
            continue
        last = file or last
        out.append((last, func))
    return out


def test_every_test_the_safety_page_names_exists() -> None:
    refs = named_tests((REPO / "docs" / "safety.md").read_text())
    assert len(refs) > 30  # the page names its proofs
    missing = []
    for file, func in refs:
        path = REPO / file
        if not path.is_file():
            missing.append(file)
        elif func and not re.search(rf"^(async )?def {func}\(", path.read_text(), re.M):
            missing.append(f"{file}::{func}")
    assert not missing, f"docs/safety.md names tests that do not exist: {missing}"


def test_the_reference_parser_reads_the_forms_the_page_uses() -> None:
    text = "`tests/unit/a.py::test_x`, `::test_y`, `tests/lab/b.py::test_z[c-d:e]`, `[f]` `x`"
    assert named_tests(text) == [
        ("tests/unit/a.py", "test_x"),
        ("tests/unit/a.py", "test_y"),
        ("tests/lab/b.py", "test_z"),
    ]
