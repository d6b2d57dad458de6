"""``rollout lab``: a local cluster with a real control plane and SSH nodes.

Thin commands over :class:`rollout.lab.cluster.Lab`; the lab's state file lets ``down``,
``status``, ``env`` and ``fault`` act on a lab that another process started.
"""

from __future__ import annotations

import json
import shlex
import time
from pathlib import Path

import click

from rollout.cli.options import output_option
from rollout.errors import LabError
from rollout.lab.cluster import Lab
from rollout.lab.daemonsets import DEFAULT_LABELS
from rollout.lab.realnode import KUBELET_VERSIONS
from rollout.lab.seeds import DISTRIBUTIONS

name_option = click.option(
    "--name", default="default", show_default=True, help="Lab name (several labs can coexist)."
)
workdir_option = click.option(
    "--workdir",
    type=click.Path(file_okay=False, path_type=Path),
    help="Lab directory (default: $ROLLOUT_LAB_DIR or ~/.cache/rollout-lab/labs/NAME).",
)


def _progress(msg: str) -> None:
    click.echo(f"[lab {time.strftime('%H:%M:%S')}] {msg}", err=True)


def _distributions(values: tuple[str, ...]) -> list[str]:
    out = [d.strip() for v in values for d in v.split(",") if d.strip()] or ["kubeadm"]
    bad = [d for d in out if d not in DISTRIBUTIONS]
    if bad:
        raise click.BadParameter(
            f"unknown distribution {bad[0]!r}; valid: {', '.join(DISTRIBUTIONS)}",
            param_hint="--distribution",
        )
    return out


@click.group("lab")
def lab() -> None:
    """A local cluster: real kube-apiserver, etcd, controller-manager and scheduler, plus nodes
    that are network + mount namespaces with a real sshd and a lab kubelet.

    \b
    Examples:
      rollout lab up --nodes 4 --distribution kubeadm,k3s
      eval "$(rollout lab env)"
      rollout lab status -o json
      rollout lab fault kubelet-stop default-node2
      rollout lab down
    """


@lab.command("up")
@click.option("--nodes", "count", type=click.IntRange(1, 200), default=4, show_default=True)
@click.option(
    "--distribution",
    "-d",
    "dists",
    multiple=True,
    help=f"Node distribution, repeatable or comma-separated, assigned round-robin "
    f"({', '.join(DISTRIBUTIONS)}; default kubeadm).",
)
@click.option(
    "--monitoring",
    is_flag=True,
    help="Also run Prometheus, Alertmanager and `rollout serve` (tools/build-monitoring-"
    "binaries.sh builds them once): the kubelets' rejections alert and roll back.",
)
@click.option(
    "--kubelet",
    type=click.Choice(["sim", "real"]),
    default=None,
    help="Which kubelet the nodes run: the simulation (default), or the real kubelet binary "
    "against a fake container runtime (built once per version; docs/lab-real-kubelet.md).",
)
@click.option(
    "--kubelet-version",
    metavar="MINOR",
    default=None,
    help=f"The kubelet's version ({', '.join(KUBELET_VERSIONS)}; implies --kubelet real unless "
    "--kubelet sim; default: the control plane's). A real kubelet is built once per version and "
    "one newer than the control plane is refused (version skew policy); the simulated kubelet "
    "plays that version's start-up checks and checkpoint files, 1.37 included.",
)
@click.option(
    "--gpu-path",
    type=click.Choice(["device-plugin", "dra"]),
    default="device-plugin",
    show_default=True,
    help="Real-kubelet nodes: the GPU allocation path they start on, by their labels (the "
    "device plugin, or the real DRA driver gpu.example.com); relabel a node to move it "
    "(docs/lab-real-kubelet.md).",
)
@click.option(
    "--device-plugin-label",
    metavar="KEY",
    default=DEFAULT_LABELS["device-plugin"],
    show_default=True,
    help="Real-kubelet nodes run the device plugin while labelled KEY=true.",
)
@click.option(
    "--dra-label",
    metavar="KEY",
    default=DEFAULT_LABELS["dra-driver"],
    show_default=True,
    help="Real-kubelet nodes run the DRA driver while labelled KEY=true.",
)
@click.option(
    "--kwok-nodes",
    type=click.IntRange(min=0),
    default=0,
    show_default=True,
    help="Also create this many kwok Nodes (not in the inventory; tainted and labelled "
    "rollout.dev/kwok=NAME), each with a Deployment of --kwok-pods-per-node pods, and run kwok "
    "(tools/build-lab-kwok.sh builds it once) as their kubelet.",
)
@click.option(
    "--kwok-pods-per-node",
    type=click.IntRange(0, 110),
    default=10,
    show_default=True,
    help="Pods on each kwok Node (one Deployment per Node, namespace rollout-kwok).",
)
@name_option
@workdir_option
@output_option
def up(
    count: int,
    dists: tuple[str, ...],
    monitoring: bool,
    kubelet: str | None,
    kubelet_version: str | None,
    gpu_path: str,
    device_plugin_label: str,
    dra_label: str,
    kwok_nodes: int,
    kwok_pods_per_node: int,
    name: str,
    workdir: Path | None,
    output: str,
) -> None:
    """Build or reuse the binaries, start the control plane and nodes, wait until Ready.

    With --monitoring, Prometheus scrapes every kubelet through the API server's node proxy
    and evaluates rollout's alert rules every 2 s; Alertmanager posts the alerts labelled
    rollout="rollback" to `rollout serve` (bearer token in LAB_DIR/monitoring/serve-token),
    which rolls back the change owning the alert's node (journals in $ROLLOUT_STATE_DIR).

    \b
    Examples:
      rollout lab up --nodes 4 --distribution kubeadm,k3s
      rollout lab up --nodes 2 --name ci -o json | jq -r .kubeconfig
      rollout lab up --nodes 4 --monitoring && eval "$(rollout lab env)"
      rollout lab up --nodes 2 --kubelet real
      rollout lab up --nodes 2 --kubelet real --gpu-path dra --name dra
      rollout lab up --nodes 1 --kubelet-version 1.35 --name skew
      rollout lab up --nodes 1 --kubelet sim --kubelet-version 1.37 --name sim137
      rollout lab up --nodes 3 --kwok-nodes 500 --name big
    """
    t0 = time.monotonic()
    if kubelet is None:
        kubelet = "real" if kubelet_version else "sim"
    lab_ = Lab(name, workdir)
    lab_.up(
        count,
        _distributions(dists),
        progress=_progress,
        monitoring=monitoring,
        kubelet=kubelet,
        kubelet_version=kubelet_version,
        kwok_nodes=kwok_nodes,
        kwok_pods_per_node=kwok_pods_per_node,
        path=gpu_path,
        path_labels={"device-plugin": device_plugin_label, "dra-driver": dra_label},
    )
    seconds = time.monotonic() - t0
    _progress(f"lab {name} up in {seconds:.1f}s; {lab_.dir}")
    if output == "json":
        doc = {"name": name, "dir": str(lab_.dir), "seconds": round(seconds, 1)}
        doc.update({k: str(v) for k, v in _paths(lab_).items()})
        doc.update(_monitoring_env(lab_))
        if lab_.kwok is not None:
            doc["kwok"] = lab_.kwok.to_dict()
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"inventory: {lab_.inventory}\nkubeconfig: {lab_.kubeconfig}\nplan: {lab_.plan}")
    for k, v in _monitoring_env(lab_).items():
        click.echo(f"{k}: {v}")
    click.echo(f'next: eval "$(rollout lab env --name {name})"')


def _paths(lab_: Lab) -> dict[str, Path]:
    return {"kubeconfig": lab_.kubeconfig, "inventory": lab_.inventory, "plan": lab_.plan}


def _monitoring_env(lab_: Lab) -> dict[str, str]:
    """The monitoring URLs, and the state dir `rollout serve` reads (so apply writes there)."""
    m = lab_.monitoring
    if m is None:
        return {}
    env = {
        "PROMETHEUS_URL": m.prometheus_url,
        "ALERTMANAGER_URL": m.alertmanager_url,
        "ROLLOUT_SERVE_URL": m.serve_url,
        "ROLLOUT_STATE_DIR": m.state_dir,
    }
    if m.serve_ca:
        env["ROLLOUT_SERVE_CA"] = m.serve_ca  # curl --cacert "$ROLLOUT_SERVE_CA" ...
    return env


@lab.command("down")
@name_option
@workdir_option
@click.option(
    "--keep",
    is_flag=True,
    help="Keep the lab's state (etcd data, certificates, keys, logs): the next `lab up` of "
    "the same name reuses it and says so.",
)
@output_option
def down(name: str, workdir: Path | None, keep: bool, output: str) -> None:
    """Stop every process, mount and namespace of the lab and remove its state (etcd data
    included), so the next `lab up` of the same name starts empty.

    \b
    Examples:
      rollout lab down
      rollout lab down --keep           # the next `lab up` reuses etcd's data
      rollout lab down --name ci -o json
    """
    lab_ = Lab.attach(name, workdir)
    lab_.down(keep=keep)
    if output == "json":
        click.echo(json.dumps({"name": name, "down": True, "kept": keep, "dir": str(lab_.dir)}))
        return
    click.echo(f"lab {name} is down" + (f"; its state is kept in {lab_.dir}" if keep else ""))


@lab.command("status")
@name_option
@workdir_option
@output_option
def status(name: str, workdir: Path | None, output: str) -> None:
    """Nodes, Ready, sshd and kubelet unit state (and monitoring health, when it runs).

    \b
    Examples:
      rollout lab status
      rollout lab status -o json | jq '.nodes[] | select(.ready != "True")'
    """
    lab_ = Lab.attach(name, workdir)
    rows = lab_.machines.node_status()
    api_ok = False
    if lab_.cp is not None:
        try:
            api_ok = lab_.cp.request("GET", "/readyz", timeout=3)[0] == 200
        except OSError:
            api_ok = False
    mon_health: dict[str, bool] | None = None
    if lab_.monitoring is not None:
        from rollout.lab.monitoring import health

        mon_health = health(lab_.monitoring)
    kwok_doc = _kwok_status(lab_) if lab_.kwok is not None else None
    if output == "json":
        doc: dict[str, object] = {"name": name, "dir": str(lab_.dir), "apiserver": api_ok}
        if mon_health is not None:
            doc["monitoring"] = {**mon_health, **_monitoring_env(lab_)}
        if kwok_doc is not None:
            doc["kwok"] = kwok_doc
        doc["nodes"] = rows
        click.echo(json.dumps(doc, indent=2))
        return
    click.echo(f"lab {name} ({lab_.dir}): kube-apiserver {'ready' if api_ok else 'NOT ready'}")
    if mon_health is not None:
        assert lab_.monitoring is not None
        urls = {
            "prometheus": lab_.monitoring.prometheus_url,
            "alertmanager": lab_.monitoring.alertmanager_url,
            "serve": lab_.monitoring.serve_url,
        }
        click.echo(
            "monitoring: "
            + ", ".join(
                f"{k} {'ready' if ok else 'NOT ready'} ({urls[k]})" for k, ok in mon_health.items()
            )
        )
    if kwok_doc is not None:
        click.echo(
            f"kwok: {'running' if kwok_doc['running'] else 'NOT running'} (pid {kwok_doc['pid']}), "
            f"{kwok_doc['ready']}/{kwok_doc['nodes']} Nodes Ready, "
            f"{kwok_doc['podsPerNode']} pod(s) per Node"
        )
    click.echo(f"{'NODE':<24} {'DISTRIBUTION':<12} {'IP':<14} {'READY':<8} {'SSHD':<5} KUBELET")
    for r in rows:
        click.echo(
            f"{r['name']:<24} {r['distribution']:<12} {r['ip']:<14} {r['ready']:<8} "
            f"{'up' if r['sshd'] else 'down':<5} {r['unit']}: {r['kubelet']}"
        )


def _kwok_status(lab_: Lab) -> dict[str, object]:
    """The recorded kwok, whether its process runs, and how many of its Nodes are Ready."""
    from rollout.lab.kwok import KWOK_LABEL, ready_count
    from rollout.lab.pids import exe_is

    k = lab_.kwok
    assert k is not None
    doc: dict[str, object] = {
        **k.to_dict(),
        "running": exe_is(k.pid, Path(k.bin_dir) / "kwok"),
        "ready": None,
    }
    if lab_.cp is not None:
        try:
            code, body = lab_.cp.request(
                "GET", f"/api/v1/nodes?labelSelector={KWOK_LABEL}%3D{lab_.name}", timeout=10
            )
        except OSError:
            code, body = 0, None
        if code == 200 and isinstance(body, dict):
            doc["ready"] = ready_count(body.get("items") or [])
    return doc


@lab.command("env")
@name_option
@workdir_option
@output_option
def env(name: str, workdir: Path | None, output: str) -> None:
    """Shell lines that point kubectl and rollout at the lab: eval "$(rollout lab env)".

    \b
    Examples:
      eval "$(rollout lab env)"
      rollout lab env -o json | jq -r .KUBECONFIG
    """
    lab_ = Lab.attach(name, workdir)
    if output == "json":
        paths = _paths(lab_)
        doc = {
            "KUBECONFIG": str(paths["kubeconfig"]),
            "ROLLOUT_INVENTORY": str(paths["inventory"]),
            "ROLLOUT_PLAN": str(paths["plan"]),
        }
        if lab_.bin_dir is not None and (lab_.bin_dir / "kubectl").exists():
            doc["PATH_PREPEND"] = str(lab_.bin_dir)
        doc.update(_monitoring_env(lab_))
        click.echo(json.dumps(doc, indent=2))
        return
    for var, val in (
        ("KUBECONFIG", lab_.kubeconfig),
        ("ROLLOUT_INVENTORY", lab_.inventory),
        ("ROLLOUT_PLAN", lab_.plan),
        *_monitoring_env(lab_).items(),
    ):
        click.echo(f"export {var}={shlex.quote(str(val))}")
    if lab_.bin_dir is not None and (lab_.bin_dir / "kubectl").exists():
        # The lab's own kubectl (same version as its API server) first on PATH.
        click.echo(f'export PATH={shlex.quote(str(lab_.bin_dir))}:"$PATH"')


FAULTS = (
    "sshd-stop",
    "sshd-start",
    "kubelet-stop",
    "kubelet-start",
    "apiserver-restart",
    "device-unhealthy",
    "device-healthy",
    "device-numa",
    "plugin-stop",
    "plugin-start",
    "plugin-restart",
    "driver-stop",
    "driver-start",
    "driver-restart",
)


@lab.command("fault")
@click.argument("fault", type=click.Choice(FAULTS))
@click.argument("node", required=False)
@click.argument("device", required=False)
@click.option(
    "--numa",
    type=click.IntRange(min=0),
    default=None,
    help="device-numa: the NUMA node the device plugin reports DEVICE on (required).",
)
@name_option
@workdir_option
@output_option
def fault(
    fault: str,
    node: str | None,
    device: str | None,
    numa: int | None,
    name: str,
    workdir: Path | None,
    output: str,
) -> None:
    """Inject a fault: stop/start a node's sshd or kubelet, restart the API server, mark a GPU
    of a real-kubelet node unhealthy or healthy (DEVICE, default every GPU), make its device
    plugin report a GPU on another NUMA node than its PCI device's (device-numa --numa N), or
    stop, start or restart its device plugin or its DRA driver (gpu.example.com). A health or
    plugin fault returns once the Node's allocatable shows it; device-numa once the plugin sent
    the new list to the kubelet; driver-stop once the driver exited (the kubelet wipes its
    ResourceSlices 30 s later), driver-start and driver-restart once its ResourceSlices list
    every GPU of the node.

    \b
    Examples:
      rollout lab fault kubelet-stop default-node2
      rollout lab fault apiserver-restart -o json
      rollout lab fault device-unhealthy default-node1 GPU-3
      rollout lab fault device-numa default-node1 --numa 0
      rollout lab fault plugin-stop default-node1 -o json
      rollout lab fault driver-restart default-node1
    """
    if device and fault not in ("device-unhealthy", "device-healthy", "device-numa"):
        raise LabError(f"fault {fault} takes no DEVICE argument")
    if (numa is None) == (fault == "device-numa"):
        raise LabError(
            "fault device-numa needs --numa N" if numa is None else f"fault {fault} takes no --numa"
        )
    lab_ = Lab.attach(name, workdir)
    result: dict[str, object] = {}
    if fault == "apiserver-restart":
        lab_.restart_apiserver()
    else:
        if not node:
            raise LabError(f"fault {fault} needs a NODE argument")
        if fault in ("device-unhealthy", "device-healthy"):
            result = lab_.devices.device_health(node, device, fault == "device-healthy")
        elif fault == "device-numa" and numa is not None:
            result = lab_.devices.device_numa(node, device, numa)
        elif fault.startswith("plugin-"):
            result = lab_.devices.plugin(node, fault.removeprefix("plugin-"))
        elif fault.startswith("driver-"):
            result = lab_.devices.driver(node, fault.removeprefix("driver-"), timeout=120.0)
        else:
            {
                "sshd-stop": lab_.machines.stop_sshd,
                "sshd-start": lab_.machines.start_sshd,
                "kubelet-stop": lab_.machines.stop_kubelet,
                "kubelet-start": lab_.machines.start_kubelet,
            }[fault](node)
    if output == "json":
        doc = {"fault": fault, "node": node, "done": True, **result}
        if device:
            doc["device"] = device
        click.echo(json.dumps(doc))
        return
    where = "".join(" " + x for x in (node, device) if x)
    after = ""
    if "numa" in result:
        changed = result.get("changed")
        names = ", ".join(str(d) for d in changed) if isinstance(changed, list) else ""
        after = f" (the plugin reports NUMA node {numa}; changed: {names or 'none'})"
    if "allocatable" in result:
        after = (
            f" (nvidia.com/gpu capacity {result['capacity']}, allocatable {result['allocatable']})"
        )
    if "slices" in result:
        listed = result["slices"]
        count = len(listed) if isinstance(listed, list) else 0
        after = f" (driver {result['state']}; its ResourceSlices list {count} device(s))"
    click.echo(f"{fault}{where}: done{after}")


COMMANDS = [lab]
