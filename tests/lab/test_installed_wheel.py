"""The built wheel, installed into a fresh venv outside the checkout, does the whole job.

Builds the sdist from this tree and the wheel from the sdist, installs ``rollout[lab]`` into a
new venv under a temporary directory, changes to another directory and runs only the installed
console script: ``render`` for a drop-in distribution (k3s: its Jinja template must come from the
wheel), ``lint``, then ``lab up`` (its build script and Go modules come from the wheel),
``apply --canary`` and ``rollback`` (the playbooks and their Ansible modules come from the wheel),
and ``lab down``, which removes the lab's state; ``lab down --keep`` keeps it and the next
``lab up`` says so.

Speed: the dependencies are downloaded once into a wheelhouse keyed by the project's run-time
requirements (``~/.cache/rollout-lab/wheelhouse-<hash>``, ~60 s cold); later runs install from it
with ``--no-index`` and no bytecode compile. Measured on the 2-core machine shared with five other
engineers' labs (load average 12-17): sdist + wheel + venv + install 12-71 s; the whole file
282-460 s, most of it the Ansible apply and restore runs on the canary (100-140 s each under that
load); the lab's one-minute gate soak is left out of the plan (the gate has its own lab tests).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from rollout.lab.binaries import find_bin_dir, missing_binaries
from tests.lab.conftest import IN_CI
from tests.unit.render_fixtures import fixture_files, write_root

pytestmark = pytest.mark.lab

REPO = Path(__file__).resolve().parents[2]
CACHE = Path(os.environ.get("ROLLOUT_LAB_CACHE") or Path.home() / ".cache" / "rollout-lab")


def run(cmd: list[str], *, timeout: float = 600, **kw: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, **kw)


def ok(p: subprocess.CompletedProcess[str]) -> subprocess.CompletedProcess[str]:
    assert p.returncode == 0, f"{p.args}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The ``bin`` directory of a fresh venv holding the wheel built from this tree."""
    t0 = time.monotonic()
    dist = tmp_path_factory.mktemp("dist")
    # the wheel is built from the sdist, so both carry the assets (MANIFEST.in and setup.py)
    ok(run([sys.executable, "setup.py", "-q", "sdist", "-d", str(dist)], cwd=REPO))
    (sdist,) = dist.glob("rollout-*.tar.gz")
    ok(run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(sdist)]))
    (wheel,) = dist.glob("rollout-*.whl")
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    wanted = [*project["dependencies"], *project["optional-dependencies"]["lab"]]
    key = hashlib.sha256("\n".join(sorted(wanted)).encode()).hexdigest()[:12]
    house = CACHE / f"wheelhouse-{key}"
    if not (house / ".complete").exists():
        house.mkdir(parents=True, exist_ok=True)
        ok(run([sys.executable, "-m", "pip", "wheel", "-q", "-w", str(house), f"{wheel}[lab]"]))
        for w in house.glob("rollout-*.whl"):
            w.unlink()  # only the dependencies are cached; rollout is built fresh every run
        (house / ".complete").write_text("")
    venv = tmp_path_factory.mktemp("venv")
    # no pip inside the venv and no .pyc compile: this pip installs into it (saves ~20 s)
    ok(run([sys.executable, "-m", "venv", "--without-pip", str(venv)]))
    pip = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), "install", "-q"]
    ok(run([*pip, "--no-index", "--no-compile", "--find-links", str(house), f"{wheel}[lab]"]))
    print(f"wheel built and installed in {time.monotonic() - t0:.1f}s")
    return venv / "bin"


def test_installed_wheel_renders_lints_and_runs_a_lab_canary_with_rollback(
    installed: Path, tmp_path: Path
) -> None:
    missing = missing_binaries(find_bin_dir())
    if missing:  # as the `lab` fixture: never skipped in CI
        msg = (
            f"lab binaries missing in {find_bin_dir()}: {missing}; run tools/build-lab-binaries.sh"
        )
        if IN_CI:
            pytest.fail(msg)
        pytest.skip(msg)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{installed}{os.pathsep}{env.get('PATH', '')}"

    def rollout(*args: str) -> subprocess.CompletedProcess[str]:
        t0 = time.monotonic()
        p = run([str(installed / "rollout"), *args], cwd=elsewhere, env=env)
        print(f"rollout {' '.join(args[:3])}: {time.monotonic() - t0:.1f}s")
        return p

    # the package and its assets come from the venv, not from this checkout
    where = ok(
        run(
            [
                str(installed / "python"),
                "-c",
                "import rollout, rollout.assets as a; print(rollout.__file__); "
                "print(a.asset_root()); print(a.lab_tools())",
            ],
            cwd=elsewhere,
            env=env,
        )
    ).stdout.split()
    for p in where:
        assert Path(p).is_relative_to(installed.parent), where
        assert not Path(p).is_relative_to(REPO), where
    tools = Path(where[2])
    assert (tools / "k8sbin" / "go.mod").is_file() and (tools / "etcdbin" / "go.mod").is_file()
    # the shipped build script runs (the binaries are cached, so it only checks and prints)
    built = ok(run(["bash", str(tools / "build-lab-binaries.sh")], cwd=elsewhere, env=env))
    assert built.stdout.strip().splitlines()[-1] == str(find_bin_dir())

    # render for a drop-in distribution: the drop-in template comes from the wheel
    root = write_root(tmp_path / "k3s-node", fixture_files("k3s"))
    rendered = ok(
        rollout(
            "render", "-d", "k3s", "--node-root", str(root), "--reserved-cpus", "0,32", "-o", "json"
        )
    )
    (dropin,) = json.loads(rendered.stdout)["files"]
    assert dropin["path"].endswith("/kubelet.conf.d/90-rollout.conf")
    assert 'reservedSystemCPUs: "0,32"' in dropin["content"]

    # lint: a clean file passes, a refused one names its file
    good = elsewhere / "good.yaml"
    good.write_text(dropin["content"])
    ok(rollout("lint", str(good)))
    bad = elsewhere / "bad.yaml"
    bad.write_text("kind: KubeletConfiguration\ncpuManagerPolicy: static\n")
    refused = rollout("lint", str(bad), "-o", "json")
    assert refused.returncode == 1, refused.stderr
    assert {f["file"] for f in json.loads(refused.stdout)} == {str(bad)}

    # the lab, a canary apply and its rollback, from the installed console script
    name = f"whl{os.getpid()}"
    labdir = tmp_path / "lab"
    lab = ("--name", name, "--workdir", str(labdir))
    ok(rollout("lab", "up", "--nodes", "2", *lab))
    try:
        lab_env = json.loads(ok(rollout("lab", "env", *lab, "-o", "json")).stdout)
        env.update({k: str(v) for k, v in lab_env.items() if k != "PATH_PREPEND"})
        env["ROLLOUT_STATE_DIR"] = str(tmp_path / "state")
        # the lab's plan without its one-minute gate soak (the gate has its own lab tests): this
        # test is about what the wheel carries, and the soak would be most of its time
        plan = yaml.safe_load(Path(env["ROLLOUT_PLAN"]).read_text())
        plan.pop("gate", None)
        env["ROLLOUT_PLAN"] = str(tmp_path / "plan.yaml")
        Path(env["ROLLOUT_PLAN"]).write_text(yaml.safe_dump(plan))
        applied = ok(rollout("apply", "--canary", "--yes", "-o", "json"))
        change = json.loads(applied.stdout)["change"]
        assert " forward apply done\n" in applied.stderr, applied.stderr
        back = ok(rollout("rollback", "--change", change, "--yes"))
        assert " restore restore done\n" in back.stderr, back.stderr

        # down --keep keeps etcd's data; the next up reuses it and says so
        kept = ok(rollout("lab", "down", "--keep", *lab, "-o", "json"))
        assert json.loads(kept.stdout)["kept"] is True
        assert (labdir / "controlplane" / "etcd").is_dir()
        again = ok(rollout("lab", "up", "--nodes", "1", *lab))
        assert "reusing kept state" in again.stderr, again.stderr
    finally:
        down = rollout("lab", "down", *lab)
    ok(down)
    assert not labdir.exists(), sorted(p.name for p in labdir.iterdir())


def test_wheel_carries_every_go_module_under_tools(installed: Path) -> None:
    """Every Go module the lab builds (``tools/<name>/go.mod``) ships, so new ones need no
    packaging change."""
    site = next(installed.parent.glob("lib/python*/site-packages"))
    shipped = site / "rollout" / "_assets" / "tools"
    modules = sorted(p.parent.name for p in (REPO / "tools").glob("*/go.mod"))
    assert modules
    for m in modules:
        assert (shipped / m / "go.mod").read_bytes() == (REPO / "tools" / m / "go.mod").read_bytes()
    for rel in ("playbooks/apply.yml", "playbooks/restore.yml", "templates/kubelet/dropin.yaml.j2"):
        assert (site / "rollout" / "_assets" / rel).is_file(), rel
    assert shutil.which("rollout", path=str(installed))
