"""An optional API connection for the commands that read a change (``status``, ``report``,
``evidence``, ``nodes``): the change's record itself is opened by
``rollout.change.record.opening``."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from rollout.errors import InputError


def optional_api(kubeconfig: str | None, context: str | None) -> Any:
    """An API connection when a kubeconfig loads, else None (the local journals still answer)."""
    if nothing_to_load(kubeconfig, context, os.environ):
        return None
    from rollout.kube.client import connect

    try:
        return connect(kubeconfig, context)
    except InputError:
        return None


def nothing_to_load(kubeconfig: str | None, context: str | None, env: Mapping[str, str]) -> bool:
    """Whether :func:`rollout.kube.client.connect` can only fail: no file at any path of the
    kubeconfig (``--kubeconfig``/``$KUBECONFIG``, a list the client merges; ``~/.kube/config``
    without either), and no pod's ServiceAccount to fall back to. Decided without importing the
    Kubernetes client, which is a quarter of a second of a local ``status``'s start-up."""
    if kubeconfig is None and context is None and env.get("KUBERNETES_SERVICE_HOST"):
        return False
    named = kubeconfig if kubeconfig is not None else env.get("KUBECONFIG")
    if named == "":
        return False  # the client's own reading of an empty value decides
    paths = named.split(os.pathsep) if named is not None else ["~/.kube/config"]
    return not any(p and os.path.exists(os.path.expanduser(p)) for p in paths)
