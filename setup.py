"""Build hook: ship the repository's run-time trees inside the package.

``playbooks/``, ``templates/kubelet/`` and ``tools/`` stay at the top of the repository (the
layout users and contributors know). A wheel build copies them into ``rollout/_assets/``, where
``rollout.assets`` finds them with ``importlib.resources``. The list of trees is
``rollout.assets.ASSET_TREES`` (read as text here: the build must not import the package).
An editable install copies nothing: ``rollout.assets`` then reads the trees in the checkout.
Everything else (project metadata, dependencies) lives in ``pyproject.toml``.
"""

from __future__ import annotations

import ast
import os
import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
#: never shipped: build outputs and caches that may sit in a contributor's tree
IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "bin", ".*")


def asset_trees() -> tuple[str, ...]:
    tree = ast.parse((HERE / "rollout" / "assets.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.AnnAssign | ast.Assign):
            targets = [node.target] if isinstance(node, ast.AnnAssign) else node.targets
            if any(isinstance(t, ast.Name) and t.id == "ASSET_TREES" for t in targets):
                assert node.value is not None
                return tuple(ast.literal_eval(node.value))
    raise RuntimeError("rollout/assets.py defines no ASSET_TREES")


class BuildPyWithAssets(build_py):
    """``build_py`` that also copies the asset trees into ``<build_lib>/rollout/_assets``."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "rollout" / "_assets"
        for rel in asset_trees():
            src = HERE / rel
            if not src.is_dir():
                raise RuntimeError(f"{src} is missing: the sdist or checkout is incomplete")
            target = dest / rel
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(src, target, ignore=IGNORE)
            for root, _dirs, names in os.walk(target):
                for name in names:
                    if name.endswith(".sh"):
                        os.chmod(os.path.join(root, name), 0o755)


setup(cmdclass={"build_py": BuildPyWithAssets})
