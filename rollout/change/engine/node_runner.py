"""The orchestrator's ``NodeRunner`` Protocol over the role's node step: plain ssh or playbooks.

Why an adapter: the orchestrator speaks in ``NodeChange`` and ``RestoreFile``; the node step
module takes per-host JSON payloads (``rollout.ansible.payloads``). Where every host of a call is
reachable with plain ssh (``rollout.ansible.direct.target``), the module runs over one ssh call
per host, at most ``--forks`` at once, through the SSH master connection preflight's facts call
opened: no Ansible start-up on the critical path (it cost ~7 s per batch on a busy 2-core
controller). Other hosts (``become``, another connection plugin, templated variables) share one
apply.yml / restore.yml run per batch (``forks`` = batch size, at most ``--forks``). Either way
the same module does the same work, so the playbooks stay the by-hand equivalent. Outcomes stay
per host, so a node that fails or is unreachable fails alone. A restore prefers the metadata
(mode, owner, group, directories we created) that the apply recorded on the node, and always the
bytes the journal holds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from rollout.ansible import direct
from rollout.ansible.outcomes import HostResult, HostStatus, TaskEvent
from rollout.ansible.payloads import (
    ABSENT,
    ApplyPayload,
    BackedUpFile,
    Backup,
    FileWrite,
    RestorePayload,
)
from rollout.ansible.runner import AnsibleRunner
from rollout.ansible.settings import write_json
from rollout.errors import RolloutError
from rollout.fanout import DEFAULT_FORKS
from rollout.models import NodeChange
from rollout.protocols import RestoreFile, RunResult


def _result(h: HostResult | None, what: str, node: str) -> RunResult:
    if h is None:
        return RunResult(False, f"{what} did not run on the host")
    report = h.report or {}
    timings = {str(k): float(v) for k, v in (report.get("timings") or {}).items()}
    if h.status == "ok":
        return RunResult(True, changed=h.changed, timings=timings)
    if report.get("refused"):
        found = "; ".join(
            f"{m.get('path')}: expected sha256 {m.get('expected')}, found {m.get('found')}"
            for m in report.get("mismatches") or ()
        )
        since = "our write" if report.get("action") == "restore" else "preflight read them"
        hint = " (rollout rollback --force overwrites them)" if since == "our write" else ""
        return RunResult(
            False,
            f"node {node}: file(s) changed on the node since {since}, nothing written: "
            f"{found}{hint}",
            refused=True,
        )
    where = f" at {h.failed_task!r}" if h.failed_task else ""
    return RunResult(False, f"{what} {h.status}{where}: {h.message or 'no message'}")


class PlaybookNodeRunner:
    """Runs the node step for the nodes of a batch: over plain ssh where the hosts allow,
    else one apply.yml / restore.yml run per call."""

    def __init__(
        self,
        root: Path,
        inventory: Path,
        on_event: Callable[[str], None] = lambda _m: None,
        direct_restore: bool = True,
        direct_apply: bool = True,
        hostvars: Mapping[str, Mapping[str, Any]] | None = None,
        forks: int = DEFAULT_FORKS,
    ) -> None:
        self.root = root
        self.inventory = inventory
        self.on_event = on_event
        #: at most this many hosts at once, over ssh and in a playbook run (``rollout.fanout``)
        self.forks = forks
        self.ansible = AnsibleRunner(root, forks=forks)
        #: restores run the node step over plain ssh (no Ansible start-up) where a host allows
        self.direct_restore = direct_restore
        #: applies run the node step over plain ssh too (the same module apply.yml calls)
        self.direct_apply = direct_apply
        self._vars: Mapping[str, Mapping[str, Any]] | None = None
        self._facts_vars: Mapping[str, Mapping[str, Any]] | None = None
        self._vars_lock = threading.Lock()
        if hostvars is not None:  # the caller read the inventory already: keep its variables
            self._vars = {h: _connection_vars(v) for h, v in hostvars.items()}
            self._save_vars(self._vars)

    def _events(self, nodes: Mapping[str, str]) -> Callable[[TaskEvent], None]:
        def handler(e: TaskEvent) -> None:
            if e.kind == "failed" or e.kind == "unreachable":
                node = nodes.get(e.host, e.host)
                self.on_event(f"{node}: {e.kind} at {e.task!r}: {e.message or ''}")

        return handler

    def per_node(self, hosts: Sequence[str]) -> bool:
        """Whether a run per node costs no more than a shared one (the orchestrator then runs
        each node of a batch through its whole forward path on its own): the apply goes over
        plain ssh to every one of ``hosts``."""
        if not self.direct_apply or (targets := self._direct_targets(sorted(hosts))) is None:
            return False
        # the orchestrator asks at the start of a batch: open each node's session for its node
        # step now (ssh, Python, the module loaded), while the node is cordoned and drained;
        # the apply (or a restore, if the drain fails) then only sends its arguments
        for t, _ in targets.values():
            direct.start(t)
        return True

    def apply_many(self, changes: Sequence[NodeChange], change_id: str) -> Mapping[str, RunResult]:
        """See ``NodeRunner.apply_many``.

        Raises:
            ExternalError: the playbook could not start at all (every node of the call failed).
        """
        payloads = {c.host: _apply_payload(c, change_id) for c in changes}
        targets = self._direct_targets(sorted(payloads)) if self.direct_apply else None
        if targets is not None:
            hosts = self._apply_direct(change_id, payloads, targets)
            return {c.node: _result(hosts.get(c.host), "apply over ssh", c.node) for c in changes}
        self._prefetch_hostvars()
        res = self.ansible.apply(
            self.inventory, change_id, payloads, self._events({c.host: c.node for c in changes})
        )
        return {
            c.node: _result(res.playbook.hosts.get(c.host), "apply playbook", c.node)
            for c in changes
        }

    def _apply_direct(
        self,
        change_id: str,
        payloads: Mapping[str, ApplyPayload],
        targets: Mapping[str, tuple[direct.Target, Mapping[str, Any]]],
    ) -> dict[str, HostResult]:
        """What apply.yml does, over one ssh call per node, all nodes at once: the same module
        (compare-and-swap check, backup, atomic writes, restart, /healthz), the same payload
        files next to the change (so ``ansible-playbook apply.yml`` can replay them by hand),
        the same backup manifest kept on the controller."""
        base = self.ansible.change_dir(change_id)
        for host, payload in payloads.items():
            write_json(base / "apply" / f"{host}.json", payload.as_json())
        results = self._run_direct(
            "apply",
            {h: {"action": "apply", "payload": p.as_json()} for h, p in payloads.items()},
            targets,
        )
        for host, h in results.items():
            manifest = (h.report or {}).get("manifest")
            if isinstance(manifest, Mapping):
                write_json(base / "backups" / host / "manifest.json", manifest)
        return results

    def restore_many(
        self,
        items: Sequence[tuple[NodeChange, Sequence[RestoreFile]]],
        change_id: str,
        force: bool = False,
    ) -> Mapping[str, RunResult]:
        """See ``NodeRunner.restore_many``.

        ``force`` (the change's journaled force policy, ``Context.force_restore``) is the only
        thing that lets a restore overwrite a file edited after our write, on both paths: the
        plain-ssh call carries it as the module's ``force``, and the playbook gets it as the extra
        variable ``rollout_kubelet_force``, set to true or false on every run. Extra variables
        beat every inventory, ``group_vars`` and ``host_vars`` value in Ansible's precedence, so a
        ``rollout_kubelet_force`` in an inventory is ignored on both paths alike: a host
        variable never turns off the compare-and-swap, force comes from ``--force`` and is
        journaled. (Refusing such an inventory instead would make every restore read the whole
        inventory first, ``rollout rollback`` included, which starts from the kept connection
        variables without ``ansible-inventory``; and it would stop a rollback in an incident over
        a variable that can no longer change anything.)

        Raises:
            ExternalError: the playbook could not start at all (every node of the call failed).
        """
        payloads = {c.host: self._restore_payload(c, change_id, files) for c, files in items}
        direct = self._direct_targets(sorted(payloads)) if self.direct_restore else None
        if direct is not None:
            hosts = self._restore_direct(change_id, payloads, direct, force)
            return {
                c.node: _result(hosts.get(c.host), "restore over ssh", c.node) for c, _ in items
            }
        res = self.ansible.restore(
            self.inventory,
            change_id,
            payloads,
            self._events({c.host: c.node for c, _ in items}),
            {FORCE_VAR: force},  # always: an inventory's value never decides (see above)
        )
        return {
            c.node: _result(res.hosts.get(c.host), "restore playbook", c.node) for c, _ in items
        }

    def node_facts(self, host: str) -> Mapping[str, Any]:
        """The host's node facts read now, by the facts module (over plain ssh where the host
        allows, else facts.yml: the path every change's preflight and evidence take; read-only):
        what the allocation-path change's release step needs of the kubelet's own account
        (``podResources``, the device and DRA checkpoints). The inventory's variables (role
        variables included: ``rollout_kubelet_root_dirs``) are read once per runner.

        Raises:
            ExternalError: the host was unreachable or its facts could not be collected.
            InputError: the inventory cannot be read.
        """
        with self._vars_lock:
            if self._facts_vars is None:
                from rollout.ansible.hosts import read_inventory

                self._facts_vars = read_inventory(self.inventory).hostvars
            hostvars = self._facts_vars
        facts = self.ansible.gather_facts(self.inventory, [host], self.root / "account", hostvars)
        return facts[host]

    def _hostvars(self) -> Mapping[str, Mapping[str, Any]]:
        """The inventory's connection variables, kept next to the change's payloads the first
        time they are read (during its apply), so a later rollback starts its restores without
        running ``ansible-inventory`` (about a second of start-up) first.

        The kept copy is used only for the very inventory it was read from (same path, same
        sha256 of its bytes): an inventory given to a later command, or the same file edited
        during an incident, is read again and wins (``rollout rollback -i fixed.ini``). When the
        inventory file is gone, the kept copy still reaches the nodes."""
        with self._vars_lock:
            if self._vars is None:
                saved = self.root / "hostvars.json"
                key = _inventory_key(self.inventory)
                try:
                    kept = json.loads(saved.read_text(encoding="utf-8"))
                except (OSError, ValueError):
                    kept = None
                gone = not Path(self.inventory).exists()  # nothing given that could win
                if (
                    isinstance(kept, dict)
                    and (gone or key is not None)
                    and (gone or kept.get("inventory") == key)
                ):
                    self._vars = kept["hostvars"]
                else:
                    from rollout.ansible.hosts import read_inventory

                    hv = read_inventory(self.inventory).hostvars
                    self._vars = {h: _connection_vars(v) for h, v in hv.items()}
                    self._save_vars(self._vars)
            return self._vars

    def _save_vars(self, hostvars: Mapping[str, Mapping[str, Any]]) -> None:
        saved = self.root / "hostvars.json"
        saved.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        tmp = saved.with_name(saved.name + ".tmp")
        kept = {"inventory": _inventory_key(self.inventory), "hostvars": hostvars}
        tmp.write_text(json.dumps(kept, sort_keys=True), encoding="utf-8")
        tmp.replace(saved)

    def _prefetch_hostvars(self) -> None:
        """Read the connection variables in the background while the apply playbook runs."""

        def read() -> None:
            with contextlib.suppress(RolloutError, OSError):
                self._hostvars()

        if self._vars is None and self.direct_restore:
            threading.Thread(target=read, daemon=True).start()

    def _direct_targets(
        self, hosts: Sequence[str]
    ) -> dict[str, tuple[direct.Target, Mapping[str, Any]]] | None:
        """Each host's plain-ssh target and variables, or None (use the playbook) when any host
        needs more than plain ssh."""
        try:
            hv = self._hostvars()
        except RolloutError:
            return None
        out = {}
        for h in hosts:
            t = direct.target(h, hv.get(h, {}))
            if t is None:
                return None
            out[h] = (t, hv.get(h, {}))
        return out

    def _restore_direct(
        self,
        change_id: str,
        payloads: Mapping[str, RestorePayload],
        targets: Mapping[str, tuple[direct.Target, Mapping[str, Any]]],
        force: bool,
    ) -> dict[str, HostResult]:
        """The restore module over one ssh call per node, all nodes at once."""
        return self._run_direct(
            "restore",
            {
                h: {"action": "restore", "payload": p.as_json(), "force": force}
                for h, p in payloads.items()
            },
            targets,
        )

    def _run_direct(
        self,
        what: str,
        calls: Mapping[str, Mapping[str, Any]],
        targets: Mapping[str, tuple[direct.Target, Mapping[str, Any]]],
    ) -> dict[str, HostResult]:
        """The node step module over one ssh call per host, all hosts at once; each host's
        outcome as a playbook run would report it."""

        jobs = {}
        for host, call in calls.items():
            t, hv = targets[host]
            args: dict[str, Any] = dict(call)
            for var, arg in _ROLE_VARS.items():
                if var in hv:
                    args[arg] = hv[var]
            jobs[host] = (t, args)
        out: dict[str, HostResult] = {}
        for host, res in direct.run_all(jobs, _direct_timeout, forks=self.forks).items():
            status: HostStatus = "ok"
            if res.get("unreachable"):
                status = "unreachable"
            elif res.get("failed"):
                status = "failed"
            if status != "ok":
                self.on_event(f"{host}: {what} {status}: {res.get('msg') or ''}")
            out[host] = HostResult(
                host,
                status,
                failed_task=str(res.get("failedStep") or "") or None,
                message=str(res.get("msg") or "") or None,
                changed=bool(res.get("changed")),
                report=res,
            )
        return out

    def _backup(self, change_id: str, host: str) -> Backup | None:
        """The controller's copy of the node's backup manifest; also where releases that ran one
        playbook per host kept it (``hosts/<host>/``), so their changes still roll back fully."""
        found = self.ansible.backup(change_id, host)
        if found is None:
            found = AnsibleRunner(self.root / "hosts" / host).backup(change_id, host)
        return found

    def _restore_payload(
        self, change: NodeChange, change_id: str, files: Sequence[RestoreFile]
    ) -> RestorePayload:
        manifest = self._backup(change_id, change.host)
        recorded = {f.path: f for f in manifest.files} if manifest else {}
        out = []
        for f in files:
            m = recorded.get(f.path)
            out.append(
                BackedUpFile(
                    path=f.path,
                    existed=f.content is not None or f.node_copy is not None,
                    sha256=(
                        hashlib.sha256(f.content).hexdigest()
                        if f.content is not None
                        else f.node_copy
                    ),
                    mode=(m.mode if m and m.mode else f.mode),
                    owner=(m.owner if m and m.owner else f.owner),
                    group=(m.group if m and m.group else f.group),
                    content=f.content,
                    missing_parents=m.missing_parents if m else (),
                    written=(
                        hashlib.sha256(change.files[f.path]).hexdigest()
                        if f.path in change.files
                        else change.written.get(f.path)
                    ),
                )
            )
        return RestorePayload.from_backup(
            Backup(change.host, change_id, tuple(out)),
            service=change.service,
            checkpoint_reset=change.checkpoint_reset,
            healthz_url=change.healthz_url,
        )


def _inventory_key(inventory: Path) -> str | None:
    """What the kept host variables were read from: the inventory's resolved path and the sha256
    of its bytes; None (never use a kept copy) for a directory or a file that cannot be read."""
    try:
        path = Path(inventory).resolve()
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None
    return f"{path}:{digest}"


def _connection_vars(v: Mapping[str, Any]) -> dict[str, Any]:
    """What a direct restore needs of a host's variables; secrets are kept only as "set"."""
    out = {k: v[k] for k in _KEPT if k in v}
    out.update({k: True for k in _SECRET_OR_FLAG if v.get(k)})
    return out


FORCE_VAR = f"{direct.ROLE_PREFIX}force"
"""The role variable restore.yml reads for the module's ``force``: the tool sets it on every
restore run as an extra variable (:meth:`PlaybookNodeRunner.restore_many`)."""

#: role variables (from the inventory) -> the node step module's arguments: every option of the
#: node step's defaults but ``force`` (a direct restore forces on ``rollback --force`` only;
#: ``tests/unit/test_node_step_defaults.py``)
_ROLE_VARS = {
    "rollout_kubelet_healthz_retries": "healthz_retries",
    "rollout_kubelet_healthz_delay": "healthz_delay",
    "rollout_kubelet_healthz_timeout": "healthz_timeout",
    "rollout_kubelet_systemctl_timeout": "systemctl_timeout",
    "rollout_kubelet_daemon_reload": "daemon_reload",
}

_KEPT = (
    "ansible_connection",
    "ansible_host",
    "ansible_ssh_host",
    "ansible_port",
    "ansible_ssh_port",
    "ansible_user",
    "ansible_ssh_user",
    "ansible_ssh_private_key_file",
    "ansible_private_key_file",
    "ansible_ssh_common_args",
    "ansible_ssh_extra_args",
    "ansible_python_interpreter",
    *_ROLE_VARS,
)
_SECRET_OR_FLAG = ("ansible_become", "ansible_ssh_pass", "ansible_password")


def _direct_timeout(args: Mapping[str, Any]) -> float:
    """A bound on one direct node step: three systemctl calls and the whole /healthz wait."""
    args = {**direct.step_defaults(), **args}
    retries = int(args["healthz_retries"])
    per_try = float(args["healthz_delay"]) + float(args["healthz_timeout"])
    return 3 * float(args["systemctl_timeout"]) + retries * per_try + 30


def _expect(change: NodeChange, path: str) -> str:
    """What the node's file must still hold right before the write: the sha256 preflight read
    (journaled with the change, so a resumed apply checks the same), else of ``before``."""
    if path in change.expect:
        return change.expect[path]
    before = change.before.get(path)
    return ABSENT if before is None else hashlib.sha256(before).hexdigest()


def _apply_payload(change: NodeChange, change_id: str) -> ApplyPayload:
    """The files with the mode and owner render chose for a new file and the node's own for an
    existing one (``NodeChange.mode``), and the digest preflight read as the expectation."""
    files = tuple(
        FileWrite(
            path,
            content,
            *change.mode.get(path, ("0644", "root", "root")),
            expect=_expect(change, path),
        )
        for path, content in sorted(change.files.items())
    )
    return ApplyPayload(
        change_id=change_id,
        files=files,
        service=change.service,
        checkpoint_reset=change.checkpoint_reset,
        healthz_url=change.healthz_url,
    )
