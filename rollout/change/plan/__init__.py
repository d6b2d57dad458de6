"""What the change is, read from the plan file.

- ``schema``: the plan file parsed once: the kubelet intent and every section, each a typed value.
- ``batches``: the ``strategy`` section, batches, drain rules, capacity and placement checks (pure).
- ``windows``: change windows: when forward steps may run (pure, the clock a parameter).
- ``gate_section``: the ``gate:`` section as a value, parsed once with the plan.
- ``allocation_path_section``: the ``allocationPath`` section as a value: the path each node group
  ends on.

May import: ``record`` (of ``rollout.change``), ``rollout.kubelet`` and the bottom modules; never
``engine``, ``preflight``, ``kinds`` or ``commands``.
"""
