"""What ``rollout serve`` accepts in a request body: Alertmanager's two alert payloads, checked
field by field before anything acts on them (pure).

Why a schema and not ``payload.get(...)``: the receiver rolls back production nodes, and what it
reads from an alert names the change (``change_id``) and the node, which become a journal path
and an API call. So a body is refused (400, the field named) unless it is UTF-8 JSON of exactly
the shape Alertmanager sends: the webhook receiver's ``{"version": "4", "alerts": [...]}`` (the
fields of Alertmanager's ``notify/webhook`` message) or the API's bare list of postable alerts
(``POST /api/v2/alerts``). Unknown fields are refused rather than ignored: a misrouted
notification or a typo (``change-id``) must not pass as an alert that names nothing. A
``change_id`` must look like the ids :func:`rollout.change.record.journal.new_change_id` makes and a
``node`` like a Kubernetes Node name, so neither can ever reach the file system as ``../x``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: A change id as ``new_change_id`` makes it: ``<UTC stamp>-<token>``, nothing else.
CHANGE_ID = re.compile(r"\A\d{8}T\d{6}Z-[0-9a-z]{1,32}\Z")
#: A Node name: an RFC 1123 subdomain (the API server's own rule for Node names).
NODE_NAME = re.compile(r"\A[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
NODE_NAME_MAX = 253

_LABELS = "labels"  # a map of string to string (labels, annotations)
#: The webhook message's fields: Alertmanager 0.35's ``notify/webhook.Message`` and the
#: ``template.Data`` it embeds (``notification_reason`` since 0.32, ``routeLabels``). A field a
#: later Alertmanager adds is refused (400 naming it) until it is listed here: the lab's
#: end-to-end test posts through the pinned Alertmanager, so CI sees such a field first.
WEBHOOK_FIELDS: Mapping[str, Any] = {
    "version": str,
    "groupKey": str,
    "truncatedAlerts": int,
    "status": str,
    "receiver": str,
    "notification_reason": str,
    "groupLabels": _LABELS,
    "commonLabels": _LABELS,
    "commonAnnotations": _LABELS,
    "routeLabels": _LABELS,
    "externalURL": str,
    "alerts": list,
}
#: An alert's fields: the webhook's ``template.Alert`` (a superset of the API's postable alert).
ALERT_FIELDS: Mapping[str, Any] = {
    "status": str,
    "labels": _LABELS,
    "annotations": _LABELS,
    "startsAt": str,
    "endsAt": str,
    "generatorURL": str,
    "fingerprint": str,
}
STATUSES = ("firing", "resolved")


@dataclass(frozen=True)
class BadBody(Exception):
    """A request body ``rollout serve`` refuses: the HTTP code, the field (dotted path, empty for
    the body as a whole) and what is wrong with it."""

    code: int
    field: str
    problem: str

    def __str__(self) -> str:
        return f"{self.field}: {self.problem}" if self.field else self.problem

    def to_dict(self) -> dict[str, str]:
        return {"error": str(self), "field": self.field}


def parse_alerts(body: bytes) -> list[dict[str, Any]]:
    """The alerts of one request body, every field checked.

    Raises:
        BadBody: not UTF-8, not JSON, nested past Python's recursion limit, not one of
            Alertmanager's payloads, an unknown field, a field of the wrong type, a ``status``
            other than firing / resolved, a ``change_id`` that is not a change id or a ``node``
            that is not a Node name (400, the field named).
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as e:
        raise BadBody(400, "", f"body is not UTF-8: {e.reason} at byte {e.start}") from None
    try:
        payload = json.loads(text, parse_constant=_no_constant)
    except RecursionError:
        raise BadBody(400, "", "body is JSON nested too deeply") from None
    except ValueError as e:
        raise BadBody(400, "", f"body is not JSON: {e}") from None
    if isinstance(payload, list):
        alerts, prefix = payload, ""
    elif isinstance(payload, dict):
        _check_fields(payload, WEBHOOK_FIELDS, "")
        if "alerts" not in payload:
            raise BadBody(400, "alerts", "missing: expected Alertmanager's payload with 'alerts'")
        alerts, prefix = payload["alerts"], "alerts"
    else:
        raise BadBody(400, "", "expected Alertmanager's payload: an object with 'alerts' or a list")
    for i, alert in enumerate(alerts):
        where = f"{prefix}[{i}]"
        if not isinstance(alert, dict):
            raise BadBody(400, where, f"an alert must be an object, not {_kind(alert)}")
        _check_fields(alert, ALERT_FIELDS, where)
        if "labels" not in alert:
            raise BadBody(400, f"{where}.labels", "missing: every alert has labels")
        _check_alert(alert, where)
    return alerts


def _check_fields(obj: Mapping[str, Any], fields: Mapping[str, Any], where: str) -> None:
    for key, value in obj.items():
        path = f"{where}.{key}" if where else key
        want = fields.get(key)
        if want is None:
            known = ", ".join(fields)
            raise BadBody(400, path, f"unknown field (Alertmanager sends {known})")
        if want == _LABELS:
            if not isinstance(value, dict):
                raise BadBody(400, path, f"must be a map of strings, not {_kind(value)}")
            for k, v in value.items():
                if not isinstance(v, str):
                    raise BadBody(400, f"{path}.{k}", f"must be a string, not {_kind(v)}")
        elif not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise BadBody(400, path, f"must be {_KINDS[want]}, not {_kind(value)}")


def _check_alert(alert: Mapping[str, Any], where: str) -> None:
    status = alert.get("status", "firing")
    if status not in STATUSES:
        raise BadBody(400, f"{where}.status", f"{status!r} is neither firing nor resolved")
    for section in ("labels", "annotations"):
        change = (alert.get(section) or {}).get("change_id")
        if change is not None and not CHANGE_ID.match(change):
            raise BadBody(
                400,
                f"{where}.{section}.change_id",
                f"{change[:80]!r} is not a change id (YYYYMMDDTHHMMSSZ-token, as apply prints it)",
            )
    node = alert["labels"].get("node")
    if node is not None and (len(node) > NODE_NAME_MAX or not NODE_NAME.match(node)):
        raise BadBody(400, f"{where}.labels.node", f"{node[:80]!r} is not a Node name")


_KINDS = {str: "a string", int: "an integer", list: "a list"}


def _kind(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    return {
        dict: "an object",
        list: "a list",
        str: "a string",
        int: "a number",
        float: "a number",
    }.get(type(value), type(value).__name__)


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")
