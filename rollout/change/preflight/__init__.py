"""Everything checked before anything is touched: the whole fleet's refusals at once.

- ``checking``: every preflight fact gathered and checked at once; nothing written until all pass.
- ``node_change``: one node's change computed from its facts: render, lint, the diff to show.
- ``device_checks``: each target node's devices: every GPU advertised, by one allocation path.

May import: ``plan``, ``kinds``, ``engine``, ``record``, ``tenancy`` of ``rollout.change``,
``rollout.kube``, ``rollout.ansible``, ``rollout.kubelet`` and the bottom modules; never
``commands``.
"""
