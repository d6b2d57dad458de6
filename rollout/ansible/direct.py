"""Run the role's node step module over a plain ``ssh`` call, without starting Ansible.

Why: a rollback is an incident, and ``ansible-playbook`` costs 2-3 s of start-up before its first
byte reaches a node (more on a busy controller). The restore's node-side work is one module call
(``rollout_kubelet_step``); this sends that same module source and its arguments over one ssh
command, through the SSH master connection Ansible left open (same ``ControlPath``, see
:data:`CONTROL_PATH`), so a restore begins on the node within tens of milliseconds of the trigger.

Only hosts Ansible would reach with plain ssh as the given user qualify (:func:`target`), with the
user, key, interpreter and become ansible-playbook would use (the host's variables, else Ansible's
environment, else its ``ansible.cfg``): a host with another connection plugin, ``become``, a
password or no interpreter named falls back to the playbook.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import re
import shlex
import subprocess
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rollout import assets
from rollout.ansible.settings import ENV
from rollout.fanout import DEFAULT_FORKS, workers

#: The role's modules that can run without Ansible (each defines ``direct(args)``).
STEP = "rollout_kubelet_step"
FACTS = "rollout_node_facts"


def _module(name: str = STEP) -> Path:
    """A module's source, from the shipped role."""
    return assets.playbooks() / "roles" / "rollout_kubelet" / "library" / f"{name}.py"


#: The role's variable for a node step option: ``rollout_kubelet_<option>``.
ROLE_PREFIX = "rollout_kubelet_"


@functools.cache
def step_defaults() -> dict[str, Any]:
    """The node step's defaults (``healthz_retries`` ...): the ``DEFAULTS`` literal of the shipped
    module, read without running it; the one set, which the role's ``defaults/main.yml`` repeats
    as ``rollout_kubelet_<option>`` (``tests/unit/test_node_step_defaults.py``)."""
    import ast

    tree = ast.parse(_module(STEP).read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and [getattr(t, "id", "") for t in node.targets] == [
            "DEFAULTS"
        ]:
            value: dict[str, Any] = ast.literal_eval(node.value)
            return value
    raise LookupError(f"{_module(STEP)}: no DEFAULTS literal")


#: Where Ansible and this module keep SSH master sockets (``%C``: ssh's hash of host, port, user),
#: so both use the same connection.
CONTROL_DIR = Path(ENV["ANSIBLE_SSH_CONTROL_PATH_DIR"])
CONTROL_PATH = str(CONTROL_DIR / "%C")
#: How long an idle SSH master stays open: long enough to span a canary's soak.
CONTROL_PERSIST = "300s"

# Runs on the node: read {source, utils} (one line) from stdin, load each of the role's module_utils
# the module imports (``utils``: name -> source) as a plain module of that name, then the module
# without running its main(); then read the arguments (the rest of stdin, up to EOF) and print the
# result as JSON.
# Nothing acts on the node before the arguments are complete: a started call (:class:`Started`)
# whose stdin is closed without them, or cut off mid-way, exits having done nothing.
_BOOTSTRAP = (
    "import json,sys,types;d=json.loads(sys.stdin.readline());u=d.get('utils') or {};"
    "[sys.modules.setdefault(n,types.ModuleType(n)) for n in u];"
    "[exec(compile(s,n+'.py','exec'),sys.modules[n].__dict__) for n,s in u.items()];"
    "g={'__name__':'rollout_direct'};"
    "exec(compile(d['source'],'rollout_module.py','exec'),g);"
    "a=json.loads(sys.stdin.read() or 'null');"
    "a is None or print(json.dumps(g['direct'](a)))"
)

_PLAIN = {None, "", "ssh", "smart"}


@dataclass(frozen=True)
class Target:
    """How to reach one host with plain ssh, from its inventory variables."""

    host: str
    port: int | None
    user: str | None
    key: str | None
    args: tuple[str, ...]
    python: str

    def argv(self) -> list[str]:
        """``ssh ... HOST python -c BOOTSTRAP`` reusing Ansible's master connection."""
        out = [
            "ssh",
            "-o",
            "BatchMode=yes",
            "-o",
            "ControlMaster=auto",
            "-o",
            f"ControlPath={CONTROL_PATH}",
            "-o",
            f"ControlPersist={CONTROL_PERSIST}",
        ]
        if self.port:
            out += ["-p", str(self.port)]
        if self.key:
            out += ["-i", self.key]
        if self.user:
            out += ["-l", self.user]
        out += [*self.args, self.host, f"{self.python} -c {shlex.quote(_BOOTSTRAP)}"]
        return out


#: Where Ansible looks for its configuration when ``$ANSIBLE_CONFIG`` is unset (the first found).
_CONFIG_FILES = (
    Path("ansible.cfg"),
    Path.home() / ".ansible.cfg",
    Path("/etc/ansible/ansible.cfg"),
)

#: The settings of Ansible's own (beside a host's variables) that decide how ansible-playbook
#: reaches a host: name -> (environment variable, ansible.cfg section, key).
_SETTINGS = {
    "user": ("ANSIBLE_REMOTE_USER", "defaults", "remote_user"),
    "key": ("ANSIBLE_PRIVATE_KEY_FILE", "defaults", "private_key_file"),
    "python": ("ANSIBLE_PYTHON_INTERPRETER", "defaults", "interpreter_python"),
    "become": ("ANSIBLE_BECOME", "privilege_escalation", "become"),
    "connection": ("ANSIBLE_TRANSPORT", "defaults", "transport"),
}


class _Unreadable(Exception):
    """Ansible's configuration could not be read here: leave the host to ansible-playbook."""


def _ansible_settings(env: Mapping[str, str]) -> dict[str, str]:
    """The :data:`_SETTINGS` Ansible would use when a host's variables name none: from its
    environment, else from its configuration file (``$ANSIBLE_CONFIG``, else the first of
    :data:`_CONFIG_FILES`), as ansible-playbook reads them.

    Raises:
        _Unreadable: the configuration file is not one this can read.
    """
    import configparser

    named = env.get("ANSIBLE_CONFIG")
    files = [Path(named)] if named else list(_CONFIG_FILES)
    cfg = configparser.ConfigParser(interpolation=None, inline_comment_prefixes=(";", "#"))
    for f in files:
        if f.is_dir():
            f = f / "ansible.cfg"
        if f.is_file():
            try:
                cfg.read_string(f.read_text(encoding="utf-8"), str(f))
            except (OSError, UnicodeDecodeError, configparser.Error) as e:
                raise _Unreadable(str(e)) from e
            break
    out = {}
    for name, (var, section, key) in _SETTINGS.items():
        value = env.get(var) or cfg.get(section, key, fallback="")
        if value:
            out[name] = value.strip()
    return out


def _true(value: Any) -> bool:
    """Ansible's boolean reading of a setting (``yes``, ``on``, ``1``, ``true`` ...)."""
    if isinstance(value, bool):
        return value
    return str(value).strip().lower() in ("yes", "on", "1", "true", "y", "t")


def target(
    name: str, hostvars: Mapping[str, Any], env: Mapping[str, str] | None = None
) -> Target | None:
    """The plain-ssh target of an inventory host, or None when Ansible would do more than plain
    ssh as the given user (another connection, ``become``, a password), or when this cannot
    reach it as ansible-playbook would (no interpreter named, only discovered; an
    ``ansible.cfg`` it cannot read): then use the playbook.

    The user, key, interpreter, become and connection come from the host's variables, else
    from Ansible's environment (``ANSIBLE_REMOTE_USER``, ``ANSIBLE_PRIVATE_KEY_FILE``,
    ``ANSIBLE_PYTHON_INTERPRETER``, ``ANSIBLE_BECOME``, ``ANSIBLE_TRANSPORT``), else from its
    ``ansible.cfg``: the precedence ansible-playbook applies."""
    v = hostvars
    try:
        a = _ansible_settings(os.environ if env is None else env)
    except _Unreadable:
        return None
    if (v.get("ansible_connection") or a.get("connection")) not in _PLAIN:
        return None
    become = v["ansible_become"] if "ansible_become" in v else a.get("become", False)
    if _true(become) or any(v.get(k) for k in ("ansible_ssh_pass", "ansible_password")):
        return None
    python = str(v.get("ansible_python_interpreter") or a.get("python") or "")
    if not python or python.startswith("auto"):
        return None  # Ansible discovers the interpreter on the node; only it knows which
    if any("{{" in str(x) or "{%" in str(x) for x in v.values()):
        return None  # a templated variable: only Ansible can render it
    args: list[str] = []
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        if v.get(key):
            args += shlex.split(str(v[key]))
    port = v.get("ansible_port") or v.get("ansible_ssh_port")
    return Target(
        host=str(v.get("ansible_host") or v.get("ansible_ssh_host") or name),
        port=int(port) if port else None,
        user=str(v.get("ansible_user") or v.get("ansible_ssh_user") or a.get("user") or "") or None,
        key=str(
            v.get("ansible_ssh_private_key_file")
            or v.get("ansible_private_key_file")
            or a.get("key")
            or ""
        )
        or None,
        args=tuple(args),
        python=python,
    )


class Started:
    """A module call whose ssh session and Python are up on the node, the module loaded, waiting
    for its arguments: what :func:`start` leaves ready so that the call itself costs one round
    trip. Until :meth:`finish` sends the arguments it has done nothing on the node."""

    def __init__(self, t: Target, module: str) -> None:
        CONTROL_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.proc = subprocess.Popen(
            t.argv(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        head = _head(module)
        try:
            assert self.proc.stdin is not None
            self.proc.stdin.write(head)
            self.proc.stdin.flush()
        except OSError:  # ssh already gone: alive() says so, the call runs cold
            pass

    def alive(self) -> bool:
        """The session has not ended (an ended one never got arguments: nothing ran)."""
        return self.proc.poll() is None

    def finish(self, args: Mapping[str, Any], timeout_s: float) -> dict[str, Any]:
        """Send the arguments, wait for the result (as :func:`run_step` returns it)."""
        try:
            out, err = self.proc.communicate(json.dumps(dict(args)), timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.communicate()
            return {"failed": True, "msg": f"node step over ssh timed out after {timeout_s:.0f}s"}
        return _outcome(self.proc.returncode, out, err)

    def cancel(self) -> None:
        """End the session without arguments (the node does nothing)."""
        with contextlib.suppress(OSError, ValueError, subprocess.SubprocessError):
            self.proc.communicate("", timeout=10)
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


_started: dict[tuple[Target, str], Started] = {}
_started_lock = threading.Lock()


def start(t: Target, module: str = STEP) -> None:
    """Open ``t``'s session for the next ``module`` call now (ssh, Python, the module loaded), so
    that :func:`run_step` on ``t`` later only sends its arguments; one waiting session per host
    and module, a stale one replaced."""
    with _started_lock:
        old = _started.get((t, module))
        if old is not None and old.alive():
            return
        _started[(t, module)] = Started(t, module)
    if old is not None:
        old.cancel()


def cancel_started() -> None:
    """End every waiting session (each does nothing on its node)."""
    with _started_lock:
        waiting = list(_started.values())
        _started.clear()
    for s in waiting:
        s.cancel()


def _take(t: Target, module: str) -> Started | None:
    with _started_lock:
        s = _started.pop((t, module), None)
    if s is not None and not s.alive():
        s.cancel()
        return None
    return s


def run_step(
    t: Target, args: Mapping[str, Any], timeout_s: float, module: str = STEP
) -> dict[str, Any]:
    """Run the role's ``module`` (the node step by default, or :data:`FACTS`) on ``t`` with
    ``args`` (through the session :func:`start` opened, when one waits); its result (``failed``
    on any error, ``unreachable`` when ssh itself failed)."""
    started = _take(t, module)
    if started is not None:
        return started.finish(args, timeout_s)
    stdin = _head(module) + json.dumps(dict(args))
    CONTROL_DIR.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        p = subprocess.run(
            t.argv(), input=stdin, capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        return {"failed": True, "msg": f"node step over ssh timed out after {timeout_s:.0f}s"}
    return _outcome(p.returncode, p.stdout, p.stderr)


def _outcome(rc: int, stdout: str, stderr: str) -> dict[str, Any]:
    if rc == 255:
        return {"failed": True, "unreachable": True, "msg": stderr.strip()[-400:]}
    try:
        out = json.loads(stdout.strip().splitlines()[-1])
    except (IndexError, json.JSONDecodeError):
        return {
            "failed": True,
            "msg": f"node step over ssh printed no result (rc {rc}): "
            + (stderr.strip() or stdout.strip())[-400:],
        }
    return out if isinstance(out, dict) else {"failed": True, "msg": "malformed result"}


@functools.cache
def _source(module: str) -> str:
    """A module's source, read once per process (every node of every batch sends the same)."""
    return _module(module).read_text(encoding="utf-8")


_UTIL_IMPORT = re.compile(r"^\s*from ansible\.module_utils\.(\w+) import ", re.MULTILINE)


@functools.cache
def _head(module: str) -> str:
    """The first line sent to the bootstrap: the module's source and the sources of the role's
    ``module_utils`` it imports (``from ansible.module_utils.NAME import``, as Ansible ships them
    with the module; the module falls back to importing ``NAME`` itself)."""
    utils_dir = _module(module).parent.parent / "module_utils"
    utils = {}
    for name in _UTIL_IMPORT.findall(_source(module)):
        path = utils_dir / f"{name}.py"
        if path.is_file():
            utils[name] = path.read_text(encoding="utf-8")
    return json.dumps({"source": _source(module), "utils": utils}) + "\n"


def run_all(
    calls: Mapping[str, tuple[Target, Mapping[str, Any]]],
    timeout_s: Callable[[Mapping[str, Any]], float],
    module: str = STEP,
    forks: int = DEFAULT_FORKS,
) -> dict[str, dict[str, Any]]:
    """:func:`run_step` on every host of ``calls`` (host -> target and arguments), one ssh call
    each, at most ``forks`` at once (``--forks``; the next host's call starts as one ends); each
    host's result, in the order of ``calls``."""

    def one(host: str) -> dict[str, Any]:
        t, args = calls[host]
        return run_step(t, args, timeout_s(args), module)

    with ThreadPoolExecutor(max_workers=workers(len(calls), forks)) as pool:
        return dict(zip(calls, pool.map(one, calls), strict=True))
