"""The lab's alert loop: a real Prometheus and Alertmanager, wired to ``rollout serve``.

Why real ones: the production path for an automated rollback is a kubelet counter scraped by
Prometheus, a rule that fires, Alertmanager posting to ``rollout serve``. Each of those is a
published Go module (built once per machine by ``tools/build-monitoring-binaries.sh``), so the
lab runs the real thing rather than hand-made HTTP requests.

What runs, all on 127.0.0.1 with ports of their own (several labs may run at once):

* **Prometheus** discovers the nodes through the API server (``kubernetes_sd_configs``, role
  ``node``) and scrapes each kubelet's ``/metrics`` through the API server's node proxy with the
  lab's admin client certificate, relabelling the node name into label ``node`` (as
  kube-prometheus does); it also scrapes ``rollout serve``'s ``/metrics``. Its rules are the
  groups of the PrometheusRule rollout ships (``rollout/data/prometheus-rule.yaml``), converted
  when the lab starts (:func:`rollout.gate.alerting.rules_file`).
* **Alertmanager** routes alerts labelled ``rollout="rollback"`` to ``rollout serve``'s
  ``/webhook`` with the bearer token from the lab's token file; the rest go to a null receiver.
* **rollout serve**, with the token file in ``<lab>/monitoring/serve-token`` and the journals of
  the state directory the lab was started with (``rollout lab env`` exports it).

Intervals (short, for a lab; see :data:`INTERVALS`): scrape and rule evaluation every 2 s,
Alertmanager ``group_wait`` 2 s, ``group_interval`` and ``repeat_interval`` 30 s (the time
Alertmanager allows ``rollout serve`` to finish a rollback). The rules' own ``for:`` are the
shipped ones (1 m for ``KubeletTopologyAffinityRejections``).

Job ``rollout`` scrapes the targets listed in ``<lab>/monitoring/rollout-targets.json``
(file discovery): ``rollout serve``, and any ``rollout watch --listen`` added with
:func:`add_rollout_target` (the gate's verdict and rejection counters live there).
"""

from __future__ import annotations

import json
import os
import secrets
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from rollout.errors import LabError
from rollout.gate.alerting import ROUTE_LABEL, dump_yaml, rules_file, shipped_rule_text
from rollout.lab.controlplane import free_port

#: The pinned versions (tools/prombin/go.mod, tools/ambin/go.mod; a unit test keeps them equal).
PROMETHEUS_MODULE_VERSION = "v0.316.0"
ALERTMANAGER_MODULE_VERSION = "v0.35.0"
BINARIES = ("prometheus", "promtool", "alertmanager")

#: The lab's intervals, in seconds (stated in ``rollout lab up --monitoring``'s output and docs).
#: ``rollout serve`` answers 202 at once and rolls back in the background, so the notification's
#: time (max(group_interval, 10 s)) no longer bounds the rollback. Repeats come every
#: ``repeat_interval``, checked at each ``group_interval``; the end-to-end test waits for one.
INTERVALS: Mapping[str, float] = {
    "scrape_interval": 2,
    "evaluation_interval": 2,
    "group_wait": 2,
    "group_interval": 30,
    "repeat_interval": 30,
}
Progress = Callable[[str], None]


def find_monitoring_bin_dir() -> Path:
    """``$ROLLOUT_MONITORING_BIN``, else the version-keyed dir that
    ``tools/build-monitoring-binaries.sh`` fills (beside the control-plane binaries)."""
    if os.environ.get("ROLLOUT_MONITORING_BIN"):
        return Path(os.environ["ROLLOUT_MONITORING_BIN"])
    cache = Path(os.environ.get("ROLLOUT_LAB_CACHE") or Path.home() / ".cache" / "rollout-lab")
    key = (
        f"monitoring-prometheus-{PROMETHEUS_MODULE_VERSION}"
        f"-alertmanager-{ALERTMANAGER_MODULE_VERSION}"
    )
    return cache / key / "bin"


def missing_monitoring_binaries(bin_dir: Path) -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir / b, os.X_OK)]


def _secs(v: float) -> str:
    return f"{v:g}s"


def prometheus_config(
    *,
    apiserver: str,
    ca: Path,
    cert: Path,
    key: Path,
    targets: Path,
    alertmanager: str,
    rules: Path,
    serve: str | None = None,
    serve_ca: Path | None = None,
) -> dict[str, Any]:
    """prometheus.yml for the lab (pure). ``apiserver``/``alertmanager`` are ``host:port``;
    ``targets`` the file listing rollout's own plain-HTTP /metrics endpoints (``rollout watch
    --listen``); ``serve`` the ``host:port`` of ``rollout serve`` over HTTPS, its certificate
    signed by ``serve_ca`` (job ``rollout-serve``)."""
    tls = {"ca_file": str(ca), "cert_file": str(cert), "key_file": str(key)}
    jobs: list[dict[str, Any]] = []
    if serve is not None:
        jobs.append(
            {
                "job_name": "rollout-serve",
                "scheme": "https",
                "tls_config": {"ca_file": str(serve_ca or ca)},
                "static_configs": [{"targets": [serve]}],
            }
        )
    return {
        "global": {
            "scrape_interval": _secs(INTERVALS["scrape_interval"]),
            "scrape_timeout": _secs(INTERVALS["scrape_interval"]),
            "evaluation_interval": _secs(INTERVALS["evaluation_interval"]),
        },
        "rule_files": [str(rules)],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]},
        "scrape_configs": [
            {
                "job_name": "kubelet",
                "scheme": "https",
                "tls_config": tls,
                "kubernetes_sd_configs": [
                    {"role": "node", "api_server": f"https://{apiserver}", "tls_config": tls}
                ],
                "relabel_configs": [
                    # every scrape goes to the API server: /api/v1/nodes/NAME/proxy/metrics
                    {"target_label": "__address__", "replacement": apiserver},
                    {
                        "source_labels": ["__meta_kubernetes_node_name"],
                        "regex": "(.+)",
                        "target_label": "__metrics_path__",
                        "replacement": "/api/v1/nodes/${1}/proxy/metrics",
                    },
                    {"source_labels": ["__meta_kubernetes_node_name"], "target_label": "node"},
                ],
            },
            {
                "job_name": "rollout",
                "file_sd_configs": [
                    {
                        "files": [str(targets)],
                        "refresh_interval": _secs(INTERVALS["scrape_interval"]),
                    }
                ],
            },
            *jobs,
        ],
    }


def alertmanager_config(
    *, webhook_url: str, token_file: Path, ca_file: Path | None = None
) -> dict[str, Any]:
    """alertmanager.yml for the lab (pure): ``rollout="rollback"`` alerts to ``rollout serve``,
    over HTTPS verified against ``ca_file`` when given (Alertmanager's ``tls_config``)."""
    k, v = ROUTE_LABEL
    http_config: dict[str, Any] = {
        "authorization": {"type": "Bearer", "credentials_file": str(token_file)}
    }
    if ca_file is not None:
        http_config["tls_config"] = {"ca_file": str(ca_file)}
    return {
        "route": {
            "receiver": "null",
            "group_by": ["alertname", "node"],
            "group_wait": _secs(INTERVALS["group_wait"]),
            "group_interval": _secs(INTERVALS["group_interval"]),
            "repeat_interval": _secs(INTERVALS["repeat_interval"]),
            "routes": [{"receiver": "rollout", "matchers": [f'{k}="{v}"']}],
        },
        "receivers": [
            {"name": "null"},
            {
                "name": "rollout",
                "webhook_configs": [
                    {
                        "url": webhook_url,
                        "send_resolved": False,
                        "http_config": http_config,
                    }
                ],
            },
        ],
    }


@dataclass
class MonitoringState:
    """What ``lab.json`` records of the monitoring processes."""

    bin_dir: str
    dir: str
    state_dir: str
    prometheus_port: int
    alertmanager_port: int
    serve_port: int
    prometheus_pid: int = 0
    alertmanager_pid: int = 0
    serve_pid: int = 0
    #: the CA that signed ``rollout serve``'s certificate ("": plain HTTP)
    serve_ca: str = ""

    @property
    def prometheus_url(self) -> str:
        return f"http://127.0.0.1:{self.prometheus_port}"

    @property
    def alertmanager_url(self) -> str:
        return f"http://127.0.0.1:{self.alertmanager_port}"

    @property
    def serve_url(self) -> str:
        return f"{'https' if self.serve_ca else 'http'}://127.0.0.1:{self.serve_port}"

    def serve_context(self) -> ssl.SSLContext | None:
        """A client TLS context that trusts ``rollout serve``'s certificate (None: plain)."""
        return ssl.create_default_context(cafile=self.serve_ca) if self.serve_ca else None

    @property
    def token_file(self) -> Path:
        return Path(self.dir) / "serve-token"

    @property
    def targets_file(self) -> Path:
        return Path(self.dir) / "rollout-targets.json"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def add_rollout_target(m: MonitoringState, target: str | None) -> None:
    """Have Prometheus scrape ``target`` (``host:port`` of a plain-HTTP rollout /metrics) in job
    rollout (None: only make sure the targets file exists)."""
    try:
        doc = json.loads(m.targets_file.read_text())
    except (OSError, ValueError):
        doc = [{"targets": []}]
    if target is not None and target not in doc[0]["targets"]:
        doc[0]["targets"].append(target)
    tmp = m.targets_file.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc) + "\n")
    tmp.replace(m.targets_file)


def _get(url: str, timeout: float = 2.0, context: ssl.SSLContext | None = None) -> int:
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as r:
            return int(r.status)
    except urllib.error.HTTPError as e:
        return int(e.code)
    except OSError:
        return 0


def health(m: MonitoringState) -> dict[str, bool]:
    """Prometheus and Alertmanager ``/-/ready``, ``rollout serve`` ``/healthz``."""
    return {
        "prometheus": _get(m.prometheus_url + "/-/ready") == 200,
        "alertmanager": _get(m.alertmanager_url + "/-/ready") == 200,
        "serve": _get(m.serve_url + "/healthz", context=m.serve_context()) == 200,
    }


def start(
    lab_dir: Path,
    *,
    apiserver: str,
    ca: Path,
    cert: Path,
    key: Path,
    kubeconfig: Path,
    state_dir: Path,
    remember: Callable[[int], None],
    serve_cert: tuple[Path, Path] | None = None,
    progress: Progress = lambda _m: None,
    timeout: float = 60.0,
) -> MonitoringState:
    """Write the configs and start rollout serve, Alertmanager and Prometheus; wait until ready.

    ``serve_cert``: ``rollout serve``'s certificate and key, signed by ``ca``: it then serves
    HTTPS only, and Alertmanager's webhook and Prometheus's scrape verify it against ``ca``
    (their ``tls_config``). ``remember(pid)`` is called for every process as soon as it is
    started (the lab's teardown bookkeeping).

    Raises:
        LabError: binaries missing, or a process did not become ready (its log named).
    """
    bin_dir = find_monitoring_bin_dir()
    missing = missing_monitoring_binaries(bin_dir)
    if missing:
        raise LabError(
            f"monitoring binaries missing in {bin_dir}: {', '.join(missing)}; "
            "run tools/build-monitoring-binaries.sh"
        )
    d = (lab_dir / "monitoring").resolve()
    d.mkdir(parents=True, exist_ok=True)
    m = MonitoringState(str(bin_dir), str(d), str(state_dir), free_port(), free_port(), free_port())
    m.token_file.write_text(secrets.token_urlsafe(32) + "\n")
    m.token_file.chmod(0o600)
    if serve_cert is not None:
        m.serve_ca = str(ca)
    rules = d / "rules.yaml"
    rules.write_text(dump_yaml(rules_file(shipped_rule_text())))
    serve_target = f"127.0.0.1:{m.serve_port}"
    if serve_cert is None:
        add_rollout_target(m, serve_target)
    else:
        add_rollout_target(m, None)  # the file exists, for rollout watch --listen to join
    (d / "prometheus.yml").write_text(
        dump_yaml(
            prometheus_config(
                apiserver=apiserver,
                ca=ca,
                cert=cert,
                key=key,
                targets=m.targets_file,
                alertmanager=f"127.0.0.1:{m.alertmanager_port}",
                rules=rules,
                serve=serve_target if serve_cert is not None else None,
                serve_ca=ca,
            )
        )
    )
    (d / "alertmanager.yml").write_text(
        dump_yaml(
            alertmanager_config(
                webhook_url=m.serve_url + "/webhook",
                token_file=m.token_file,
                ca_file=ca if serve_cert is not None else None,
            )
        )
    )
    env = {**os.environ, "ROLLOUT_STATE_DIR": str(state_dir)}
    m.serve_pid = _spawn(
        d / "serve.log",
        [
            sys.executable,
            "-c",
            "from rollout.cli import main; main()",
            "serve",
            "--listen",
            f"127.0.0.1:{m.serve_port}",
            "--token-file",
            str(m.token_file),
            *(
                ["--tls-cert-file", str(serve_cert[0]), "--tls-key-file", str(serve_cert[1])]
                if serve_cert is not None
                else []
            ),
            "--kubeconfig",
            str(kubeconfig),
        ],
        env,
        d,
    )
    remember(m.serve_pid)
    m.alertmanager_pid = _spawn(
        d / "alertmanager.log",
        [
            str(bin_dir / "alertmanager"),
            f"--config.file={d / 'alertmanager.yml'}",
            f"--storage.path={d / 'alertmanager-data'}",
            f"--web.listen-address=127.0.0.1:{m.alertmanager_port}",
            "--cluster.listen-address=",  # no HA gossip: one instance, no extra port
        ],
        env,
        d,
    )
    remember(m.alertmanager_pid)
    m.prometheus_pid = _spawn(
        d / "prometheus.log",
        [
            str(bin_dir / "prometheus"),
            f"--config.file={d / 'prometheus.yml'}",
            f"--storage.tsdb.path={d / 'prometheus-data'}",
            f"--web.listen-address=127.0.0.1:{m.prometheus_port}",
            "--web.enable-lifecycle",
            "--storage.tsdb.retention.time=1d",
        ],
        env,
        d,
    )
    remember(m.prometheus_pid)
    deadline = time.monotonic() + timeout
    while True:
        h = health(m)
        if all(h.values()):
            break
        if time.monotonic() > deadline:
            down = [k for k, ok in h.items() if not ok]
            tails = "\n".join(_tail(d / f"{k}.log") for k in down)
            raise LabError(f"monitoring not ready after {timeout:.0f}s: {down}\n{tails}")
        time.sleep(0.2)
    progress(
        f"monitoring ready: Prometheus {m.prometheus_url}, Alertmanager {m.alertmanager_url}, "
        f"rollout serve {m.serve_url}; intervals: "
        + ", ".join(f"{k} {_secs(v)}" for k, v in INTERVALS.items())
    )
    return m


def _spawn(log: Path, args: list[str], env: Mapping[str, str], cwd: Path) -> int:
    from rollout.lab import nodes as n

    with open(log, "ab") as f:
        f.write(f"\n=== {time.strftime('%H:%M:%S')} start {Path(args[0]).name}\n".encode())
        f.flush()
        p = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=f,
            stderr=subprocess.STDOUT,
            cwd=cwd,
            env=dict(env),
            start_new_session=True,
        )
    n.CHILDREN[p.pid] = p
    return p.pid


def _tail(path: Path, chars: int = 1500) -> str:
    try:
        return f"--- {path}\n" + path.read_text(errors="replace")[-chars:]
    except OSError:
        return f"--- {path}: unreadable"


def ours(m: MonitoringState) -> list[int]:
    """The monitoring PIDs that are still the programs we started (safe to signal)."""

    def exe_is(pid: int, want: Path) -> bool:
        try:
            return Path(os.readlink(f"/proc/{pid}/exe")) == want
        except OSError:
            return False

    def cmd_has(pid: int, needle: str) -> bool:
        try:
            return needle in Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace")
        except OSError:
            return False

    b = Path(m.bin_dir)
    out = []
    if m.prometheus_pid and exe_is(m.prometheus_pid, b / "prometheus"):
        out.append(m.prometheus_pid)
    if m.alertmanager_pid and exe_is(m.alertmanager_pid, b / "alertmanager"):
        out.append(m.alertmanager_pid)
    if m.serve_pid and cmd_has(m.serve_pid, str(m.token_file)):
        out.append(m.serve_pid)
    return out


def load_state(doc: Mapping[str, Any] | None) -> MonitoringState | None:
    if not doc:
        return None
    return MonitoringState(**doc)


def query(m: MonitoringState, promql: str, timeout: float = 5.0) -> Any:
    """``/api/v1/query`` answer as JSON (for tests and ``lab status``)."""
    url = m.prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": promql})
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.loads(r.read())
