"""``rollout lint`` end to end with CliRunner, and the real node files in tests/fixtures."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from rollout.cli import cli
from rollout.errors import InputError
from rollout.kubelet.facts import load_node_facts

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet"

INTENT = (
    "apiVersion: kubelet.config.k8s.io/v1beta1\n"
    "kind: KubeletConfiguration\n"
    "cpuManagerPolicy: static\n"
    'reservedSystemCPUs: "0,32"\n'
    "topologyManagerPolicy: single-numa-node\n"
    "topologyManagerScope: pod\n"
)


def real_file(name: str, dest: Path) -> Path:
    """Copy a fixture without its ``# [fixture]`` provenance lines (not part of the real file)."""
    text = (FIXTURES / name).read_text(encoding="utf-8")
    kept = [ln for ln in text.splitlines(keepends=True) if not ln.startswith("# [fixture]")]
    out = dest / name
    out.write_text("".join(kept), encoding="utf-8")
    return out


def run(*args: str) -> tuple[int, str]:
    result = CliRunner().invoke(cli, ["lint", *args])
    return result.exit_code, result.output


def test_clean_file_exits_0(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(INTENT)
    code, out = run(str(f))
    assert (code, out) == (0, "0 error(s), 0 warning(s)\n")


def test_error_exits_1_with_file_line_and_message(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(INTENT.replace("single-numa-node", "single-numa"))
    code, out = run(str(f))
    assert code == 1
    assert out.splitlines()[0] == (
        f"{f}:5: error: topologyManagerPolicy: invalid configuration: topologyManagerPolicy "
        '(--topology-manager-policy) "single-numa" must be one of: '
        '["none" "best-effort" "restricted" "single-numa-node"]'
    )
    assert out.splitlines()[-1] == "1 error(s), 0 warning(s)"


def test_json_output_shape(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(INTENT + "cpuManagerPolicyy: static\n")
    code, out = run(str(f), "-o", "json")
    assert code == 0
    assert json.loads(out) == [
        {
            "severity": "warning",
            "field": "cpuManagerPolicyy",
            "message": 'unknown field "cpuManagerPolicyy" (did you mean "cpuManagerPolicy"?): '
            "the kubelet ignores it (strict decoding fails, it falls back to lenient decoding)",
            "file": str(f),
            "line": 7,
        }
    ]


def test_kubelet_version_changes_the_verdict(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(INTENT + 'cpuManagerPolicyOptions:\n  strict-cpu-reservation: "true"\n')
    assert run(str(f), "--kubelet-version", "1.33")[0] == 0
    code, out = run(str(f), "--kubelet-version", "v1.31.4", "-o", "json")
    assert code == 1
    assert json.loads(out)[0]["message"] == (
        'new static policy error: unknown CPU Manager Policy option: "strict-cpu-reservation"'
    )


def test_node_facts(tmp_path: Path) -> None:
    f = tmp_path / "c.yaml"
    f.write_text(INTENT)
    facts = tmp_path / "facts.yaml"
    facts.write_text(
        "onlineCPUs: 0-15\nnumaNodes:\n  - {id: 0, cpus: 0-7}\n  - {id: 1, cpus: 8-15}\n"
    )
    code, out = run(str(f), "--node-facts", str(facts), "-o", "json")
    assert code == 1
    assert json.loads(out)[0]["message"] == (
        "reserved-cpus: 0,32 is not a subset of online-cpus: 0-15"
    )


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["/nonexistent/config.yaml"], "no such file"),
        (["--distribution", "gke", "--node-root", "."], "unknown distribution 'gke'"),
        (["--kubelet-version", "latest", "x.yaml"], "is not a version"),
        ([], "give FILE... or both --distribution and --node-root"),
    ],
)
def test_bad_input_exits_2(args: list[str], expected: str) -> None:
    code, out = run(*args)
    assert code == 2
    assert expected in out


def test_malformed_yaml_names_file_and_line(tmp_path: Path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text("kind: KubeletConfiguration\ncpuManagerPolicy: [static\n")
    code, out = run(str(f))
    assert code == 2
    assert f"{f}:" in out and "invalid YAML" in out


def test_malformed_facts(tmp_path: Path) -> None:
    facts = tmp_path / "facts.json"
    facts.write_text('{"onlineCPUs": "0-3", "numaNodes": [{"id": 0, "cpus": "3-1"}]}')
    with pytest.raises(InputError, match=r"numaNodes\[0\]\.cpus.*invalid range"):
        load_node_facts(facts)


@pytest.mark.parametrize(
    "name",
    [
        "kubeadm-var-lib-kubelet-config.yaml",
        "k3s-00-k3s-defaults.conf",
        "rke2-00-rke2-defaults.conf",
        "kubespray-kubelet-config.yaml",
        "eks-al2-kubelet-config.json",
        "eks-al2023-config.json",
        "eks-al2023-40-nodeadm.conf",
    ],
)
def test_stock_configs_lint_clean(name: str, tmp_path: Path) -> None:
    code, out = run(str(real_file(name, tmp_path)), "-o", "json")
    assert (code, json.loads(out)) == (0, [])


def test_eks_al2_with_reserved_cpus_hits_the_cgroup_rule(tmp_path: Path) -> None:
    path = real_file("eks-al2-kubelet-config.json", tmp_path)
    data = json.loads(path.read_text())
    data["reservedSystemCPUs"] = "0-1"
    path.write_text(json.dumps(data, indent=2))
    code, out = run(str(path), "-o", "json")
    assert code == 1
    [finding] = json.loads(out)
    assert finding["message"] == (
        "invalid configuration: can't use reservedSystemCPUs (--reserved-cpus) with "
        "systemReservedCgroup (--system-reserved-cgroup) or kubeReservedCgroup "
        "(--kube-reserved-cgroup)"
    )
    assert finding["file"] == str(path)
    lines = path.read_text().splitlines()
    assert '"reservedSystemCPUs"' in lines[finding["line"] - 1]


def test_node_set_via_distribution(tmp_path: Path) -> None:
    """k3s node: the distribution's defaults plus our drop-in, merged like the kubelet."""
    dropins = tmp_path / "var/lib/rancher/k3s/agent/etc/kubelet.conf.d"
    dropins.mkdir(parents=True)
    real_file("k3s-00-k3s-defaults.conf", tmp_path)
    (tmp_path / "k3s-00-k3s-defaults.conf").rename(dropins / "00-k3s-defaults.conf")
    (dropins / "90-rollout.conf").write_text(INTENT.replace('"0,32"', '""'))
    code, out = run("--distribution", "k3s", "--node-root", str(tmp_path), "-o", "json")
    assert code == 1
    [finding] = json.loads(out)
    assert finding["field"] == "cpuManagerPolicy"
    assert finding["message"].startswith("[cpumanager] the static policy requires")
    assert finding["file"].endswith("90-rollout.conf")


def test_every_finding_names_its_file_even_without_a_line(tmp_path: Path) -> None:
    """``memoryManagerPolicy: Static`` without ``reservedMemory``: the finding is about a field
    no file sets, so it has no line; with two files it must still say which one."""
    good = tmp_path / "a.yaml"
    good.write_text(INTENT)
    bad = tmp_path / "b.yaml"
    bad.write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\n"
        "memoryManagerPolicy: Static\n"
    )
    code, out = run(str(good), str(bad), "-o", "json")
    findings = json.loads(out)
    assert code == 1
    assert findings, "the Static memory manager without reservedMemory must be refused"
    assert {f["file"] for f in findings} == {str(bad)}
    assert any(f["line"] is None for f in findings)
    code, text = run(str(good), str(bad))
    lines = [ln for ln in text.splitlines() if ": error: " in ln]
    assert lines
    assert all(ln.startswith(f"{bad}: ") for ln in lines), text


def test_node_root_findings_name_the_nodes_config_file(tmp_path: Path) -> None:
    (tmp_path / "var/lib/kubelet").mkdir(parents=True)
    (tmp_path / "var/lib/kubelet/config.yaml").write_text(
        "apiVersion: kubelet.config.k8s.io/v1beta1\n"
        "kind: KubeletConfiguration\n"
        "memoryManagerPolicy: Static\n"
    )
    code, out = run("--distribution", "kubeadm", "--node-root", str(tmp_path), "-o", "json")
    findings = json.loads(out)
    assert code == 1
    assert findings
    assert all(f["file"] for f in findings), findings


def microk8s_node(tmp_path: Path) -> Path:
    """The MicroK8s snap's own default args/kubelet at its node path."""
    args = tmp_path / "var/snap/microk8s/current/args"
    args.mkdir(parents=True)
    real_file("microk8s-args-kubelet", tmp_path).rename(args / "kubelet")
    return args / "kubelet"


def test_microk8s_default_args_fail_on_kubelet_137(tmp_path: Path) -> None:
    """The snap's args carry --containerd, a cAdvisor flag the 1.37 kubelet no longer has."""
    args = microk8s_node(tmp_path)
    node = ["--distribution", "microk8s", "--node-root", str(tmp_path)]
    code, out = run(*node, "--kubelet-version", "1.37", "-o", "json")
    assert code == 1
    [finding] = [f for f in json.loads(out) if f["severity"] == "error"]
    assert finding["field"] == "--containerd"
    assert finding["message"].startswith("failed to parse kubelet flag: unknown flag: --containerd")
    assert finding["file"] == "/var/snap/microk8s/current/args/kubelet"
    assert args.read_text().splitlines()[finding["line"] - 1].startswith("--containerd=")
    # the same args on 1.36: the flag is deprecated, not removed
    code, out = run(*node, "--kubelet-version", "1.36", "-o", "json")
    assert (code, [f for f in json.loads(out) if f["severity"] == "error"]) == (0, [])


def eks_al2_node(tmp_path: Path) -> Path:
    """The EKS AL2 bootstrap's own kubelet-config.json at its node path."""
    d = tmp_path / "etc/kubernetes/kubelet"
    d.mkdir(parents=True)
    return real_file("eks-al2-kubelet-config.json", tmp_path).rename(d / "kubelet-config.json")


def test_eks_al2_node_fails_on_kubelet_135_unless_fail_cgroup_v1_false(tmp_path: Path) -> None:
    """AL2 boots cgroup v1; since 1.35 the kubelet refuses it unless failCgroupV1: false."""
    config = eks_al2_node(tmp_path)
    node = ["--distribution", "eks-al2", "--node-root", str(tmp_path), "-o", "json"]
    code, out = run(*node, "--kubelet-version", "1.35")
    assert code == 1
    [finding] = json.loads(out)
    assert finding["field"] == "failCgroupV1"
    assert finding["message"].startswith(
        "kubelet is configured to not run on a host using cgroup v1. cgroup v1 support is "
        "unsupported and will be removed in a future release"
    )
    assert finding["file"] == "/etc/kubernetes/kubelet/kubelet-config.json"
    assert run(*node, "--kubelet-version", "1.34") == (0, "[]\n")
    data = json.loads(config.read_text())
    config.write_text(json.dumps({**data, "failCgroupV1": False}, indent=2))
    assert run(*node, "--kubelet-version", "1.35") == (0, "[]\n")
