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
