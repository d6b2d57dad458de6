"""The kinds of change: each writes only its own steps (``KindSteps``) and plan section.

- ``registry``: which kind the engine runs, and the kind a journal names.
- ``kubelet_config``: the kubelet-config change's own steps (backup, apply, verify, restore).
- ``kubelet_record``: what the journal keeps of a kubelet-config node change, and what is rebuilt
  from it.
- ``kubelet_verify``: a node proven healthy after a kubelet restart: the running config, not the
  file.
- ``allocation_path``: the allocation-path change: a GPU node moved between device plugin and DRA
  driver.
- ``allocation_preflight``: the allocation-path change's preflight: can the cluster carry it.
- ``claim_freeze``: the cluster-wide freeze of new ResourceClaims around a migration's restore.

May import: ``engine``, ``plan``, ``record`` of ``rollout.change`` and the layers below it; never
``preflight`` or ``commands``.
"""
