"""A canary applied by ``rollout`` versus the way users do it today, side by side in one lab.

Usage::

    .venv/bin/python benchmarks/apply_bench.py [--nodes 10] [--max-unavailable 2]

1. ``rollout apply --canary --yes`` on all N nodes (canary group = all, ``maxUnavailable`` as
   given); wall time, and from the journal the waits it cannot avoid: per batch, the slowest
   node's drain + apply playbook (write, restart, healthz) + verify (Ready, configz, devices).
2. ``rollout rollback`` (not timed) to put the nodes back.
3. The script users run today, per node in sequence: ``kubectl drain --ignore-daemonsets
   --delete-emptydir-data``, ``ansible-playbook apply.yml`` with the same payload, ``kubectl
   uncordon``; wall time.

Prints one JSON object: both wall times, their ratio, the time ``rollout`` adds per node beyond
the unavoidable waits (preflight with facts gathering included, and without it), how many
playbook runs the apply made, and per batch the slowest drain / apply / verify and the wall.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout.ansible.payloads import ApplyPayload, FileWrite  # noqa: E402
from rollout.change.kinds.kubelet_record import change_from_record  # noqa: E402
from rollout.change.record.journal import Journal  # noqa: E402
from rollout.change.record.replay import replay  # noqa: E402
from rollout.lab.binaries import find_bin_dir  # noqa: E402
from rollout.lab.cluster import Lab  # noqa: E402
from tests.lab import changekit as ck  # noqa: E402

BIN = Path(sys.executable).parent


def _t(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def unavoidable(journal: Journal) -> tuple[float, float]:
    """(sum over batches of the slowest node's drain+apply+verify, preflight-to-first-step gap)."""
    entries = journal.entries()
    spans: dict[tuple[str, str], dict[str, float]] = {}
    for e in entries:
        if e.node and e.step in ("drain", "apply", "verify"):
            spans.setdefault((e.node, e.step), {})[e.phase.value] = _t(e.ts)
    per_node: dict[str, float] = {}
    for (node, _step), s in spans.items():
        if "begin" in s and "done" in s:
            per_node[node] = per_node.get(node, 0.0) + s["done"] - s["begin"]
    begin = next(e for e in entries if e.step == "change")
    batches = begin.data.get("batches", [])
    waits = sum(max(per_node.get(n, 0.0) for n in b) for b in batches)
    return waits, _t(begin.ts)


def per_batch(journal: Journal) -> list[dict[str, float]]:
    """Per batch: the slowest node's drain, apply, verify, and the batch's wall (first node step
    begun to last uncordon done), from the journal's timestamps."""
    entries = journal.entries()
    begin = next(e for e in entries if e.step == "change")
    out = []
    for batch in begin.data.get("batches", []):
        spans: dict[str, float] = {}
        ts = [_t(e.ts) for e in entries if e.node in batch and e.path and e.path.value == "forward"]
        for step in ("drain", "apply", "verify"):
            longest = 0.0
            for n in batch:
                b = [
                    _t(e.ts)
                    for e in entries
                    if (e.node, e.step) == (n, step) and e.phase.value == "begin"
                ]
                d = [
                    _t(e.ts)
                    for e in entries
                    if (e.node, e.step) == (n, step) and e.phase.value == "done"
                ]
                if b and d:
                    longest = max(longest, d[-1] - b[0])
            spans[step] = round(longest, 1)
        spans["wall"] = round(max(ts) - min(ts), 1) if ts else 0.0
        out.append(spans)
    return out


def playbook_runs(journal: Journal) -> int:
    """How many ansible-runner runs the change made (one artifacts dir each)."""
    return sum(1 for d in (journal.dir / "ansible").glob("**/artifacts/*") if d.is_dir())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes", type=int, default=10)
    ap.add_argument("--max-unavailable", type=int, default=2)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="apply-bench-"))
    lab = Lab(f"bench{os.getpid() % 1000}", work / "lab")
    lab.start_control_plane()
    try:
        names = [f"b{i}" for i in range(1, args.nodes + 1)]
        lab.machines.add_nodes(names, ["kubeadm"])
        inv = ck.inventory(lab, names, names, work / "inv.ini")
        plan = ck.plan(work / "plan.yaml", dict.fromkeys(names, "kubeadm"), args.max_unavailable)
        env = ck.env(lab, work / "state")
        started = time.time()
        r = ck.cli(
            ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"],
            env,
            1800,
        )
        tool_wall = time.time() - started
        assert r.returncode == 0, r.stderr
        change = json.loads(r.stdout)["change"]
        journal = Journal.open(work / "state", change)
        waits, change_begin = unavoidable(journal)
        preflight = change_begin - started
        batches = per_batch(journal)
        runs = playbook_runs(journal)
        status = replay(journal.entries())
        changes = {n: change_from_record(journal, n, status.nodes[n].record) for n in names}
        r = ck.cli(["rollback", "--change", change, "--yes"], env, 1800)
        assert r.returncode == 0, r.stderr

        kubectl = str(find_bin_dir() / "kubectl")
        script_dir = work / "script"
        (script_dir / "payload").mkdir(parents=True)
        for n, c in changes.items():  # the same files rollout wrote, as the script's payloads
            payload = ApplyPayload(
                change_id="script",
                files=tuple(
                    FileWrite(p, b, *c.mode[p], expect=c.expect[p])
                    for p, b in sorted(c.files.items())
                ),
                service=c.service,
                checkpoint_reset=c.checkpoint_reset,
                healthz_url=c.healthz_url,
            )
            (script_dir / "payload" / f"{n}.json").write_text(json.dumps(payload.as_json()))
        from rollout.ansible.runner import ENV

        senv = {
            **env,
            **ENV,
            "ANSIBLE_ROLES_PATH": str(REPO / "playbooks" / "roles"),
            "PATH": f"{BIN}:{env['PATH']}",
        }
        started = time.time()
        for n in names:
            subprocess.run(
                [
                    kubectl,
                    "drain",
                    n,
                    "--ignore-daemonsets",
                    "--delete-emptydir-data",
                    "--timeout=120s",
                ],
                env=senv,
                check=True,
                capture_output=True,
            )
            pb = subprocess.run(
                [
                    str(BIN / "ansible-playbook"),
                    "-i",
                    str(inv),
                    str(REPO / "playbooks" / "apply.yml"),
                    "-l",
                    n,
                    "-e",
                    "rollout_hosts=all",
                    "-e",
                    f"rollout_kubelet_payload_dir={script_dir / 'payload'}",
                    "-e",
                    f"rollout_kubelet_result_dir={script_dir / 'results'}",
                ],
                env=senv,
                check=False,
                capture_output=True,
                text=True,
                cwd=REPO / "playbooks",
            )
            if pb.returncode != 0:
                raise SystemExit(
                    f"ansible-playbook failed on {n}:\n{pb.stdout[-3000:]}\n{pb.stderr[-2000:]}"
                )
            subprocess.run([kubectl, "uncordon", n], env=senv, check=True, capture_output=True)
        script_wall = time.time() - started
        added = tool_wall - waits
        print(
            json.dumps(
                {
                    "nodes": args.nodes,
                    "maxUnavailable": args.max_unavailable,
                    "rolloutWallS": round(tool_wall, 1),
                    "scriptWallS": round(script_wall, 1),
                    "scriptOverRollout": round(script_wall / tool_wall, 2),
                    "unavoidableWaitsS": round(waits, 1),
                    "preflightS": round(preflight, 1),
                    "addedPerNodeS": round(added / args.nodes, 2),
                    "addedPerNodeWithoutPreflightS": round((added - preflight) / args.nodes, 2),
                    "applyPlaybookRuns": runs,
                    "batches": batches,
                },
                indent=2,
            )
        )
    finally:
        lab.down()


if __name__ == "__main__":
    main()
