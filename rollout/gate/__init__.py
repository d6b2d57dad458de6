"""The gate: signals in, verdicts out; the soak, the alert routing and the webhook receiver.

Owns ``analysis`` (the pure verdict), ``soaking`` (soak the canary, evaluate, record),
``prometheus`` (the PromQL signal), ``alerting`` (alert to owning change, pure), ``owning`` (the
journals and Lease read for it) and ``serve`` (the Alertmanager webhook receiver).

May import: ``rollout.change`` (to read a change's journal and plan), ``rollout.kube``,
``rollout.kubelet`` and the bottom modules. Never ``evidence``, ``lab`` or ``cli``.
"""
