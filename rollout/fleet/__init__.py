"""The fleet as it is: every node, what its last change left, what runs now, drift.

- ``survey``: every node of the fleet: what its last change left, what runs now, how it serves
  devices.
- ``drift``: a node whose files or running config differ from what its last change left.

May import: ``rollout.change`` and the layers below it; never ``gate``, ``evidence``, ``lab`` or
``cli``.
"""
