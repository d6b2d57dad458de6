"""Where rollout's run-time files are: the playbooks, the kubelet templates and the lab's build.

The repository keeps them at its top (``playbooks/``, ``templates/kubelet/``, ``tools/``), where
users and contributors know them. A wheel or sdist build copies those trees into the package as
``rollout/_assets/`` (see ``setup.py``), so an installed rollout (``pipx install``, a venv) finds
them with ``importlib.resources`` and never reads a checkout. An editable install or a plain
checkout has no ``_assets``; there the same relative paths resolve against the directory the
``rollout`` package is imported from, i.e. the repository root. Every module reads these roots
from here, never by walking up from their own source file.
"""

from __future__ import annotations

import functools
from importlib.resources import files
from pathlib import Path

from rollout.errors import RolloutError

#: The trees the build copies into ``rollout/_assets/``, relative to the repository root. All of
#: ``tools/`` ships, so a new Go module the lab builds (``tools/<name>/go.mod``) ships without a
#: change here or in ``setup.py``.
ASSET_TREES = ("playbooks", "templates/kubelet", "tools")


def import_root() -> Path:
    """The ``sys.path`` entry the running ``rollout`` package comes from (site-packages or a
    checkout). Child processes that must import this same rollout with another interpreter
    setup (the lab's systemctl shim, lab kubelets) put it first on their path."""
    return Path(str(files("rollout"))).resolve().parent


@functools.cache
def asset_root() -> Path:
    """The directory holding ``playbooks/``, ``templates/kubelet/`` and ``tools/``."""
    packaged = files("rollout").joinpath("_assets")
    if packaged.is_dir():
        # a wheel or sdist install: a real directory (rollout is installed unzipped)
        return Path(str(packaged))
    checkout = import_root()
    if all((checkout / t).is_dir() for t in ASSET_TREES):
        return checkout
    raise RolloutError(
        f"rollout's run-time files are missing: neither {packaged} nor "
        f"{checkout}/{{{','.join(ASSET_TREES)}}} exists; reinstall rollout from its wheel or sdist"
    )


def playbooks() -> Path:
    """The Ansible playbooks (``apply.yml``, ``restore.yml``, ``facts.yml``) and their role."""
    return asset_root() / "playbooks"


def kubelet_templates() -> Path:
    """The Jinja templates for kubelet config files and drop-ins."""
    return asset_root() / "templates" / "kubelet"


def lab_tools() -> Path:
    """``build-lab-binaries.sh`` and the Go wrapper modules it builds (``k8sbin/``, ...)."""
    return asset_root() / "tools"
