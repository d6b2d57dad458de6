"""The Kubernetes client's exception is mapped at one place, ``rollout.kube.rest``: an error
answer is :class:`rollout.kube.rest.AnswerError`, the project's :class:`rollout.errors.ApiError`
(exit 7 on the CLI, ``status`` and the API server's message), and never the client's
``ApiException``; no other module names ``ApiException``, inside ``rollout.kube`` or out.
Runtime: well under 1 s.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import pytest
from kubernetes.client.exceptions import ApiException

from rollout.errors import ApiError, ExternalError, RolloutError
from rollout.kube.client import call
from rollout.kube.rest import AnswerError, CoordinationV1, Rest, exchange

PACKAGE = Path(__file__).resolve().parents[2] / "rollout"
NAME = "ApiException"


def _names_it(tree: ast.AST) -> bool:
    """Whether the source names ``ApiException`` or imports the client's exceptions module."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and node.id == NAME:
            return True
        if isinstance(node, ast.Attribute) and node.attr == NAME:
            return True
        if isinstance(node, ast.alias) and NAME in (node.name, node.asname):
            return True
        if isinstance(node, ast.Import) and any(
            a.name.startswith("kubernetes") and "exceptions" in a.name for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom):
            module = node.module or ""
            via = "exceptions" in module or any(a.name == "exceptions" for a in node.names)
            if module.startswith("kubernetes") and via:
                return True
    return False


def test_no_module_but_the_boundary_names_the_clients_exception() -> None:
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE.parent)
        if rel.parts == ("rollout", "kube", "rest.py"):
            continue
        if _names_it(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            offenders.append(str(rel))
    assert not offenders, (
        f"{NAME} is named outside rollout/kube/rest.py: {offenders}; inside rollout.kube catch "
        "rollout.kube.rest.AnswerError (status, body), outside it rollout.errors.ApiError"
    )


def test_the_boundary_test_sees_each_way_of_naming_it() -> None:
    for src in (
        "from kubernetes.client.exceptions import ApiException",
        "from kubernetes.client.rest import ApiException as E",
        "import kubernetes.client.exceptions",
        "from kubernetes.client import exceptions",
        "try:\n    x\nexcept client.ApiException:\n    pass",
    ):
        assert _names_it(ast.parse(src)), src
    for src in ("import urllib3\nurllib3.exceptions.HTTPError", "from kubernetes import config"):
        assert not _names_it(ast.parse(src)), src


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


def test_an_error_answer_is_the_projects_api_error_not_the_clients() -> None:
    rest = Rest(_Client(_Resp(404, "Not Found", NOT_FOUND)))  # type: ignore[arg-type]
    with pytest.raises(ApiError) as e:
        rest.send("GET", "/api/v1/nodes/x")
    err = e.value
    assert isinstance(err, ExternalError) and isinstance(err, RolloutError)
    assert err.exit_code == 7 and (err.status, err.reason) == (404, "Not Found")
    assert str(err) == '404 nodes "x" not found'  # the API server's wording, not the headers
    # inside rollout.kube the decisions read the answer's body and headers; the client's own
    # exception type never leaves rollout.kube.rest
    assert not isinstance(err, ApiException) and err.body == NOT_FOUND.decode()
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


def test_the_one_mapping_serves_every_request_the_tool_sends() -> None:
    # Rest.send and the tenancy audit's impersonated requests both go through exchange
    forbidden = _Resp(403, "Forbidden", b'{"message":"alice cannot create pods"}')
    with pytest.raises(AnswerError) as e:
        exchange(_Client(forbidden), "POST", "https://x/y", {}, None, None, timeout=5)  # type: ignore[arg-type]
    assert (e.value.status, str(e.value)) == (403, "403 alice cannot create pods")
    assert not isinstance(e.value, ApiException)
    ok = _Resp(201, "Created", b"{}")
    assert exchange(_Client(ok), "POST", "https://x/y", {}, None, None, timeout=5) is ok  # type: ignore[arg-type]
