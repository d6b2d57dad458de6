"""``rollout.kube.client.connect`` in a pod (``rollout serve`` from deploy/serve.yaml): with no
kubeconfig named and none at ``~/.kube/config``, the pod's ServiceAccount token and CA are used,
as client-go does; a kubeconfig, when there is one, still wins."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rollout.kube import client


def _service_account(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    sa = tmp_path / "sa"
    sa.mkdir()
    (sa / "token").write_text("pod-token")  # as the kubelet mounts it: no newline
    (sa / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n")
    monkeypatch.setattr(client, "SERVICE_ACCOUNT_DIR", str(sa))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "127.0.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")


def test_a_pod_without_kubeconfig_uses_its_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _service_account(tmp_path, monkeypatch)
    cfg = client.connect().api_client.configuration
    assert cfg.host == "https://127.0.0.1:6443"
    assert cfg.auth_settings()["BearerToken"]["value"].lower() == "bearer pod-token"
    assert cfg.ssl_ca_cert == str(tmp_path / "sa" / "ca.crt")


def test_a_kubeconfig_wins_over_the_service_account(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _service_account(tmp_path, monkeypatch)
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.2:7443"}}],
                "users": [{"name": "u", "user": {"token": "operator-token"}}],
                "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "x",
            }
        )
    )
    assert client.connect(str(kubeconfig)).api_client.configuration.host == (
        "https://127.0.0.2:7443"
    )
    assert not client.in_cluster({"KUBERNETES_SERVICE_HOST": ""})
    home = tmp_path / "h"
    (home / ".kube").mkdir(parents=True)
    (home / ".kube" / "config").write_text("{}")
    assert not client.in_cluster({"KUBERNETES_SERVICE_HOST": "10.0.0.1"}, str(home))


def test_no_kubeconfig_and_no_pod_is_a_named_input_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.delenv("KUBECONFIG", raising=False)
    with pytest.raises(client.InputError, match="cannot load kubeconfig"):
        client.connect()


def _kubeconfig(path: Path, server: str, **cluster: object) -> Path:
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": server, **cluster}}],
                "users": [{"name": "u", "user": {"token": "t"}}],
                "contexts": [
                    {"name": "x", "context": {"cluster": "c", "user": "u"}},
                    {"name": "other", "context": {"cluster": "elsewhere", "user": "u"}},
                ],
                "current-context": "x",
            }
        )
    )
    return path


def test_the_listings_are_compressed_unless_the_kubeconfig_disables_it(tmp_path: Path) -> None:
    """kubectl's ``disable-compression: true`` on the cluster entry: the tool asks for plain
    answers too (counted by the loopback stand-in, which compresses as kube-apiserver does)."""
    from rollout.kube import nodes as kn
    from tests.unit.fake_apiserver import Fleet, serving

    fleet = Fleet(400, 1)
    with serving(fleet) as url:
        plain = _kubeconfig(tmp_path / "plain", url, **{"disable-compression": True})
        packed = _kubeconfig(tmp_path / "packed", url)
        assert len(kn.nodes_listed(client.connect(str(plain)))[0]) == 400
        assert fleet.compressed["/api/v1/nodes"] == 0
        assert len(kn.nodes_listed(client.connect(str(packed)))[0]) == 400
        assert fleet.compressed["/api/v1/nodes"] == 1
    assert client.compression_disabled(str(plain), None)
    assert not client.compression_disabled(str(plain), "other")  # another cluster's context
    assert not client.compression_disabled(str(packed), None)


def test_kubeconfig_files_follow_kubectl(tmp_path: Path) -> None:
    assert client.kubeconfig_files("/k/a") == ["/k/a"]
    assert client.kubeconfig_files(None, {"KUBECONFIG": "/k/a:/k/b"}) == ["/k/a", "/k/b"]
    assert client.kubeconfig_files(None, {})[0].endswith("/.kube/config")


def test_the_first_kubeconfig_file_naming_the_cluster_wins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _kubeconfig(
        tmp_path / "first", "https://127.0.0.2:7443", **{"disable-compression": True}
    )
    second = _kubeconfig(tmp_path / "second", "https://127.0.0.3:7443")
    monkeypatch.setenv("KUBECONFIG", f"{first}:{second}")
    assert client.compression_disabled(None, None)
    monkeypatch.setenv("KUBECONFIG", f"{second}:{first}")
    assert not client.compression_disabled(None, None)
