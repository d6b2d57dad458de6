"""Pure parts of the lab: node shape and CPU numbering, seeded layouts per distribution (checked
against the distribution table the rest of the tool uses), inventory and plan text, relay
endpoints, and the systemctl shim's verbs over a temporary state directory."""

from __future__ import annotations

import configparser
import json
from pathlib import Path

import pytest

from rollout.change.plan.schema import load_plan
from rollout.kubelet import distributions as dist
from rollout.kubelet.cpuset import format_cpus as cpulist
from rollout.lab import shim
from rollout.lab.hardware import NodeShape, sysfs_tree
from rollout.lab.inventory import canary_count, inventory_text, plan_text
from rollout.lab.nodefiles import LabNode
from rollout.lab.relay import Endpoint
from rollout.lab.seeds import DISTRIBUTIONS, LAYOUTS, SeedContext, seed_files

CTX = SeedContext("n1", "10.213.1.2", "apiVersion: v1\nkind: Config\n", "-----BEGIN CERT")


def test_default_shape_numbers_cpus_like_linux() -> None:
    s = NodeShape()
    assert s.cpus == 64
    assert cpulist(s.numa_cpus(0)) == "0-15,32-47"
    assert cpulist(s.numa_cpus(1)) == "16-31,48-63"
    topo = s.topology()
    assert [len(n["gpus"]) for n in topo["numaNodes"]] == [4, 4]  # type: ignore[index]
    assert sum(n["memoryBytes"] for n in topo["numaNodes"]) == 1 << 40  # type: ignore[index]


@pytest.mark.parametrize(
    ("cpus", "text"),
    [([], ""), ([3], "3"), ([0, 1, 2, 5], "0-2,5"), ([7, 6, 9], "6-7,9")],
)
def test_cpulist(cpus: list[int], text: str) -> None:
    assert cpulist(cpus) == text


def test_sysfs_tree_has_the_paths_the_facts_playbook_reads(tmp_path: Path) -> None:
    sysfs_tree(NodeShape(sockets=2, gpus_per_numa=1), tmp_path)
    assert (tmp_path / "node/online").read_text() == "0-1\n"
    assert (tmp_path / "node/node1/cpulist").read_text() == "16-31,48-63\n"
    gpus = sorted((tmp_path / "pci").iterdir())
    assert [(g / "vendor").read_text() for g in gpus] == ["0x10de\n", "0x10de\n"]
    assert [(g / "numa_node").read_text() for g in gpus] == ["0\n", "1\n"]


@pytest.mark.parametrize("name", DISTRIBUTIONS)
def test_seeds_use_the_distribution_table_paths_and_unit(name: str) -> None:
    files = seed_files(name, CTX)
    d = dist.get(name)
    assert LAYOUTS[name].unit == d.service
    assert LAYOUTS[name].root_dir == d.root_dir
    if d.config_file:
        assert d.config_file in files
    if d.dropin_always:
        assert any(p.startswith(str(d.dropin_dir) + "/") for p in files)
    flag_files = [f.path for f in d.flag_files if "*" not in f.path and f.path in files]
    assert flag_files or name == "kubeadm" or d.config_file, "some flag or config file is seeded"
    assert LAYOUTS[name].unit_path in files
    for path, text in files.items():
        if path.endswith(".json") or path.endswith("40-nodeadm.conf"):
            json.loads(text)
        if path.endswith(".service"):
            unit = configparser.ConfigParser(strict=False, interpolation=None)
            unit.read_string(text)
            assert unit["Service"]["Restart"] == "always"


def test_nodeadm_files_are_go_marshalindent_without_trailing_newline() -> None:
    files = seed_files("eks-al2023", CTX)
    text = files["/etc/kubernetes/kubelet/config.json"]
    assert text.startswith('{\n    "kind"') and not text.endswith("\n")


@pytest.mark.parametrize(("total", "canary"), [(1, 1), (3, 1), (4, 1), (8, 2), (9, 2)])
def test_canary_is_first_quarter_at_least_one(total: int, canary: int) -> None:
    assert canary_count(total) == canary


def _nodes(count: int, dists: tuple[str, ...] = ("kubeadm",)) -> list[LabNode]:
    return [LabNode(f"n{i}", i, dists[(i - 1) % len(dists)], "t") for i in range(1, count + 1)]


def test_inventory_groups_and_connection_vars() -> None:
    text = inventory_text(_nodes(5), Path("/k/key"))
    cp = configparser.ConfigParser(allow_no_value=True, delimiters=("=",), strict=False)
    cp.read_string(text)
    assert list(cp["canary"]) == ["n1"]
    assert [k.split()[0] for k in cp["nodes"]] == ["n1", "n2", "n3", "n4", "n5"]
    assert "n2 ansible_host=10.213.2.2 rollout_distribution=kubeadm" in text
    assert cp["all:vars"]["ansible_ssh_private_key_file"] == "/k/key"
    assert "UserKnownHostsFile=/dev/null" in cp["all:vars"]["ansible_ssh_common_args"]


def test_lab_plan_is_a_valid_plan(tmp_path: Path) -> None:
    p = tmp_path / "plan.yaml"
    p.write_text(plan_text(_nodes(4, ("kubeadm", "k3s")), "demo"))
    plan = load_plan(p)
    assert plan.kubelet["reservedSystemCPUs"] == "0,32"
    assert plan.kubelet["topologyManagerPolicy"] == "single-numa-node"
    assert plan.strategy.canary_group == "canary"
    assert plan.nodes["n2"].distribution == "k3s"


@pytest.mark.parametrize(
    ("text", "ep"),
    [
        ("tcp:127.0.0.1:6443", Endpoint("tcp", host="127.0.0.1", port=6443)),
        ("unix:/x/api.sock", Endpoint("unix", path="/x/api.sock")),
    ],
)
def test_relay_endpoints(text: str, ep: Endpoint) -> None:
    assert Endpoint.parse(text) == ep


@pytest.mark.parametrize("bad", ["tcp:6443", "unix:", "http://x", "tcp:h:p"])
def test_relay_rejects_bad_endpoints(bad: str) -> None:
    with pytest.raises(ValueError, match="not an endpoint"):
        Endpoint.parse(bad)


@pytest.fixture
def shim_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    units = tmp_path / "units.json"
    units.write_text(
        json.dumps(
            {
                "kubelet": {
                    "execStart": ["/bin/true"],
                    "log": str(tmp_path / "kubelet.log"),
                    "fragmentPath": "/usr/lib/systemd/system/kubelet.service",
                }
            }
        )
    )
    monkeypatch.setattr(shim, "UNITS_FILE", units)
    monkeypatch.setattr(shim, "STATE_ROOT", tmp_path / "state")
    return tmp_path


def test_shim_show_of_a_stopped_unit_satisfies_ansible(
    shim_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert shim.systemctl(["show", "kubelet.service"]) == 0
    props = dict(line.split("=", 1) for line in capsys.readouterr().out.splitlines())
    assert props["LoadState"] == "loaded"
    assert (props["ActiveState"], props["SubState"]) == ("inactive", "dead")
    assert props["UnitFileState"] == "enabled"
    assert shim.systemctl(["is-active", "kubelet"]) == 3
    assert capsys.readouterr().out == "inactive\n"


def test_shim_unknown_unit(shim_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert shim.systemctl(["show", "docker"]) == 0
    assert "LoadState=not-found" in capsys.readouterr().out
    assert shim.systemctl(["restart", "docker"]) == 5
    assert "Unit docker.service not found." in capsys.readouterr().err
    assert shim.systemctl(["status", "docker"]) == 4


def test_shim_status_shows_as_many_log_lines_as_asked(
    shim_env: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (shim_env / "kubelet.log").write_text("".join(f"line {i}\n" for i in range(30)))
    assert shim.systemctl(["status", "kubelet"]) == 3  # not running
    out = capsys.readouterr().out
    assert "line 19" not in out and "line 20" in out and "line 29" in out  # systemd's 10
    assert shim.systemctl(["status", "--no-pager", "--lines=25", "kubelet"]) == 3
    out = capsys.readouterr().out
    assert "line 4\n" not in out and "line 5\n" in out
    assert shim.systemctl(["status", "-n", "0", "kubelet"]) == 3
    assert "line" not in capsys.readouterr().out


def test_shim_daemon_reload_and_enable(shim_env: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert shim.systemctl(["daemon-reload"]) == 0
    assert shim.systemctl(["disable", "kubelet"]) == 0
    assert shim.systemctl(["is-enabled", "kubelet"]) == 1
    assert shim.systemctl(["show", "kubelet", "-p", "UnitFileState", "--value"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-1] == "disabled"
    assert (shim_env / "state/daemon-reloads").read_text() == "1\n"


def test_lab_eks_al2_seed_runs_on_cgroup_v1_kubelets() -> None:
    """AL2 is cgroup v1: the lab's AL2 seed carries failCgroupV1: false, so lint and preflight
    do not refuse the lab's own AL2 node on a 1.35+ kubelet."""
    from rollout.kubelet.loading import effective, node_from_files
    from rollout.kubelet.validation import validate

    files = {p: v for p, v in seed_files("eks-al2", CTX).items() if isinstance(v, str | bytes)}
    eff = effective(node_from_files("eks-al2", files))
    found = validate(
        eff.config,
        origins=eff.origins,
        kubelet_version="1.36",
        flags=eff.flag_origins,
        distribution="eks-al2",
    )
    assert [f for f in found if f.field == "failCgroupV1"] == []
    assert eff.config["failCgroupV1"] is False


@pytest.mark.parametrize("distribution", DISTRIBUTIONS)
def test_lab_seeds_run_on_the_cgroup_v1_lab_machine_for_135_and_later(distribution: str) -> None:
    """The lab machine boots cgroup v1 and the facts module reports it (cgroupVersion 1): every
    distribution's seed for a 1.35+ kubelet sets failCgroupV1: false, so lint and preflight do not
    refuse the lab's own nodes; a 1.34 seed (failCgroupV1 defaults to false there) does not."""
    from rollout.kubelet.facts import NodeFacts
    from rollout.kubelet.loading import effective, node_from_files
    from rollout.kubelet.validation import validate

    v1_host = NodeFacts(frozenset(range(4)), cgroup_version=1)
    for version, minor in (("v1.35.4", "1.35"), ("v1.36.3", "1.36"), ("v1.37.2", "1.37")):
        files = seed_files(distribution, CTX, version)
        eff = effective(node_from_files(distribution, files))
        found = validate(
            eff.config,
            origins=eff.origins,
            kubelet_version=minor,
            node_facts=v1_host,
            flags=eff.flag_origins,
            distribution=distribution,
        )
        assert [f.message for f in found if f.field == "failCgroupV1"] == [], (distribution, minor)
        assert eff.config["failCgroupV1"] is False
    old = effective(node_from_files(distribution, seed_files(distribution, CTX, "v1.34.4")))
    if distribution != "eks-al2":  # AL2's own bootstrap sets it for every version
        assert "failCgroupV1" not in old.config
    assert seed_files(distribution, CTX) == seed_files(distribution, CTX, "v1.36.3")
