"""The settings every way of reaching a node shares: the Ansible environment of a playbook run
and of the plain-ssh path (the same SSH master connection), and the atomic JSON writer of the
controller's files.

Why a module of its own: ``runner`` (playbooks), ``direct`` (plain ssh) and ``gathering`` (facts
over plain ssh) all need these; with them in ``runner``, ``direct`` and ``gathering`` imported
``runner`` and ``runner`` imported ``gathering``, an import circle
(``tests/unit/test_import_cycles.py`` walks the imports of ``rollout/ansible/``).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any


def path_with_ansible() -> str:
    """PATH with this interpreter's bin directory first, so the ansible-playbook installed with
    this package runs even when its virtualenv is not activated."""
    here = str(Path(sys.executable).parent)
    path = os.environ.get("PATH", os.defpath)
    return path if path.split(os.pathsep)[0] == here else here + os.pathsep + path


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


def write_json(path: Path, data: Any) -> None:
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
