"""The files a lab node starts with, laid out as each distribution lays them out on a real node.

The tool edits kubelet configuration *where the distribution keeps it*, so a lab node must carry the
same files at the same paths: the KubeletConfiguration file, drop-in directories, flag and
environment files, and the service unit with its drop-ins. The contents are written here (our own
text, in each writer's format: sigs.k8s.io/yaml sorted keys for kubeadm/k3s/RKE2, jq-style JSON for
EKS AL2, Go ``MarshalIndent`` JSON without trailing newline for nodeadm, Jinja-style YAML for
kubespray, one flag per line for MicroK8s); facts such as paths, unit names and flag variables
follow the real distributions (provenance: ``tests/fixtures/kubelet/README.md``).

Nothing here does I/O: :func:`seed_files` returns ``{node path: content}`` and the lab writes it.
"""

from __future__ import annotations

import json
import re
import zlib
from dataclasses import dataclass

DISTRIBUTIONS = ("kubeadm", "k3s", "rke2", "eks-al2", "eks-al2023", "microk8s", "kubespray")


@dataclass(frozen=True)
class SeedContext:
    """Node-specific values that appear inside the seeded files."""

    node_name: str
    node_ip: str
    kubeconfig: str
    ca_pem: str


@dataclass(frozen=True)
class DistroLayout:
    """Where a distribution keeps the kubelet's pieces on a node."""

    name: str
    unit: str
    unit_path: str
    drop_ins: tuple[str, ...]
    kubeconfig_path: str
    ca_path: str
    root_dir: str = "/var/lib/kubelet"


LAYOUTS: dict[str, DistroLayout] = {
    "kubeadm": DistroLayout(
        "kubeadm",
        "kubelet",
        "/usr/lib/systemd/system/kubelet.service",
        ("/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",),
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/pki/ca.crt",
    ),
    "kubespray": DistroLayout(
        "kubespray",
        "kubelet",
        "/etc/systemd/system/kubelet.service",
        (),
        "/etc/kubernetes/kubelet.conf",
        "/etc/kubernetes/ssl/ca.crt",
    ),
    "k3s": DistroLayout(
        "k3s",
        "k3s",
        "/etc/systemd/system/k3s.service",
        (),
        "/var/lib/rancher/k3s/agent/kubelet.kubeconfig",
        "/var/lib/rancher/k3s/agent/client-ca.crt",
    ),
    "rke2": DistroLayout(
        "rke2",
        "rke2-server",
        "/usr/lib/systemd/system/rke2-server.service",
        (),
        "/var/lib/rancher/rke2/agent/kubelet.kubeconfig",
        "/var/lib/rancher/rke2/agent/client-ca.crt",
    ),
    "eks-al2": DistroLayout(
        "eks-al2",
        "kubelet",
        "/etc/systemd/system/kubelet.service",
        (
            "/etc/systemd/system/kubelet.service.d/10-kubelet-args.conf",
            "/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf",
        ),
        "/var/lib/kubelet/kubeconfig",
        "/etc/kubernetes/pki/ca.crt",
    ),
    "eks-al2023": DistroLayout(
        "eks-al2023",
        "kubelet",
        "/etc/systemd/system/kubelet.service",
        (),
        "/var/lib/kubelet/kubeconfig",
        "/etc/kubernetes/pki/ca.crt",
    ),
    "microk8s": DistroLayout(
        "microk8s",
        "snap.microk8s.daemon-kubelite",
        "/etc/systemd/system/snap.microk8s.daemon-kubelite.service",
        (),
        "/var/snap/microk8s/current/credentials/kubelet.config",
        "/var/snap/microk8s/current/certs/ca.crt",
        "/var/snap/microk8s/common/var/lib/kubelet",
    ),
}


def _kubelet_yaml(client_ca: str, cluster_dns: str, extra: str = "", fail_v1: str = "") -> str:
    """A KubeletConfiguration as sigs.k8s.io/yaml writes it (keys sorted, lists not indented);
    ``fail_v1``: a ``failCgroupV1: false`` line (:func:`lab_fail_cgroup_v1`)."""
    return f"""apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 0s
    enabled: true
  x509:
    clientCAFile: {client_ca}
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 0s
    cacheUnauthorizedTTL: 0s
cgroupDriver: systemd
clusterDNS:
- {cluster_dns}
clusterDomain: cluster.local
containerRuntimeEndpoint: ""
cpuManagerReconcilePeriod: 0s
{extra}evictionPressureTransitionPeriod: 0s
{fail_v1}fileCheckFrequency: 0s
healthzBindAddress: 127.0.0.1
healthzPort: 10248
httpCheckFrequency: 0s
imageMaximumGCAge: 0s
imageMinimumGCAge: 0s
kind: KubeletConfiguration
logging:
  flushFrequency: 0
  options:
    json:
      infoBufferSize: "0"
    text:
      infoBufferSize: "0"
  verbosity: 0
memorySwap: {{}}
nodeStatusReportFrequency: 0s
nodeStatusUpdateFrequency: 0s
resolvConf: /run/systemd/resolve/resolv.conf
rotateCertificates: true
runtimeRequestTimeout: 0s
shutdownGracePeriod: 0s
shutdownGracePeriodCriticalPods: 0s
staticPodPath: /etc/kubernetes/manifests
streamingConnectionIdleTimeout: 0s
syncFrequency: 0s
volumeStatsAggPeriod: 0s
"""


def _rancher_defaults(program: str, cluster_dns: str, fail_v1: str = "") -> str:
    base = f"/var/lib/rancher/{program}/agent"
    return f"""address: 0.0.0.0
apiVersion: kubelet.config.k8s.io/v1beta1
authentication:
  anonymous:
    enabled: false
  webhook:
    cacheTTL: 2m0s
    enabled: true
  x509:
    clientCAFile: {base}/client-ca.crt
authorization:
  mode: Webhook
  webhook:
    cacheAuthorizedTTL: 5m0s
    cacheUnauthorizedTTL: 30s
cgroupDriver: systemd
clusterDNS:
- {cluster_dns}
clusterDomain: cluster.local
containerRuntimeEndpoint: unix:///run/k3s/containerd/containerd.sock
cpuManagerReconcilePeriod: 10s
evictionHard:
  imagefs.available: 5%
  nodefs.available: 5%
evictionPressureTransitionPeriod: 5m0s
{fail_v1}failSwapOn: false
fileCheckFrequency: 20s
healthzBindAddress: 127.0.0.1
httpCheckFrequency: 20s
kind: KubeletConfiguration
nodeStatusReportFrequency: 5m0s
nodeStatusUpdateFrequency: 10s
resolvConf: /etc/resolv.conf
runtimeRequestTimeout: 2m0s
serializeImagePulls: false
staticPodPath: {base}/pod-manifests
streamingConnectionIdleTimeout: 4h0m0s
syncFrequency: 1m0s
tlsCertFile: {base}/serving-kubelet.crt
tlsPrivateKeyFile: {base}/serving-kubelet.key
volumeStatsAggPeriod: 1m0s
"""


def _unit(description: str, exec_start: str, extra: str = "", restart_sec: int = 10) -> str:
    return f"""[Unit]
Description={description}
Wants=network-online.target
After=network-online.target

[Service]
{extra}ExecStart={exec_start}
Restart=always
StartLimitInterval=0
RestartSec={restart_sec}

[Install]
WantedBy=multi-user.target
"""


# The fields both EKS AMIs' bootstrap writes the same way (AL2 bootstrap.sh, AL2023 nodeadm).
_EKS_COMMON: dict[str, object] = {
    "kind": "KubeletConfiguration",
    "apiVersion": "kubelet.config.k8s.io/v1beta1",
    "address": "0.0.0.0",
    "authentication": {
        "anonymous": {"enabled": False},
        "webhook": {"cacheTTL": "2m0s", "enabled": True},
        "x509": {"clientCAFile": "/etc/kubernetes/pki/ca.crt"},
    },
    "authorization": {
        "mode": "Webhook",
        "webhook": {"cacheAuthorizedTTL": "5m0s", "cacheUnauthorizedTTL": "30s"},
    },
    "clusterDomain": "cluster.local",
    "hairpinMode": "hairpin-veth",
    "readOnlyPort": 0,
    "cgroupDriver": "systemd",
    "cgroupRoot": "/",
    "featureGates": {"RotateKubeletServerCertificate": True},
    "protectKernelDefaults": True,
    "serializeImagePulls": False,
    "serverTLSBootstrap": True,
}


def lab_fail_cgroup_v1(kubelet_version: str | None) -> bool:
    """Whether a lab node's files set ``failCgroupV1: false``: for kubelets 1.35 and later
    (``None``: the lab's own version, 1.36). The lab machine boots cgroup v1 and since 1.35 the
    kubelet refuses it unless told not to (#134298); the facts module reports the node's cgroup
    version, so lint and preflight would refuse every lab node without it. This is the lab's
    setting, as on any cgroup v1 host, not the distribution's default file (EKS AL2's has it
    for the same reason)."""
    m = re.match(r"v?1\.(\d+)", kubelet_version or "v1.36")
    return not m or int(m.group(1)) >= 35


def seed_files(
    distribution: str, ctx: SeedContext, kubelet_version: str | None = None
) -> dict[str, str]:
    """``{absolute node path: content}`` for a fresh node of ``distribution`` running
    ``kubelet_version`` (``None``: the lab's own; decides :func:`lab_fail_cgroup_v1`).

    Raises:
        KeyError: unknown distribution (callers validate names first).
    """
    fail_v1 = lab_fail_cgroup_v1(kubelet_version)
    yaml_v1 = "failCgroupV1: false\n" if fail_v1 else ""
    lay = LAYOUTS[distribution]
    files: dict[str, str] = {lay.kubeconfig_path: ctx.kubeconfig, lay.ca_path: ctx.ca_pem}
    if distribution == "kubeadm":
        files |= {
            "/var/lib/kubelet/config.yaml": _kubelet_yaml(
                "/etc/kubernetes/pki/ca.crt", "10.96.0.10", fail_v1=yaml_v1
            ),
            "/var/lib/kubelet/kubeadm-flags.env": (
                'KUBELET_KUBEADM_ARGS="--container-runtime-endpoint='
                "unix:///var/run/containerd/containerd.sock "
                '--pod-infra-container-image=registry.k8s.io/pause:3.10"\n'
            ),
            "/etc/default/kubelet": "KUBELET_EXTRA_ARGS=\n",
            lay.unit_path: _unit("kubelet: The Kubernetes Node Agent", "/usr/bin/kubelet"),
            lay.drop_ins[0]: (
                "# Note: This dropin only works with kubeadm and kubelet v1.11+\n"
                "[Service]\n"
                'Environment="KUBELET_KUBECONFIG_ARGS=--bootstrap-kubeconfig='
                "/etc/kubernetes/bootstrap-kubelet.conf "
                '--kubeconfig=/etc/kubernetes/kubelet.conf"\n'
                'Environment="KUBELET_CONFIG_ARGS=--config=/var/lib/kubelet/config.yaml"\n'
                "EnvironmentFile=-/var/lib/kubelet/kubeadm-flags.env\n"
                "EnvironmentFile=-/etc/default/kubelet\n"
                "ExecStart=\n"
                "ExecStart=/usr/bin/kubelet $KUBELET_KUBECONFIG_ARGS $KUBELET_CONFIG_ARGS "
                "$KUBELET_KUBEADM_ARGS $KUBELET_EXTRA_ARGS\n"
            ),
        }
    elif distribution == "kubespray":
        files |= {
            "/etc/kubernetes/kubelet-config.yaml": (
                "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n"
                'nodeStatusUpdateFrequency: "10s"\nfailSwapOn: True\nauthentication:\n'
                "  anonymous:\n    enabled: false\n  webhook:\n    enabled: True\n  x509:\n"
                "    clientCAFile: /etc/kubernetes/ssl/ca.crt\nauthorization:\n  mode: Webhook\n"
                # kubespray's template writes kubelet_fail_cgroup_v1 here, as a Python bool
                + ("failCgroupV1: False\n" if fail_v1 else "")
                + "staticPodPath: /etc/kubernetes/manifests\ncgroupDriver: systemd\n"
                "containerLogMaxFiles: 5\ncontainerLogMaxSize: 10Mi\nmaxPods: 110\n"
                f"address: {ctx.node_ip}\nreadOnlyPort: 0\nhealthzPort: 10248\n"
                "healthzBindAddress: 127.0.0.1\nkubeletCgroups: /system.slice/kubelet.service\n"
                "clusterDomain: cluster.local\nprotectKernelDefaults: true\n"
                "rotateCertificates: true\nclusterDNS:\n- 169.254.25.10\nkubeReserved:\n"
                '  cpu: "100m"\n  memory: 256Mi\nsystemReserved:\n  cpu: "500m"\n'
                '  memory: 512Mi\nresolvConf: "/run/systemd/resolve/resolv.conf"\n'
            ),
            "/etc/kubernetes/kubelet.env": (
                'KUBE_LOGTOSTDERR="--logtostderr=true"\nKUBE_LOG_LEVEL="--v=2"\n'
                f'KUBELET_ADDRESS="--node-ip={ctx.node_ip}"\n'
                f'KUBELET_HOSTNAME="--hostname-override={ctx.node_name}"\n'
                'KUBELET_ARGS="--bootstrap-kubeconfig=/etc/kubernetes/bootstrap-kubelet.conf '
                "--config=/etc/kubernetes/kubelet-config.yaml "
                "--kubeconfig=/etc/kubernetes/kubelet.conf "
                '--container-runtime-endpoint=unix:///var/run/containerd/containerd.sock"\n'
            ),
            lay.unit_path: _unit(
                "Kubernetes Kubelet Server",
                "/usr/local/bin/kubelet $KUBE_LOGTOSTDERR $KUBE_LOG_LEVEL $KUBELET_API_SERVER "
                "$KUBELET_ADDRESS $KUBELET_PORT $KUBELET_HOSTNAME $KUBELET_ARGS",
                "EnvironmentFile=-/etc/kubernetes/kubelet.env\n",
            ),
        }
    elif distribution in ("k3s", "rke2"):
        dns = "10.43.0.10"
        rancher = f"/var/lib/rancher/{distribution}"
        binary = "/usr/local/bin/k3s server" if distribution == "k3s" else "/usr/bin/rke2 server"
        files |= {
            f"/etc/rancher/{distribution}/config.yaml": (
                f"node-ip: {ctx.node_ip}\nnode-name: {ctx.node_name}\n"
                "kubelet-arg:\n- max-pods=110\n"
            ),
            f"{rancher}/agent/etc/kubelet.conf.d/00-{distribution}-defaults.conf": (
                _rancher_defaults(distribution, dns, yaml_v1)
            ),
            lay.unit_path: _unit(
                "Lightweight Kubernetes"
                if distribution == "k3s"
                else "Rancher Kubernetes Engine v2 (server)",
                binary,
                f"EnvironmentFile=-/etc/default/{lay.unit}\nEnvironmentFile=-/etc/sysconfig/{lay.unit}\n",
                restart_sec=5,
            ),
        }
    elif distribution == "eks-al2":
        cfg = {
            **_EKS_COMMON,
            "tlsCipherSuites": ["TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256"],
            "clusterDNS": ["10.100.0.10"],
            "maxPods": 58,
            "evictionHard": {"memory.available": "100Mi", "nodefs.available": "10%"},
            "kubeReserved": {"cpu": "310m", "ephemeral-storage": "1Gi", "memory": "9902Mi"},
            "systemReservedCgroup": "/system",
            "kubeReservedCgroup": "/runtime",
            # AL2 boots cgroup v1, and since 1.35 the kubelet refuses it unless told not to
            # (failCgroupV1 defaults to true): an AL2 node on the lab's kubelet needs this line,
            # and lint / preflight refuse the node without it
            "failCgroupV1": False,
        }
        files |= {
            "/etc/kubernetes/kubelet/kubelet-config.json": json.dumps(cfg, indent=2) + "\n",
            lay.unit_path: _unit(
                "Kubernetes Kubelet",
                "/usr/bin/kubelet $KUBELET_ARGS $KUBELET_EXTRA_ARGS",
                "ExecStartPre=/sbin/iptables -P FORWARD ACCEPT -w 5\n",
                restart_sec=5,
            ),
            lay.drop_ins[0]: (
                "[Service]\nEnvironment='KUBELET_ARGS=--node-ip="
                f"{ctx.node_ip} --pod-infra-container-image=602401143452.dkr.ecr.us-west-2"
                ".amazonaws.com/eks/pause:3.5 --v=2 --hostname-override="
                f"{ctx.node_name} --cloud-provider=external "
                "--container-runtime-endpoint=unix:///run/containerd/containerd.sock'\n"
            ),
            lay.drop_ins[1]: (
                "[Service]\nEnvironment='KUBELET_EXTRA_ARGS="
                "--node-labels=eks.amazonaws.com/nodegroup=gpu'\n"
            ),
        }
    elif distribution == "eks-al2023":
        cfg = {
            **_EKS_COMMON,
            "containerRuntimeEndpoint": "unix:///run/containerd/containerd.sock",
            "kubeReserved": {"cpu": "70m", "ephemeral-storage": "1Gi", "memory": "9902Mi"},
            "systemReservedCgroup": "/system",
            "kubeReservedCgroup": "/runtime",
            "providerID": f"aws:///us-west-2a/i-0{zlib.crc32(ctx.node_name.encode()):016x}",
        }
        if fail_v1:
            cfg["failCgroupV1"] = False
        files |= {
            "/etc/kubernetes/kubelet/config.json": json.dumps(cfg, indent=4),
            "/etc/kubernetes/kubelet/config.json.d/40-nodeadm.conf": json.dumps(
                {
                    "apiVersion": "kubelet.config.k8s.io/v1beta1",
                    "clusterDNS": ["10.100.0.10"],
                    "kind": "KubeletConfiguration",
                    "maxPods": 58,
                },
                indent=4,
                sort_keys=True,
            ),
            "/etc/eks/kubelet/environment": (
                f'NODEADM_KUBELET_ARGS="--node-ip={ctx.node_ip} '
                f"--hostname-override={ctx.node_name} "
                "--cloud-provider=external --config=/etc/kubernetes/kubelet/config.json "
                "--config-dir=/etc/kubernetes/kubelet/config.json.d "
                '--kubeconfig=/var/lib/kubelet/kubeconfig"\n'
            ),
            lay.unit_path: _unit(
                "Kubernetes Kubelet",
                "/usr/bin/kubelet $NODEADM_KUBELET_ARGS",
                "EnvironmentFile=/etc/eks/kubelet/environment\n",
                restart_sec=5,
            ),
        }
    elif distribution == "microk8s":
        files |= {
            "/var/snap/microk8s/current/args/kubelet": (
                "--resolv-conf=/run/systemd/resolve/resolv.conf\n"
                "--kubeconfig=${SNAP_DATA}/credentials/kubelet.config\n"
                "--cert-dir=${SNAP_DATA}/certs\n"
                "--client-ca-file=${SNAP_DATA}/certs/ca.crt\n"
                "--anonymous-auth=false\n"
                "--root-dir=${SNAP_COMMON}/var/lib/kubelet\n"
                "--fail-swap-on=false\n"
                '--eviction-hard="memory.available<100Mi,nodefs.available<1Gi,imagefs.available<1Gi"\n'
                "--container-runtime-endpoint=${SNAP_COMMON}/run/containerd.sock\n"
                "--containerd=${SNAP_COMMON}/run/containerd.sock\n"
                '--node-labels="microk8s.io/cluster=true"\n'
                "--authentication-token-webhook=true\n"
                "--read-only-port=0\n"
                "--serialize-image-pulls=false\n"
                "--cluster-domain=cluster.local\n"
                "--cluster-dns=10.152.183.10\n" + ("--fail-cgroupv1=false\n" if fail_v1 else "")
            ),
            "/var/snap/microk8s/common/var/lib/kubelet/.keep": "",
            lay.unit_path: _unit(
                "Service for snap application microk8s.daemon-kubelite",
                "/usr/bin/snap run microk8s.daemon-kubelite",
                "EnvironmentFile=-/etc/environment\n",
                restart_sec=10,
            ),
        }
    else:  # pragma: no cover - guarded by LAYOUTS lookup above
        raise KeyError(distribution)
    return files
