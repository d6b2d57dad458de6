"""The alerting assets rollout ships, and who owns a node an alert names (both pure).

Why here and not in ``deploy/``: users run the installed wheel, so the rules the lab loads and
``rollout serve``'s docs point at must be inside the package. ``rollout/data/prometheus-rule.yaml``
is the canonical PrometheusRule; ``deploy/prometheus-rule.yaml`` is kept identical by a test.
Prometheus without the Operator reads plain rules files, so :func:`rules_file` converts the
PrometheusRule's ``spec.groups`` into one (the same rules, never a hand-kept copy).

Why the node decides the change: a kubelet counter carries the node (``node`` label, added by
the scrape's relabelling) but knows nothing about changes. The change that owns a node is the
newest change whose journal touched it; it owns the node while the node is ``applying``,
``applied`` or ``restoring`` in that journal. A node that change ``restored`` (or failed to
restore: a person must look) is owned by nobody, whatever older journals say: the newest change
replaced what they wrote.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.error import YAMLError

from rollout.change.record.replay import ChangeStatus
from rollout.errors import InputError, Location, ParseError
from rollout.models import NodeState

RULE_RESOURCE = "prometheus-rule.yaml"
#: The label that routes an alert to ``rollout serve`` (the shipped rules that should roll back).
ROUTE_LABEL = ("rollout", "rollback")
#: Node states in which the change's files may be on the node (so a rollback has work to do).
OWNED_STATES = frozenset({NodeState.APPLYING, NodeState.APPLIED, NodeState.RESTORING})


def shipped_rule_text() -> str:
    """The PrometheusRule rollout ships (``rollout/data/prometheus-rule.yaml``)."""
    return resources.files("rollout").joinpath("data", RULE_RESOURCE).read_text()


def rules_file(text: str, source: str = RULE_RESOURCE) -> dict[str, Any]:
    """A PrometheusRule (YAML text) as a Prometheus rules file: ``{"groups": [...]}``.

    Raises:
        InputError: not YAML, not a ``monitoring.coreos.com/v1`` PrometheusRule, or a group or
            rule without the fields Prometheus needs (file, field and line named).
    """
    yaml = YAML(typ="rt")
    try:
        doc: Any = yaml.load(text)
    except YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        line = mark.line + 1 if mark is not None else None
        raise ParseError(f"not valid YAML: {e}", Location(source, line=line)) from e

    def where(node: Any, field: str, key: Any = None) -> Location:
        lc = getattr(node, "lc", None)
        line = None
        if lc is not None:
            try:
                line = (lc.key(key)[0] if key is not None else lc.line) + 1
            except (KeyError, TypeError, AttributeError):
                line = lc.line + 1
        return Location(source, field=field, line=line)

    if not isinstance(doc, Mapping):
        raise InputError("expected a PrometheusRule object", Location(source))
    if doc.get("kind") != "PrometheusRule" or doc.get("apiVersion") != "monitoring.coreos.com/v1":
        raise InputError(
            "expected kind: PrometheusRule, apiVersion: monitoring.coreos.com/v1",
            where(doc, "kind", "kind" if "kind" in doc else None),
        )
    spec = doc.get("spec")
    groups = spec.get("groups") if isinstance(spec, Mapping) else None
    if not isinstance(groups, list) or not groups:
        raise InputError("no rule groups", where(doc, "spec.groups", "spec" if spec else None))
    out = []
    for i, g in enumerate(groups):
        if not isinstance(g, Mapping) or not g.get("name"):
            raise InputError("a group needs a name", where(g, f"spec.groups[{i}].name"))
        rules = g.get("rules")
        if not isinstance(rules, list) or not rules:
            raise InputError("a group needs rules", where(g, f"spec.groups[{i}].rules"))
        conv = []
        for j, r in enumerate(rules):
            f = f"spec.groups[{i}].rules[{j}]"
            if not isinstance(r, Mapping) or not (r.get("alert") or r.get("record")):
                raise InputError("a rule needs alert or record", where(r, f))
            if not r.get("expr"):
                raise InputError("a rule needs expr", where(r, f + ".expr"))
            conv.append(_plain(r))
        group = {k: _plain(v) for k, v in g.items() if k != "rules"}
        group["rules"] = conv
        out.append(group)
    return {"groups": out}


def _plain(v: Any) -> Any:
    """ruamel's round-trip containers as plain dicts, lists and strings."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, str):
        return str(v)
    return v


def dump_yaml(doc: Any) -> str:
    """YAML text of plain data (for the files Prometheus and promtool read)."""
    yaml = YAML(typ="safe", pure=True)
    yaml.default_flow_style = False
    buf = io.StringIO()
    yaml.dump(doc, buf)
    return buf.getvalue()


def routed_alerts(doc: Mapping[str, Any]) -> list[str]:
    """Names of the alerts in a rules file that carry the routing label ``rollout="rollback"``."""
    k, v = ROUTE_LABEL
    return [
        str(r["alert"])
        for g in doc["groups"]
        for r in g["rules"]
        if r.get("alert") and (r.get("labels") or {}).get(k) == v
    ]


# ---------------------------------------------------------------------------------------------
# Which change owns a node


@dataclass(frozen=True)
class Owner:
    """The change that owns a node now, and what an alert on that node rolls back.

    Attributes:
        change: the change id.
        node: the node the alert named.
        state: the node's state in that change's journal.
        nodes: the nodes to roll back (the node, or its batch under ``rollback-group``).
        live: the change holds the cluster Lease now (its owner process is alive).
    """

    change: str
    node: str
    state: NodeState
    nodes: tuple[str, ...]
    live: bool = False


def owner_of(
    node: str,
    changes: Iterable[ChangeStatus],
    *,
    lease_change: str | None = None,
    group_policy: Mapping[str, bool] | None = None,
) -> Owner | None:
    """The change that owns ``node`` now (pure), or None.

    Args:
        node: the node the alert names.
        changes: every change's replayed status (any order; ids sort by start time).
        lease_change: the change id the live cluster Lease names, if any.
        group_policy: change id -> True when its plan says ``onFailure: rollback-group``.

    Returns:
        The newest change that touched ``node`` (state other than ``pending``), when it holds
        the node in an owned state (:data:`OWNED_STATES`); else None.
    """
    touched = [
        c for c in changes if node in c.nodes and c.nodes[node].state is not NodeState.PENDING
    ]
    if not touched:
        return None
    newest = max(touched, key=lambda c: c.change)
    state = newest.nodes[node].state
    if state not in OWNED_STATES:
        return None
    nodes: Sequence[str] = (node,)
    if (group_policy or {}).get(newest.change):
        nodes = _batch_of(newest, node)
    return Owner(newest.change, node, state, tuple(nodes), live=lease_change == newest.change)


def _batch_of(change: ChangeStatus, node: str) -> list[str]:
    """The node's batch in the change (from its ``begin`` record), owned nodes only."""
    for batch in change.info.batches:
        if node in batch:
            return [
                n
                for n in batch
                if n == node or (n in change.nodes and change.nodes[n].state in OWNED_STATES)
            ]
    return [node]
