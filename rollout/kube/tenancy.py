"""The API calls of ``rollout tenancy``: requests sent as a tenant (impersonation, always a
server-side dry run), access reviews, the reads the render checks and the audit make, and the
server-side apply of the rendered policy.

These calls are not the tool's: ``deploy/rbac.yaml`` (the change engine's least-privilege role)
grants none of them. ``deploy/tenancy-audit-rbac.yaml`` does, and :data:`NEEDS` lists each
(``tests/unit/test_tenancy.py`` checks the manifest against it).

Why impersonation headers are sent by hand: the client merges headers into a plain dict, and
the API server reads each ``Impersonate-Group`` header line as one group, so several groups
need several lines (an ``HTTPHeaderDict``), which the generated client cannot express.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from urllib3 import HTTPHeaderDict

from rollout.errors import ExternalError
from rollout.kube.client import Api, call, describe
from rollout.kube.rest import JSON, MERGE_PATCH, AnswerError, Rest, exchange

APPLY_PATCH = "application/apply-patch+yaml"
FIELD_MANAGER = "rollout-tenancy"

#: (API group, resource, verb) each call here needs, for deploy/tenancy-audit-rbac.yaml.
NEEDS = {
    ("", "users", "impersonate"),
    ("", "groups", "impersonate"),
    ("", "serviceaccounts", "impersonate"),
    ("authorization.k8s.io", "subjectaccessreviews", "create"),
    ("", "namespaces", "list"),
    ("", "nodes", "list"),
    ("resource.k8s.io", "deviceclasses", "get"),
    ("resource.k8s.io", "deviceclasses", "list"),
    ("resource.k8s.io", "resourceclaims", "create"),  # the selector compile check (dry run)
    ("node.k8s.io", "runtimeclasses", "get"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicies", "get"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "get"),
}
#: What ``rollout tenancy render --apply`` needs: ClusterRole rollout-tenancy-apply.
APPLY_NEEDS = {
    ("admissionregistration.k8s.io", "validatingadmissionpolicies", "patch"),
    ("admissionregistration.k8s.io", "validatingadmissionpolicybindings", "patch"),
}

_PLURALS = {
    "ValidatingAdmissionPolicy": ("admissionregistration.k8s.io/v1", "validatingadmissionpolicies"),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io/v1",
        "validatingadmissionpolicybindings",
    ),
}


@dataclass(frozen=True)
class Answer:
    """The API server's answer to one request: ``status`` (201, 200, 403, 422, ...) and, for a
    refusal, its ``message`` verbatim."""

    status: int
    message: str = ""

    @property
    def allowed(self) -> bool:
        return 200 <= self.status <= 299


def _message(e: AnswerError) -> str:
    try:
        body = json.loads(e.body or "{}")
        return str(body.get("message") or e.reason or "")
    except (ValueError, AttributeError):
        return str(e.body or e.reason or "")


class TenancyApi:
    """The calls, over the tool's connection (the operator's or the auditor's credentials)."""

    def __init__(self, api: Api) -> None:
        self.api = api
        self.rest = Rest(api.api_client)

    def _json(self, method: str, path: str, _request_timeout: Any = 30.0, **kw: Any) -> Any:
        return self.rest.json(method, path, timeout=_request_timeout, **kw)

    # --- as the operator ----------------------------------------------------------------

    def get(self, path: str) -> Any:
        """GET ``path``; None when it answers 404."""
        try:
            return call(f"GET {path}", self._json, "GET", path)
        except AnswerError as e:
            if e.status == 404:
                return None
            raise ExternalError(f"GET {path}: {describe(e)}") from e

    def list(self, path: str, label_selector: str | None = None) -> list[dict[str, Any]]:
        query = {"labelSelector": label_selector} if label_selector else None
        try:
            out = call(f"GET {path}", self._json, "GET", path, query=query)
        except AnswerError as e:
            raise ExternalError(f"GET {path}: {describe(e)}") from e
        return list((out or {}).get("items") or [])

    def served(self, group_version: str) -> bool:
        """Whether the API server serves ``group_version`` (``resource.k8s.io/v1``)."""
        return self.get(f"/apis/{group_version}") is not None

    def access_review(
        self,
        user: str,
        groups: tuple[str, ...],
        verb: str,
        group: str,
        resource: str,
        namespace: str = "",
        name: str = "",
    ) -> tuple[bool, str]:
        """A SubjectAccessReview: whether ``user`` in ``groups`` may, and the authorizer's
        reason (RBAC names the binding and role that allow it)."""
        attrs = {"verb": verb, "group": group, "resource": resource}
        if namespace:
            attrs["namespace"] = namespace
        if name:
            attrs["name"] = name
        body = {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {"user": user, "groups": list(groups), "resourceAttributes": attrs},
        }
        try:
            out = call(
                "SubjectAccessReview",
                self._json,
                "POST",
                "/apis/authorization.k8s.io/v1/subjectaccessreviews",
                body=body,
            )
        except AnswerError as e:
            raise ExternalError(f"SubjectAccessReview: {describe(e)}") from e
        status = (out or {}).get("status") or {}
        return bool(status.get("allowed")), str(status.get("reason") or "")

    def apply(self, obj: dict[str, Any], dry_run: bool) -> Answer:
        """Server-side apply of one rendered object (field manager ``rollout-tenancy``,
        conflicts forced: the rendered policy is the source of truth for its fields)."""
        gv, plural = _PLURALS[obj["kind"]]
        path = f"/apis/{gv}/{plural}/{obj['metadata']['name']}"
        query = {"fieldManager": FIELD_MANAGER, "force": "true"}
        if dry_run:
            query["dryRun"] = "All"
        try:
            call(
                f"apply {obj['kind']} {obj['metadata']['name']}",
                self._json,
                "PATCH",
                path,
                query=query,
                body=obj,
                content_type=APPLY_PATCH,
            )
        except AnswerError as e:
            return Answer(e.status, _message(e))
        return Answer(200)

    def dry_run_create(self, path: str, body: dict[str, Any]) -> Answer:
        """A server-side dry-run create as the operator (the selector compile check)."""
        return self._send(None, "POST", path, body, JSON)

    # --- as a tenant --------------------------------------------------------------------

    def as_tenant(
        self,
        user: str,
        groups: tuple[str, ...],
        method: str,
        path: str,
        body: dict[str, Any],
        patch: bool = False,
    ) -> Answer:
        """One request as ``user`` in ``groups`` (impersonated), always ``dryRun=All``: the
        API server authorizes and admits it as it would the tenant's, and stores nothing."""
        return self._send((user, groups), method, path, body, MERGE_PATCH if patch else JSON)

    def who_am_i(self, user: str, groups: tuple[str, ...]) -> dict[str, Any]:
        """The user the API server sees under impersonation (a SelfSubjectReview)."""
        body = {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        resp = self._raw(
            (user, groups),
            "POST",
            "/apis/authentication.k8s.io/v1/selfsubjectreviews",
            body,
            JSON,
            dry_run=False,
        )
        return dict((json.loads(resp.read() or b"{}").get("status") or {}).get("userInfo") or {})

    def _send(
        self,
        who: tuple[str, tuple[str, ...]] | None,
        method: str,
        path: str,
        body: dict[str, Any],
        content_type: str,
    ) -> Answer:
        try:
            resp = call(f"{method} {path}", self._raw, who, method, path, body, content_type, True)
        except AnswerError as e:
            return Answer(e.status, _message(e))
        return Answer(int(resp.status))

    def _raw(
        self,
        who: tuple[str, tuple[str, ...]] | None,
        method: str,
        path: str,
        body: dict[str, Any],
        content_type: str,
        dry_run: bool,
        _request_timeout: Any = 30.0,
    ) -> Any:
        client = self.api.api_client
        req = client.param_serialize(
            method=method,
            resource_path=path,
            query_params=[("dryRun", "All")] if dry_run else None,
            header_params={"Accept": JSON, "Content-Type": content_type},
            body=body,
            auth_settings=["BearerToken"],
        )
        m, url, headers, data, post = req
        h = HTTPHeaderDict(headers)
        if who is not None:
            user, groups = who
            h["Impersonate-User"] = user
            for g in groups:
                h.add("Impersonate-Group", g)
        return exchange(client, m, url, h, data, post, timeout=_request_timeout)


def explain(e: BaseException) -> str:
    """:func:`rollout.kube.client.describe`, for the CLI's messages."""
    return describe(e)
