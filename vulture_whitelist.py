"""Names vulture reports as unused that are used where it cannot see, each with the reason.

``vulture`` (config in pyproject.toml, run by tests/unit/test_house.py) scans rollout/, tests/
and benchmarks/. It does not see Jinja templates, ``dataclasses.asdict`` / ``__dict__``
serialisation, or attributes the standard library reads. Anything it reports that is not one of
these is dead code: delete it rather than list it here.
"""

# ruff: noqa: F821, B018
# fmt: off

# -- read by the standard library (socketserver / http.server), never by our code
daemon_threads  # ThreadingMixIn: handler threads do not block interpreter exit (lab kubelet)
request_queue_size  # TCPServer.listen backlog (lab kubelet server)
_.get_request  # TCPServer hook: the lab kubelet wraps accepted sockets in TLS
protocol_version  # BaseHTTPRequestHandler: HTTP/1.1 keep-alive (lab kubelet)
_.close_connection  # BaseHTTPRequestHandler: end the keep-alive loop
_.retries  # kubernetes.client.Configuration: urllib3 retries off, rollout retries itself
_.default_flow_style  # ruamel.yaml YAML(): block style for the rules files Prometheus reads

# -- fields serialised whole (asdict / __dict__ / JSON / Jinja templates), read by whoever
#    reads the output: the lab's state file, the runbook templates, the alert receiver's reply
sshd_pid  # rollout.lab.nodes.NodeProcs -> lab.json (asdict); `lab down` of another process
ran  # rollout.evidence.runbook: rendered by rollout/data/templates/runbook.*.j2
generated  # rollout.evidence.runbook: rendered by runbook.*.j2
pools  # rollout.evidence.runbook: rendered by runbook.*.j2
window_now  # rollout.evidence.runbook: rendered by runbook.*.j2
fingerprint  # rollout.gate.serve.AlertOutcome -> the receiver's JSON reply (o.__dict__)

# -- record fields set where the record is built and kept for readers of the data (the CLI's
#    -o json, journal entries, docs tables); listed so the record stays complete
elapsed_s  # rollout.ansible.outcomes.PlaybookResult: how long ansible-playbook ran
artifacts  # rollout.ansible.outcomes.PlaybookResult: ansible-runner's artifact dir, for debugging
upgrades  # rollout.kubelet.distributions.Distribution: the docs' "survives upgrades" column
smt_siblings  # rollout.kubelet.facts.NodeFacts: parsed from the node facts file (CPU topology)
manager  # rollout.kubelet.options.PolicyOption: which kubelet manager owns the option

# -- a test double's method the role's module calls (playbooks/ is outside vulture's paths)
_.kubelet_said  # tests/unit/test_node_step_module.py fake: rollout_kubelet_step.py calls it

# -- http.server dispatches a request to its handler's do_<METHOD> by name
_.do_PATCH  # tests/unit/test_rest.py: the loopback API server's PATCH
_.do_PUT  # tests/unit/test_rest.py: the loopback API server's PUT

# -- click subcommands: the group's decorator registers them (rollout/cli/tenancy.py)
render_cmd  # `rollout tenancy render`
audit_cmd  # `rollout tenancy audit`

# -- socketserver calls handle_error when a request's handler raises
_.handle_error  # rollout/gate/serve.py: a failed TLS handshake or a peer gone mid-request
