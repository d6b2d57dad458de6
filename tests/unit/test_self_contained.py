"""The repository is self-contained: a clone runs its tests with nothing beside it.

The real node files the render and lint tests read live in ``tests/fixtures/`` (copied with their
provenance notes); no file in the project reads a directory outside the checkout.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
FIXTURES = REPO / "tests" / "fixtures" / "kubelet"
# built from pieces, so this file does not match itself
OUTSIDE = (
    "../" + "shared",
    "/work/" + "shared",
    "parents[2]" + ".parent",
    "parents[1].par" + "ent",
)

# a path built from the checkout's parent (``REPO.parent / "shared/..."``) or naming the shared
# directory as a relative path; built from pieces, like OUTSIDE
BESIDE = re.compile(r"\b(?:REPO|ROOT|HERE)\.par" + r"ent\b|[\"']shar" + r"ed/")


def tracked_text_files() -> list[Path]:
    out = subprocess.run(
        ["git", "ls-files", "-z"], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    files = []
    for name in filter(None, out.split("\0")):
        p = REPO / name
        # what runs or configures something; prose (Markdown, provenance) may name the shared dir
        if p.is_file() and p.suffix not in {".md", ".txt", ".png", ".svg", ".sum"}:
            files.append(p)
    return files


def test_nothing_reads_outside_the_repository() -> None:
    hits = []
    for p in tracked_text_files():
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            continue
        for n, line in enumerate(text.splitlines(), 1):
            hits += [f"{p.relative_to(REPO)}:{n}: {line.strip()}" for o in OUTSIDE if o in line]
    assert not hits, "reads outside the checkout:\n" + "\n".join(hits)


def test_fixtures_live_in_the_repository_with_their_provenance() -> None:
    names = {p.name for p in FIXTURES.iterdir()}
    assert "README.md" in names
    for p in sorted(FIXTURES.iterdir()):
        if p.name == "README.md" or p.name.endswith(".source.txt"):
            continue
        if p.is_dir():
            # a set of files from one source (a harness's vectors) says where they come from once
            assert (p / "README.md").is_file(), f"{p.name}/: no README.md with its provenance"
            continue
        text = p.read_text(encoding="utf-8")
        has_note = "[fixture]" in text or f"{p.name}.source.txt" in names
        assert has_note, f"{p.name}: no provenance line and no {p.name}.source.txt"


def test_no_code_in_rollout_or_benchmarks_reads_beside_the_checkout() -> None:
    """The shared fixture set sits beside the checkout; rollout/ and benchmarks/ read only the
    repository's own copies (``tests/fixtures/``)."""
    code = [
        p
        for p in tracked_text_files()
        if p.relative_to(REPO).parts[0] in {"rollout", "benchmarks"} and p.suffix == ".py"
    ]
    assert any(p.name == "preflight_bench.py" for p in code)
    hits = [
        f"{p.relative_to(REPO)}:{n}: {line.strip()}"
        for p in code
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if BESIDE.search(line) or any(o in line for o in OUTSIDE)
    ]
    assert not hits, "reads beside the checkout:\n" + "\n".join(hits)
