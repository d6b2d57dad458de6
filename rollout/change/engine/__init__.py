"""The skeleton every kind of change runs through: per node cordon, drain, the kind's steps, verify,
uncordon (and the same for restore); batches, canary, gate, windows, resume.

- ``context``: what every node step takes, and ``KindSteps``: the seam a kind plugs into.
- ``orchestrator``: the change loop: batches, the gate after the canary, rollback.
- ``forward``: a node's forward path: cordon, drain, the kind's steps, verify, uncordon, journaled.
- ``restore``: putting a node back: automatic restore, ``rollback`` and ``resume`` share it.
- ``resumption``: finishing an interrupted change: nodes in flight settled, the gate a crash cut
  short.
- ``drain``: draining a node through the Eviction API, PodDisruptionBudgets named.
- ``node_runner``: the ``NodeRunner`` over the role's node step: plain ssh or playbooks.
- ``parallel``: per-node work side by side, bounded by ``--forks``, failures by node.

May import: ``plan`` and ``record`` of ``rollout.change`` and the layers below it;
``kinds.registry`` only (which kind runs); never ``preflight`` or ``commands``.
"""
