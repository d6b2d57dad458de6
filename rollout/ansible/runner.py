"""Run the facts, apply and restore playbooks through ansible-runner, and read what they report.

Why a wrapper: the orchestrator needs per-host outcomes (ok / failed at which step / unreachable),
not Ansible's event stream, and it must not pay Ansible's start-up cost more than once per batch.
So one call runs one playbook for all hosts of a batch (``forks`` = number of hosts), over
pipelined SSH with ControlPersist, with fact gathering off. The node-side work of an apply or a
restore is one module call per host (``rollout_kubelet_step``); its result, read from the event
stream, is the host's report. Per-host outcomes are computed by a
pure function (:func:`summarize`) from the events, so the rules are unit-tested on plain data.

Directories on the controller, under ``private_data_dir_root``::

    facts/<host>.json                                     what facts.yml collected (the kubelet
                                                          files' bytes, sha256, mode, owner too)
    changes/<change>/apply/<host>.json                    apply payloads (written here)
    changes/<change>/restore/<host>.json                  restore payloads (written here)
    changes/<change>/backups/<host>/manifest.json         the node's backup, bytes included, from
                                                          the node step's result in the events
    runner/, runner-1/, ...                               ansible-runner's private data dirs, one
                                                          per run in flight (runs may overlap)
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

from rollout import assets
from rollout.ansible.payloads import ApplyPayload, Backup, RestorePayload
from rollout.errors import ExternalError, InputError, Location


def _path_with_ansible() -> str:
    """PATH with this interpreter's bin directory first, so the ansible-playbook installed with
    this package runs even when its virtualenv is not activated."""
    here = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", os.defpath)
    return path if path.split(os.pathsep)[0] == here else here + os.pathsep + path


HostStatus = Literal["ok", "failed", "unreachable", "skipped"]

#: Settings that keep Ansible's per-run overhead low and its behaviour predictable.
ENV: dict[str, str] = {
    "ANSIBLE_PIPELINING": "True",
    "ANSIBLE_SSH_ARGS": "-C -o ControlMaster=auto -o ControlPersist=300s",
    # one master connection per node, shared by preflight, apply, verify and restore runs, and
    # by the restore that runs the node step over plain ssh (rollout/ansible/direct.py)
    "ANSIBLE_SSH_CONTROL_PATH_DIR": str(Path.home() / ".ansible" / "cp"),
    "ANSIBLE_SSH_CONTROL_PATH": "%(directory)s/%%C",
    "ANSIBLE_GATHERING": "explicit",
    "ANSIBLE_FACT_CACHING": "memory",
    "ANSIBLE_RETRY_FILES_ENABLED": "False",
    "ANSIBLE_INTERPRETER_PYTHON": "auto_silent",
    "ANSIBLE_DEPRECATION_WARNINGS": "False",
    "ANSIBLE_NOCOLOR": "True",
}


@dataclass(frozen=True)
class TaskEvent:
    """One task outcome on one host, as passed to ``on_event``."""

    kind: Literal["start", "ok", "failed", "unreachable", "skipped"]
    host: str
    task: str
    changed: bool = False
    message: str | None = None
    result: Mapping[str, Any] | None = None


PLAYBOOK_TIMEOUT_S = 900.0
"""Wall-clock limit of one playbook run (``$ROLLOUT_PLAYBOOK_TIMEOUT_S`` overrides it): a run
past it is killed and every host it had not finished counts as failed, so the orchestrator
restores those nodes instead of leaving them cordoned behind a hung task."""


def playbook_timeout(env: Mapping[str, str] | None = None) -> float:
    """``$ROLLOUT_PLAYBOOK_TIMEOUT_S`` (seconds, > 0), else :data:`PLAYBOOK_TIMEOUT_S`."""
    raw = (os.environ if env is None else env).get("ROLLOUT_PLAYBOOK_TIMEOUT_S", "")
    try:
        value = float(raw)
    except ValueError:
        return PLAYBOOK_TIMEOUT_S
    return value if value > 0 else PLAYBOOK_TIMEOUT_S


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


def _kill_leftovers(private_data_dir: Path) -> list[int]:
    """SIGKILL what is left of a timed-out run: ansible-runner's own kill can miss the
    ``ansible-playbook`` process, which would go on changing nodes after we restored them.
    Only processes whose command line names this run's private data dir are touched.

    Returns:
        The pids killed.
    """
    import signal

    marker = os.fsencode(str(private_data_dir) + os.sep)
    killed = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except OSError:
                continue
    return killed


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


def _tail(r: Any, limit: int = 400) -> str:
    """The end of a run's stdout, for a message when no task ran at all."""
    try:
        text = str(r.stdout.read())
    except (AttributeError, OSError, ValueError):
        return "no output"
    return " ".join(text.split())[-limit:] or "no output"


def _write_json(path: Path, data: Any) -> None:
    """Write JSON atomically (tmp + fsync + rename), readable by the owner only."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.chmod(tmp, 0o600)
    os.replace(tmp, path)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        raise InputError(e.msg, Location(file=str(path), line=e.lineno)) from e


class AnsibleRunner:
    """Runs the playbooks in ``playbooks/`` through ansible-runner.

    Args:
        private_data_dir_root: controller directory for payloads, facts, backups, results and
            ansible-runner's artifacts (see the module docstring).
        playbook_dir: where the playbooks live (default: the ones rollout ships,
            ``rollout.assets.playbooks()``).
        envvars: extra environment for Ansible (e.g. ``ANSIBLE_PYTHON_INTERPRETER``).
    """

    def __init__(
        self,
        private_data_dir_root: Path,
        playbook_dir: Path | None = None,
        envvars: Mapping[str, str] | None = None,
    ) -> None:
        self.root = Path(private_data_dir_root)
        self.playbook_dir = Path(playbook_dir) if playbook_dir else assets.playbooks()
        self.envvars = {
            **ENV,
            "ANSIBLE_ROLES_PATH": str(self.playbook_dir / "roles"),
            "PATH": _path_with_ansible(),
            **(envvars or {}),
        }
        self._busy: set[int] = set()
        self._slots = threading.Lock()

    def _take_slot(self) -> int:
        """The lowest private data dir no run in flight uses (ansible-runner's files in it are
        per run, so two overlapping runs, e.g. a restore during another batch's apply, must not
        share one)."""
        with self._slots:
            slot = 0
            while slot in self._busy:
                slot += 1
            self._busy.add(slot)
            return slot

    def change_dir(self, change_id: str) -> Path:
        return self.root / "changes" / change_id

    def run(
        self,
        playbook: str,
        inventory: Path,
        hosts: Sequence[str] | None,
        extravars: Mapping[str, Any],
        on_event: Callable[[TaskEvent], None] | None = None,
        *,
        report_dir: Path | None = None,
    ) -> PlaybookResult:
        """Run one playbook on ``hosts`` (all inventory hosts when None).

        Raises:
            ExternalError: ansible-runner could not start the playbook at all.
        """
        import ansible_runner  # deferred: its import costs ~0.3 s and most commands never run it

        events: list[TaskEvent] = []

        def handler(raw: dict[str, Any]) -> bool:
            e = task_event(raw)
            if e is not None:
                events.append(e)
                if on_event is not None:
                    on_event(e)
            return True

        extra = {"rollout_hosts": "all", **extravars}
        forks = max(1, len(hosts)) if hosts else 50
        started = time.monotonic()
        limit = playbook_timeout()
        slot = self._take_slot()
        try:
            pdd = self.root / ("runner" if slot == 0 else f"runner-{slot}")
            pdd.mkdir(parents=True, exist_ok=True, mode=0o700)
            r = ansible_runner.run(
                private_data_dir=str(pdd),
                project_dir=str(self.playbook_dir),
                playbook=playbook,
                inventory=str(Path(inventory).resolve()),
                limit=",".join(hosts) if hosts else None,
                extravars=extra,
                envvars=self.envvars,
                forks=forks,
                quiet=True,
                event_handler=handler,
                rotate_artifacts=20,
                timeout=int(max(1, limit)),
            )
        except Exception as e:  # ansible-runner raises plain exceptions for config errors
            raise ExternalError(f"ansible-runner could not run {playbook}: {e}") from e
        finally:
            with self._slots:
                self._busy.discard(slot)
        elapsed = time.monotonic() - started
        # the node step module's result, straight from the event stream
        reports: dict[str, Mapping[str, Any]] = {
            e.host: e.result for e in events if e.result is not None
        }
        if report_dir is not None:
            for host in hosts or sorted({e.host for e in events}):
                data = _read_json(report_dir / f"{host}.json")
                if isinstance(data, Mapping) and host not in reports:
                    reports[host] = data
        results = summarize(events, hosts or (), reports)
        if str(r.status) == "timeout":
            results = timed_out(results, limit)
            _kill_leftovers(pdd)
        artifact_dir = str(getattr(r.config, "artifact_dir", "") or "") or None
        if not events and r.rc != 0:
            raise ExternalError(
                f"{playbook} did not run (ansible-runner status {r.status}, rc {r.rc}): "
                f"{_tail(r)}; artifacts in {artifact_dir}"
            )
        return PlaybookResult(
            playbook=playbook,
            status=str(r.status),
            rc=int(r.rc if r.rc is not None else -1),
            hosts=results,
            elapsed_s=elapsed,
            artifacts=artifact_dir,
        )

    def gather_facts(
        self,
        inventory: Path,
        hosts: Sequence[str] | None = None,
        out_dir: Path | None = None,
        hostvars: Mapping[str, Mapping[str, Any]] | None = None,
    ) -> dict[str, dict[str, Any]]:
        """Collect each host's NodeFacts dict (also written to ``out_dir/<host>.json``).

        With ``hostvars`` (the inventory's, as ``ansible-inventory --list`` gives them) and every
        host reachable with plain ssh, the facts module runs over one ssh call per host, all at
        once (:func:`facts_direct`): no Ansible start-up, and each call leaves the SSH master
        connection open for the apply, verify and restore that follow. Otherwise facts.yml runs.

        Raises:
            ExternalError: a host was unreachable or its facts could not be collected, naming it
                (fail closed: a change is never planned on partial facts).
        """
        out = Path(out_dir) if out_dir else self.root / "facts"
        if hosts and hostvars is not None:
            direct_facts = facts_direct(hosts, hostvars, out, self.playbook_dir)
            if direct_facts is not None:
                return direct_facts
        result = self.run(
            "facts.yml", inventory, hosts, {"rollout_kubelet_facts_dir": str(out.resolve())}
        )
        bad = {h: r for h, r in result.hosts.items() if r.status != "ok"}
        if bad:
            detail = "; ".join(
                f"{h}: {r.status}" + (f" at {r.failed_task!r}: {r.message}" if r.message else "")
                for h, r in sorted(bad.items())
            )
            raise ExternalError(f"could not collect node facts: {detail}")
        facts: dict[str, dict[str, Any]] = {}
        for host in result.hosts:
            data = _read_json(out / f"{host}.json")
            if not isinstance(data, dict):
                raise ExternalError(f"facts.yml reported ok for {host} but wrote no facts")
            facts[host] = data
        return facts

    def apply(
        self,
        inventory: Path,
        change_id: str,
        payloads: Mapping[str, ApplyPayload],
        on_event: Callable[[TaskEvent], None] | None = None,
        extravars: Mapping[str, Any] | None = None,
    ) -> ApplyResult:
        """Write each host's payload and run apply.yml on those hosts; keep each host's backup
        manifest (from the node step's result) under ``backups/<host>/manifest.json``.

        ``extravars`` overrides role defaults (e.g. ``rollout_kubelet_healthz_retries``).
        """
        base = self.change_dir(change_id)
        for host, payload in payloads.items():
            _write_json(base / "apply" / f"{host}.json", payload.as_json())
        result = self.run(
            "apply.yml",
            inventory,
            sorted(payloads),
            {
                "rollout_kubelet_payload_dir": str((base / "apply").resolve()),
                "rollout_kubelet_result_dir": "",
                **(extravars or {}),
            },
            on_event,
        )
        for host, h in result.hosts.items():
            manifest = (h.report or {}).get("manifest")
            if isinstance(manifest, Mapping):
                _write_json(base / "backups" / host / "manifest.json", manifest)
        return ApplyResult(result, {h: self.backup(change_id, h) for h in sorted(payloads)})

    def backup(self, change_id: str, host: str) -> Backup | None:
        """The controller's copy of ``host``'s backup for ``change_id``, or None."""
        path = self.change_dir(change_id) / "backups" / host / "manifest.json"
        data = _read_json(path)
        return None if data is None else Backup.from_manifest(host, data, file=str(path))

    def restore(
        self,
        inventory: Path,
        change_id: str,
        payloads: Mapping[str, RestorePayload],
        on_event: Callable[[TaskEvent], None] | None = None,
        extravars: Mapping[str, Any] | None = None,
    ) -> PlaybookResult:
        """Write each host's restore payload and run restore.yml on those hosts."""
        base = self.change_dir(change_id)
        for host, payload in payloads.items():
            _write_json(base / "restore" / f"{host}.json", payload.as_json())
        return self.run(
            "restore.yml",
            inventory,
            sorted(payloads),
            {
                "rollout_kubelet_payload_dir": str((base / "restore").resolve()),
                "rollout_kubelet_result_dir": "",
                **(extravars or {}),
            },
            on_event,
        )


#: role variables (defaults/main.yml, overridable per host) -> the facts module's arguments
FACTS_VARS = {
    "rollout_kubelet_distribution_markers": "markers",
    "rollout_kubelet_files": "kubelet_paths",
    "rollout_kubelet_root_dirs": "checkpoint_dirs",
    "rollout_kubelet_machine_file": "machine_file",
    "rollout_kubelet_gpu_vendors": "gpu_vendors",
    "rollout_kubelet_gpu_classes": "gpu_classes",
}

#: Bound on one facts call over ssh (reads a few files; the connection is the slow part).
FACTS_TIMEOUT_S = 120.0


def role_defaults(playbook_dir: Path) -> dict[str, Any]:
    """The role's defaults (``roles/rollout_kubelet/defaults/main.yml``), as Ansible reads them."""
    import yaml

    path = playbook_dir / "roles" / "rollout_kubelet" / "defaults" / "main.yml"
    data = yaml.safe_load(path.read_text(encoding="utf-8"))
    return dict(data) if isinstance(data, Mapping) else {}


def facts_direct(
    hosts: Sequence[str],
    hostvars: Mapping[str, Mapping[str, Any]],
    out: Path,
    playbook_dir: Path,
) -> dict[str, dict[str, Any]] | None:
    """What facts.yml does, over one plain ssh call per host, all hosts at once; None when a host
    needs more than plain ssh (then the playbook runs).

    Raises:
        ExternalError: as :meth:`AnsibleRunner.gather_facts`.
    """
    from rollout.ansible import direct

    defaults = role_defaults(playbook_dir)
    jobs = {}
    for h in hosts:
        hv = hostvars.get(h, {})
        t = direct.target(h, hv)
        if t is None:
            return None
        args = {arg: hv.get(var, defaults.get(var)) for var, arg in FACTS_VARS.items()}
        if any(v is None for v in args.values()) or "{{" in json.dumps(args):
            return None  # a templated or missing role variable: only Ansible can render it
        jobs[h] = (t, args)

    results = direct.run_all(jobs, lambda _args: FACTS_TIMEOUT_S, module=direct.FACTS)
    bad = {h: r for h, r in results.items() if r.get("failed") or "node_facts" not in r}
    if bad:
        detail = "; ".join(
            f"{h}: {'unreachable' if r.get('unreachable') else 'failed'}: {r.get('msg') or ''}"
            for h, r in sorted(bad.items())
        )
        raise ExternalError(f"could not collect node facts: {detail}")
    facts: dict[str, dict[str, Any]] = {}
    for h in hosts:
        data = dict(results[h]["node_facts"])
        _write_json(out / f"{h}.json", data)
        facts[h] = data
    return facts
