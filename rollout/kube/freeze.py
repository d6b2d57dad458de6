"""The API calls of the claim freeze (``rollout.change.kinds.claim_freeze``): server-side apply of a
ValidatingAdmissionPolicy and its binding, their deletion, and the server-side dry-run claim
that proves the freeze in force.

These calls are beyond the change engine's least-privilege role (``deploy/rbac.yaml`` writes no
policy); ``deploy/claim-freeze-rbac.yaml`` grants them (:data:`NEEDS`, checked by
``tests/unit/test_claim_freeze.py``), to bind only where a plan sets ``freezeClaims``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from rollout.errors import ExternalError
from rollout.kube.client import Api, call, describe
from rollout.kube.rest import JSON, AnswerError, Rest

APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "rollout-claim-freeze"
#: (API group, resource, verb) each call here needs.
NEEDS = {
    ("admissionregistration.k8s.io", "validatingadmissionpolicies", "create"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicies", "patch"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicies", "delete"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "create"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "patch"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "delete"),
    ("resource.k8s.io", "resourceclaims", "create"),  # the dry run only
}
PLURALS = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
}
BASE = "/apis/admissionregistration.k8s.io/v1"


def _message(e: AnswerError) -> str:
    return str(e)


def _json(api: Api) -> Any:
    """``Rest.json`` taking ``call``'s ``_request_timeout``."""
    rest = Rest(api.api_client)

    def send(method: str, path: str, _request_timeout: Any = 30.0, **kw: Any) -> Any:
        return rest.json(method, path, timeout=_request_timeout, **kw)

    return send


def apply_objects(api: Api, objects: Sequence[Mapping[str, Any]]) -> None:
    """Server-side apply each policy or binding (field manager ``rollout-claim-freeze``,
    conflicts forced: the rendered object is the source of truth).

    Raises:
        ExternalError: the API server refused one (its answer named).
    """
    send = _json(api)
    for obj in objects:
        name = obj["metadata"]["name"]
        path = f"{BASE}/{PLURALS[obj['kind']]}/{name}"
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        try:
            call(
                f"apply {obj['kind']} {name}",
                send,
                "PATCH",
                path,
                query=query,
                body=dict(obj),
                content_type=APPLY_PATCH,
            )
        except AnswerError as e:
            raise ExternalError(f"apply {obj['kind']} {name}: {describe(e)}") from e


def delete_object(api: Api, kind: str, name: str) -> bool:
    """Delete the policy or binding ``name``; False when there was none.

    Raises:
        ExternalError: the API server refused the deletion.
    """
    send = _json(api)
    path = f"{BASE}/{PLURALS[kind]}/{name}"
    try:
        call(f"delete {kind} {name}", send, "DELETE", path)
    except AnswerError as e:
        if e.status == 404:
            return False
        raise ExternalError(f"delete {kind} {name}: {describe(e)}") from e
    return True


def dry_run_create(api: Api, obj: Mapping[str, Any]) -> str | None:
    """A server-side dry-run create of the namespaced ``obj`` (``dryRun=All``: admitted and
    validated, never stored): the API server's refusal, or None when it would be created.

    Raises:
        ExternalError: no answer (the connection failed past the retries).
    """
    send = _json(api)
    group, version = str(obj["apiVersion"]).split("/")
    plural = str(obj["kind"]).lower() + "s"
    ns = obj["metadata"]["namespace"]
    path = f"/apis/{group}/{version}/namespaces/{ns}/{plural}"
    try:
        call(
            f"dry-run create {obj['kind']}",
            send,
            "POST",
            path,
            query={"dryRun": "All"},
            body=dict(obj),
            content_type=JSON,
        )
    except AnswerError as e:
        return _message(e)
    return None
