"""An optional API connection for the commands that read a change (``status``, ``report``,
``evidence``, ``nodes``): the change's record itself is opened by ``rollout.change.record``."""

from __future__ import annotations

from typing import Any

from rollout.errors import InputError


def optional_api(kubeconfig: str | None, context: str | None) -> Any:
    """An API connection when a kubeconfig loads, else None (the local journals still answer)."""
    from rollout.kube.client import connect

    try:
        return connect(kubeconfig, context)
    except InputError:
        return None
