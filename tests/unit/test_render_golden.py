"""Golden files: what render produces for every distribution, fresh and on real node files.

``UPDATE_GOLDEN=1 pytest tests/unit/test_render_golden.py`` rewrites the goldens; review the diff.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from rollout.kubelet.distributions import DISTRIBUTIONS
from rollout.kubelet.intent import build_intent
from rollout.kubelet.loading import node_from_files
from rollout.kubelet.render import Rendered, render
from tests.unit.render_fixtures import fixture_files, real_node

GOLDEN = Path(__file__).parent / "golden" / "render"
INTENT = build_intent({"reservedSystemCPUs": "0,32"})

CASES = [(dist, method) for dist in sorted(DISTRIBUTIONS) for method in DISTRIBUTIONS[dist].methods]


def _serialise(r: Rendered) -> str:
    out = []
    for f in r.files:
        out.append(f"=== {f.path} ({f.action}, {f.mode})\n")
        text = f.content.decode()
        out.append(text if text.endswith("\n") else text + "\n<no final newline>\n")
    out.append(f"=== removed on rollback: {list(r.removed)}\n")
    out.append(f"=== checkpoint reset: {list(r.checkpoint_reset)}\n")
    out.extend(f"=== warning: {w}\n" for w in r.warnings)
    return "".join(out)


def _check(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN") == "1":
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden {path}; run with UPDATE_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize(("dist", "method"), CASES)
def test_real_node(dist: str, method: str) -> None:
    _check(f"{dist}-{method}-real.txt", _serialise(render(real_node(dist), INTENT, method)))


@pytest.mark.parametrize(("dist", "method"), CASES)
def test_fresh_node(dist: str, method: str) -> None:
    node = node_from_files(dist, {})
    if dist == "eks-al2023" and method == "dropin":
        pytest.skip("a fresh AL2023 node has no --config-dir (see test_render_props)")
    _check(f"{dist}-{method}-fresh.txt", _serialise(render(node, INTENT, method)))


@pytest.mark.parametrize("dist", sorted(DISTRIBUTIONS))
def test_untouched_lines_are_byte_identical(dist: str) -> None:
    """An in-place edit keeps every line that does not hold one of our fields."""
    files = fixture_files(dist)
    r = render(real_node(dist), INTENT)
    for f in r.files:
        if f.action != "modify":
            continue
        old = files[f.path].decode().splitlines()
        new = f.content.decode().splitlines()
        ours = (
            "cpuManagerPolicy",
            "reservedSystemCPUs",
            "topologyManager",
            "--cpu-manager",
            "--reserved-cpus",
            "--topology-manager",
            '"cpuManager',
            '"reservedSystem',
            '"topologyManager',
            "kubeReservedCgroup",
            "systemReservedCgroup",
            '"kubeReservedCgroup',
            '"systemReservedCgroup',
        )
        kept = [line for line in old if not line.strip().startswith(ours)]
        assert [line for line in new if line in kept or not line.strip().startswith(ours)][
            : len(kept)
        ]
        assert all(line in new for line in kept if line.strip() not in ("}",))
