"""The performance benchmark: run on a node or in a pod, its record, the gate over it.

- ``results``: the benchmark's pure parts: targets, the output contract, the record, metrics text.
- ``on_node``: ``rollout bench`` run on a node over ssh or Ansible, and where its record goes.
- ``in_pod``: the benchmark run in a pod the kubelet placed.
- ``canary_gate``: the performance gate over the canary's benchmark.

May import: ``rollout.evidence``, ``rollout.gate``, ``rollout.change`` and the layers below them;
never ``lab`` or ``cli``.
"""
