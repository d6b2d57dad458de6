"""Fleet-scale costs of the rollout process, side by side in one run (issue 23).

Usage::

    .venv/bin/python benchmarks/scale_bench.py journal [--nodes 1000,5000] [--rounds 3]
        [--against DIR]   # a second checkout, run side by side
    .venv/bin/python benchmarks/scale_bench.py preflight [--nodes 0,500,2000,5000] [--pods 20]
    .venv/bin/python benchmarks/scale_bench.py all
    .venv/bin/python benchmarks/scale_bench.py kwok [--nodes 0,500,2000] [--kwok-pods 2]
        [--against DIR]   # a second checkout, its CLI alternating with this one's
    .venv/bin/python benchmarks/scale_bench.py apply [--nodes 8,40,160] [--rounds 2]
    .venv/bin/python benchmarks/scale_bench.py decode [--pods 50000] [--rounds 5]

``journal``: a synthetic change of N nodes, journaled as the real engine journals it (the entries of
a real ``run_change`` over the unit fakes, one canary batch of 2 nodes then one of 2, templated to N
nodes in batches of 50, backups hard-linked per node), read back by ``rollout status`` and
``rollout report -o json`` as subprocesses (no kubeconfig: the local journal only). Each command's
CPU seconds (user + system) come from ``wait4``'s rusage of that process, its peak RSS from its
``VmHWM`` (:func:`hwm_mb`); medians of ``--rounds``.

``preflight``: preflight's reads ahead of the facts (``ClusterReader.prefetch``: version,
discovery, Nodes, PDBs, ResourceSlices, controllers, pods) against a loopback stand-in of the API
server (``tests/unit/fake_apiserver.py``, in its own process) holding N Nodes with ``--pods`` pods
each, for an inventory of 8 of them. ``before`` is the pod read preflight made until issue 23
(one ``spec.nodeName`` listing per Node of the cluster, what ``prefetch`` did), ``after`` the
paginated listing it makes now; each in a fresh client process (CPU seconds and wall of the
reads, the imports before them excluded; peak RSS as ``VmHWM``), the
requests counted by the server; the two alternate, ``--rounds`` times, medians reported.

``kwok``: the real thing, not a stand-in: for each N a lab (``Lab.up``: real etcd,
kube-apiserver, controller-manager and scheduler) with 8 SSH nodes and N kwok Nodes of
``--kwok-pods`` Deployment-owned pods each; then ``rollout apply --canary --dry-run -o json`` (the
whole preflight: the cluster's reads, the facts over ssh, the plan) on the lab's inventory and plan,
as a subprocess, ``--rounds`` times: its CPU seconds (``wait4``), wall and peak RSS (``VmHWM``),
whole process (imports included), and the API requests it caused by ``apiserver_request_total``
(its GET and LIST counters; the Lease renewals and controllers' writes running beside it are left
out). ``all`` does not include it.

``apply``: for each N a lab of N SSH nodes (simulated kubelets), then ``rounds`` times a whole
``rollout apply --yes`` of the lab's plan without its gate, ``maxUnavailable: 25%`` (the canary
group, the first quarter, then three batches: 4 batches at every size), and ``rollback --yes``
of it: CPU with the children (``wait4``: ssh, Ansible) and of the rollout process alone (its
``RUSAGE_SELF`` at exit), each also per changed node; wall; peak RSS.

``decode``: the pod listing's pages (500 kwok-like pods each, ``--pods`` in all) decoded in this
process two ways, alternating: ``json.loads`` alone (the old path's first step) and the listing's
own path now (``pods_by_node``: a node's requests summed from its pods' briefs, the inventory's
pods decoded whole);
CPU seconds (``process_time``), medians.

Prints the raw numbers as JSON, then a Markdown table.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

CHANGE = "20261202T120000Z-scale0"
TEMPLATE_NODES = ["tmpl-a", "tmpl-b", "tmpl-c", "tmpl-d"]
BATCH = 50
INVENTORY = 8


def _template(tmp: Path) -> tuple[list[dict[str, Any]], Path]:
    """The journal a real change of 4 nodes writes (canary of 2, then 2), through the engine and
    the unit fakes; and its directory (the backups)."""
    from rollout.change.engine.orchestrator import NoGate, run_change
    from rollout.change.plan.batches import Batch
    from rollout.change.record.entries import ChangeBegin
    from rollout.change.record.journal import Journal
    from tests.unit.fakes_change import (
        FakeCluster,
        FakeRunner,
        fake_context,
        make_change,
        make_node,
    )

    cluster = FakeCluster({n: make_node(n) for n in TEMPLATE_NODES})
    journal = Journal.create(tmp / "template", CHANGE)
    ctx = fake_context(cluster, FakeRunner(cluster), journal)
    batches = [Batch(tuple(TEMPLATE_NODES[:2]), True), Batch(tuple(TEMPLATE_NODES[2:]), False)]
    changes = {n: make_change(n) for n in TEMPLATE_NODES}
    run_change(ctx, changes, batches, NoGate(), False, info=ChangeBegin(plan="/p", inventory="/i"))
    lines = journal.file.read_text(encoding="utf-8").splitlines()
    return [json.loads(x) for x in lines], journal.dir


def synthetic_journal(root: Path, n: int, tmp: Path, cut: bool = False) -> Path:
    """A state directory holding change ``CHANGE`` over ``n`` nodes (see the module docstring).
    ``cut``: the process died after the first half of the batches (no end entry, the later
    batches' nodes pending): what ``rollout resume --dry-run`` plans over."""
    entries, tdir = _template(tmp)
    names = [f"node-{i:05d}" for i in range(n)]
    canary = names[:BATCH]
    batches = [names[i : i + BATCH] for i in range(0, n, BATCH)]
    per_node = [e for e in entries if e.get("node") == TEMPLATE_NODES[0]]
    begin = next(e for e in entries if e["step"] == "change" and e["phase"] == "begin")
    gates = [e for e in entries if e["step"] == "gate"]
    end = [e for e in entries if e["step"] == "change" and e["phase"] != "begin"]
    out: list[str] = []

    def put(e: dict[str, Any]) -> None:
        out.append(json.dumps(e, sort_keys=True, separators=(",", ":")))

    data = {**begin.get("data", {}), "nodes": names, "batches": batches, "canary": canary}
    put({**begin, "data": data})
    node_lines = [json.dumps(e, sort_keys=True, separators=(",", ":")) for e in per_node]
    for i, batch in enumerate(batches):
        if cut and i >= max(1, len(batches) // 2):
            break
        for name in batch:
            out.extend(x.replace(f'"{TEMPLATE_NODES[0]}"', f'"{name}"') for x in node_lines)
        if i == 0:
            for g in gates:
                put({**g, "data": {**g.get("data", {}), "nodes": canary}})
    for e in () if cut else end:
        put({**e, "data": {**e.get("data", {}), "message": f"{n} node(s) applied"}})
    cdir = root / "changes" / CHANGE
    (cdir / "backups").mkdir(parents=True)
    (cdir / "journal.jsonl").write_text("\n".join(out) + "\n", encoding="utf-8")
    blobs = list((tdir / "backups" / TEMPLATE_NODES[0]).iterdir())
    for name in names:
        d = cdir / "backups" / name
        d.mkdir()
        for b in blobs:
            os.link(b, d / b.name)
    return cdir / "journal.jsonl"


def hwm_mb(pid: int | str = "self") -> float:
    """The process's peak resident set (``VmHWM`` in ``/proc/PID/status``), MB; 0 once gone.

    Not ``ru_maxrss``: Linux carries a parent's peak RSS into a child across fork and exec, so a
    child started by this (large) benchmark process would report at least the benchmark's own
    peak. ``VmHWM`` belongs to the child's own address space, which starts empty at exec."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _measure(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run ``argv``; its CPU seconds (``wait4``), wall seconds and peak RSS (MB, ``VmHWM``
    polled every 5 ms until it exits: the last reading is within 5 ms of its end)."""
    started = time.monotonic()
    # cwd "/": ``python -c`` puts the working directory first on sys.path, ahead of PYTHONPATH,
    # so run from a checkout it would import that checkout whatever PYTHONPATH names
    p = subprocess.Popen(
        argv, env=env, cwd="/", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    peak = 0.0
    while True:
        peak = max(peak, hwm_mb(p.pid))
        pid, status, ru = os.wait4(p.pid, os.WNOHANG)
        if pid:
            break
        time.sleep(0.005)
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - started
    if p.returncode != 0:
        raise SystemExit(f"{argv[3:]} failed ({p.returncode})")
    return {"cpu_s": ru.ru_utime + ru.ru_stime, "wall_s": wall, "rss_mb": peak}


_CLI = (
    "import atexit, collections, json, os, sys\n"
    "if os.environ.get('SCALE_BENCH_SENT'):\n"
    "    from rollout.kube import rest\n"
    "    sent = collections.Counter()\n"
    "    send = rest.Rest.send\n"
    "    def counted(self, method, path, query=None, **kw):\n"
    "        parts = path.strip('/').split('/')\n"
    "        if parts[0] == 'api':\n"
    "            parts = parts[2:]\n"
    "        elif parts[0] == 'apis' and len(parts) > 2:\n"
    "            parts = parts[3:]\n"
    "        if parts[:1] == ['namespaces'] and len(parts) > 2:\n"
    "            parts = parts[2:]\n"
    "        verb = 'WATCH' if (query or {}).get('watch') else method\n"
    "        label = (parts or [path])[0] + ('/' + parts[2] if len(parts) > 2 else '')\n"
    "        sent[verb + (' one ' if len(parts) > 1 else ' ') + label] += 1\n"
    "        return send(self, method, path, query=query, **kw)\n"
    "    rest.Rest.send = counted\n"
    "    def _dump():\n"
    "        with open(os.environ['SCALE_BENCH_SENT'], 'w') as f:\n"
    "            json.dump(sent, f)\n"
    "    atexit.register(_dump)\n"
    "if os.environ.get('SCALE_BENCH_OWN'):\n"
    "    import resource\n"
    "    def _own():\n"
    "        ru = resource.getrusage(resource.RUSAGE_SELF)\n"
    "        with open(os.environ['SCALE_BENCH_OWN'], 'w') as f:\n"
    "            f.write(repr(ru.ru_utime + ru.ru_stime))\n"
    "    atexit.register(_own)\n"
    "from rollout.cli import cli\n"
    "sys.exit(cli.main(prog_name='rollout'))\n"
)
"""The CLI; with ``$SCALE_BENCH_SENT`` it also counts every request the rollout process itself
sends (its REST layer's ``send``, by verb and the path's kind) and writes them there at exit:
what the API server's metric cannot tell apart from kwok's and the controllers' requests. With
``$SCALE_BENCH_OWN`` it writes its own CPU seconds there at exit (``RUSAGE_SELF``: the rollout
process alone, not its ssh and Ansible children)."""


def journal_bench(sizes: list[int], rounds: int, against: Path | None = None) -> dict[str, Any]:
    """``against``: a second checkout (``git worktree add``), run alternately with this one on the
    same journal, round by round; its rows are keyed ``<command>@against``."""
    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rollout-scale-") as tmp:
        for n in sizes:
            root = Path(tmp) / f"state-{n}"
            file = synthetic_journal(root, n, Path(tmp) / f"t{n}")
            lines = sum(1 for _ in file.open(encoding="utf-8"))
            env = {
                **os.environ,
                "ROLLOUT_STATE_DIR": str(root),
                "KUBECONFIG": str(Path(tmp) / "no-kubeconfig"),
                "PYTHONPATH": str(REPO),
            }
            row: dict[str, Any] = {"entries": lines, "journal_mb": file.stat().st_size / 2**20}
            status = ["status", "--change", CHANGE]
            sides = (
                {"": env}
                if against is None
                else {"": env, "@against": {**env, "PYTHONPATH": str(against)}}
            )
            cut_root = Path(tmp) / f"cut-{n}"
            synthetic_journal(cut_root, n, Path(tmp) / f"c{n}", cut=True)
            resume = ["resume", "--change", CHANGE, "--dry-run", "-o", "json"]
            for cmd in (status, ["report", "--change", CHANGE, "-o", "json"], resume):
                runs: dict[str, list[dict[str, float]]] = {k: [] for k in sides}
                for _ in range(rounds):
                    for side, side_env in sides.items():
                        if cmd is resume:  # --dry-run is newer than a checkout compared against
                            if side:
                                continue
                            side_env = {**side_env, "ROLLOUT_STATE_DIR": str(cut_root)}
                        runs[side].append(_measure([sys.executable, "-c", _CLI, *cmd], side_env))
                for side, got in runs.items():
                    if not got:
                        continue
                    row[cmd[0] + side] = {
                        "raw": got,
                        **{k: statistics.median(r[k] for r in got) for k in got[0]},
                    }
            out[str(n)] = row
            shutil.rmtree(root)
            shutil.rmtree(cut_root)
    return out


def _prefetch_child(strategy: str, url: str) -> None:
    """In a fresh process: preflight's reads ahead of the facts, the ``before`` or ``after`` way;
    prints CPU seconds, wall and peak RSS."""
    t0, c0 = time.monotonic(), time.process_time()
    from rollout.change.preflight.checking import ClusterReader
    from rollout.kube import nodes as kn
    from tests.unit.fake_apiserver import api_for, node_name

    api = api_for(url)
    t1, c1 = time.monotonic(), time.process_time()
    reader = ClusterReader(api, {node_name(i) for i in range(INVENTORY)})
    if strategy == "after":
        reader.prefetch()
        listing = reader.pod_listing()
        pods = sum(u.cpu_millis for u in listing.used.values()) // 100  # 100m a stand-in pod
    else:  # what prefetch did until issue 23: the same reads, the pods one Node at a time,
        # each node's records and objects kept (it served both from memory later)
        reader.pod_listing = lambda: ({}, {})  # type: ignore[method-assign]
        reader.prefetch()
        refs: dict[str, Any] = {}
        objects: dict[str, Any] = {}
        for n in reader.node_objects():
            got = kn.pod_objects_on(api, n)
            refs[n] = kn.pod_refs(got)
            objects[n] = sorted(
                (d for d in got if not kn.finished(d)),
                key=lambda d: str(d["metadata"].get("creationTimestamp") or ""),
            )
        pods = sum(len(v) for v in refs.values())
    done = {
        "cpu_s": time.process_time() - c1,
        "wall_s": time.monotonic() - t1,
        "import_cpu_s": c1 - c0,
        "import_wall_s": t1 - t0,
        "rss_mb": hwm_mb(),
        "pods": pods,
    }
    print(json.dumps(done))


def preflight_bench(sizes: list[int], pods: int, rounds: int) -> dict[str, Any]:
    from urllib.request import urlopen

    from tests.unit.fake_apiserver import serve_forever

    out: dict[str, Any] = {}
    ctx = multiprocessing.get_context("fork")
    for n in sizes:
        parent, child = ctx.Pipe()
        server = ctx.Process(target=serve_forever, args=(n, pods, child), daemon=True)
        server.start()
        url = f"http://127.0.0.1:{parent.recv()}"
        row: dict[str, Any] = {"nodes": n, "pods_per_node": pods}
        try:
            runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
            for _ in range(rounds):
                for strategy in ("before", "after"):  # alternating, so load hits both alike
                    urlopen(f"{url}/_requests").read()  # reset the counts
                    p = subprocess.run(
                        [sys.executable, __file__, "_prefetch", strategy, url],
                        capture_output=True,
                        text=True,
                        check=True,
                        env={**os.environ, "PYTHONPATH": str(REPO)},
                    )
                    got = json.loads(p.stdout.strip().splitlines()[-1])
                    got["requests"] = json.loads(urlopen(f"{url}/_requests").read())
                    got["requests_total"] = sum(got["requests"].values())
                    runs[strategy].append(got)
            for strategy, got_all in runs.items():
                row[strategy] = {
                    "raw": got_all,
                    **{
                        k: statistics.median(g[k] for g in got_all)
                        for k in ("cpu_s", "wall_s", "rss_mb", "requests_total", "pods")
                    },
                }
        finally:
            server.kill()
            server.join()
        out[str(n)] = row
    return out


def _api_reads(lab: Any) -> dict[str, float]:
    """apiserver_request_total of the GET and LIST verbs, by ``verb resource``."""
    import re

    code, text = lab.api.request("GET", "/metrics", timeout=60)
    assert code == 200 and isinstance(text, str), code
    out: dict[str, float] = {}
    for m in re.finditer(r"^apiserver_request_total\{([^}]*)\} (\S+)$", text, re.M):
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m[1]))
        if labels.get("verb") in ("GET", "LIST"):
            key = f"{labels['verb']} {labels.get('resource', '')}"
            out[key] = out.get(key, 0.0) + float(m[2])
    return out


GATE_SOAK_S = 20


def _gate_plan(lab_plan: Path, out: Path) -> Path:
    """The lab's plan with a gate of a ``GATE_SOAK_S`` soak (probe pods make the admissions;
    no baseline)."""
    text = lab_plan.read_text().rstrip("\n") + "\n"
    gate = {"soak": f"{GATE_SOAK_S}s", "window": "60s", "interval": "2s", "threshold": "5%"}
    gate_lines = [f"  {k}: {json.dumps(v)}" for k, v in gate.items()]
    gate_lines += ["  minAdmissions: 1", '  baseline: "none"', "  probes: true"]
    out.write_text(text + "gate:\n" + "\n".join(gate_lines) + "\n")
    return out


def _change_round(lab: Any, env: dict[str, str], plan: Path) -> dict[str, Any]:
    """``apply --canary --yes`` (its gate soak included), ``status``, ``report -o json`` and
    ``rollback --yes`` of that change, once each: CPU, wall, peak RSS and the GET/LIST requests
    of each."""
    out: dict[str, Any] = {}
    state = Path(env["ROLLOUT_STATE_DIR"]) / "changes"
    apply = ["apply", "--plan", str(plan), "-i", str(lab.inventory), "--canary", "--yes"]
    steps: list[tuple[str, list[str]]] = [("apply_canary_gate", [*apply, "-o", "json"])]
    for name, args in steps:
        out[name] = _measured_with_reads(lab, [sys.executable, "-c", _CLI, *args], env)
    change = sorted(d.name for d in state.iterdir())[-1]
    for name, args in (
        ("status", ["status", "--change", change]),
        ("report", ["report", "--change", change, "-o", "json"]),
        ("rollback", ["rollback", "--change", change, "--yes"]),
    ):
        out[name] = _measured_with_reads(lab, [sys.executable, "-c", _CLI, *args], env)
    out["change"] = change
    return out


def _measured_with_reads(lab: Any, argv: list[str], env: dict[str, str]) -> dict[str, Any]:
    """:func:`_measure` of ``argv``, plus the GET/LIST requests the API server counted while it
    ran (every client's; the /metrics GET between the two readings is ours)."""
    sent = Path(tempfile.mkdtemp(prefix="rollout-sent-")) / "sent.json"
    before = _api_reads(lab)
    r: dict[str, Any] = dict(_measure(argv, {**env, "SCALE_BENCH_SENT": str(sent)}))
    after = _api_reads(lab)
    reads = {k: v - before.get(k, 0.0) for k, v in after.items()}
    r["requests"] = {k: v for k, v in reads.items() if v}
    r["requests_total"] = sum(reads.values())
    if sent.exists():  # the --against checkout's CLI runs through the same wrapper
        r["sent"] = json.loads(sent.read_text())
        r["sent_total"] = sum(r["sent"].values())
    shutil.rmtree(sent.parent, ignore_errors=True)
    return r


def kwok_bench(
    sizes: list[int],
    pods: int,
    rounds: int,
    against: Path | None = None,
    change: bool = False,
) -> dict[str, Any]:
    """``against``: a second checkout whose CLI runs alternately with this one's on the same
    lab, round by round; its rows are keyed ``<N>@against``. ``change``: then, with this
    checkout only, one canary apply with its gate soak, ``status``, ``report`` and ``rollback``
    (:func:`_change_round`), keyed ``<N>`` ``change``."""
    from rollout.lab.cluster import Lab

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rollout-scale-kwok-") as tmp:
        for n in sizes:
            lab = Lab(f"sbk{os.getpid()}n{n}", Path(tmp) / f"lab{n}")
            t0 = time.monotonic()
            lab.up(8, kwok_nodes=n, kwok_pods_per_node=pods, timeout=180)
            try:
                up_s = time.monotonic() - t0
                env = {
                    **os.environ,
                    "KUBECONFIG": str(lab.kubeconfig),
                    "ROLLOUT_STATE_DIR": str(Path(tmp) / f"state{n}"),
                    "PYTHONPATH": str(REPO),
                }
                sides = {"": env}
                if against is not None:
                    sides["@against"] = {**env, "PYTHONPATH": str(against)}
                argv = [sys.executable, "-c", _CLI, "apply", "--plan", str(lab.plan)]
                argv += ["-i", str(lab.inventory), "--canary", "--dry-run", "-o", "json"]
                runs: dict[str, list[dict[str, Any]]] = {side: [] for side in sides}
                for _ in range(rounds):
                    for side, side_env in sides.items():
                        runs[side].append(_measured_with_reads(lab, argv, side_env))
                changed = (
                    _change_round(lab, env, _gate_plan(lab.plan, Path(tmp) / f"gate{n}.yaml"))
                    if change
                    else None
                )
                for side, side_runs in runs.items():
                    if changed is not None and not side:
                        out[f"{n}-change"] = {"kwok_nodes": n, **changed}
                    out[f"{n}{side}"] = {
                        "kwok_nodes": n,
                        "pods_per_node": pods,
                        "ssh_nodes": 8,
                        "lab_up_s": up_s,
                        "checkout": str(against if side else REPO),
                        "raw": side_runs,
                        **{
                            k: statistics.median(r[k] for r in side_runs)
                            for k in ("cpu_s", "wall_s", "rss_mb", "requests_total")
                        },
                    }
            finally:
                lab.down()
    return out


def _kwok_like_pod(i: int) -> dict[str, Any]:
    """A pod as the API server lists a kwok Deployment's pod (``rollout/lab/kwok.py``): its
    managedFields, tolerations the admission plugins add, status as kwok writes it."""
    node = f"lab-kwok{i // 10}"
    when = "2026-12-05T10:00:05Z"
    ready = {"status": "True", "lastProbeTime": None, "lastTransitionTime": when}
    return {
        "metadata": {
            "name": f"{node}-7d9f8b6c5-{i:05d}",
            "generateName": f"{node}-7d9f8b6c5-",
            "namespace": "rollout-kwok",
            "uid": f"6f1c2a3b-1234-4e5f-8a9b-{i:012d}",
            "resourceVersion": str(100000 + i),
            "creationTimestamp": "2026-12-05T10:00:00Z",
            "labels": {"app": node, "rollout.dev/kwok": "lab", "pod-template-hash": "7d9f8b6c5"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{node}-7d9f8b6c5",
                    "uid": "0a1b2c3d-aaaa-bbbb-cccc-000000000001",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": when,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:metadata": {"f:generateName": {}, "f:labels": {".": {}, "f:app": {}}},
                        "f:spec": {
                            "f:containers": {
                                'k:{"name":"app"}': {
                                    ".": {},
                                    "f:image": {},
                                    "f:resources": {".": {}, "f:requests": {"f:cpu": {}}},
                                }
                            },
                            "f:nodeName": {},
                            "f:nodeSelector": {},
                            "f:tolerations": {},
                        },
                    },
                },
                {
                    "manager": "kwok",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": when,
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {
                        "f:status": {
                            "f:conditions": {'k:{"type":"Ready"}': {".": {}, "f:status": {}}},
                            "f:phase": {},
                            "f:podIP": {},
                        }
                    },
                    "subresource": "status",
                },
            ],
        },
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "registry.invalid/rollout-lab/kwok-app:1",
                    "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}},
                    "terminationMessagePath": "/dev/termination-log",
                    "terminationMessagePolicy": "File",
                    "imagePullPolicy": "IfNotPresent",
                }
            ],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "nodeSelector": {"rollout.dev/kwok": "lab"},
            "automountServiceAccountToken": False,
            "nodeName": node,
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {"key": "kwok.x-k8s.io/node", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {
            "phase": "Running",
            "conditions": [{**ready, "type": t} for t in ("Initialized", "Ready", "PodScheduled")],
            "hostIP": "127.0.0.1",
            "podIP": "10.64.0.5",
            "startTime": when,
            "containerStatuses": [
                {
                    "name": "app",
                    "state": {"running": {"startedAt": when}},
                    "ready": True,
                    "restartCount": 0,
                    "image": "registry.invalid/rollout-lab/kwok-app:1",
                    "started": True,
                }
            ],
            "qosClass": "Burstable",
        },
    }


class _Pages:
    """The REST layer's pod listing over pages made in memory (``continue``: the next index)."""

    def __init__(self, pages: list[bytes]) -> None:
        self.pages = pages

    def list_pod_for_all_namespaces(self, _continue: str | None = None, **_kw: Any) -> bytes:
        return self.pages[int(_continue or 0)]


def decode_bench(pods: int, rounds: int) -> dict[str, Any]:
    """The pod listing's pages (500 kwok-like pods each, ``--pods`` in all; the inventory's
    pods are one in every 50 pages) read two ways in this process, alternating round by round:
    ``json.loads`` of each page (what the listing did first before the briefs, before it built
    a record per pod: a lower bound of the old path) against
    :func:`rollout.kube.nodes.pods_by_node` itself over the same bytes."""
    from types import SimpleNamespace

    from rollout.kube import nodes as kn

    count = max(1, pods // 500)
    pages = [
        json.dumps(
            {
                "metadata": {"continue": str(p + 1) if p + 1 < count else ""},
                "items": [_kwok_like_pod(p * 500 + i) for i in range(500)],
            }
        ).encode()
        for p in range(count)
    ]
    api = SimpleNamespace(core=_Pages(pages))
    keep = {f"lab-kwok{p * 50}" for p in range(0, count, 50)}
    runs: dict[str, list[float]] = {"json.loads": [], "briefs": []}
    for _ in range(rounds):
        c = time.process_time()
        for body in pages:
            json.loads(body)
        runs["json.loads"].append(time.process_time() - c)
        c = time.process_time()
        listing = kn.pods_by_node(api, keep)  # type: ignore[arg-type]
        runs["briefs"].append(time.process_time() - c)
        assert len(listing.used) == count * 50 and set(listing.refs) == keep
    return {
        "pods": count * 500,
        "mb": sum(map(len, pages)) / 1e6,
        "raw": runs,
        **{k: statistics.median(v) for k, v in runs.items()},
    }


def _no_gate_plan(lab_plan: Path, out: Path) -> Path:
    """The lab's plan without its gate, ``maxUnavailable: 25%``: with the lab's canary group (the
    first quarter of the nodes) a change of 4 batches at every size."""
    kept: list[str] = []
    in_gate = False
    for line in lab_plan.read_text().splitlines():
        if line.startswith("gate:"):
            in_gate = True
            continue
        if in_gate and (line.startswith(" ") or line.startswith("#")):
            continue
        in_gate = False
        kept.append(line.replace("maxUnavailable: 1", 'maxUnavailable: "25%"'))
    out.write_text("\n".join(kept) + "\n")
    return out


def apply_bench(sizes: list[int], rounds: int) -> dict[str, Any]:
    """For each N: a lab of N SSH nodes (simulated kubelets), then ``rounds`` times a whole
    ``apply --yes`` (4 batches, no gate) and a ``rollback --yes`` of it, as subprocesses: CPU of
    the process with its children (``wait4``) and of the rollout process alone (its
    ``RUSAGE_SELF``), both per changed node, wall and peak RSS."""
    from rollout.lab.cluster import Lab

    out: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="rollout-scale-apply-") as tmp:
        for n in sizes:
            lab = Lab(f"sba{os.getpid()}n{n}", Path(tmp) / f"lab{n}")
            t0 = time.monotonic()
            lab.up(n, timeout=max(180.0, 3.0 * n))
            try:
                up_s = time.monotonic() - t0
                own = Path(tmp) / f"own{n}"
                env = {
                    **os.environ,
                    "KUBECONFIG": str(lab.kubeconfig),
                    "ROLLOUT_STATE_DIR": str(Path(tmp) / f"state{n}"),
                    "PYTHONPATH": str(REPO),
                    "SCALE_BENCH_OWN": str(own),
                }
                plan = _no_gate_plan(lab.plan, Path(tmp) / f"plan{n}.yaml")
                state = Path(env["ROLLOUT_STATE_DIR"]) / "changes"
                runs: dict[str, list[dict[str, Any]]] = {"apply": [], "rollback": []}
                for _ in range(rounds):
                    argv = [sys.executable, "-c", _CLI, "apply", "--plan", str(plan)]
                    argv += ["-i", str(lab.inventory), "--yes", "-o", "json"]
                    for step in ("apply", "rollback"):
                        r = dict(_measure(argv, env))
                        r["own_cpu_s"] = float(own.read_text())
                        r["cpu_per_node_s"] = r["cpu_s"] / n
                        r["own_cpu_per_node_s"] = r["own_cpu_s"] / n
                        runs[step].append(r)
                        change = sorted(d.name for d in state.iterdir())[-1]
                        argv = [sys.executable, "-c", _CLI, "rollback", "--change", change]
                        argv += ["-i", str(lab.inventory), "--yes"]
                for step, got in runs.items():
                    out[f"{n}-{step}"] = {
                        "ssh_nodes": n,
                        "step": step,
                        "lab_up_s": up_s,
                        "raw": got,
                        **{
                            k: statistics.median(r[k] for r in got)
                            for k in (
                                "cpu_s",
                                "own_cpu_s",
                                "cpu_per_node_s",
                                "own_cpu_per_node_s",
                                "wall_s",
                                "rss_mb",
                            )
                        },
                    }
            finally:
                lab.down()
    return out


def _apply_table(applied: dict[str, Any]) -> str:
    lines = [
        "| SSH nodes | step | CPU s with children | per node | rollout process alone | per node "
        "| wall s | peak RSS MB |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in applied.values():
        lines.append(
            f"| {r['ssh_nodes']} | {r['step']} | {r['cpu_s']:.2f} | {r['cpu_per_node_s']:.3f} "
            f"| {r['own_cpu_s']:.2f} | {r['own_cpu_per_node_s']:.3f} | {r['wall_s']:.1f} "
            f"| {r['rss_mb']:.0f} |"
        )
    return "\n".join(lines)


def _kwok_table(kwok: dict[str, Any]) -> str:
    lines = [
        "| kwok Nodes | checkout | their pods | GET+LIST requests | CPU s | wall s "
        "| peak RSS MB | lab up s |",
        "|---|---|---|---|---|---|---|---|",
    ]
    changes = {k: r for k, r in kwok.items() if k.endswith("-change")}
    for key, r in kwok.items():
        if key in changes:
            continue
        n = r["kwok_nodes"]
        side = "against" if key.endswith("@against") else "this"
        lines.append(
            f"| {n:,} | {side} | {n * r['pods_per_node']:,} | {r['requests_total']:.0f} "
            f"| {r['cpu_s']:.2f} | {r['wall_s']:.2f} | {r['rss_mb']:.0f} | {r['lab_up_s']:.0f} |"
        )
    if changes:
        lines += [
            "",
            "| kwok Nodes | step | GET+LIST requests | CPU s | wall s | peak RSS MB |",
            "|---|---|---|---|---|---|",
        ]
        for r in changes.values():
            for step in ("apply_canary_gate", "status", "report", "rollback"):
                m = r[step]
                lines.append(
                    f"| {r['kwok_nodes']:,} | {step} | {m['requests_total']:.0f} "
                    f"| {m['cpu_s']:.2f} | {m['wall_s']:.2f} | {m['rss_mb']:.0f} |"
                )
    return "\n".join(lines)


def _table(journal: dict[str, Any] | None, preflight: dict[str, Any] | None) -> str:
    lines: list[str] = []
    if journal:
        lines += [
            "| journal nodes | entries | MB | status CPU s | status RSS MB | report CPU s "
            "| report RSS MB | resume --dry-run CPU s | its RSS MB |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for n, r in journal.items():
            for side in ("", "@against"):
                if "status" + side not in r:
                    continue
                s, rp = r["status" + side], r["report" + side]
                rs = r.get("resume" + side)
                resumed = f"{rs['cpu_s']:.2f} | {rs['rss_mb']:.0f}" if rs else "- | -"
                lines.append(
                    f"| {int(n):,}{side} | {r['entries']:,} | {r['journal_mb']:.1f} "
                    f"| {s['cpu_s']:.2f} | {s['rss_mb']:.0f} | {rp['cpu_s']:.2f} "
                    f"| {rp['rss_mb']:.0f} | {resumed} |"
                )
        lines.append("")
    if preflight:
        lines += [
            "| cluster Nodes | pods | requests before / after | CPU s before / after "
            "| wall s before / after | RSS MB before / after |",
            "|---|---|---|---|---|---|",
        ]
        for n, r in preflight.items():
            b, a = r["before"], r["after"]
            lines.append(
                f"| {int(n):,} | {int(n) * r['pods_per_node']:,} "
                f"| {int(b['requests_total']):,} / {int(a['requests_total']):,} "
                f"| {b['cpu_s']:.2f} / {a['cpu_s']:.2f} | {b['wall_s']:.2f} / {a['wall_s']:.2f} "
                f"| {b['rss_mb']:.0f} / {a['rss_mb']:.0f} |"
            )
    return "\n".join(lines)


def compile_checkouts(*checkouts: Path) -> None:
    """Compile each checkout's ``rollout`` package to bytecode before any round, as pip does
    when it installs the wheel. Why: with ``PYTHONDONTWRITEBYTECODE`` set (this machine sets
    it) a checkout's modules are compiled from source in every CLI run, 0.1-0.17 s of CPU that
    an installed wheel never spends, which would raise every size's figure alike and flatten
    the ratios between them."""
    for c in checkouts:
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(c / "rollout")],
            check=True,
            stdout=subprocess.DEVNULL,
        )


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "_prefetch":
        _prefetch_child(sys.argv[2], sys.argv[3])
        return
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["journal", "preflight", "all", "kwok", "apply", "decode"])
    ap.add_argument("--nodes", help="comma-separated sizes")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--pods", type=int, default=20)
    ap.add_argument(
        "--against", type=Path, help="journal, kwok: a second checkout to run side by side"
    )
    ap.add_argument("--kwok-pods", type=int, default=2, help="pods per kwok Node (kwok)")
    ap.add_argument(
        "--change",
        action="store_true",
        help="kwok: also a canary apply with its gate soak, status, report and rollback",
    )
    a = ap.parse_args()
    compile_checkouts(REPO, *([a.against] if a.against else []))
    if a.what == "decode":
        got = decode_bench(a.pods, a.rounds)
        print(json.dumps({"decode": got}, indent=2))
        print(
            f"{got['pods']:,} pods, {got['mb']:.0f} MB: json.loads {got['json.loads']:.2f} s, "
            f"briefs {got['briefs']:.2f} s ({got['json.loads'] / got['briefs']:.1f}x)"
        )
        return
    if a.what == "apply":
        sizes = [int(x) for x in (a.nodes or "8,40,160").split(",")]
        applied = apply_bench(sizes, a.rounds)
        print(json.dumps({"apply": applied}, indent=2))
        print(_apply_table(applied))
        return
    if a.what == "kwok":
        sizes = [int(x) for x in (a.nodes or "0,500,2000").split(",")]
        kwok = kwok_bench(sizes, a.kwok_pods, a.rounds, a.against, a.change)
        print(json.dumps({"kwok": kwok}, indent=2))
        print(_kwok_table(kwok))
        return
    journal = preflight = None
    if a.what in ("journal", "all"):
        sizes = [int(x) for x in (a.nodes or "1000,5000").split(",")]
        journal = journal_bench(sizes, a.rounds, a.against)
    if a.what in ("preflight", "all"):
        sizes = [int(x) for x in (a.nodes or "0,500,2000,5000").split(",")]
        preflight = preflight_bench(sizes, a.pods, a.rounds)
    print(json.dumps({"journal": journal, "preflight": preflight}, indent=2))
    print(_table(journal, preflight))


if __name__ == "__main__":
    main()
