"""Loading a kubeconfig and calling the API server through transient failures.

Why retries here: an API server restarted mid-drain (an upgrade, a leader change) refuses
connections for a few seconds. That is not a reason to abandon a node half-drained, so every call
goes through :func:`call`, which retries connection errors and 5xx answers for a bounded time and
then raises a named :class:`~rollout.errors.ExternalError`. Decisions about 4xx answers (429 on an
eviction, 404, 409) stay with the caller.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes import client, config
from kubernetes.client.exceptions import ApiException
from kubernetes.config.config_exception import ConfigException

from rollout.errors import ExternalError, InputError, Location, truncate

T = TypeVar("T")

RETRY_S = 60.0
"""How long a call keeps retrying connection errors and 5xx answers."""

REQUEST_TIMEOUT_S = 30.0
"""The HTTP timeout of each API request made through :func:`call` (connect and read); a request
that hangs past it counts as a transient failure and is retried until ``RETRY_S``."""

_TRANSIENT = (500, 502, 503, 504)


@dataclass(frozen=True)
class Api:
    """The API groups the tool uses, sharing one connection pool."""

    api_client: client.ApiClient
    core: client.CoreV1Api
    policy: client.PolicyV1Api
    coordination: client.CoordinationV1Api
    custom: client.CustomObjectsApi
    apis: client.ApisApi
    version: client.VersionApi


def connect(kubeconfig: str | None = None, context: str | None = None) -> Api:
    """Load the kubeconfig (``--kubeconfig``/``$KUBECONFIG``/``~/.kube/config``) and context.

    Raises:
        InputError: no usable kubeconfig or context.
    """
    cfg = client.Configuration()
    try:
        config.load_kube_config(  # type: ignore[no-untyped-call]
            config_file=kubeconfig, context=context, client_configuration=cfg
        )
    except (ConfigException, OSError, TypeError) as e:
        raise InputError(f"cannot load kubeconfig: {e}", Location(file=kubeconfig)) from e
    cfg.retries = False
    api_client = client.ApiClient(cfg)
    return Api(
        api_client=api_client,
        core=client.CoreV1Api(api_client),
        policy=client.PolicyV1Api(api_client),
        coordination=client.CoordinationV1Api(api_client),
        custom=client.CustomObjectsApi(api_client),
        apis=client.ApisApi(api_client),
        version=client.VersionApi(api_client),
    )


def is_transient(e: BaseException) -> bool:
    """Connection trouble or a 5xx answer: worth another try."""
    if isinstance(e, ApiException):
        return e.status in _TRANSIENT or e.status == 0
    return isinstance(e, urllib3.exceptions.HTTPError | ConnectionError | TimeoutError)


def call(
    what: str,
    fn: Callable[..., T],
    *args: Any,
    retry_s: float = RETRY_S,
    sleep: Callable[[float], None] = time.sleep,
    **kwargs: Any,
) -> T:
    """Call ``fn`` (a Kubernetes API method) with an HTTP timeout (``_request_timeout``, default
    :data:`REQUEST_TIMEOUT_S`); retry transient failures for up to ``retry_s`` seconds.

    Raises:
        ApiException: a non-transient API answer (the caller decides).
        ExternalError: still failing after ``retry_s``; ``what`` names the call.
    """
    deadline = time.monotonic() + retry_s
    delay = 0.2
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_S)
    while True:
        try:
            return fn(*args, **kwargs)
        except Exception as e:
            if not is_transient(e):
                raise
            if time.monotonic() >= deadline:
                raise ExternalError(f"{what}: API server unavailable: {describe(e)}") from e
            sleep(delay)
            delay = min(delay * 2, 2.0)


def describe(e: BaseException) -> str:
    """A short message for an API error (its ``message`` field, truncated)."""
    if isinstance(e, ApiException):
        import json

        try:
            body = json.loads(e.body or "{}")
            msg = body.get("message") or e.reason
        except (ValueError, AttributeError):
            msg = e.body or e.reason
        return f"{e.status} {truncate(str(msg))}"
    return truncate(f"{type(e).__name__}: {e}")


def warm_client() -> None:
    """Import the API client's classes (their models take 1.5-2 s of CPU to build, more on a
    busy controller), so a caller can do it in a thread while ansible-inventory and the facts'
    ssh calls run."""
    from kubernetes import client

    for name in ("CoreV1Api", "PolicyV1Api", "CoordinationV1Api", "CustomObjectsApi"):
        getattr(client, name)
