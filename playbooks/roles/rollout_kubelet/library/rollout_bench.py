#!/usr/bin/python
# ruff: noqa: E402, UP031  (Ansible module layout; runs on the node's own Python)
"""Run an operator's benchmark command on a node, once per requested NUMA binding.

Why a module: ``rollout bench`` needs the same command run under two CPU/memory bindings on the
same node, one after the other, with proof of the binding each run actually got. One module
call does both runs (one ssh round trip or one playbook task) and returns each run's output for
the controller to parse (``rollout.bench.results``).

Binding mechanisms:

* ``numactl``: ``numactl --cpunodebind=N --membind=N``: CPUs and memory of NUMA node N.
* ``cpu-affinity``: the NUMA node's CPU list (``/sys/devices/system/node/nodeN/cpulist``, passed
  by the controller from the node's facts) set with ``sched_setaffinity``, what ``taskset -c``
  does; memory is not bound (the kernel's default policy allocates on the node of the CPU that
  first touches a page).
* ``auto``: ``numactl`` when it is on the node's PATH and a probe (``numactl --cpunodebind=N
  --membind=N true``) succeeds for every requested node, else ``cpu-affinity``; why is reported.

Each run's shell writes its own ``Cpus_allowed_list`` and ``Mems_allowed_list`` (from
``/proc/$$/status``, after the binding, before the command) to a file this module returns: the
binding each run really had, whatever the command prints.
"""

from __future__ import annotations

DOCUMENTATION = r"""
module: rollout_bench
short_description: Run a benchmark command under NUMA bindings and report each run's output
description:
  - Runs C(command) (a shell command line) once per entry of C(runs), bound to that entry's
    NUMA node, and returns each run's exit status, output and the binding it observed.
options:
  args_b64:
    description: The bench's arguments, JSON, base64-encoded (so that Ansible's templating
      leaves an operator's command line alone) - C(command) (a shell command line),
      C(standin) (Python source run with the node's Python instead of C(command)), C(runs)
      (C({name, numa, cpus, env}) per run, in order), C(mechanism) (auto, numactl or
      cpu-affinity) and C(timeout_s) (seconds one run may take).
    type: str
    required: true
author: rollout
"""

import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

try:
    from ansible.module_utils.basic import AnsibleModule
except ImportError:  # run over plain ssh by the rollout tool (see direct())
    AnsibleModule = None

MECHANISMS = ("auto", "numactl", "cpu-affinity")
#: Bytes of each run's stdout and stderr returned (the contract's JSON is the last line).
OUTPUT_LIMIT = 65536

# Runs after the binding: record the shell's own allowed CPUs and memory nodes, then exec the
# command ($1) in a fresh shell so that nothing of this wrapper stays around it.
WRAPPER = (
    'grep -E "^(Cpus|Mems)_allowed_list:" /proc/$$/status > "$ROLLOUT_BENCH_OBSERVED" '
    '|| exit 97; exec /bin/sh -c "$1"'
)


def parse_cpuset(text):
    out = set()
    for part in (text or "").strip().split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-", 1)
            out.update(range(int(lo), int(hi) + 1))
        else:
            out.add(int(part))
    return out


def choose_mechanism(requested, numactl, probe):
    """(mechanism, why) for ``requested``; ``numactl`` is its path or None, ``probe()`` returns
    None when numactl binds every requested node, else what it said.

    Raises:
        ValueError: ``numactl`` was asked for and cannot bind here, or the name is unknown.
    """
    if requested not in MECHANISMS:
        raise ValueError("mechanism must be one of %s, not %r" % (", ".join(MECHANISMS), requested))
    if requested == "cpu-affinity":
        return "cpu-affinity", "asked for"
    if numactl is None:
        if requested == "numactl":
            raise ValueError("mechanism numactl: numactl is not on the node's PATH")
        return "cpu-affinity", "numactl is not on the node's PATH"
    failed = probe()
    if failed is None:
        return "numactl", "asked for" if requested == "numactl" else "numactl binds every node"
    if requested == "numactl":
        raise ValueError("mechanism numactl: %s" % failed)
    return "cpu-affinity", "numactl cannot bind here: %s" % failed


def _probe(numactl, runs):
    for r in runs:
        n = int(r["numa"])
        argv = [numactl, "--cpunodebind=%d" % n, "--membind=%d" % n, "true"]
        try:
            p = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        except (OSError, subprocess.SubprocessError) as e:
            return "%s: %s" % (" ".join(argv), e)
        if p.returncode != 0:
            said = (p.stderr or p.stdout).strip().splitlines()
            return "%s exited %d: %s" % (" ".join(argv), p.returncode, said[-1] if said else "")
    return None


def bound_argv(mechanism, numactl, numa, command):
    """The argv of one run: the binding (numactl's; cpu-affinity is set before exec) around
    the wrapper shell that records the binding and execs ``command``."""
    inner = ["/bin/sh", "-c", WRAPPER, "rollout-bench", command]
    if mechanism == "numactl":
        return [numactl, "--cpunodebind=%d" % numa, "--membind=%d" % numa, *inner]
    return inner


def _tail(text):
    return text[-OUTPUT_LIMIT:] if text else ""


def _observed(path):
    out = {}
    try:
        with open(path, encoding="utf-8") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key == "Cpus_allowed_list":
                    out["cpus"] = value.strip()
                elif key == "Mems_allowed_list":
                    out["mems"] = value.strip()
    except OSError:
        pass
    return out


def run_one(run, command, mechanism, numactl, timeout_s, workdir):
    numa = int(run["numa"])
    cpus = sorted(parse_cpuset(str(run.get("cpus", ""))))
    if mechanism == "cpu-affinity" and not cpus:
        return {"name": run.get("name"), "error": "NUMA node %d has no CPUs to bind to" % numa}
    observed = os.path.join(workdir, "observed-%s" % run.get("name", numa))
    env = dict(os.environ)
    env.update({str(k): str(v) for k, v in (run.get("env") or {}).items()})
    env["ROLLOUT_BENCH_OBSERVED"] = observed
    preexec = None
    if mechanism == "cpu-affinity":

        def preexec():
            os.sched_setaffinity(0, cpus)

    argv = bound_argv(mechanism, numactl, numa, command)
    started = time.monotonic()
    out = {"name": run.get("name"), "numa": numa, "mechanism": mechanism}
    try:
        p = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            env=env,
            cwd=workdir,
            timeout=timeout_s,
            preexec_fn=preexec,
            check=False,
        )
    except subprocess.TimeoutExpired as e:
        out.update(
            error="timed out after %gs" % timeout_s,
            stdout=_tail(e.stdout if isinstance(e.stdout, str) else ""),
            stderr=_tail(e.stderr if isinstance(e.stderr, str) else ""),
        )
        return out
    except OSError as e:  # sched_setaffinity refused (a CPU the node does not have), no shell
        out["error"] = "could not start the run: %s" % e
        return out
    out.update(
        rc=p.returncode,
        stdout=_tail(p.stdout),
        stderr=_tail(p.stderr),
        elapsedS=round(time.monotonic() - started, 3),
        observed=_observed(observed),
    )
    return out


def bench(args):
    runs = list(args.get("runs") or ())
    if not runs:
        raise ValueError("runs: at least one run is needed")
    numactl = shutil.which("numactl")
    mechanism, why = choose_mechanism(
        args.get("mechanism") or "auto", numactl, lambda: _probe(numactl, runs)
    )
    timeout_s = float(args.get("timeout_s") or 600)
    with tempfile.TemporaryDirectory(prefix="rollout-bench-") as workdir:
        command = args.get("command") or ""
        if args.get("standin"):
            path = os.path.join(workdir, "standin.py")
            with open(path, "w", encoding="utf-8") as f:
                f.write(args["standin"])
            command = "%s %s" % (sys.executable, path)
        if not command:
            raise ValueError("command: empty, and no stand-in given")
        results = [run_one(r, command, mechanism, numactl, timeout_s, workdir) for r in runs]
    return {
        "changed": False,
        "rollout_step": "bench",
        "mechanism": mechanism,
        "mechanismWhy": why,
        "numactl": numactl,
        "runs": results,
    }


def direct(args):
    """Entry point when the rollout tool runs this file over plain ssh (no Ansible)."""
    try:
        return bench(args)
    except (ValueError, KeyError, OSError) as e:
        return {"failed": True, "msg": str(e)}


def main():
    module = AnsibleModule(
        argument_spec={"args_b64": {"type": "str", "required": True}},
        supports_check_mode=False,
    )
    if not module.params["args_b64"]:
        module.fail_json(msg="no arguments: rollout bench sets rollout_kubelet_bench_args_b64")
    try:
        args = json.loads(base64.b64decode(module.params["args_b64"]).decode("utf-8"))
        module.exit_json(**bench(args))
    except (ValueError, KeyError, OSError) as e:
        module.fail_json(msg=str(e))


if __name__ == "__main__":
    main()
