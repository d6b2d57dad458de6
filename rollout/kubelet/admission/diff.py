"""Differential check of the model against the kubelet's own code (the Go harness).

``run_model`` answers a ``Scenario`` in the harness's output format; ``run_harness`` feeds many
scenarios to one harness process (``tools/admissiondiff``) and reads its answers; ``compare``
lists the differences; ``shrink`` cuts a disagreeing scenario down to a minimal reproducer.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from rollout.kubelet.admission.model import Node
from rollout.kubelet.admission.scenarios import Scenario


def run_model(sc: Scenario) -> dict[str, Any]:
    try:
        node = Node(sc.machine, sc.config)
    except ValueError as e:
        return {"error": str(e)}
    pods = []
    for p in sc.pods:
        v = node.admit(p)
        out: dict[str, Any] = {"uid": v.uid, "admit": v.admitted}
        if not v.admitted:
            out["reason"], out["message"] = v.reason, v.message
        else:
            if v.cpus:
                out["cpus"] = {c: sorted(s) for c, s in sorted(v.cpus.items()) if s}
            if v.memory:
                out["memory"] = {c: {r: list(n) for r, n in m.items()} for c, m in v.memory.items()}
        pods.append(out)
    return {"pods": pods}


def _normal(res: dict[str, Any]) -> dict[str, Any]:
    if res.get("error"):
        return {"error": True}
    pods = []
    for p in res.get("pods") or []:
        q = {k: v for k, v in p.items() if v not in (None, {}, "")}
        q.setdefault("admit", False)
        pods.append(q)
    return {"pods": pods}


def compare(model: dict[str, Any], kubelet: dict[str, Any]) -> list[str]:
    """Differences, pod by pod (an empty list: they agree). Both refusing the config agrees."""
    a, b = _normal(model), _normal(kubelet)
    if "error" in a or "error" in b:
        if ("error" in a) != ("error" in b):
            return [
                f"config: model {model.get('error') or 'accepts'}; "
                f"kubelet {kubelet.get('error') or 'accepts'}"
            ]
        return []
    out = []
    for i, (pa, pb) in enumerate(zip(a["pods"], b["pods"], strict=False)):
        if pa != pb:
            out.append(f"pod {i} ({pa.get('uid')}): model {pa} != kubelet {pb}")
    if len(a["pods"]) != len(b["pods"]):
        out.append(f"pod count: model {len(a['pods'])} != kubelet {len(b['pods'])}")
    return out


def run_harness(
    binary: str, scenarios: Sequence[Scenario], timeout: float = 1800
) -> list[dict[str, Any]]:
    """One harness process for all scenarios: JSON lines in, JSON lines out."""
    data = "".join(json.dumps(s.to_json()) + "\n" for s in scenarios)
    proc = subprocess.run(
        [binary], input=data, capture_output=True, text=True, timeout=timeout, check=True
    )
    lines = proc.stdout.splitlines()
    if len(lines) != len(scenarios):
        raise RuntimeError(
            f"harness answered {len(lines)} of {len(scenarios)} scenarios: {proc.stderr[-2000:]}"
        )
    return [json.loads(line) for line in lines]


def shrink(sc: Scenario, disagrees: Callable[[Scenario], bool]) -> Scenario:
    """Drop pods after the first disagreement, then every pod and container that is not needed."""
    best = sc
    for n in range(1, len(sc.pods) + 1):
        cut = replace(sc, pods=sc.pods[:n])
        if disagrees(cut):
            best = cut
            break
    changed = True
    while changed:
        changed = False
        for i in range(len(best.pods)):
            trial = replace(best, pods=best.pods[:i] + best.pods[i + 1 :])
            if trial.pods and disagrees(trial):
                best, changed = trial, True
                break
        if changed:
            continue
        for i, p in enumerate(best.pods):
            for j in range(len(p.containers)):
                if len(p.containers) == 1:
                    continue
                q = replace(p, containers=p.containers[:j] + p.containers[j + 1 :])
                if not any(not c.init for c in q.containers):
                    continue
                trial = replace(best, pods=(*best.pods[:i], q, *best.pods[i + 1 :]))
                if disagrees(trial):
                    best, changed = trial, True
                    break
            if changed:
                break
    return best
