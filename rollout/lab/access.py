"""Where the lab's API server is and who may talk to it: addresses, the lab CA, client and
serving certs, kubeconfigs and TLS contexts.

Why apart from :mod:`rollout.lab.controlplane`: that module starts and stops processes; this is
the security set-up every client of the lab needs, like a kubeadm cluster scaled down:

* a CA (``cryptography``), an apiserver serving cert, client certs for admin (``system:masters``),
  kube-controller-manager, kube-scheduler and the apiserver's kubelet client;
* a ServiceAccount signing key, used by kube-controller-manager with
  ``--use-service-account-credentials``;
* per-node client certs (``system:node:<name>`` in ``system:nodes``) and kubelet serving certs, so
  a lab kubelet authenticates and is authorised exactly like a real one.

:class:`ControlPlaneAccess` is the part of :class:`rollout.lab.controlplane.ControlPlane` that
holds these; the control plane sets the attributes it declares.

Networking: why nodes cannot be on loopback, and how they reach the API server
---------------------------------------------------------------------------------
Checked in the v1.36 source:

* ``pkg/registry/core/node/strategy.go`` ``ResourceLocation`` -> ``isProxyableHostname`` resolves
  the node's address and refuses anything that is not ``net.IP.IsGlobalUnicast()`` with ``400
  "address not allowed"``. Loopback (127.0.0.0/8) and link-local (169.254.0.0/16) fail; RFC1918
  addresses (10/8, 172.16/12, 192.168/16) pass. So ``/api/v1/nodes/<n>/proxy/configz`` only works
  when the node's InternalIP is a private, non-loopback address: the lab nodes live in their own
  network namespaces with veth pairs and private addresses.
* ``pkg/apis/core/validation`` ``ValidateEndpointIP`` rejects loopback addresses, so with
  ``--advertise-address=127.0.0.1`` the ``kubernetes`` Service endpoint reconciler would fail on
  every sync. The flag itself is accepted. We therefore use ``--endpoint-reconciler-type=none``
  when the API server only has a loopback address; nothing in the lab needs that endpoint.
* kube-apiserver has a single ``--bind-address``. ``0.0.0.0`` would also listen on the machine's
  real interfaces, so it is never used. Instead, when the nodes' network is in use, call
  ``ControlPlane.allow_node_network`` (or pass ``node_network_ip``) with the *host-side* lab
  address (e.g. the address of the lab bridge / host veth end, such as ``10.250.0.1``) **before**
  ``ControlPlane.start``. The API server then binds to and advertises that address only, its
  serving cert gets it as a SAN, and every client (admin, controller-manager, scheduler, lab
  kubelets) uses ``https://<host_ip>:<port>``. From the host, traffic to a local address stays on
  the host (it is routed through ``lo``), so traffic is only ever on loopback or lab-netns
  addresses. etcd and the controller-manager / scheduler serving ports stay on 127.0.0.1.
* Verified with a lab netns + veth pair (host end 10.251.77.1/30): apiserver bound to the host
  end, ``ss`` shows one listener on that address only, and a ``system:node:<n>`` client inside
  the netns registered its Node. With one /30 per node, give each netns a default route via its
  host end (``ip -n NS route add default via <host end>``) so every node reaches the one
  apiserver address; or put a dedicated lab address on the host's ``lo`` (``ip addr add
  10.213.0.1/32 dev lo``) and use that as ``host_ip``, independent of which nodes exist.
* The apiserver reaches kubelets at their ``InternalIP`` (``--kubelet-preferred-address-types``
  puts InternalIP first) and verifies their serving cert against the lab CA
  (``--kubelet-certificate-authority``): use :meth:`ControlPlaneAccess.kubelet_serving_cert`.
"""

from __future__ import annotations

import base64
import json
import ssl
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from rollout.lab.pki import PKI, write_key

SERVICE_IP = "10.0.0.1"


def _safe_name(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in name)


class ControlPlaneAccess:
    """The API server's address and the lab's credentials (a part of ``ControlPlane``)."""

    workdir: Path
    apiserver_port: int
    _node_network_ip: str | None
    _pki: PKI | None

    @property
    def apiserver_host(self) -> str:
        return self._node_network_ip or "127.0.0.1"

    @property
    def apiserver_url(self) -> str:
        return f"https://{self.apiserver_host}:{self.apiserver_port}"

    @property
    def pki_dir(self) -> Path:
        return self.workdir / "pki"

    @property
    def ca_cert(self) -> Path:
        return self.pki.ca_cert_path

    @property
    def pki(self) -> PKI:
        if self._pki is None:
            self._pki = PKI(self.pki_dir)
        return self._pki

    @property
    def kubeconfig(self) -> Path:
        """Admin kubeconfig (``system:masters``)."""
        return self.workdir / "kubeconfigs" / "admin.kubeconfig"

    @property
    def admin_cert(self) -> tuple[Path, Path]:
        return self.pki_dir / "admin.crt", self.pki_dir / "admin.key"

    def write_kubeconfig(
        self,
        user: str,
        groups: Sequence[str] = (),
        *,
        name: str | None = None,
        embed: bool = False,
        server: str | None = None,
    ) -> Path:
        """Issue a client cert for ``user`` in ``groups`` and write a kubeconfig for it.

        ``embed=True`` inlines the CA, cert and key (a self-contained file to copy onto a node);
        ``server`` overrides :attr:`apiserver_url`."""
        stem = _safe_name(name or f"user-{user}")
        cert, key = self.pki.issue(stem, user, organizations=groups, client=True)
        return self._kubeconfig_file(stem, user, cert, key, embed=embed, server=server)

    def node_kubeconfig(
        self, node_name: str, *, embed: bool = True, server: str | None = None
    ) -> Path:
        """Kubeconfig for a lab kubelet: ``system:node:<node_name>`` in group ``system:nodes``
        (self-contained by default)."""
        return self.write_kubeconfig(
            f"system:node:{node_name}",
            ["system:nodes"],
            name=f"node-{node_name}",
            embed=embed,
            server=server,
        )

    def kubelet_serving_cert(self, node_name: str, ip: str) -> tuple[Path, Path]:
        """Serving cert for a lab kubelet (SANs: ``ip`` and ``node_name``), signed by the lab CA,
        which the API server trusts for kubelet connections."""
        return self.pki.issue(
            f"kubelet-serving-{_safe_name(node_name)}",
            f"system:node:{node_name}",
            organizations=["system:nodes"],
            server=True,
            dns=[node_name],
            ips=[ip],
        )

    def _kubeconfig_file(
        self,
        stem: str,
        user: str,
        cert: Path,
        key: Path,
        *,
        embed: bool = False,
        server: str | None = None,
    ) -> Path:
        path = self.workdir / "kubeconfigs" / f"{stem}.kubeconfig"
        path.parent.mkdir(parents=True, exist_ok=True)
        # JSON is valid YAML: client-go, kubectl and the Python client all read it.
        cluster: dict[str, str] = {"server": server or self.apiserver_url}
        creds: dict[str, str]
        if embed:
            cluster["certificate-authority-data"] = b64(self.ca_cert)
            creds = {"client-certificate-data": b64(cert), "client-key-data": b64(key)}
        else:
            cluster["certificate-authority"] = str(self.ca_cert)
            creds = {"client-certificate": str(cert), "client-key": str(key)}
        cfg = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "lab", "cluster": cluster}],
            "users": [{"name": user, "user": creds}],
            "contexts": [{"name": "lab", "context": {"cluster": "lab", "user": user}}],
            "current-context": "lab",
        }
        path.write_text(json.dumps(cfg, indent=2) + "\n")
        return path

    def _issue_certs(self) -> None:
        """The control plane's own certs, kubeconfigs and ServiceAccount key (kept if present)."""
        pki = self.pki
        ips = ["127.0.0.1", SERVICE_IP]
        if self._node_network_ip:
            ips.append(self._node_network_ip)
        pki.issue(
            "apiserver",
            "kube-apiserver",
            server=True,
            ips=ips,
            dns=[
                "localhost",
                "kubernetes",
                "kubernetes.default",
                "kubernetes.default.svc",
                "kubernetes.default.svc.cluster.local",
            ],
        )
        pki.issue(
            "apiserver-kubelet-client",
            "kube-apiserver-kubelet-client",
            organizations=["system:masters"],
            client=True,
        )
        cert, key = pki.issue(
            "admin", "rollout-lab-admin", organizations=["system:masters"], client=True
        )
        self._kubeconfig_file("admin", "rollout-lab-admin", cert, key)
        cert, key = pki.issue(
            "kube-controller-manager", "system:kube-controller-manager", client=True
        )
        self._kubeconfig_file(
            "kube-controller-manager", "system:kube-controller-manager", cert, key
        )
        cert, key = pki.issue("kube-scheduler", "system:kube-scheduler", client=True)
        self._kubeconfig_file("kube-scheduler", "system:kube-scheduler", cert, key)
        # --service-account-key-file gets the public key: the apiserver finds no public key in a
        # PKCS#8 private key block. An existing sa.key is kept (tokens stay valid across restarts).
        sa, sa_pub = pki.dir / "sa.key", pki.dir / "sa.pub"
        sa_key: Any = None
        if sa.exists():
            sa_key = serialization.load_pem_private_key(sa.read_bytes(), None)
        if sa_key is None:
            sa_key = ec.generate_private_key(ec.SECP256R1())
            write_key(sa, sa_key)
        sa_pub.write_bytes(
            sa_key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def ssl_context(self, cert: tuple[Path, Path] | None = None) -> ssl.SSLContext:
        """TLS context trusting the lab CA, presenting ``cert`` (default: admin)."""
        ctx = ssl.create_default_context(cafile=str(self.ca_cert))
        c, k = cert or self.admin_cert
        ctx.load_cert_chain(str(c), str(k))
        return ctx


def b64(path: Path) -> str:
    """Base64 of a file (for embedding certs in kubeconfigs or configs)."""
    return base64.b64encode(path.read_bytes()).decode()
