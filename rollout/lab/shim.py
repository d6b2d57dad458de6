"""A ``systemctl`` stand-in for lab nodes, and the tiny supervisor behind it.

PID 1 on the lab machine is not systemd, and a real kubelet cannot run here, so each lab node gets
this program bind-mounted over ``/usr/bin/systemctl`` inside its own mount namespace. Ansible
(``ansible.builtin.systemd_service``), testinfra and people over SSH then drive the node's kubelet
unit with the same verbs they use on a real node. It knows only the units listed in the node's
``/etc/rollout-lab/units.json`` (the distribution's kubelet unit: ``kubelet``, ``k3s-agent``,
``rke2-agent``, ``snap.microk8s.daemon-kubelite``...).

``start`` launches a supervisor (detached, its own session) that runs the unit's command and, like
systemd's ``Restart=always``, starts it again ``RestartSec`` seconds after every exit. While it
crash-loops the unit is ``activating`` / ``auto-restart``, as ``systemctl is-active`` shows on a
real node with a kubelet that refuses its configuration. Output goes to the unit's log file
(``/var/log/kubelet.log``). State lives in ``/var/lib/rollout-lab/units/<unit>/`` inside the node.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

UNITS_FILE = Path("/etc/rollout-lab/units.json")
STATE_ROOT = Path("/var/lib/rollout-lab/units")


@dataclass(frozen=True)
class Unit:
    """One supervised unit, as declared in ``units.json``."""

    name: str
    exec_start: tuple[str, ...]
    log: str
    restart_sec: float
    description: str
    fragment: str
    drop_ins: tuple[str, ...]
    env: tuple[tuple[str, str], ...] = ()


def load_units(path: Path | None = None) -> dict[str, Unit]:
    """Read the node's unit table (default :data:`UNITS_FILE`); missing file means no units."""
    try:
        raw = json.loads((path or UNITS_FILE).read_text())
    except FileNotFoundError:
        return {}
    return {
        name: Unit(
            name=name,
            exec_start=tuple(u["execStart"]),
            log=u.get("log", f"/var/log/{name}.log"),
            restart_sec=float(u.get("restartSec", 1.0)),
            description=u.get("description", name),
            fragment=u.get("fragmentPath", ""),
            drop_ins=tuple(u.get("dropInPaths", ())),
            env=tuple(sorted(u.get("environment", {}).items())),
        )
        for name, u in raw.items()
    }


def _unit_name(arg: str) -> str:
    return arg[: -len(".service")] if arg.endswith(".service") else arg


def _state_dir(unit: str) -> Path:
    return STATE_ROOT / unit


def _read(p: Path, default: str = "") -> str:
    try:
        return p.read_text().strip()
    except OSError:
        return default


def _alive(pid: int) -> bool:
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie is not alive for our purposes
    return "State:\tZ" not in _read(Path(f"/proc/{pid}/status"))


def _supervisor_pid(unit: str) -> int:
    pid = int(_read(_state_dir(unit) / "supervisor.pid", "0") or 0)
    return pid if _alive(pid) else 0


def active_state(unit: str) -> tuple[str, str]:
    """``(ActiveState, SubState)`` of ``unit`` as systemd would report them."""
    if not _supervisor_pid(unit):
        return "inactive", "dead"
    state = _read(_state_dir(unit) / "state", "activating")
    return ("active", "running") if state == "active" else ("activating", "auto-restart")


# ------------------------------------------------------------------------------- supervisor
def supervise(unit: Unit) -> None:
    """Run ``unit`` forever, restarting it after every exit (``Restart=always``) until SIGTERM."""
    d = _state_dir(unit.name)
    d.mkdir(parents=True, exist_ok=True)
    stopping = False
    child: subprocess.Popen[bytes] | None = None

    def on_term(_sig: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        if child is not None and child.poll() is None:
            child.terminate()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGINT, on_term)
    env = dict(os.environ)
    env.update(dict(unit.env))
    Path(unit.log).parent.mkdir(parents=True, exist_ok=True)
    restarts = int(_read(d / "restarts", "0") or 0)
    while not stopping:
        with open(unit.log, "ab") as log:
            log.write(f"=== {time.strftime('%Y-%m-%dT%H:%M:%S')} Started {unit.name}\n".encode())
            log.flush()
            child = subprocess.Popen(
                list(unit.exec_start), stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env
            )
        (d / "main.pid").write_text(f"{child.pid}\n")
        (d / "state").write_text("active\n")
        (d / "started").write_text(f"{time.time()}\n")
        while True:
            try:
                child.wait(timeout=1.0 if stopping else None)
                break
            except subprocess.TimeoutExpired:
                child.kill()
        (d / "main.pid").unlink(missing_ok=True)
        if stopping:
            break
        (d / "state").write_text("activating\n")
        with open(unit.log, "ab") as log:
            log.write(
                f"=== {unit.name}.service: Main process exited, code=exited, "
                f"status={child.returncode}; scheduled restart in {unit.restart_sec:g}s\n".encode()
            )
        deadline = time.monotonic() + unit.restart_sec
        while not stopping and time.monotonic() < deadline:
            time.sleep(0.1)
        if not stopping:
            restarts += 1
            (d / "restarts").write_text(f"{restarts}\n")
    (d / "state").write_text("inactive\n")
    (d / "supervisor.pid").unlink(missing_ok=True)


# ------------------------------------------------------------------------------- verbs
def _start(unit: Unit) -> None:
    if _supervisor_pid(unit.name):
        return
    d = _state_dir(unit.name)
    d.mkdir(parents=True, exist_ok=True)
    (d / "state").write_text("activating\n")
    proc = subprocess.Popen(
        [sys.executable, "-m", "rollout.lab.shim", "--supervise", unit.name],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
        close_fds=True,
    )
    (d / "supervisor.pid").write_text(f"{proc.pid}\n")
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not (d / "main.pid").exists():
        time.sleep(0.02)


def _stop(unit: Unit) -> None:
    pid = _supervisor_pid(unit.name)
    if not pid:
        return
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + 15
    while _alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if _alive(pid):
        os.kill(pid, signal.SIGKILL)
    main_pid = int(_read(_state_dir(unit.name) / "main.pid", "0") or 0)
    if _alive(main_pid):
        os.kill(main_pid, signal.SIGKILL)
    (_state_dir(unit.name) / "supervisor.pid").unlink(missing_ok=True)
    (_state_dir(unit.name) / "state").write_text("inactive\n")


def _fmt_ts(t: str) -> str:
    if not t:
        return ""
    return time.strftime("%a %Y-%m-%d %H:%M:%S UTC", time.gmtime(float(t)))


def show(unit: Unit | None, name: str) -> dict[str, str]:
    """The properties ``systemctl show UNIT`` prints (the subset Ansible and people read)."""
    if unit is None:
        return {
            "Id": f"{name}.service",
            "Names": f"{name}.service",
            "LoadState": "not-found",
            "ActiveState": "inactive",
            "SubState": "dead",
            "UnitFileState": "",
        }
    d = _state_dir(unit.name)
    act, sub = active_state(unit.name)
    main_pid = _read(d / "main.pid", "0") if act == "active" else "0"
    started = _fmt_ts(_read(d / "started")) if act != "inactive" else ""
    return {
        "Type": "simple",
        "Restart": "always",
        "RestartUSec": f"{int(unit.restart_sec * 1_000_000)}",
        "MainPID": main_pid or "0",
        "ExecMainPID": main_pid or "0",
        "ExecMainStartTimestamp": started,
        "ActiveEnterTimestamp": started,
        "NRestarts": _read(d / "restarts", "0") or "0",
        "Id": f"{unit.name}.service",
        "Names": f"{unit.name}.service",
        "Description": unit.description,
        "LoadState": "loaded",
        "ActiveState": act,
        "SubState": sub,
        "FragmentPath": unit.fragment,
        "DropInPaths": " ".join(unit.drop_ins),
        "UnitFileState": "enabled" if _read(d / "enabled", "enabled") == "enabled" else "disabled",
        "UnitFilePreset": "enabled",
    }


def _status_text(unit: Unit, lines_shown: int = 10) -> str:
    p = show(unit, unit.name)
    lines = [
        f"● {unit.name}.service - {unit.description}",
        f"     Loaded: loaded ({unit.fragment}; {p['UnitFileState']}; preset: enabled)",
    ]
    if unit.drop_ins:
        lines.append(f"    Drop-In: {' '.join(unit.drop_ins)}")
    since = f" since {p['ActiveEnterTimestamp']}" if p["ActiveEnterTimestamp"] else ""
    lines.append(f"     Active: {p['ActiveState']} ({p['SubState']}){since}")
    if p["MainPID"] != "0":
        lines.append(f"   Main PID: {p['MainPID']}")
    try:
        tail = Path(unit.log).read_text(errors="replace").splitlines()[-lines_shown:]
        tail = tail if lines_shown > 0 else []
    except OSError:
        tail = []
    if tail:
        lines.append("")
        lines.extend(tail)
    return "\n".join(lines)


_IGNORED_FLAGS = {
    "--no-pager",
    "--no-block",
    "--system",
    "--no-ask-password",
    "--plain",
    "--full",
    "-l",
    "--no-legend",
    "--now",
    "--all",
    "-a",
}


def systemctl(argv: list[str]) -> int:
    """Run one ``systemctl`` command line; returns the exit code systemctl would."""
    props: list[str] = []
    value_only = quiet = False
    lines = 10
    words: list[str] = []
    it = iter(argv)
    for a in it:
        if a in ("-n", "--lines") or a.startswith("--lines="):
            # how many log lines `status` shows (systemd's default is 10)
            value = a.split("=", 1)[1] if "=" in a else next(it, "10")
            lines = int(value) if value.isdigit() else 10
        elif a in ("-p", "--property"):
            props.extend(next(it, "").split(","))
        elif a.startswith("--property="):
            props.extend(a.split("=", 1)[1].split(","))
        elif a == "--value":
            value_only = True
        elif a in ("-q", "--quiet"):
            quiet = True
        elif a == "--version":
            print("systemd 252 (rollout lab shim)")
            return 0
        elif a in _IGNORED_FLAGS or a.startswith("--type") or a.startswith("--state"):
            continue
        else:
            words.append(a)
    if not words:
        print("rollout lab systemctl shim: no verb given", file=sys.stderr)
        return 1
    verb, names = words[0], [_unit_name(n) for n in words[1:]]
    units = load_units()
    if verb in ("daemon-reload", "daemon-reexec", "reset-failed"):
        STATE_ROOT.mkdir(parents=True, exist_ok=True)
        f = STATE_ROOT / "daemon-reloads"
        if verb == "daemon-reload":
            f.write_text(f"{int(_read(f, '0') or 0) + 1}\n")
        return 0
    if verb == "show":
        for i, n in enumerate(names):
            p = show(units.get(n), n)
            keys = props or list(p)
            if i:
                print()
            for k in keys:
                v = p.get(k, "")
                print(v if value_only else f"{k}={v}")
        return 0
    if verb == "is-active":
        rc = 0
        for n in names:
            act = active_state(n)[0] if n in units else "inactive"
            if not quiet:
                print(act)
            rc = rc if act == "active" else 3
        return rc
    if verb == "is-enabled":
        rc = 0
        for n in names:
            if n not in units:
                print(f"Failed to get unit file state for {n}.service: No such file or directory")
                return 1
            st = _read(_state_dir(n) / "enabled", "enabled")
            if not quiet:
                print(st)
            rc = rc if st == "enabled" else 1
        return rc
    if verb == "list-unit-files":
        for u in units.values():
            print(f"{u.name}.service {_read(_state_dir(u.name) / 'enabled', 'enabled')} enabled")
        return 0
    unknown = [n for n in names if n not in units]
    if verb == "status":
        if unknown:
            print(f"Unit {unknown[0]}.service could not be found.", file=sys.stderr)
            return 4
        rc = 0
        for n in names:
            print(_status_text(units[n], lines))
            rc = rc if active_state(n)[0] == "active" else 3
        return rc
    if verb not in (
        "start",
        "stop",
        "restart",
        "try-restart",
        "reload-or-restart",
        "enable",
        "disable",
        "kill",
    ):
        print(f"rollout lab systemctl shim: unsupported verb {verb!r}", file=sys.stderr)
        return 1
    if unknown:
        print(
            f"Failed to {verb} {unknown[0]}.service: Unit {unknown[0]}.service not found.",
            file=sys.stderr,
        )
        return 5
    for n in names:
        u = units[n]
        if verb in ("enable", "disable"):
            _state_dir(n).mkdir(parents=True, exist_ok=True)
            (_state_dir(n) / "enabled").write_text(f"{verb}d\n")
        elif verb == "start":
            _start(u)
        elif verb == "stop":
            _stop(u)
        elif verb == "kill":
            main_pid = int(_read(_state_dir(n) / "main.pid", "0") or 0)
            if _alive(main_pid):
                os.kill(main_pid, signal.SIGTERM)
        elif verb == "try-restart" and not _supervisor_pid(n):
            continue
        else:
            _stop(u)
            _start(u)
    return 0


def main() -> None:
    """Entry point of the shim (``systemctl ...``) and of the supervisor (``--supervise U``)."""
    argv = sys.argv[1:]
    if argv[:1] == ["--supervise"]:
        units = load_units()
        with contextlib.suppress(KeyboardInterrupt):
            supervise(units[argv[1]])
        return
    sys.exit(systemctl(argv))


if __name__ == "__main__":
    main()
