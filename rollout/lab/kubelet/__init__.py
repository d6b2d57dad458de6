"""The lab kubelet: a stand-in for the kubelet that behaves like it where ``rollout`` depends on it.

A real kubelet cannot run in the lab (no container runtime, no cgroups to spare), but everything
``rollout`` does on a node is judged by what the kubelet does: whether it starts with the new
configuration, what ``/configz`` says, whether the node stays Ready, and which pods it rejects with
``TopologyAffinityError``. This package reproduces exactly that, against the real API server.

Contract with the lab nodes (``rollout/lab/nodes.py``, ``nodefiles.py``)
------------------------------------------------------------------------
* Started inside the node's namespaces, in the foreground::

      python -m rollout.lab.kubelet --node-config /etc/rollout-lab/node.json

  Logs go to stderr in klog's text format (``E1130 21:43:27.123456    1234 file.go:NNN] "msg"
  key="value"``); structured values are quoted and escaped as klog does (``\\"``). The ``systemctl``
  shim redirects stderr to the node's log file and restarts the process after it exits, like
  systemd ``Restart=always`` with a short ``RestartSec``. Exit status 1 means "refused to start"
  (bad configuration or checkpoint), exactly where the kubelet exits 1.
* ``node.json``::

      {"nodeName", "nodeIP", "distribution", "kubeletPort": 10250,
       "apiserverSocket": "<host path of a unix socket relaying to the API server>",
       "apiserverURL": "https://127.0.0.1:6443",   # preferred over apiserverSocket when set
       "apiserverCA", "clientCert", "clientKey", "servingCert", "servingKey",
       "topology": {"cpuModel", "sockets", "threadsPerCore",
                    "numaNodes": [{"id": 0, "cpus": "0-15,32-47", "memoryBytes": N,
                                   "gpus": ["GPU-...", ...]}]},
       "capacity": {"cpu", "memory", "pods", "nvidia.com/gpu"},
       "labels": {...}, "kubeletVersion": "v1.36.x",
       # GPUs may be listed as ids or as {"id": "GPU-0", "pciAddress": "..."} objects
       "nodeRoot": "/",            # optional: where the node's files are (tests use a temp dir)
       "podCIDR": "10.244.N.0/24"  # optional: pod IPs; derived from nodeIP otherwise}

* The configuration is read from the node's own files (``rollout.kubelet.loading.load_node`` +
  ``effective``) for ``distribution``; checkpoints live in the effective ``--root-dir`` (the
  distribution's, unless its flags override it). ``apiserverURL`` (reached through the node's
  in-namespace relay) wins over ``apiserverSocket`` when both are set.
* Serves HTTPS on ``nodeIP:kubeletPort`` with the serving cert: ``/healthz``, ``/configz``,
  ``/metrics``, ``/pods``; and plain HTTP ``/healthz`` on ``healthzBindAddress:healthzPort``
  (default ``127.0.0.1:10248``) inside the node. HTTPS clients must present a certificate
  signed by ``apiserverCA`` (the API server's kubelet client cert is); ``/healthz`` also answers
  without one.
* Node: registers the Node, posts status every 10 s, renews its Lease in ``kube-node-lease``
  every 2 s (duration 10 s): when the process stops, the node controller marks it NotReady.
* Pods bound to the node are admitted like the Topology Manager (``admission.py``); rejected pods
  get ``phase: Failed, reason: TopologyAffinityError`` and a Warning event, admitted ones go
  Running; deleted ones release their resources and are removed.

Only the standard library (plus PyYAML via ``loading``) is imported, so it starts in well under a
second; it never imports ``kubernetes`` (design rule: only ``rollout.kube`` does).
"""
