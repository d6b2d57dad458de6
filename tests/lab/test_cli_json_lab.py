"""In the lab, from another process: the lab commands' ``-o json`` on a running lab.

``lab env -o json`` names the files the text form exports; ``lab fault ... -o json`` stops and
starts a node's kubelet and says so in JSON, and ``lab status -o json`` sees the effect.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rollout.lab.cluster import Lab

pytestmark = pytest.mark.lab


def rollout(*args: str) -> Any:
    r = subprocess.run(
        [str(Path(sys.executable).parent / "rollout"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


@pytest.mark.timeout(120)
def test_lab_env_fault_and_status_json(lab: Lab, lab_nodes: Any) -> None:
    (node,) = lab_nodes(1).names
    where = ["--name", lab.name, "--workdir", str(lab.dir)]
    env = rollout("lab", "env", *where, "-o", "json")
    assert env["KUBECONFIG"] == str(lab.kubeconfig)
    assert Path(env["KUBECONFIG"]).is_file()
    stopped = rollout("lab", "fault", "kubelet-stop", node, *where, "-o", "json")
    assert stopped == {"fault": "kubelet-stop", "node": node, "done": True}
    rows = {r["name"]: r for r in rollout("lab", "status", *where, "-o", "json")["nodes"]}
    assert rows[node]["kubelet"] == "inactive"
    started = rollout("lab", "fault", "kubelet-start", node, *where, "-o", "json")
    assert started["done"] is True
    lab.machines.wait_ready([node], timeout=30)
