"""What the change is, read from the plan file.

- ``schema``: the plan file parsed once: the kubelet intent and every section, each a typed value.
- ``strategy``: the ``strategy`` section (``maxUnavailable``, a percentage resolved by
  ``Strategy.for_nodes``; the drain policy; batch sizes) (pure).
- ``batches``: the canary first, then the rest in batches; the canary group alike (pure).
- ``drain_rules``: how a node is drained, which pods a drain may not lose, the PodDisruptionBudgets
  that would block it (pure).
- ``capacity``: whether the nodes left can take a batch's evicted pods, by room and by placement
  (pure).
- ``windows``: change windows: when forward steps may run (pure, the clock a parameter).
- ``gate_section``: the ``gate:`` section as a value, parsed once with the plan.
- ``allocation_path_section``: the ``allocationPath`` section as a value: the path each node group
  ends on.

May import: ``record`` (of ``rollout.change``), ``rollout.kubelet`` and the bottom modules; never
``engine``, ``preflight``, ``kinds`` or ``commands``.
"""
