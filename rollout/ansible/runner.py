"""Run the facts, apply and restore playbooks through ansible-runner, and read what they report.

Why a wrapper: the orchestrator needs per-host outcomes (ok / failed at which step / unreachable),
not Ansible's event stream, and it must not pay Ansible's start-up cost more than once per batch.
So one call runs one playbook for all hosts of a batch (``forks``: the number of hosts, at most
``--forks``, see :mod:`rollout.fanout`), over
pipelined SSH with ControlPersist, with fact gathering off. The node-side work of an apply or a
restore is one module call per host (``rollout_kubelet_step``); its result, read from the event
stream, is the host's report. Per-host outcomes are computed by a pure function
(:func:`rollout.ansible.outcomes.summarize`) from the events, so the rules are unit-tested on
plain data; facts over plain ssh, without Ansible, are :mod:`rollout.ansible.gathering`.

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
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rollout import assets
from rollout.ansible.gathering import facts_direct
from rollout.ansible.outcomes import (
    ApplyResult,
    PlaybookResult,
    TaskEvent,
    summarize,
    task_event,
    timed_out,
)
from rollout.ansible.payloads import ApplyPayload, Backup, RestorePayload
from rollout.ansible.settings import ENV, path_with_ansible, write_json
from rollout.errors import ExternalError, InputError, Location
from rollout.fanout import DEFAULT_FORKS, workers

# what callers of rollout.ansible.runner import from here, though it now lives beside it
__all__ = [
    "AnsibleRunner",
]


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


def _tail(r: Any, limit: int = 400) -> str:
    """The end of a run's stdout, for a message when no task ran at all."""
    try:
        text = str(r.stdout.read())
    except (AttributeError, OSError, ValueError):
        return "no output"
    return " ".join(text.split())[-limit:] or "no output"


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
        forks: at most this many hosts at once, in a playbook run and over plain ssh
            (``--forks``; :mod:`rollout.fanout`).
    """

    def __init__(
        self,
        private_data_dir_root: Path,
        playbook_dir: Path | None = None,
        envvars: Mapping[str, str] | None = None,
        forks: int = DEFAULT_FORKS,
    ) -> None:
        self.root = Path(private_data_dir_root)
        self.forks = forks
        self.playbook_dir = Path(playbook_dir) if playbook_dir else assets.playbooks()
        self.envvars = {
            **ENV,
            "ANSIBLE_ROLES_PATH": str(self.playbook_dir / "roles"),
            "PATH": path_with_ansible(),
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
        forks = workers(len(hosts), self.forks) if hosts else self.forks
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
        once (at most ``forks``; :func:`rollout.ansible.gathering.facts_direct`): no Ansible
        start-up, and each call
        leaves the SSH master connection open for the apply, verify and restore that follow.
        Otherwise facts.yml runs.

        Raises:
            ExternalError: a host was unreachable or its facts could not be collected, naming it
                (fail closed: a change is never planned on partial facts).
        """
        out = Path(out_dir) if out_dir else self.root / "facts"
        if hosts and hostvars is not None:
            direct_facts = facts_direct(hosts, hostvars, out, self.playbook_dir, self.forks)
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
            write_json(base / "apply" / f"{host}.json", payload.as_json())
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
                write_json(base / "backups" / host / "manifest.json", manifest)
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
            write_json(base / "restore" / f"{host}.json", payload.as_json())
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
