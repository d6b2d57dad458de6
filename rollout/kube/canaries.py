"""Application canaries in progress (Argo Rollouts, Flagger): a reason to wait.

Why: changing the device-allocation layer while an application canary is being judged confounds
both verdicts (a pod rejected by the kubelet looks like a bad release, and the reverse). The
runbook and ``apply`` warn; they do not refuse, because the operator may know the two are unrelated.
Only what the API shows is reported; a group that is not served means no such canaries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kubernetes.client.exceptions import ApiException

from rollout.errors import truncate

if TYPE_CHECKING:
    from rollout.kube.client import Api

# (API group, version, plural, kind, status phases that mean "being judged")
SOURCES = (
    ("argoproj.io", "v1alpha1", "rollouts", "Argo Rollout", ("Progressing", "Paused")),
    (
        "flagger.app",
        "v1beta1",
        "canaries",
        "Flagger Canary",
        ("Progressing", "Promoting", "Finalising", "Waiting", "WaitingPromotion"),
    ),
)


def in_progress(obj: Mapping[str, Any], phases: tuple[str, ...]) -> str | None:
    """The phase of a canary object that is in progress, else None (pure)."""
    phase = str((obj.get("status") or {}).get("phase") or "")
    return phase if phase in phases else None


def canaries_in_progress(api: Api) -> list[str]:
    """One warning per Argo Rollout / Flagger Canary in progress (empty when none or not served).

    A listing the tool may not read is reported as a warning too, never as "none".
    """
    try:
        served = {g.get("name") for g in (api.apis.get_api_versions().get("groups") or [])}
    except ApiException as e:
        return [f"could not list API groups to look for application canaries: {e.status}"]
    out = []
    for group, version, plural, kind, phases in SOURCES:
        if group not in served:
            continue
        try:
            items = api.custom.list_cluster_custom_object(group, version, plural).get("items", [])
        except ApiException as e:
            out.append(
                f"could not list {plural}.{group} ({e.status} {truncate(str(e.reason))}); "
                "an application canary may be in progress"
            )
            continue
        for obj in items:
            phase = in_progress(obj, phases)
            if phase:
                meta = obj.get("metadata") or {}
                out.append(
                    f"{kind} {meta.get('namespace', '')}/{meta.get('name', '')} is {phase}: "
                    "change the device-allocation layer and a model-serving version in separate "
                    "windows"
                )
    return out
