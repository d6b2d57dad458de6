"""Ansible strategy and connection choices side by side on one lab, in one run.

Usage::

    .venv/bin/python benchmarks/ansible_choices_bench.py [--nodes 8] [--rounds 5]

Each round runs, in turn, one playbook run over every node at once whose one task is the node
step module in its read-only ``check`` action (the shape of the apply and restore runs, without
writes and kubelet restarts, so the numbers are the overhead of the choice only), under each
configuration:

* ``linear + pipelining + ControlPersist`` (what ``rollout`` uses),
* ``free`` strategy (same connection settings),
* no pipelining (each module is copied to the node first),
* no ControlPersist (a fresh SSH connection for every task),
* the Mitogen ``mitogen_linear`` strategy, when the ``mitogen`` package is installed,
* the node step over one plain ``ssh`` call per node through the warm master
  (``rollout/ansible/direct.py``, what a restore uses; no Ansible start-up).

Configurations alternate within a round, so a busy machine slows them alike. Reports per
configuration the median and all raw wall times, and the controller CPU (user + sys of the
child processes) per run.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout.ansible import direct  # noqa: E402
from rollout.ansible.hosts import read_inventory  # noqa: E402
from rollout.ansible.runner import ENV, AnsibleRunner  # noqa: E402
from rollout.lab.cluster import Lab  # noqa: E402
from tests.lab import changekit as ck  # noqa: E402

PATHS = ["/var/lib/kubelet/config.yaml", "/etc/kubernetes/kubelet.conf.d/90-rollout.conf"]
PLAYBOOK = f"""---
- name: Read the sha256 of the kubelet files on every node
  hosts: all
  gather_facts: false
  tasks:
    - name: Run the node step module's read-only check
      rollout_kubelet_step:
        action: check
        payload:
          paths: {json.dumps(PATHS)}
"""


def _mitogen() -> str | None:
    try:
        import ansible_mitogen  # type: ignore[import-not-found]
    except ImportError:
        return None
    return str(Path(ansible_mitogen.__file__).parent / "plugins" / "strategy")


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ansible-choices-"))
    lab = Lab(f"acb{os.getpid() % 1000}", work / "lab")
    lab.start_control_plane()
    try:
        names = [f"a{i}" for i in range(1, args.nodes + 1)]
        lab.machines.add_nodes(names, ["kubeadm"])
        inv = ck.inventory(lab, names, names[:1], work / "inv.ini")
        configs: dict[str, dict[str, str]] = {
            "linear+pipelining+ControlPersist (rollout)": {},
            "free+pipelining+ControlPersist": {"ANSIBLE_STRATEGY": "free"},
            "linear, no pipelining": {"ANSIBLE_PIPELINING": "False"},
            "linear, no ControlPersist": {"ANSIBLE_SSH_ARGS": "-C -o ControlMaster=no"},
        }
        mitogen = _mitogen()
        if mitogen:
            configs["mitogen_linear"] = {
                "ANSIBLE_STRATEGY": "mitogen_linear",
                "ANSIBLE_STRATEGY_PLUGINS": mitogen,
            }
        pb = work / "pb"
        pb.mkdir()
        (pb / "check.yml").write_text(PLAYBOOK)
        library = REPO / "playbooks" / "roles" / "rollout_kubelet" / "library"
        runs: dict[str, Callable[[], None]] = {}
        for name, extra in configs.items():
            runner = AnsibleRunner(
                work / name.replace(" ", "_"), pb, {"ANSIBLE_LIBRARY": str(library), **extra}
            )

            def run(runner: AnsibleRunner = runner) -> None:
                r = runner.run("check.yml", inv, names, {})
                if not r.ok:  # counted, not fatal: a busy lab node's sshd may time out
                    bad = sorted(h for h, x in r.hosts.items() if x.status != "ok")
                    raise RuntimeError(f"not ok on {bad}")

            runs[name] = run
        hv = read_inventory(inv).hostvars
        targets = {h: direct.target(h, hv[h]) for h in names}

        def plain_ssh() -> None:
            def one(h: str) -> dict[str, Any]:
                t = targets[h]
                assert t is not None
                out = direct.run_step(t, {"action": "check", "payload": {"paths": PATHS}}, 60)
                if out.get("status") != "ok":
                    raise RuntimeError(f"not ok on {h}: {out.get('msg')}")
                return out

            with ThreadPoolExecutor(len(names)) as pool:
                list(pool.map(one, names))

        runs["node step over plain ssh (warm master, no Ansible)"] = plain_ssh
        walls: dict[str, list[float]] = {k: [] for k in runs}
        cpus: dict[str, list[float]] = {k: [] for k in runs}
        failures: dict[str, list[str]] = {k: [] for k in runs}
        for name in runs:  # warm-up: masters open, caches hot
            try:
                runs[name]()
            except RuntimeError as e:
                failures[name].append(f"warm-up: {e}")
        for _ in range(args.rounds):
            for name, run in runs.items():
                c0, t0 = _children_cpu(), time.monotonic()
                try:
                    run()
                except RuntimeError as e:
                    failures[name].append(str(e))
                    continue
                walls[name].append(round(time.monotonic() - t0, 3))
                cpus[name].append(round(_children_cpu() - c0, 3))
        base = statistics.median(walls["linear+pipelining+ControlPersist (rollout)"])
        out = {
            "nodes": args.nodes,
            "rounds": args.rounds,
            "ansibleEnv": {k: ENV[k] for k in ("ANSIBLE_PIPELINING", "ANSIBLE_SSH_ARGS")},
            "mitogen": bool(mitogen),
            "results": {
                name: {
                    "medianWallS": statistics.median(walls[name]) if walls[name] else None,
                    "vsRollout": round(statistics.median(walls[name]) / base, 2)
                    if walls[name]
                    else None,
                    "medianControllerCpuS": statistics.median(cpus[name]) if cpus[name] else None,
                    "wallS": walls[name],
                    "failedRuns": failures[name],
                }
                for name in runs
            },
        }
        print(json.dumps(out, indent=2))
    finally:
        lab.down()


if __name__ == "__main__":
    main()
