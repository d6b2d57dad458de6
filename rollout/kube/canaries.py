"""Model-serving canaries in progress: a reason to refuse a change of the device layer.

Why: the design says to change the device-allocation layer and a model-serving version in
separate windows. Changing the kubelet's managers while an application canary is being judged
confounds both verdicts (a pod rejected by the kubelet looks like a bad release, and the
reverse). ``apply`` and ``promote`` refuse while one is in progress (exit 3);
``--force-serving REASON`` overrides and journals the reason and what was in progress. The
runbook lists them as warnings.

What counts as in progress, from the API's own objects (the controllers are not asked):

* an Argo Rollout whose ``status.phase`` is ``Progressing`` or ``Paused``;
* a Flagger Canary whose ``status.phase`` is one of its analysis or promotion phases;
* a KServe InferenceService one of whose components (predictor, transformer, explainer) splits
  its traffic over more than one revision, or has a revision created or ready that is not yet
  rolled out (:func:`isvc_rollout`);
* a Deployment rolling out with a pod on a node the command changes: old-revision pods still
  beside the new ones, in ``kubectl rollout status``'s words (:func:`deployment_rollout`). A
  Deployment merely scaling or starting (one revision) is not a version change and is not named.

The custom resources are looked for in every namespace (the tool does not trace them to their
pods); a group the API server does not serve means no such canaries; a listing the tool may not
read is a warning, never "none".
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping
from typing import TYPE_CHECKING, Any

from rollout.errors import truncate
from rollout.kube.rest import AnswerError
from rollout.models import ServingReads, requirement_holds

if TYPE_CHECKING:
    from rollout.kube.client import Api

ARGO_PHASES = ("Progressing", "Paused")
FLAGGER_PHASES = ("Progressing", "Promoting", "Finalising", "Waiting", "WaitingPromotion")
WINDOWS = "change the device-allocation layer and a model-serving version in separate windows"


def in_progress(obj: Mapping[str, Any], phases: tuple[str, ...]) -> str | None:
    """The phase of a canary object that is in progress, else None (pure)."""
    phase = str((obj.get("status") or {}).get("phase") or "")
    return phase if phase in phases else None


def isvc_rollout(obj: Mapping[str, Any]) -> str | None:
    """What of a KServe InferenceService is rolling out, else None (pure).

    Per component of ``status.components``: traffic on more than one revision (the canary's
    ``latest``/``prev`` split under ``canaryTrafficPercent``), or a ``latestCreatedRevision``
    not yet ready, or a ``latestReadyRevision`` not yet the ``latestRolledoutRevision`` (KServe
    sets the latter once the ready revision takes 100% of the traffic)."""
    found = []
    components = (obj.get("status") or {}).get("components") or {}
    for name in sorted(components):
        c = components[name] or {}
        split = [
            f"{t.get('revisionName') or t.get('tag') or '?'} {t.get('percent')}%"
            for t in c.get("traffic") or ()
            if isinstance(t, Mapping) and int(t.get("percent") or 0) > 0
        ]
        created, ready = c.get("latestCreatedRevision"), c.get("latestReadyRevision")
        rolled = c.get("latestRolledoutRevision")
        if len(split) > 1:
            found.append(f"{name} traffic split {', '.join(split)}")
        elif created and ready and created != ready:
            found.append(f"{name} revision {created} created, {ready} the latest ready")
        elif ready and rolled and ready != rolled:
            found.append(f"{name} revision {ready} ready, {rolled} the latest rolled out")
    return "; ".join(found) or None


def deployment_rollout(obj: Mapping[str, Any]) -> str | None:
    """``kubectl rollout status``'s words for a Deployment whose old-revision pods still run
    beside the new ones (``status.replicas`` > ``status.updatedReplicas``), else None (pure).

    A Deployment with one revision only (created, scaled, waiting for its pods to be available)
    is not a version change: None."""
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    name = str((obj.get("metadata") or {}).get("name") or "")
    total, updated = int(status.get("replicas") or 0), int(status.get("updatedReplicas") or 0)
    if total <= updated:
        return None
    reasons = {
        c.get("reason") for c in status.get("conditions") or () if c.get("type") == "Progressing"
    }
    if "ProgressDeadlineExceeded" in reasons:
        return f'deployment "{name}" exceeded its progress deadline'
    want = spec.get("replicas")
    if want is not None and updated < int(want):
        return (
            f'Waiting for deployment "{name}" rollout to finish: {updated} out of {want} new '
            "replicas have been updated..."
        )
    return (
        f'Waiting for deployment "{name}" rollout to finish: {total - updated} old replicas are '
        "pending termination..."
    )


def selects(selector: Mapping[str, Any] | None, labels: Mapping[str, str]) -> bool:
    """Whether a label selector (``matchLabels``, ``matchExpressions``) selects ``labels``
    (pure); a null or empty selector selects nothing here (a Deployment always has one)."""
    if not selector:
        return False
    match = selector.get("matchLabels") or {}
    exprs = selector.get("matchExpressions") or ()
    if not match and not exprs:
        return False
    return all(labels.get(k) == v for k, v in match.items()) and all(
        requirement_holds(
            labels,
            str(r.get("key")),
            str(r.get("operator")),
            [str(v) for v in r.get("values") or ()],
        )
        for r in exprs
    )


def rolling_on(
    deployments: Iterable[Mapping[str, Any]],
    nodes: Collection[str],
    pods: Mapping[str, Iterable[Mapping[str, Any]]],
) -> list[str]:
    """One line per Deployment rolling out (:func:`deployment_rollout`) with a pod on one of
    ``nodes`` (``pods``: node -> pod objects), naming the nodes and pods (pure)."""
    out = []
    for d in deployments:
        why = deployment_rollout(d)
        if why is None:
            continue
        meta = d.get("metadata") or {}
        ns, name = str(meta.get("namespace") or ""), str(meta.get("name") or "")
        selector = (d.get("spec") or {}).get("selector")
        where = sorted(
            (node, str((p.get("metadata") or {}).get("name") or ""))
            for node in nodes
            for p in pods.get(node, ())
            if (p.get("metadata") or {}).get("namespace") == ns
            and selects(selector, (p.get("metadata") or {}).get("labels") or {})
        )
        if where:
            on = ", ".join(f"{ns}/{pod} on {node}" for node, pod in where)
            out.append(f"Deployment {ns}/{name} is rolling out ({on}): {why}; {WINDOWS}")
    return out


def _judge_phase(phases: tuple[str, ...]) -> Callable[[Mapping[str, Any]], str | None]:
    def judge(obj: Mapping[str, Any]) -> str | None:
        phase = in_progress(obj, phases)
        return None if phase is None else f"is {phase}"

    return judge


def _judge_isvc(obj: Mapping[str, Any]) -> str | None:
    what = isvc_rollout(obj)
    return None if what is None else f"is rolling out ({what})"


# (API group, version, plural, kind, judge: what of the object is in progress, or None)
SOURCES: tuple[tuple[str, str, str, str, Callable[[Mapping[str, Any]], str | None]], ...] = (
    ("argoproj.io", "v1alpha1", "rollouts", "Argo Rollout", _judge_phase(ARGO_PHASES)),
    ("flagger.app", "v1beta1", "canaries", "Flagger Canary", _judge_phase(FLAGGER_PHASES)),
    ("serving.kserve.io", "v1beta1", "inferenceservices", "KServe InferenceService", _judge_isvc),
)


def serving_reads(api: Api) -> ServingReads:
    """The custom resources in progress (:data:`SOURCES`, every namespace), the Deployments
    rolling out (every namespace: preflight keeps those with a pod on a node it changes), and
    what could not be read."""
    try:
        served = {g.get("name") for g in (api.apis.get_api_versions().get("groups") or [])}
    except AnswerError as e:
        return ServingReads(
            unread=(f"could not list API groups to look for model-serving canaries: {e.status}",)
        )
    found: list[str] = []
    unread: list[str] = []
    for group, version, plural, kind, judge in SOURCES:
        if group not in served:
            continue
        try:
            items = api.custom.list_cluster_custom_object(group, version, plural).get("items", [])
        except AnswerError as e:
            unread.append(
                f"could not list {plural}.{group} ({e.status} {truncate(str(e.reason))}); "
                "a model-serving canary may be in progress"
            )
            continue
        for obj in items:
            what = judge(obj)
            if what:
                meta = obj.get("metadata") or {}
                found.append(
                    f"{kind} {meta.get('namespace', '')}/{meta.get('name', '')} {what}: {WINDOWS}"
                )
    deployments: list[dict[str, Any]] = []
    try:
        listed = api.apps.list_deployment_for_all_namespaces().get("items") or []
        deployments = [d for d in listed if deployment_rollout(d) is not None]
    except AnswerError as e:
        unread.append(
            f"could not list deployments.apps ({e.status} {truncate(str(e.reason))}); a "
            "Deployment may be rolling out on the nodes"
        )
    return ServingReads(tuple(found), tuple(deployments), tuple(unread))


def canaries_in_progress(api: Api) -> list[str]:
    """One warning per model-serving canary in progress (:data:`SOURCES`, every namespace) and
    per listing that could not be read (the runbook's warnings; empty when none)."""
    reads = serving_reads(api)
    return [*reads.canaries, *reads.unread]
