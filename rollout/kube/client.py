"""Loading a kubeconfig and calling the API server through transient failures.

Why retries here: an API server restarted mid-drain (an upgrade, a leader change) refuses
connections for a few seconds. That is not a reason to abandon a node half-drained, so every call
goes through :func:`call`, which retries connection errors and 5xx answers for a bounded time and
then raises a named :class:`~rollout.errors.ExternalError`. Decisions about 4xx answers (429 on an
eviction, 404, 409) stay with the caller.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
import yaml
from kubernetes import config
from kubernetes.client.api_client import ApiClient
from kubernetes.client.configuration import Configuration
from kubernetes.config.config_exception import ConfigException

from rollout.errors import ExternalError, InputError, Location, truncate
from rollout.kube.rest import (
    AnswerError,
    AppsV1,
    CoordinationV1,
    CoreV1,
    Custom,
    Discovery,
    PolicyV1,
    Rest,
)
from rollout.retrying import Backoff, retry

T = TypeVar("T")

RETRY_S = 60.0
"""How long a call keeps retrying connection errors and 5xx answers."""

REQUEST_TIMEOUT_S = 30.0
"""The HTTP timeout of each API request made through :func:`call` (connect and read); a request
that hangs past it counts as a transient failure and is retried until ``RETRY_S``."""

_TRANSIENT = (500, 502, 503, 504)

BACKOFF = Backoff(0.2, 2.0)
"""The wait between two tries of :func:`call`: 0.2 s, doubling, at most 2 s."""


@dataclass(frozen=True)
class Api:
    """The API groups the tool uses (:mod:`rollout.kube.rest`: JSON in and out), sharing one
    connection pool."""

    api_client: ApiClient
    core: CoreV1
    policy: PolicyV1
    coordination: CoordinationV1
    apps: AppsV1
    custom: Custom
    apis: Discovery


SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
"""Where a pod's ServiceAccount token and CA are mounted (``rollout serve`` in its Deployment)."""


def in_cluster(env: Mapping[str, str] | None = None, home: str | None = None) -> bool:
    """Whether to use the pod's ServiceAccount, as client-go does: no kubeconfig named and none
    at ``~/.kube/config``, and ``KUBERNETES_SERVICE_HOST`` set."""
    env = os.environ if env is None else env
    return bool(env.get("KUBERNETES_SERVICE_HOST")) and not os.path.exists(default_kubeconfig(home))


def default_kubeconfig(home: str | None = None) -> str:
    """``~/.kube/config`` (under ``home`` when given)."""
    return os.path.join(home or os.path.expanduser("~"), ".kube", "config")


def connect(kubeconfig: str | None = None, context: str | None = None) -> Api:
    """Load the kubeconfig (``--kubeconfig``/``$KUBECONFIG``/``~/.kube/config``) and context;
    in a pod with none of those, its ServiceAccount (:func:`in_cluster`).

    Raises:
        InputError: no usable kubeconfig or context.
    """
    cfg = Configuration()
    gzip = True
    try:
        if kubeconfig is None and context is None and in_cluster():
            config.incluster_config.InClusterConfigLoader(  # type: ignore[no-untyped-call]
                token_filename=os.path.join(SERVICE_ACCOUNT_DIR, "token"),
                cert_filename=os.path.join(SERVICE_ACCOUNT_DIR, "ca.crt"),
            ).load_and_set(cfg)
        else:
            config.load_kube_config(  # type: ignore[no-untyped-call]
                config_file=kubeconfig, context=context, client_configuration=cfg
            )
            gzip = not compression_disabled(kubeconfig, context)
    except (ConfigException, OSError, TypeError) as e:
        raise InputError(f"cannot load kubeconfig: {e}", Location(file=kubeconfig)) from e
    cfg.retries = False
    return for_client(ApiClient(cfg), gzip=gzip)


def kubeconfig_files(kubeconfig: str | None, env: Mapping[str, str] | None = None) -> list[str]:
    """The files a kubeconfig is read from, first first: ``kubeconfig``, else each of
    ``$KUBECONFIG`` (``:``-separated, merged as kubectl merges them), else ``~/.kube/config``."""
    if kubeconfig:
        return [kubeconfig]
    env = os.environ if env is None else env
    listed = [f for f in (env.get("KUBECONFIG") or "").split(os.pathsep) if f]
    return listed or [default_kubeconfig()]


def compression_disabled(kubeconfig: str | None, context: str | None) -> bool:
    """Whether the cluster of ``context`` (else the current context) says
    ``disable-compression: true``: then the tool asks for plain answers, as kubectl does.

    The files are merged as kubectl merges them, in one pass: the first file that sets
    ``current-context``, names the context or names the cluster wins. A file that cannot be
    read is skipped (:func:`connect` has already loaded the kubeconfig it uses)."""
    current: str | None = None
    contexts: dict[str, Any] = {}
    clusters: dict[str, Any] = {}
    for path in kubeconfig_files(kubeconfig):
        try:
            with open(path, encoding="utf-8") as f:
                doc = yaml.safe_load(f)
        except (OSError, yaml.YAMLError):
            continue
        if not isinstance(doc, dict):
            continue
        current = current or doc.get("current-context")
        for into, key in ((contexts, "contexts"), (clusters, "clusters")):
            for entry in doc.get(key) or ():
                if isinstance(entry, dict) and entry.get("name") is not None:
                    into.setdefault(entry["name"], entry.get(key[:-1]) or {})
    chosen = contexts.get(context or current or "") or {}
    cluster = clusters.get(chosen.get("cluster") or "") or {}
    return bool(cluster.get("disable-compression"))


def for_client(api_client: ApiClient, gzip: bool = True) -> Api:
    """The API groups over an ``ApiClient`` (its configuration: host, TLS, credentials);
    ``gzip``: whether the JSON reads ask for compressed answers."""
    rest = Rest(api_client, gzip=gzip)
    return Api(
        api_client=api_client,
        core=CoreV1(rest),
        policy=PolicyV1(rest),
        coordination=CoordinationV1(rest),
        apps=AppsV1(rest),
        custom=Custom(rest),
        apis=Discovery(rest),
    )


def is_transient(e: BaseException) -> bool:
    """Connection trouble or a 5xx answer: worth another try."""
    if isinstance(e, AnswerError):
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
        AnswerError: a non-transient API answer (the caller decides).
        ExternalError: still failing after ``retry_s``; ``what`` names the call.
    """
    kwargs.setdefault("_request_timeout", REQUEST_TIMEOUT_S)
    return retry(
        lambda: fn(*args, **kwargs),
        is_transient,
        backoff=BACKOFF,
        within_s=retry_s,
        give_up=lambda e: ExternalError(f"{what}: API server unavailable: {describe(e)}"),
        sleep=sleep,
    )


def describe(e: BaseException) -> str:
    """A short message for an API error (its ``message`` field, truncated)."""
    if isinstance(e, AnswerError):
        import json

        try:
            body = json.loads(e.body or "{}")
            msg = body.get("message") or e.reason
        except (ValueError, AttributeError):
            msg = e.body or e.reason
        return f"{e.status} {truncate(str(msg))}"
    return truncate(f"{type(e).__name__}: {e}")
