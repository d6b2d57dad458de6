"""Would this kubelet start? Lint for the effective KubeletConfiguration, in the kubelet's words.

The kubelet checks its configuration in two places: when it parses it (``validation.go``: all
errors reported at once) and when its Topology, CPU and Memory managers start (each constructor
stops at its first error and the kubelet exits, so under systemd the node crash-loops). Both sets
of rules are replayed here as pure functions over the effective configuration (file, drop-ins and
flags already merged by ``loading.effective``), optionally with the node's hardware facts.

``validate`` returns every finding, errors and warnings, in the order the kubelet would meet them.
``startup_errors`` returns only what the kubelet would actually exit with: the lab kubelet uses it
to refuse to start exactly like the real one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rollout.kubelet.facts import NodeFacts
from rollout.kubelet.findings import Finding, Severity
from rollout.kubelet.options import DEFAULT_KUBELET_VERSION, parse_version
from rollout.kubelet.rules_base import Ctx, OriginLike, Stage
from rollout.kubelet.rules_machine import check_machine, check_strict_pool
from rollout.kubelet.rules_managers import (
    check_cpu_manager,
    check_memory_manager,
    check_server,
    check_topology_manager,
)
from rollout.kubelet.rules_static import (
    check_decode,
    check_feature_gates,
    check_flags,
    check_validation,
)


def _run(
    config: Mapping[str, Any],
    origins: Mapping[str, OriginLike] | None,
    kubelet_version: str | None,
    node_facts: NodeFacts | None,
    flags: Mapping[str, OriginLike] | None = None,
    distribution: str | None = None,
) -> list[tuple[Stage, Finding]]:
    version = parse_version(kubelet_version) if kubelet_version else DEFAULT_KUBELET_VERSION
    ctx = Ctx(
        config=config,
        origins=origins or {},
        version=version,
        facts=node_facts,
        flags=flags or {},
        distribution=distribution,
    )
    check_flags(ctx)
    check_decode(ctx)
    check_feature_gates(ctx)
    check_validation(ctx)
    reserved = check_server(ctx)
    check_machine(ctx)
    check_topology_manager(ctx)
    check_cpu_manager(ctx, reserved)
    check_memory_manager(ctx, reserved)
    check_strict_pool(ctx, reserved)
    return sorted(ctx.found, key=lambda sf: sf[0])


def validate(
    config: Mapping[str, Any],
    *,
    origins: Mapping[str, OriginLike] | None = None,
    kubelet_version: str | None = None,
    node_facts: NodeFacts | None = None,
    flags: Mapping[str, OriginLike] | None = None,
    distribution: str | None = None,
) -> list[Finding]:
    """Every finding for an effective KubeletConfiguration, in the order the kubelet meets them.

    Args:
        config: the effective configuration (camelCase keys): ``loading.effective(n).config``.
        origins: per top-level field, where it was set (anything with ``file`` and ``line``).
        kubelet_version: ``"1.35"`` or ``"v1.35.2"``; decides which policy options exist and their
            maturity. Default: ``options.DEFAULT_KUBELET_VERSION``.
        node_facts: the node's hardware; enables the machine-dependent rules.
        flags: the kubelet's command-line flags by name (no dashes), with where each was set:
            ``loading.effective(n).flag_origins``.
        distribution: the node's distribution name; enables the distribution rules (EKS AL2
            runs cgroup v1).

    Raises:
        InputError: ``kubelet_version`` is not a version.
    """
    return [f for _, f in _run(config, origins, kubelet_version, node_facts, flags, distribution)]


def startup_errors(
    config: Mapping[str, Any],
    node_facts: NodeFacts | None = None,
    *,
    origins: Mapping[str, OriginLike] | None = None,
    kubelet_version: str | None = None,
    flags: Mapping[str, OriginLike] | None = None,
    distribution: str | None = None,
) -> list[Finding]:
    """The errors this kubelet would exit with; empty when it would start.

    The kubelet stops at the first stage that fails. ``validation.go`` reports all of its errors
    together (an aggregate), so for that stage every error is returned, in the kubelet's order;
    for every other stage only the first error is, because the kubelet returns on it. Errors of
    ``Stage.LATER`` are left out: the kubelet starts, and fails only on a later restart. Messages
    are what the kubelet's error says; the kubelet logs them wrapped, e.g.
    ``"Failed to run kubelet" err="failed to run Kubelet: <message>"``.
    """
    found = _run(config, origins, kubelet_version, node_facts, flags, distribution)
    errors = [(s, f) for s, f in found if f.severity is Severity.ERROR and s is not Stage.LATER]
    if not errors:
        return []
    first_stage = errors[0][0]
    if first_stage is Stage.VALIDATION:
        return [f for s, f in errors if s is Stage.VALIDATION]
    return [errors[0][1]]
