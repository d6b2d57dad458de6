"""Properties of render: it never changes a field we do not own, it is idempotent, and it is
deterministic. Inputs are the real node files plus generated extra fields and reservations."""

from __future__ import annotations

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from rollout.errors import ConflictError
from rollout.kubelet.intent import build_intent
from rollout.kubelet.loading import effective, node_from_files
from rollout.kubelet.render import render
from rollout.kubelet.yamledit import edit_yaml, scalar
from tests.unit.render_fixtures import fixture_files, real_node

DISTS = ["kubeadm", "k3s", "rke2", "eks-al2", "eks-al2023", "kubespray", "microk8s"]
cpus = st.lists(st.integers(0, 127), min_size=1, max_size=6, unique=True).map(
    lambda xs: ",".join(str(x) for x in sorted(xs))
)
policies = st.sampled_from(["single-numa-node", "restricted", "best-effort"])


@settings(max_examples=40, deadline=None)
@given(dist=st.sampled_from(DISTS), reserved=cpus, policy=policies)
def test_fields_we_do_not_own_keep_their_effective_value(
    dist: str, reserved: str, policy: str
) -> None:
    intent = build_intent({"reservedSystemCPUs": reserved, "topologyManagerPolicy": policy})
    r = render(real_node(dist), intent)
    before, after = r.effective_before.config, r.effective_after.config
    touched = set(intent.fields) | {
        "kubeReserved",
        "systemReserved",
        "kubeReservedCgroup",
        "systemReservedCgroup",
    }
    for k in set(before) | set(after):
        if k not in touched:
            assert before.get(k) == after.get(k), k
    for k, v in intent.fields.items():
        assert after[k] == v


@settings(max_examples=40, deadline=None)
@given(dist=st.sampled_from(DISTS), reserved=cpus, policy=policies)
def test_render_is_idempotent_and_deterministic(dist: str, reserved: str, policy: str) -> None:
    intent = build_intent({"reservedSystemCPUs": reserved, "topologyManagerPolicy": policy})
    node = real_node(dist)
    first = render(node, intent)
    assert render(node, intent).files == first.files
    applied = node.with_files({f.path: f.content for f in first.files})
    again = render(applied, intent)
    assert again.files == ()
    assert again.checkpoint_reset == ()


keys = st.from_regex(r"[a-z][a-zA-Z]{2,12}", fullmatch=True).filter(
    lambda k: k not in ("cpuManagerPolicy", "reservedSystemCPUs", "kind", "apiVersion")
)
# Text a config value can hold, weighted to YAML's indicators (": ", " #", a trailing ":", quotes,
# flow and block markers) and the YAML 1.1 words, plus any other character.
texts = st.one_of(
    st.text("abc0:/ #'\"-[]{},&*!|>%@`", max_size=8),
    st.sampled_from(["foo:", "a::", "y", "No", "null", "~", "- a", "a #b", "0x1f", "1e3"]),
    st.text(max_size=8),
)
values = st.one_of(st.integers(-5, 500), texts, st.booleans())


@settings(max_examples=300, deadline=None)
@given(text=texts)
@example(text="foo:")
def test_a_scalar_reads_back_unchanged_as_value_item_and_key(text: str) -> None:
    import yaml

    s = scalar(text)
    assert yaml.safe_load(f"k: {s}\n") == {"k": text}, s
    assert yaml.safe_load(f"k:\n- {s}\n") == {"k": [text]}, s
    assert yaml.safe_load(f"{s}: 1\n") == {text: 1}, s


@settings(max_examples=60, deadline=None)
@given(extra=st.dictionaries(keys, values, max_size=5), reserved=cpus, policy=texts)
def test_yaml_edit_keeps_other_fields(extra: dict[str, object], reserved: str, policy: str) -> None:
    """Other fields of every type (strings too) survive an edit, and a set string reads back."""
    import yaml

    base = fixture_files("kubespray")["/etc/kubernetes/kubelet-config.yaml"].decode()
    text = base + "".join(yaml.safe_dump({k: v}, allow_unicode=True) for k, v in extra.items())
    before = yaml.safe_load(text)
    after = yaml.safe_load(
        edit_yaml(text, {"reservedSystemCPUs": reserved, "cpuManagerPolicy": policy})
    )
    assert after.pop("reservedSystemCPUs") == reserved
    assert after.pop("cpuManagerPolicy") == policy
    before.pop("cpuManagerPolicy", None)
    assert after == before


def test_missing_final_newline_stays_missing() -> None:
    out = edit_yaml("a: 1\nb: 2", {"cpuManagerPolicy": "static"})
    assert out == "a: 1\nb: 2\ncpuManagerPolicy: static"


def test_flag_override_is_refused_with_file_and_line() -> None:
    files = fixture_files("rke2")
    files["/etc/rancher/rke2/config.yaml.d/60-x.yaml"] = (
        b'kubelet-arg:\n  - "cpu-manager-policy=none"\n'
    )
    with pytest.raises(ConflictError) as e:
        render(node_from_files("rke2", files), build_intent({"reservedSystemCPUs": "0"}))
    assert "60-x.yaml:2" in str(e.value) and "cpuManagerPolicy" in str(e.value)


def test_kubeadm_extra_args_override_is_refused() -> None:
    files = fixture_files("kubeadm")
    files["/etc/default/kubelet"] = b'KUBELET_EXTRA_ARGS="--topology-manager-policy=none"\n'
    with pytest.raises(ConflictError, match="/etc/default/kubelet:1"):
        render(node_from_files("kubeadm", files), build_intent({"reservedSystemCPUs": "0"}))


def test_eks_al2023_cgroups_cleared_in_dropin_and_effective_matches_configz() -> None:
    r = render(real_node("eks-al2023"), build_intent({"reservedSystemCPUs": "0,1"}))
    cfg = r.effective_after.config
    assert cfg["kubeReservedCgroup"] == "" and cfg["systemReservedCgroup"] == ""
    assert cfg["systemReserved"]["cpu"] == "2" and "cpu" not in cfg["kubeReserved"]
    assert any("reserved cgroups" in w for w in r.warnings)


def test_eks_al2023_dropin_without_config_dir_is_refused() -> None:
    with pytest.raises(ConflictError, match="nodeconfig"):
        render(node_from_files("eks-al2023", {}), build_intent({"reservedSystemCPUs": "0"}))


def test_effective_merges_dropins_key_wise_and_lists_replaced() -> None:
    files = fixture_files("k3s")
    files["/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/50-a.conf"] = (
        b"apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
        b"evictionHard:\n  memory.available: 200Mi\nclusterDNS:\n- 1.1.1.1\n"
    )
    e = effective(node_from_files("k3s", files))
    assert e.config["evictionHard"] == {
        "imagefs.available": "5%",
        "nodefs.available": "5%",
        "memory.available": "200Mi",
    }
    assert e.config["clusterDNS"] == ["1.1.1.1"]
    assert e.origins["clusterDNS"].file.endswith("50-a.conf") and e.origins["clusterDNS"].line == 5
