"""What one playbook run did to each host, computed from ansible-runner's event stream. Pure.

Why apart from :mod:`rollout.ansible.runner`: the runner starts processes and writes files; these
are the rules that turn events into per-host outcomes (unreachable beats failed beats ok, the
first failed step named, a run killed at its timeout failing every host it had not finished),
and the records the orchestrator reads. They are plain data and pure functions, unit-tested
without Ansible.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from rollout.ansible.payloads import Backup

HostStatus = Literal["ok", "failed", "unreachable", "skipped"]


@dataclass(frozen=True)
class TaskEvent:
    """One task outcome on one host, as passed to ``on_event``."""

    kind: Literal["start", "ok", "failed", "unreachable", "skipped"]
    host: str
    task: str
    changed: bool = False
    message: str | None = None
    result: Mapping[str, Any] | None = None


def timed_out(results: Mapping[str, HostResult], limit_s: float) -> dict[str, HostResult]:
    """The outcomes of a run killed at its timeout (pure): a host that had not failed yet did
    not finish, so it failed too, with the timeout named."""
    msg = f"the playbook ran past its timeout of {limit_s:.0f}s and was stopped"
    return {
        h: r
        if r.status in ("failed", "unreachable")
        else replace(r, status="failed", failed_task=r.failed_task or "(timeout)", message=msg)
        for h, r in results.items()
    }


@dataclass(frozen=True)
class HostResult:
    """What one playbook run did to one host.

    Attributes:
        status: ``ok``; ``failed`` (a task failed; ``failed_task`` names the first step that did);
            ``unreachable`` (SSH could not reach it); ``skipped`` (no task ran on it).
        failed_task: the name of the step that failed, if any.
        message: the failure message (the playbook's named message when it has one).
        changed: whether any task changed something on the host.
        report: the JSON the playbook wrote for this host (apply/restore), if any.
    """

    host: str
    status: HostStatus
    failed_task: str | None = None
    message: str | None = None
    changed: bool = False
    report: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class PlaybookResult:
    """One playbook run: runner status, return code, per-host results and wall time."""

    playbook: str
    status: str
    rc: int
    hosts: Mapping[str, HostResult]
    elapsed_s: float
    artifacts: str | None = None

    @property
    def ok(self) -> bool:
        return all(h.status == "ok" for h in self.hosts.values())


@dataclass(frozen=True)
class ApplyResult:
    """apply.yml's outcome plus each host's backup (None where no backup reached the controller)."""

    playbook: PlaybookResult
    backups: Mapping[str, Backup | None] = field(default_factory=dict)


_KINDS: dict[str, Literal["start", "ok", "failed", "unreachable", "skipped"]] = {
    "runner_on_start": "start",
    "runner_on_ok": "ok",
    "runner_on_failed": "failed",
    "runner_on_unreachable": "unreachable",
    "runner_on_skipped": "skipped",
    "runner_item_on_failed": "failed",
}


def task_event(event: Mapping[str, Any]) -> TaskEvent | None:
    """Turn an ansible-runner event into a :class:`TaskEvent` (None for other events)."""
    kind = _KINDS.get(str(event.get("event", "")))
    data = event.get("event_data") or {}
    if kind is None or not data.get("host"):
        return None
    res = data.get("res") or {}
    if kind == "failed" and data.get("ignore_errors"):
        kind = "ok"
    message = res.get("msg") if isinstance(res, Mapping) else None
    return TaskEvent(
        kind=kind,
        host=str(data["host"]),
        task=str(data.get("task") or ""),
        changed=bool(res.get("changed")) if isinstance(res, Mapping) else False,
        message=str(message) if message else None,
        result=res if isinstance(res, Mapping) and res.get("rollout_step") else None,
    )


def summarize(
    events: Iterable[TaskEvent],
    hosts: Iterable[str],
    reports: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, HostResult]:
    """Per-host outcome from the task events of one run. Pure.

    Unreachable beats failed beats ok. ``failed_task`` is the first failed step, or the one the
    playbook's own report names (its rescue records the step before failing with a named
    message); ``message`` is the last failure message, which is the named one.
    """
    reports = dict(reports or {})
    seen: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.kind == "start":
            continue
        s = seen.setdefault(e.host, {"status": "ok", "task": None, "msg": None, "changed": False})
        s["changed"] = s["changed"] or e.changed
        if e.kind == "unreachable":
            s["status"], s["task"], s["msg"] = "unreachable", e.task, e.message
        elif e.kind == "failed" and s["status"] != "unreachable":
            s["status"] = "failed"
            s["task"] = s["task"] or e.task
            s["msg"] = e.message or s["msg"]
    out: dict[str, HostResult] = {}
    for host in sorted({*hosts, *seen}):
        report = reports.get(host)
        if host not in seen:
            out[host] = HostResult(host, "skipped", report=report)
            continue
        s = seen[host]
        task = s["task"]
        if report and (report.get("failedTask") or report.get("failedStep")):
            task = str(report.get("failedTask") or report.get("failedStep"))
        out[host] = HostResult(
            host=host,
            status=s["status"],
            failed_task=task if s["status"] != "ok" else None,
            message=s["msg"] if s["status"] != "ok" else None,
            changed=s["changed"],
            report=report,
        )
    return out
