"""Gathering node facts over plain ssh, one call per host, all hosts at once (no Ansible).

Why apart from :mod:`rollout.ansible.runner`: this path does what ``facts.yml`` does without
starting Ansible at all: it reads the role's defaults the way Ansible would, refuses (returns
None) when a host needs more than plain ssh or a role variable is templated, and runs the facts
module through :mod:`rollout.ansible.direct`. The runner falls back to the playbook when it
returns None.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from rollout.ansible import direct
from rollout.ansible.settings import write_json
from rollout.errors import ExternalError
from rollout.fanout import DEFAULT_FORKS

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


def open_facts(
    hosts: Sequence[str],
    hostvars: Mapping[str, Mapping[str, Any]],
    forks: int = DEFAULT_FORKS,
) -> None:
    """Open the facts sessions of the first ``forks`` of ``hosts`` (the calls
    :func:`facts_direct` starts first) ahead of it: ssh, Python and the module up on each node,
    waiting; nothing is read on a node until the call sends its arguments, so what the call
    reads is the node as it is then. Does nothing when :func:`facts_direct` would not run over
    plain ssh (the playbook runs then).

    Why: over a fresh session the facts call is mostly its start-up (8 nodes at load 6: 1.7-2.1 s
    cold, 0.12 s over open sessions; ``benchmarks/README.md``, node_step_bench), and ``apply``'s
    ``after`` evidence can open them while its last batch runs."""
    targets = [direct.target(h, hostvars.get(h, {})) for h in hosts]
    if any(t is None for t in targets):
        return
    for t in targets[: max(1, forks)]:
        if t is not None:
            direct.start(t, direct.FACTS)


def facts_direct(
    hosts: Sequence[str],
    hostvars: Mapping[str, Mapping[str, Any]],
    out: Path,
    playbook_dir: Path,
    forks: int = DEFAULT_FORKS,
) -> dict[str, dict[str, Any]] | None:
    """What facts.yml does, over one plain ssh call per host, at most ``forks`` at once; None
    when a host needs more than plain ssh (then the playbook runs).

    Raises:
        ExternalError: as :meth:`AnsibleRunner.gather_facts`.
    """
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

    results = direct.run_all(jobs, lambda _args: FACTS_TIMEOUT_S, module=direct.FACTS, forks=forks)
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
        write_json(out / f"{h}.json", data)
        facts[h] = data
    return facts
