"""The AWX job form's files (``deploy/awx/``, the root ``ansible.cfg``): what can be checked
without an AWX. The job itself runs through ansible-runner in ``tests/lab/test_awx_lab.py``.

* ``ansible-builder create`` (ansible-builder 3.2, a test dependency) turns the execution
  environment definition into a build context holding the wheel from ``dist/``, the system
  packages and the ansible-core / ansible-runner pins (no image is built: no container runtime
  here);
* ansible-lint's production profile passes on the playbook and the EE definition (it checks the
  EE file against ansible-builder's v3 schema);
* the playbook's exit-code table is ``docs/exit-codes.md``'s, the credential type is the shape AWX
  accepts, the workflow's nodes are the playbook's actions, and the root ``ansible.cfg`` says
  nothing about how a host is reached.

Runtime: about 10-15 s on 2 cores (ansible-builder, ansible-lint).
"""

from __future__ import annotations

import configparser
import re
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
AWX = REPO / "deploy" / "awx"


def _run(*cmd: str, cwd: Path = REPO, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        cmd,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={"PATH": f"{BIN}:/usr/bin:/bin", "HOME": str(Path.home()), "NO_COLOR": "1"},
    )


def test_ansible_builder_create_writes_a_context_with_the_wheel(tmp_path: Path) -> None:
    # the checkout's layout, with a file in dist/ named as `pip wheel` names the wheel: what
    # create does with it is copy it (building and installing the real wheel is
    # tests/lab/test_installed_wheel.py's, a minute of this suite's time not spent twice)
    root = tmp_path / "checkout"
    shutil.copytree(AWX, root / "deploy" / "awx")
    wheel = root / "dist" / "rollout-0.1.0-py3-none-any.whl"
    wheel.parent.mkdir()
    wheel.write_bytes(b"PK\x05\x06" + bytes(18))  # an empty zip archive
    context = tmp_path / "context"
    r = _run(
        str(BIN / "ansible-builder"), "create", "-f", "deploy/awx/execution-environment.yml",
        "-c", str(context), "--output-filename", "Containerfile", cwd=root,
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    containerfile = (context / "Containerfile").read_text()
    assert 'ARG EE_BASE_IMAGE="quay.io/ansible/awx-ee:24.6.1"' in containerfile
    assert "COPY _build/wheels/ /tmp/rollout-wheels/" in containerfile
    assert "pip install --no-cache-dir /tmp/rollout-wheels/rollout-*.whl" in containerfile
    assert "RUN rollout --version" in containerfile
    assert "ansible-core>=2.17,<2.20" in containerfile
    assert "ansible-runner>=2.4,<2.5" in containerfile
    built = context / "_build"
    assert (built / "wheels" / wheel.name).read_bytes() == wheel.read_bytes()
    assert "openssh-client [platform:dpkg]" in (built / "bindep.txt").read_text()


def test_ansible_lint_production_profile_passes_on_the_awx_files() -> None:
    r = _run(
        str(BIN / "ansible-lint"), "--profile", "production", "--nocolor",
        "deploy/awx/rollout.yml", "deploy/awx/execution-environment.yml",
    )  # fmt: skip
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Profile 'production' was required, and it passed" in r.stdout + r.stderr


def _play() -> dict[str, object]:
    (play,) = yaml.safe_load((AWX / "rollout.yml").read_text())
    assert isinstance(play, dict)
    return play


def test_the_playbooks_exit_codes_are_the_documented_ones() -> None:
    doc = (REPO / "docs" / "exit-codes.md").read_text()
    table = doc.split("## By outcome")[0]
    documented = {int(m) for m in re.findall(r"^\| (\d+) \|", table, re.M)}
    play_vars = _play()["vars"]
    assert isinstance(play_vars, dict)
    assert set(play_vars["rollout_job_exit_meanings"]) == documented
    # a gate that holds (8) is for the approval node to decide, never a failed job; a change
    # rolled back (5) fails the job, which runs the workflow's failure path
    ok = play_vars["rollout_job_ok_codes"]
    assert ok == {"apply-canary": [0, 8], "promote": [0, 8], "rollback": [0], "status": [0]}


def test_the_credential_type_is_the_kubeconfig_file_and_env_injector() -> None:
    cred = yaml.safe_load((AWX / "credential-type.yml").read_text())
    (field,) = cred["inputs"]["fields"]
    assert field["id"] == "kube_config" and field["secret"] and field["multiline"]
    assert cred["inputs"]["required"] == ["kube_config"]
    assert cred["kind"] == "cloud"
    assert cred["injectors"] == {
        "file": {"template.kubeconfig": "{{ kube_config }}"},
        "env": {"KUBECONFIG": "{{ tower.filename.kubeconfig }}"},
    }


def test_the_workflow_runs_the_playbooks_actions_and_rolls_back_on_failure() -> None:
    flow = yaml.safe_load((AWX / "workflow.yml").read_text())
    play_vars = _play()["vars"]
    assert isinstance(play_vars, dict)
    templates = {t["name"]: t for t in flow["job_templates"]}
    for t in templates.values():
        assert t["playbook"] == "deploy/awx/rollout.yml"
        assert t["extra_vars"]["rollout_action"] in play_vars["rollout_job_ok_codes"]
    nodes = {n["identifier"]: n for n in flow["workflow_job_template"]["nodes"]}
    action = {
        i: templates[n["unified_job_template"]]["extra_vars"]["rollout_action"]
        for i, n in nodes.items()
        if "unified_job_template" in n
    }
    # canary -> approval -> promote; every failure path ends in a rollback
    assert action["canary"] == "apply-canary" and nodes["canary"]["success_nodes"] == ["approve"]
    assert nodes["approve"]["type"] == "approval"
    assert nodes["approve"]["success_nodes"] == ["promote"] and action["promote"] == "promote"
    for i in ("canary", "approve", "promote"):
        (fallback,) = nodes[i]["failure_nodes"]
        assert action[fallback] == "rollback", i


def test_the_root_ansible_cfg_says_nothing_about_reaching_a_host() -> None:
    cfg = configparser.ConfigParser(interpolation=None)
    cfg.read(REPO / "ansible.cfg")
    # rollout's plain-ssh transport reads these from ./ansible.cfg (rollout/ansible/direct.py):
    # a project-level file must not change how the tool reaches a node
    reach = {"remote_user", "private_key_file", "interpreter_python", "become", "transport"}
    keys = {k for s in cfg.sections() for k in cfg[s]}
    assert keys and not keys & reach, keys
