"""rollout's run-time trees (playbooks, kubelet templates, the lab's build) come from one place,
``rollout.assets``, in a checkout and in an installed wheel alike."""

from __future__ import annotations

import re
from pathlib import Path

from rollout import assets

REPO = Path(__file__).resolve().parents[2]


def test_a_checkout_reads_the_trees_at_the_top_of_the_repository() -> None:
    assert assets.asset_root() == REPO
    assert (assets.playbooks() / "apply.yml").is_file()
    assert (assets.kubelet_templates() / "dropin.yaml.j2").is_file()
    assert (assets.lab_tools() / "build-lab-binaries.sh").is_file()
    assert assets.import_root() == REPO


def test_the_build_and_the_sdist_ship_the_same_trees() -> None:
    # setup.py calls setup() at import; read its ASSET_TREES parser without running the build
    source = (REPO / "setup.py").read_text(encoding="utf-8")
    body = source.split("\nsetup(", 1)[0]
    namespace: dict[str, object] = {"__file__": str(REPO / "setup.py")}
    exec(compile(body, "setup.py", "exec"), namespace)
    trees = namespace["asset_trees"]()  # type: ignore[operator]
    assert trees == assets.ASSET_TREES
    manifest = (REPO / "MANIFEST.in").read_text(encoding="utf-8")
    for tree in trees:
        assert re.search(rf"^graft {re.escape(tree)}$", manifest, re.M), tree


def test_no_module_finds_files_relative_to_its_own_source() -> None:
    """Everything a module reads at run time goes through rollout.assets or importlib.resources:
    ``Path(__file__).parents[...]`` only works in a checkout."""
    hits = [
        f"{p.relative_to(REPO)}:{n}"
        for p in (REPO / "rollout").rglob("*.py")
        for n, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if "Path(__file__)" in line or ".parents[" in line
    ]
    assert not hits, hits
