"""Where each distribution keeps the kubelet's configuration and flags, and how we add our settings.

This is data, not logic: render, lint, the playbooks and the lab all read the same table, so a path
or a service name is written down exactly once. Facts and their sources:
``shared/domain/kubelet.md`` sections 4 and 5, and the fixtures README
("Files that get regenerated").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from rollout.errors import UnknownDistributionError

FlagFormat = Literal["env", "systemd", "k3s-config", "args"]


@dataclass(frozen=True)
class FlagFile:
    """A node file that contributes kubelet command-line flags.

    Attributes:
        path: node path; a trailing ``/*.yaml`` means every such file in the directory,
            in lexical order.
        format: ``env`` (systemd EnvironmentFile ``VAR="--a=b --c"``), ``systemd`` (unit
            drop-in with ``Environment="VAR=..."`` lines), ``k3s-config`` (k3s/RKE2
            config.yaml ``kubelet-arg`` list),
            ``args`` (MicroK8s: one flag per line).
        variables: for ``env``/``systemd``: the variables whose values reach the kubelet's
            command line.
        owner: who writes the file (for messages).
    """

    path: str
    format: FlagFormat
    variables: tuple[str, ...] = ()
    owner: str = ""


@dataclass(frozen=True)
class Regenerated:
    """A node file the distribution rewrites, so a local edit there is lost."""

    path: str
    by: str


@dataclass(frozen=True)
class Distribution:
    """One distribution's kubelet layout.

    Attributes:
        name: the ``--distribution`` value.
        config_file: node path of the ``--config`` KubeletConfiguration file, or None.
        config_format: ``yaml`` or ``json`` (of the config file and of drop-ins we write).
        dropin_dir: the ``--config-dir`` directory (node path), or None.
        dropin_always: whether the distribution always passes ``--config-dir`` (k3s, RKE2).
        flag_files: files holding kubelet flags, in the order their flags reach the command line
            (a later flag wins, as with the kubelet's flag parser).
        regenerated: files the distribution rewrites, and by what.
        methods: ways to add our settings; the first is the default.
        services: systemd units that run the kubelet (server/agent variants).
        root_dir: the kubelet ``--root-dir`` (checkpoint files live there).
        our_dropin: the drop-in file we own (sorts after the distribution's own), or None.
        our_unit_dropin: for kubeadm's ``dropin`` method: the systemd drop-in that adds
            ``--config-dir``.
        upgrades: what survives the distribution's upgrade/re-provisioning, in words (the
            table in docs/distributions.md).
        cgroup_version: the cgroup hierarchy every node of the distribution boots with, when
            the distribution fixes it (EKS AL2: v1); None when it depends on the node.
    """

    name: str
    config_file: str | None
    config_format: Literal["yaml", "json"]
    dropin_dir: str | None
    dropin_always: bool
    flag_files: tuple[FlagFile, ...]
    regenerated: tuple[Regenerated, ...]
    methods: tuple[str, ...]
    services: tuple[str, ...]
    root_dir: str
    our_dropin: str | None
    our_unit_dropin: str | None = None
    nodeadm_file: str | None = None
    upgrades: str = ""
    cgroup_version: int | None = None

    @property
    def default_method(self) -> str:
        return self.methods[0]

    @property
    def cpu_manager_state(self) -> str:
        return f"{self.root_dir}/cpu_manager_state"

    @property
    def memory_manager_state(self) -> str:
        return f"{self.root_dir}/memory_manager_state"

    @property
    def checkpoints(self) -> tuple[str, str]:
        return (self.cpu_manager_state, self.memory_manager_state)

    @property
    def service(self) -> str:
        """The unit restarted by default (the first of ``services``)."""
        return self.services[0]


_KUBEADM_VARS = (
    "KUBELET_KUBECONFIG_ARGS",
    "KUBELET_CONFIG_ARGS",
    "KUBELET_KUBEADM_ARGS",
    "KUBELET_EXTRA_ARGS",
)

KUBEADM = Distribution(
    name="kubeadm",
    config_file="/var/lib/kubelet/config.yaml",
    config_format="yaml",
    dropin_dir="/etc/kubernetes/kubelet.conf.d",
    dropin_always=False,
    flag_files=(
        FlagFile(
            "/usr/lib/systemd/system/kubelet.service.d/10-kubeadm.conf",
            "systemd",
            _KUBEADM_VARS,
            "kubeadm package",
        ),
        FlagFile(
            "/etc/systemd/system/kubelet.service.d/10-kubeadm.conf",
            "systemd",
            _KUBEADM_VARS,
            "kubeadm package (older installs)",
        ),
        FlagFile(
            "/etc/systemd/system/kubelet.service.d/20-rollout.conf",
            "systemd",
            _KUBEADM_VARS,
            "rollout",
        ),
        FlagFile(
            "/var/lib/kubelet/kubeadm-flags.env",
            "env",
            ("KUBELET_KUBEADM_ARGS",),
            "kubeadm init/join",
        ),
        FlagFile(
            "/etc/default/kubelet", "env", ("KUBELET_EXTRA_ARGS",), "the administrator (.deb)"
        ),
        FlagFile(
            "/etc/sysconfig/kubelet", "env", ("KUBELET_EXTRA_ARGS",), "the administrator (.rpm)"
        ),
    ),
    regenerated=(
        Regenerated(
            "/var/lib/kubelet/config.yaml",
            "kubeadm join / kubeadm upgrade node (from ConfigMap kube-system/kubelet-config)",
        ),
        Regenerated("/var/lib/kubelet/kubeadm-flags.env", "kubeadm init / join"),
    ),
    methods=("dropin", "inplace"),
    services=("kubelet",),
    root_dir="/var/lib/kubelet",
    our_dropin="/etc/kubernetes/kubelet.conf.d/90-rollout.conf",
    our_unit_dropin="/etc/systemd/system/kubelet.service.d/20-rollout.conf",
    upgrades=(
        "dropin: both files are ours and survive `kubeadm upgrade` (it rewrites only "
        "config.yaml and "
        "kubeadm-flags.env); inplace: lost on `kubeadm upgrade node` / re-join"
    ),
)

K3S = Distribution(
    name="k3s",
    config_file=None,
    config_format="yaml",
    dropin_dir="/var/lib/rancher/k3s/agent/etc/kubelet.conf.d",
    dropin_always=True,
    flag_files=(
        FlagFile("/etc/rancher/k3s/config.yaml", "k3s-config", (), "the administrator"),
        FlagFile("/etc/rancher/k3s/config.yaml.d/*.yaml", "k3s-config", (), "the administrator"),
    ),
    regenerated=(
        Regenerated(
            "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/00-k3s-defaults.conf",
            "k3s on every start",
        ),
        Regenerated(
            "/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/10-cli-config.conf",
            "k3s on every start (kubelet-arg config=)",
        ),
    ),
    methods=("dropin",),
    services=("k3s", "k3s-agent"),
    root_dir="/var/lib/kubelet",
    our_dropin="/var/lib/rancher/k3s/agent/etc/kubelet.conf.d/90-rollout.conf",
    upgrades="our drop-in survives restarts and upgrades (k3s rewrites only 00-/10-/20- entries)",
)

RKE2 = Distribution(
    name="rke2",
    config_file=None,
    config_format="yaml",
    dropin_dir="/var/lib/rancher/rke2/agent/etc/kubelet.conf.d",
    dropin_always=True,
    flag_files=(
        FlagFile("/etc/rancher/rke2/config.yaml", "k3s-config", (), "the administrator"),
        FlagFile(
            "/etc/rancher/rke2/config.yaml.d/*.yaml",
            "k3s-config",
            (),
            "the administrator / Rancher",
        ),
    ),
    regenerated=(
        Regenerated(
            "/var/lib/rancher/rke2/agent/etc/kubelet.conf.d/00-rke2-defaults.conf",
            "rke2 on every start",
        ),
        Regenerated(
            "/etc/rancher/rke2/config.yaml.d/50-rancher.yaml", "Rancher (provisioned clusters)"
        ),
    ),
    methods=("dropin",),
    services=("rke2-server", "rke2-agent"),
    root_dir="/var/lib/kubelet",
    our_dropin="/var/lib/rancher/rke2/agent/etc/kubelet.conf.d/90-rollout.conf",
    upgrades=(
        "our drop-in survives restarts and upgrades (RKE2 rewrites only 00-rke2-defaults.conf)"
    ),
)

EKS_AL2 = Distribution(
    name="eks-al2",
    config_file="/etc/kubernetes/kubelet/kubelet-config.json",
    config_format="json",
    dropin_dir=None,
    dropin_always=False,
    flag_files=(
        FlagFile(
            "/etc/systemd/system/kubelet.service.d/10-kubelet-args.conf",
            "systemd",
            ("KUBELET_ARGS",),
            "bootstrap.sh",
        ),
        FlagFile(
            "/etc/systemd/system/kubelet.service.d/30-kubelet-extra-args.conf",
            "systemd",
            ("KUBELET_EXTRA_ARGS",),
            "bootstrap.sh --kubelet-extra-args",
        ),
    ),
    regenerated=(
        Regenerated(
            "/etc/kubernetes/kubelet/kubelet-config.json",
            "bootstrap.sh when user data runs (new instances)",
        ),
    ),
    methods=("inplace",),
    services=("kubelet",),
    root_dir="/var/lib/kubelet",
    our_dropin=None,
    # Amazon Linux 2 boots the cgroup v1 hierarchy (and EKS publishes no AL2 AMIs for 1.33+)
    cgroup_version=1,
    upgrades=(
        "in-place edit lasts for the instance's life; replacement instances need it in the "
        "launch template"
    ),
)

EKS_AL2023 = Distribution(
    name="eks-al2023",
    config_file="/etc/kubernetes/kubelet/config.json",
    config_format="json",
    dropin_dir="/etc/kubernetes/kubelet/config.json.d",
    dropin_always=False,
    flag_files=(
        FlagFile("/etc/eks/kubelet/environment", "env", ("NODEADM_KUBELET_ARGS",), "nodeadm"),
    ),
    regenerated=(
        Regenerated("/etc/kubernetes/kubelet/config.json", "nodeadm on every boot"),
        Regenerated(
            "/etc/kubernetes/kubelet/config.json.d/40-nodeadm.conf", "nodeadm on every boot"
        ),
        Regenerated("/etc/eks/kubelet/environment", "nodeadm on every boot"),
    ),
    methods=("dropin", "nodeconfig"),
    services=("kubelet",),
    root_dir="/var/lib/kubelet",
    our_dropin="/etc/kubernetes/kubelet/config.json.d/90-rollout.conf",
    nodeadm_file="/etc/eks/nodeadm.d/90-rollout.yaml",
    upgrades=(
        "dropin: effective at once, needs --config-dir (nodeadm passes it when "
        "spec.kubelet.config is non-empty); nodeconfig: also writes "
        "/etc/eks/nodeadm.d/90-rollout.yaml so nodeadm keeps it on reboot"
    ),
)

KUBESPRAY = Distribution(
    name="kubespray",
    config_file="/etc/kubernetes/kubelet-config.yaml",
    config_format="yaml",
    dropin_dir=None,
    dropin_always=False,
    flag_files=(FlagFile("/etc/kubernetes/kubelet.env", "env", ("KUBELET_ARGS",), "kubespray"),),
    regenerated=(
        Regenerated("/etc/kubernetes/kubelet-config.yaml", "every kubespray playbook run"),
        Regenerated("/etc/kubernetes/kubelet.env", "every kubespray playbook run"),
    ),
    methods=("inplace",),
    services=("kubelet",),
    root_dir="/var/lib/kubelet",
    our_dropin=None,
    upgrades=(
        "lost on the next kubespray run unless the inventory sets the same values (kubelet_* vars)"
    ),
)

MICROK8S = Distribution(
    name="microk8s",
    config_file=None,
    config_format="yaml",
    dropin_dir=None,
    dropin_always=False,
    flag_files=(
        FlagFile(
            "/var/snap/microk8s/current/args/kubelet", "args", (), "MicroK8s / the administrator"
        ),
    ),
    regenerated=(),
    methods=("flags",),
    services=("snap.microk8s.daemon-kubelite",),
    root_dir="/var/snap/microk8s/common/var/lib/kubelet",
    our_dropin=None,
    upgrades="the args file persists across snap refreshes (deprecated flags are removed on start)",
)

#: Units whose restart restarts the control plane too: the k3s server and RKE2 server run the
#: kubelet in one process with the API server, scheduler and controller manager (and embedded
#: etcd); MicroK8s runs every component in kubelite. Restarting "the kubelet" restarts them all.
CONTROL_PLANE_UNITS: dict[str, str] = {
    "k3s": "the k3s server (API server, scheduler, controller manager, embedded etcd or kine)",
    "rke2-server": "the RKE2 server (its kubelet starts the control-plane static pods and etcd)",
    "snap.microk8s.daemon-kubelite": (
        "kubelite, which runs every MicroK8s component (API server, scheduler, controller "
        "manager, proxy)"
    ),
}

DISTRIBUTIONS: dict[str, Distribution] = {
    d.name: d for d in (KUBEADM, K3S, RKE2, EKS_AL2, EKS_AL2023, KUBESPRAY, MICROK8S)
}

# MicroK8s args use snap variables; these are their values on a node.
SNAP_VARS = {
    "SNAP_DATA": "/var/snap/microk8s/current",
    "SNAP_COMMON": "/var/snap/microk8s/common",
    "SNAP": "/snap/microk8s/current",
}


def get(name: str | Distribution) -> Distribution:
    """Look a distribution up by name.

    Raises:
        UnknownDistributionError: naming the valid choices.
    """
    if isinstance(name, Distribution):
        return name
    try:
        return DISTRIBUTIONS[name]
    except KeyError:
        valid = ", ".join(sorted(DISTRIBUTIONS))
        raise UnknownDistributionError(f"unknown distribution {name!r}; valid: {valid}") from None
