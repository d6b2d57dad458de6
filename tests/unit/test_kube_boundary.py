"""The Kubernetes client's exception stays inside ``rollout.kube``: an error answer leaves the
package as :class:`rollout.errors.ApiError` (exit 7 on the CLI, ``status`` and the API server's
message), and no module outside it names ``ApiException``. Runtime: well under 1 s.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from rollout.errors import ApiError, ExternalError, RolloutError
from rollout.kube.client import call
from rollout.kube.rest import AnswerError, CoordinationV1, Rest

PACKAGE = Path(__file__).resolve().parents[2] / "rollout"
NAME = "ApiException"


def _names(tree: ast.AST) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            out.add(node.id)
        elif isinstance(node, ast.Attribute):
            out.add(node.attr)
        elif isinstance(node, ast.alias):
            out.update({*node.name.split("."), node.asname or ""})
        elif isinstance(node, ast.ImportFrom) and node.module:
            out.update(node.module.split("."))
    return out


def test_no_module_outside_kube_names_the_clients_exception() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        if rel.parts[:2] == ("rollout", "kube"):
            continue
        names = _names(ast.parse(path.read_text(encoding="utf-8"), str(path)))
        if NAME in names or ("exceptions" in names and "kubernetes" in names):
            offenders.append(str(rel))
    assert not offenders, (
        f"{NAME} is named outside rollout/kube: {offenders}; catch rollout.errors.ApiError "
        "(its status) instead, and decide in rollout.kube"
    )


class _Resp:
    def __init__(self, status: int, reason: str, data: bytes) -> None:
        self.status, self.reason, self.data, self.headers = status, reason, data, {"X": "y"}

    def read(self) -> bytes:
        return self.data


class _Client:
    """An ``ApiClient`` stand-in: one canned answer, or the client's own exception."""

    def __init__(self, answer: _Resp | Exception) -> None:
        self.answer = answer

    def param_serialize(self, **kw: Any) -> tuple[Any, ...]:
        return ("GET", "https://x" + kw["resource_path"], {}, None, None)

    def call_api(self, *args: Any, **kw: Any) -> _Resp:
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


NOT_FOUND = b'{"kind":"Status","message":"nodes \\"x\\" not found","code":404}'


def test_an_error_answer_is_the_projects_api_error_and_still_the_clients_inside() -> None:
    rest = Rest(_Client(_Resp(404, "Not Found", NOT_FOUND)))  # type: ignore[arg-type]
    with pytest.raises(ApiError) as e:
        rest.send("GET", "/api/v1/nodes/x")
    err = e.value
    assert isinstance(err, ExternalError) and isinstance(err, RolloutError)
    assert err.exit_code == 7 and (err.status, err.reason) == (404, "Not Found")
    assert str(err) == '404 nodes "x" not found'  # the API server's wording, not the headers
    # inside rollout.kube the decisions read the client's fields, as before
    assert isinstance(err, ApiException) and err.body == NOT_FOUND.decode()
    assert err.headers == {"X": "y"}


def test_no_answer_keeps_the_cause_and_a_plain_body_is_quoted() -> None:
    tls = ApiException(status=0, reason="SSLError: certificate verify failed")
    with pytest.raises(AnswerError) as e:
        Rest(_Client(tls)).send("GET", "/api/v1/nodes")  # type: ignore[arg-type]
    assert e.value.status == 0 and e.value.__cause__ is tls
    assert str(e.value) == "0 SSLError: certificate verify failed"
    with pytest.raises(AnswerError) as e:
        Rest(_Client(_Resp(403, "Forbidden", b"forbidden: no"))).send("GET", "/x")  # type: ignore[arg-type]
    assert str(e.value) == "403 forbidden: no"


def test_call_raises_a_non_transient_answer_as_the_projects_error() -> None:
    conflict = _Resp(409, "Conflict", b'{"message":"the object has been modified"}')
    leases = CoordinationV1(Rest(_Client(conflict)))  # type: ignore[arg-type]
    with pytest.raises(ApiError) as e:
        call("replace lease", leases.replace_namespaced_lease, "l", "ns", {}, retry_s=0)
    assert e.value.status == 409 and "the object has been modified" in str(e.value)
