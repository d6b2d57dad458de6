"""``rollout apply`` against an operator's loops and the physical floor, and the canary rollback,
side by side on one lab in one run, repeated for medians.

Usage::

    .venv/bin/python benchmarks/node_step_bench.py [--sizes 8:2,16:4] [--rounds 3]
        [--playbook-sizes 8] [--playbook-rounds 1] [--canaries 1,4] [--skip-loops]
        [--baseline-tree PATH] [--dry-run-rounds N]

On one lab of max(N) kubeadm nodes with 2 x max(N) small pods spread over them (so every drain
evicts), each round runs, for every size N:maxUnavailable (the first N nodes; canary group = the
first batch):

1. ``rollout apply --yes`` (all batches), wall time from the command's start; from the journal:
   preflight (command start to the change's first entry), per batch the slowest node's drain /
   apply / verify, the node step's own timings, and the **floor**: the sum over batches of the
   slowest node's drain + kubelet restart (stop + start + /healthz, timed on the node by the node
   step) + verify (Ready, /configz). Then ``rollout rollback`` of the N nodes (timed).
2. The operator's loop, one node at a time: ``kubectl drain``; one ``ssh`` that writes the same
   files, removes ``cpu_manager_state``, restarts the kubelet and waits for ``/healthz``;
   ``kubectl wait Ready``; poll ``/configz`` until the new policy shows; ``kubectl uncordon``.
3. For the sizes in ``--playbook-sizes`` (in the first ``--playbook-rounds`` rounds): the same
   loop with ``ansible-playbook apply.yml`` per node instead of the ssh. (Between runs the nodes
   are put back untimed.)

Before every timed ``rollout apply`` and every loop the bench pods are deleted and the run waits
until their replacements run on every one of the N nodes (``podsOnNodes`` in the output), so
every drain evicts something in every round, not only in the first.

With ``--baseline-tree PATH`` (a checkout of another commit, e.g. ``git worktree add --detach
PATH main``), each round also runs ``rollout apply --yes`` (and its rollback) with that tree's
``rollout`` package first on ``PYTHONPATH``, same venv, same lab, same plan: the two versions
alternate which goes first from round to round, and the loop follows them, so all three see
the same load (``baseline`` in the output, ``baselineTree`` names its commit). With
``--dry-run-rounds N`` as well, after the rounds: N ``rollout apply --dry-run`` (preflight alone)
of each tree in turn per size (``dryRuns``).

Then, each round, for each canary size C: ``rollout apply --canary --yes`` with a C-node canary
group, then ``rollout rollback --change ID --yes`` timed from the command's start (the trigger)
to its exit and to the last node restored, Ready and uncordoned (the journal's last restore-path
``uncordon`` ``done``), with and without the drain.

Prints one JSON object with the raw numbers per round, the medians and the ratios of medians;
the load average (``/proc/loadavg``) is recorded before every timed run.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from rollout.ansible.payloads import ApplyPayload, FileWrite  # noqa: E402
from rollout.ansible.runner import ENV  # noqa: E402
from rollout.change.kinds.kubelet_record import change_from_record  # noqa: E402
from rollout.change.record.journal import Journal  # noqa: E402
from rollout.change.record.replay import replay  # noqa: E402
from rollout.lab.binaries import find_bin_dir  # noqa: E402
from rollout.lab.cluster import Lab  # noqa: E402
from rollout.models import NodeChange  # noqa: E402
from tests.lab import changekit as ck  # noqa: E402

BIN = Path(sys.executable).parent


def _t(ts: str) -> float:
    return datetime.fromisoformat(ts).timestamp()


def _spans(journal: Journal, path: str) -> dict[tuple[str, str], float]:
    """(node, step) -> seconds from its first begin to its last done, on ``path``."""
    b: dict[tuple[str, str], float] = {}
    d: dict[tuple[str, str], float] = {}
    for e in journal.entries():
        if not e.node or not e.path or e.path.value != path:
            continue
        k = (e.node, e.step)
        if e.phase.value == "begin":
            b.setdefault(k, _t(e.ts))
        elif e.phase.value == "done":
            d[k] = _t(e.ts)
    return {k: d[k] - b[k] for k in b if k in d}


def forward_numbers(journal: Journal) -> dict[str, Any]:
    """Per batch the slowest drain / apply / verify, the node step's timings, and the floor."""
    entries = journal.entries()
    begin = next(e for e in entries if e.step == "change")
    spans = _spans(journal, "forward")
    node_step = {
        e.node: dict(e.data.get("nodeStep") or {})
        for e in entries
        if e.node and e.step == "apply" and e.phase.value == "done"
    }
    batches, floor = [], 0.0
    for batch in begin.data.get("batches", []):
        ts = [_t(e.ts) for e in entries if e.node in batch and e.path and e.path.value == "forward"]
        row: dict[str, Any] = {"nodes": len(batch)}
        for step in ("drain", "apply", "verify"):
            row[step] = round(max(spans.get((n, step), 0.0) for n in batch), 2)
        restart = {
            n: sum(node_step.get(n, {}).get(k, 0.0) for k in ("stop", "start", "healthz"))
            for n in batch
        }
        row["restartOnNode"] = round(max(restart.values()), 2)
        for part in ("stop", "start", "healthz"):  # where the restart's time goes, slowest node
            row[part] = round(max(node_step.get(n, {}).get(part, 0.0) for n in batch), 3)
        row["nodeStepTotal"] = round(max(node_step.get(n, {}).get("total", 0.0) for n in batch), 2)
        row["wall"] = round(max(ts) - min(ts), 2) if ts else 0.0
        floor += max(
            spans.get((n, "drain"), 0.0) + restart[n] + spans.get((n, "verify"), 0.0) for n in batch
        )
        batches.append(row)
    done = [_t(e.ts) for e in entries if e.step == "change" and e.phase.value == "done"]
    evidence = [_t(e.ts) for e in entries if e.step == "evidence"]
    return {
        "batches": batches,
        "floorS": round(floor, 2),
        "changeBegin": _t(begin.ts),
        "changeDone": done[-1] if done else None,
        "lastEvidence": evidence[-1] if evidence else None,
    }


def timeline(journal: Journal, started: float) -> dict[str, Any]:
    """Where the time goes: per node, each forward step as [start, seconds] from the command's
    start (the profile of one run, from the journal's before/after entries)."""
    out: dict[str, Any] = {}
    begun: dict[tuple[str, str], float] = {}
    for e in journal.entries():
        if not e.node or not e.path or e.path.value != "forward":
            continue
        t = _t(e.ts) - started
        if e.phase.value == "begin":
            begun[(e.node, e.step)] = t
        elif (e.node, e.step) in begun:
            b = begun.pop((e.node, e.step))
            out.setdefault(e.node, {})[e.step] = [round(b, 2), round(t - b, 2)]
    return out


def restore_numbers(journal: Journal, trigger: float) -> dict[str, float]:
    """From the first restore-path entry to the last restore-path uncordon done (the node
    restored, Ready with its old /configz, uncordoned); the same from the trigger; and the drain
    part of it (the slowest node's restore-path drain)."""
    entries = [e for e in journal.entries() if e.path and e.path.value == "restore"]
    start = _t(entries[0].ts)
    end = max(_t(e.ts) for e in entries if e.step == "uncordon" and e.phase.value == "done")
    drains = _spans(journal, "restore")
    drain = max((v for (_, s), v in drains.items() if s == "drain"), default=0.0)
    return {
        "journalS": round(end - start, 2),
        "drainS": round(drain, 2),
        "triggerToFirstEntryS": round(start - trigger, 2),
        "triggerToUncordonedS": round(end - trigger, 2),
        "triggerToUncordonedWithoutDrainS": round(end - trigger - drain, 2),
    }


def _deployment(lab: Lab, ns: str, replicas: int) -> None:
    code, out = lab.api.request("POST", "/api/v1/namespaces", {"metadata": {"name": ns}})
    assert code in (201, 409), out
    labels = {"app": "bench"}
    body = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "bench", "namespace": ns},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": labels},
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "topologySpreadConstraints": [
                        {
                            "maxSkew": 1,
                            "topologyKey": "kubernetes.io/hostname",
                            "whenUnsatisfiable": "ScheduleAnyway",
                            "labelSelector": {"matchLabels": labels},
                        }
                    ],
                    "containers": [
                        {
                            "name": "c",
                            "image": "registry.invalid/pause:3.10",
                            "resources": {"requests": {"cpu": "50m", "memory": "32Mi"}},
                        }
                    ],
                },
            },
        },
    }
    code, out = lab.api.request("POST", f"/apis/apps/v1/namespaces/{ns}/deployments", body)
    assert code == 201, out

    def running() -> bool:
        code, out = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods")
        phases = [p.get("status", {}).get("phase") for p in out.get("items", [])]
        return code == 200 and phases.count("Running") >= replicas

    ck.wait_for(running, 180, "bench pods running", every=0.5)


def respread(lab: Lab, ns: str, replicas: int, names: list[str]) -> int:
    """Delete the bench pods and wait until their replacements run on every node of ``names``.

    Applies and rollbacks move pods off the nodes they drain; without this the next timed run
    would find near-empty nodes and drain nothing. Returns how many running pods are on ``names``.
    """
    code, out = lab.api.request("DELETE", f"/api/v1/namespaces/{ns}/pods?labelSelector=app%3Dbench")
    assert code == 200, out
    wanted = set(names)
    seen: list[int] = [0]  # pods on ``names`` in the last listing that satisfied the wait

    def spread() -> bool:
        code, out = lab.api.request("GET", f"/api/v1/namespaces/{ns}/pods")
        if code != 200:
            return False
        live = [
            p
            for p in out.get("items", [])
            if p.get("status", {}).get("phase") == "Running"
            and not p["metadata"].get("deletionTimestamp")
        ]
        on = [p["spec"].get("nodeName") for p in live]
        seen[0] = sum(1 for x in on if x in wanted)
        return len(live) >= replicas and wanted <= set(on)

    ck.wait_for(spread, 180, "bench pods re-spread over every node", every=0.5)
    return seen[0]


def _ssh(lab: Lab, node: str) -> list[str]:
    ip = lab.nodes[node].node.ip
    return [
        "ssh",
        "-o",
        "StrictHostKeyChecking=no",
        "-o",
        "UserKnownHostsFile=/dev/null",
        "-o",
        "LogLevel=ERROR",
        "-o",
        "BatchMode=yes",
        "-i",
        str(lab.machines.ssh_key),
        f"root@{ip}",
    ]


def _write_script(files: dict[str, bytes], c: NodeChange) -> str:
    """What an operator's one ssh call runs: write the files, reset the checkpoint, restart,
    wait for /healthz."""
    lines = ["set -e"]
    for path, data in sorted(files.items()):
        b64 = base64.b64encode(data).decode()
        lines.append(f"mkdir -p {shlex.quote(os.path.dirname(path))}")
        lines.append(f"echo {b64} | base64 -d > {shlex.quote(path)}")
    lines += [f"rm -f {shlex.quote(p)}" for p in c.checkpoint_reset]
    lines.append(f"systemctl restart {shlex.quote(c.service)}")
    probe = (
        "import ssl,sys,time,urllib.request\n"
        "c=ssl.create_default_context(cafile='/etc/rollout-lab/pki/ca.crt')\n"
        "for i in range(600):\n"
        "  try:\n"
        f"    if urllib.request.urlopen({c.healthz_url!r},timeout=2,context=c).read()==b'ok':"
        " sys.exit(0)\n"
        "  except Exception: pass\n"
        "  time.sleep(0.2)\n"
        "sys.exit(1)\n"
    )
    lines.append(f"python3 -c {shlex.quote(probe)}")
    return "\n".join(lines) + "\n"


def _policy(lab: Lab, node: str) -> str | None:
    """The running kubelet's cpuManagerPolicy, None while it does not answer (restarting)."""
    try:
        return ck.configz(lab, node).get("cpuManagerPolicy")
    except AssertionError:
        return None


def _put_back(lab: Lab, originals: dict[str, dict[str, bytes | None]], changes: Any) -> None:
    """Untimed: every node's files back to the originals (created files removed), restarted."""
    for n, files in originals.items():
        script = ["set -e"]
        for path, data in files.items():
            if data is None:
                script.append(f"rm -f {shlex.quote(path)}")
            else:
                b64 = base64.b64encode(data).decode()
                script.append(f"echo {b64} | base64 -d > {shlex.quote(path)}")
        c = changes[n]
        script += [f"rm -f {shlex.quote(p)}" for p in c.checkpoint_reset]
        script.append(f"systemctl restart {shlex.quote(c.service)}")
        for attempt in range(10):  # untimed; sshd on a busy lab node may refuse a moment
            r = subprocess.run(
                [*_ssh(lab, n), "bash -s"],
                input="\n".join(script) + "\n",
                text=True,
                check=False,
                capture_output=True,
            )
            if r.returncode == 0:
                break
            time.sleep(1 + attempt)
        else:
            raise SystemExit(f"could not put {n} back: {r.stderr}")
    for n in originals:
        ck.wait_for(
            lambda n=n: _policy(lab, n) == "none",
            60,
            f"{n} back to none",
            every=0.2,
        )


def _loop(lab: Lab, names: list[str], env: dict[str, str], apply_one: Any) -> float:
    kubectl = str(find_bin_dir() / "kubectl")
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
            env=env,
            check=True,
            capture_output=True,
        )
        apply_one(n)
        subprocess.run(
            [kubectl, "wait", "--for=condition=Ready", f"node/{n}", "--timeout=120s"],
            env=env,
            check=True,
            capture_output=True,
        )
        ck.wait_for(
            lambda n=n: _policy(lab, n) == "static",
            120,
            f"{n} configz",
            every=0.1,
        )
        subprocess.run([kubectl, "uncordon", n], env=env, check=True, capture_output=True)
    return time.time() - started


def _commit(tree: Path) -> str:
    r = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
        capture_output=True,
        text=True,
        check=False,
    )
    return r.stdout.strip()


def _load() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def _median(xs: list[float]) -> float:
    return round(statistics.median(xs), 2) if xs else float("nan")


class Bench:
    """One lab, its pods, and the runs; every timed run appends its raw numbers."""

    def __init__(
        self, lab: Lab, work: Path, names: list[str], baseline: Path | None = None
    ) -> None:
        self.lab, self.work, self.all = lab, work, names
        self.env = ck.env(lab, work / "state")
        self.env["PATH"] = f"{BIN}:{self.env['PATH']}"
        self.env.pop("PYTHONPATH", None)
        self.baseline_env: dict[str, str] | None = None
        # the CLI as pip installs it: its bytecode compiled once, before any timed run (with
        # PYTHONDONTWRITEBYTECODE set, as on the helpers' machine, every run compiled every
        # module it imports from source again; the installed kubernetes package has its own)
        for tree in (REPO, baseline) if baseline is not None else (REPO,):
            subprocess.run(
                [sys.executable, "-m", "compileall", "-q", str(tree / "rollout")], check=True
            )
        if baseline is not None:  # the other tree's package first on the path, same venv
            self.baseline_env = {**self.env, "PYTHONPATH": str(baseline)}
            r = subprocess.run(
                [sys.executable, "-c", "import rollout; print(rollout.__file__)"],
                env=self.baseline_env,
                cwd="/",  # as for the CLI's script: not this checkout first on the path
                capture_output=True,
                text=True,
                check=True,
            )
            assert r.stdout.strip().startswith(str(baseline)), r.stdout

    def files(self, n: int, canary: int, mu: int, tag: str) -> tuple[Path, Path]:
        names = self.all[:n]
        inv = ck.inventory(self.lab, names, names[:canary], self.work / f"inv-{tag}.ini")
        # the lab's fast-failure vars would shorten nothing on success; keep the role defaults
        inv.write_text(inv.read_text().replace(ck.FAST_VARS, ""))
        plan = ck.plan(self.work / f"plan-{tag}.yaml", dict.fromkeys(names, "kubeadm"), mu)
        return inv, plan

    def respread(self, n: int) -> int:
        return respread(self.lab, "bench", 2 * len(self.all), self.all[:n])

    def apply(
        self, n: int, mu: int, env: dict[str, str] | None = None
    ) -> tuple[dict[str, Any], Journal]:
        env = env or self.env
        inv, plan = self.files(n, mu, mu, f"{n}")
        pods = self.respread(n)
        load = _load()
        started = time.time()
        r = ck.cli(["apply", "--plan", str(plan), "-i", str(inv), "--yes", "-o", "json"], env, 1800)
        wall = time.time() - started
        assert r.returncode == 0, r.stderr
        change = json.loads(r.stdout)["change"]
        journal = Journal.open(self.work / "state", change)
        fwd = forward_numbers(journal)
        out = {
            "load": load,
            "podsOnNodes": pods,
            "wallS": round(wall, 2),
            "preflightS": round(fwd["changeBegin"] - started, 2),
            # the change's end to its last evidence entry (the after collection) and to exit
            "evidenceAfterS": round(fwd["lastEvidence"] - fwd["changeDone"], 2)
            if fwd["lastEvidence"] and fwd["changeDone"]
            else None,
            "changeDoneToExitS": round(started + wall - fwd["changeDone"], 2)
            if fwd["changeDone"]
            else None,
            "floorS": fwd["floorS"],
            "batches": fwd["batches"],
            "timeline": timeline(journal, started),
            "end": round(wall, 2),
        }
        started = time.time()
        r = ck.cli(["rollback", "--change", change, "--yes"], env, 1800)
        assert r.returncode == 0, r.stderr
        out["rollbackAllWallS"] = round(time.time() - started, 2)
        return out, journal

    def dry_runs(self, n: int, mu: int, rounds: int) -> dict[str, Any]:
        """``rollout apply --dry-run`` (preflight alone: inventory, facts, API reads, render and
        lint, the preview; nothing written) with this tree and the baseline tree in turn,
        ``rounds`` times each, alternating which goes first."""
        inv, plan = self.files(n, mu, mu, f"{n}")
        out: dict[str, Any] = {"rollout": [], "baseline": [], "load": []}
        for i in range(rounds):
            for which in ("rollout", "baseline") if i % 2 == 0 else ("baseline", "rollout"):
                env = self.baseline_env if which == "baseline" else self.env
                assert env is not None, "--dry-run-rounds needs --baseline-tree"
                out["load"].append(_load())
                started = time.time()
                r = ck.cli(
                    ["apply", "--plan", str(plan), "-i", str(inv), "--dry-run", "-o", "json"],
                    env,
                    600,
                )
                assert r.returncode == 0, r.stderr
                out[which].append(round(time.time() - started, 2))
        out["rolloutMedianS"] = _median(out["rollout"])
        out["baselineMedianS"] = _median(out["baseline"])
        return out

    def canary_rollback(self, size: int) -> dict[str, Any]:
        inv, plan = self.files(len(self.all), size, size, f"c{size}")
        r = ck.cli(
            ["apply", "--plan", str(plan), "-i", str(inv), "--canary", "--yes", "-o", "json"],
            self.env,
            1800,
        )
        assert r.returncode == 0, r.stderr
        cid = json.loads(r.stdout)["change"]
        load = _load()
        started = time.time()
        r = ck.cli(["rollback", "--change", cid, "--yes"], self.env, 1800)
        wall = time.time() - started
        assert r.returncode == 0, r.stderr
        nums = restore_numbers(Journal.open(self.work / "state", cid), started)
        return {
            "canaryNodes": size,
            "load": load,
            "triggerToExitS": round(wall, 2),
            **nums,
            "journalWithoutDrainS": round(nums["journalS"] - nums["drainS"], 2),
        }

    def loops(self, n: int, journal: Journal, playbook: bool) -> dict[str, Any]:
        names = self.all[:n]
        status = replay(journal.entries())
        changes = {x: change_from_record(journal, x, status.nodes[x].record) for x in names}
        originals = {
            x: {
                b.path: (journal.load_backup(x, b.sha256) if b.existed else None)
                for b in status.nodes[x].backups
            }
            for x in names
        }
        lab, env = self.lab, self.env

        def by_ssh(x: str) -> None:
            script = _write_script(dict(changes[x].files), changes[x])
            subprocess.run(
                [*_ssh(lab, x), "bash -s"], input=script, text=True, check=True, capture_output=True
            )

        out: dict[str, Any] = {"podsOnNodes": self.respread(n), "load": _load()}
        out["loopSshWallS"] = round(_loop(lab, names, env, by_ssh), 2)
        _put_back(lab, originals, changes)
        if not playbook:
            return out
        pdir = self.work / f"loop-payload-{n}"
        pdir.mkdir(exist_ok=True)
        for x, c in changes.items():
            payload = ApplyPayload(
                change_id="loop",
                files=tuple(
                    FileWrite(p, b, *c.mode[p], expect=c.expect[p])
                    for p, b in sorted(c.files.items())
                ),
                service=c.service,
                checkpoint_reset=c.checkpoint_reset,
                healthz_url=c.healthz_url,
                backup_dir="/var/lib/rollout/backups/loop",
            )
            (pdir / f"{x}.json").write_text(json.dumps(payload.as_json()))
        aenv = {**env, **ENV, "ANSIBLE_ROLES_PATH": str(REPO / "playbooks" / "roles")}
        inv, _ = self.files(n, 1, 1, f"loop{n}")

        def by_playbook(x: str) -> None:
            pb = subprocess.run(
                [
                    str(BIN / "ansible-playbook"),
                    "-i",
                    str(inv),
                    str(REPO / "playbooks" / "apply.yml"),
                    "-l",
                    x,
                    "-e",
                    "rollout_hosts=all",
                    "-e",
                    f"rollout_kubelet_payload_dir={pdir}",
                    "-e",
                    f"rollout_kubelet_result_dir={self.work / 'loop-results'}",
                ],
                env=aenv,
                check=False,
                capture_output=True,
                text=True,
                cwd=REPO / "playbooks",
            )
            if pb.returncode != 0:
                raise SystemExit(f"ansible-playbook failed on {x}:\n{pb.stdout[-3000:]}")

        out["podsOnNodesPlaybook"] = self.respread(n)
        out["loadPlaybook"] = _load()
        out["loopPlaybookWallS"] = round(_loop(lab, names, env, by_playbook), 2)
        _put_back(lab, originals, changes)
        for x in names:  # the loop's node-side backups would refuse a second "loop" change
            subprocess.run(
                [*_ssh(lab, x), "rm -rf /var/lib/rollout/backups/loop"],
                check=True,
                capture_output=True,
            )
        return out


def summarize(out: dict[str, Any]) -> dict[str, Any]:
    """Medians per size over the rounds, and ratios of medians."""
    summary: dict[str, Any] = {}
    for key in out["sizes"]:
        runs = [r[key] for r in out["rounds"] if key in r]
        n = int(key.split(":")[0])
        wall = _median([r["rollout"]["wallS"] for r in runs])
        floor = _median([r["rollout"]["floorS"] for r in runs])
        row: dict[str, Any] = {
            "rolloutWallS": wall,
            "preflightS": _median([r["rollout"]["preflightS"] for r in runs]),
            "floorS": floor,
            "rollbackAllWallS": _median([r["rollout"]["rollbackAllWallS"] for r in runs]),
            "rollout/floor": round(wall / floor, 2) if floor else None,
            "addedPerNodeS": round((wall - floor) / n, 2),
        }
        after = [r["rollout"]["evidenceAfterS"] for r in runs if r["rollout"].get("evidenceAfterS")]
        if after:
            row["evidenceAfterS"] = _median(after)
        base = [r["baseline"]["wallS"] for r in runs if "baseline" in r]
        if base:
            row["baselineWallS"] = _median(base)
            row["baselinePreflightS"] = _median([r["baseline"]["preflightS"] for r in runs])
            row["baselineEvidenceAfterS"] = _median(
                [r["baseline"]["evidenceAfterS"] or 0.0 for r in runs]
            )
            row["baseline/rollout"] = round(row["baselineWallS"] / wall, 2)
            row["baseline/rollout per round"] = [
                round(r["baseline"]["wallS"] / r["rollout"]["wallS"], 2) for r in runs
            ]
        ssh = [r["loops"]["loopSshWallS"] for r in runs if "loops" in r]
        if ssh:
            row["loopSshWallS"] = _median(ssh)
            row["loopSsh/rollout"] = round(row["loopSshWallS"] / wall, 2)
            row["loopSsh/rollout per round"] = [
                round(r["loops"]["loopSshWallS"] / r["rollout"]["wallS"], 2)
                for r in runs
                if "loops" in r
            ]
            if base:
                row["loopSsh/baseline"] = round(row["loopSshWallS"] / row["baselineWallS"], 2)
                row["loopSsh/baseline per round"] = [
                    round(r["loops"]["loopSshWallS"] / r["baseline"]["wallS"], 2)
                    for r in runs
                    if "loops" in r
                ]
        pb = [
            r["loops"]["loopPlaybookWallS"]
            for r in runs
            if "loopPlaybookWallS" in r.get("loops", {})
        ]
        if pb:
            row["loopPlaybookWallS"] = _median(pb)
            row["loopPlaybook/rollout"] = round(row["loopPlaybookWallS"] / wall, 2)
        summary[key] = row
    for size in {c["canaryNodes"] for r in out["rounds"] for c in r.get("canaryRollback", [])}:
        rows = [
            c
            for r in out["rounds"]
            for c in r.get("canaryRollback", [])
            if c["canaryNodes"] == size
        ]
        summary[f"canaryRollback:{size}"] = {
            k: _median([c[k] for c in rows])
            for k in (
                "triggerToExitS",
                "triggerToFirstEntryS",
                "triggerToUncordonedS",
                "triggerToUncordonedWithoutDrainS",
                "journalS",
                "drainS",
                "journalWithoutDrainS",
            )
        }
    return summary


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="8:2,16:4", help="N:maxUnavailable, comma-separated")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--playbook-sizes", default="8", help="sizes that also run the playbook loop")
    ap.add_argument("--playbook-rounds", type=int, default=1, help="rounds with the playbook loop")
    ap.add_argument("--canaries", default="1,4")
    ap.add_argument("--skip-loops", action="store_true")
    ap.add_argument(
        "--baseline-tree", type=Path, help="another checkout whose apply runs beside this one"
    )
    ap.add_argument(
        "--dry-run-rounds",
        type=int,
        default=0,
        help="then, per size, this many dry runs of each tree in turn (preflight alone)",
    )
    args = ap.parse_args()
    sizes = [(int(a), int(b)) for a, b in (x.split(":") for x in args.sizes.split(",") if x)]
    playbook_sizes = {int(x) for x in args.playbook_sizes.split(",") if x}
    canaries = [int(x) for x in args.canaries.split(",") if x]
    biggest = max(n for n, _ in sizes)
    work = Path(tempfile.mkdtemp(prefix="node-step-bench-"))
    lab = Lab(f"nsb{os.getpid() % 1000}", work / "lab")
    lab.start_control_plane()
    out: dict[str, Any] = {
        "sizes": [f"{n}:{mu}" for n, mu in sizes],
        "cpus": os.cpu_count(),
        "commit": _commit(REPO),
        "rounds": [],
    }
    if args.baseline_tree:
        out["baselineTree"] = {
            "path": str(args.baseline_tree),
            "commit": _commit(args.baseline_tree),
        }
    try:
        names = [f"s{i}" for i in range(1, biggest + 1)]
        lab.machines.add_nodes(names, ["kubeadm"])
        _deployment(lab, "bench", 2 * biggest)
        bench = Bench(lab, work, names, args.baseline_tree)
        for i in range(args.rounds):
            row: dict[str, Any] = {}
            out["rounds"].append(row)
            for n, mu in sizes:
                key = f"{n}:{mu}"
                row[key] = {}
                # with a baseline, the two versions take turns going first
                order = ["rollout", "baseline"] if i % 2 == 0 else ["baseline", "rollout"]
                for which in order:
                    if which == "baseline" and bench.baseline_env is None:
                        continue
                    env = bench.baseline_env if which == "baseline" else None
                    numbers, j = bench.apply(n, mu, env)
                    row[key][which] = numbers
                    if which == "rollout":
                        journal = j
                print(json.dumps({"round": i + 1, key: row[key]}), file=sys.stderr, flush=True)
                if not args.skip_loops:
                    playbook = n in playbook_sizes and i < args.playbook_rounds
                    row[key]["loops"] = bench.loops(n, journal, playbook)
                    print(json.dumps({"round": i + 1, key: row[key]["loops"]}), file=sys.stderr)
            row["canaryRollback"] = []
            for size in canaries:
                row["canaryRollback"].append(bench.canary_rollback(size))
                print(json.dumps(row["canaryRollback"][-1]), file=sys.stderr, flush=True)
        if args.dry_run_rounds:
            out["dryRuns"] = {
                f"{n}:{mu}": bench.dry_runs(n, mu, args.dry_run_rounds) for n, mu in sizes
            }
        out["summary"] = summarize(out)
        print(json.dumps(out, indent=2))
    finally:
        lab.down()


if __name__ == "__main__":
    main()
