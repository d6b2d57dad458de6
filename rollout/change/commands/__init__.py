"""What ``apply``, ``promote``, ``migrate``, ``resume`` and ``rollback`` build around the engine,
below the CLI.

- ``apply_change``: ``apply``: prepare (nothing written), then run under the Lease.
- ``promote_change``: ``promote``: may a held canary go on, and the batches it then runs.
- ``migrate_pool``: ``migrate``: an allocation-path change from a plan.
- ``migrate_evidence``: a migration's ``before`` and ``after`` evidence.
- ``session``: the change session: Lease, record, context; ``resume`` and ``rollback``.
- ``change_options``: what a command that changes nodes was asked for, as one frozen value.
- ``stages``: a staged plan: which stage ``apply`` runs next, and why the next is held.
- ``progress``: live progress: a per-node table on a terminal, plain lines in CI logs.
- ``evidence_hooks``: what a command calls back into the evidence layer for.
- ``recreate_workloads``: ``apply --recreate-workloads``: the operator's pods evicted and their
  replacements awaited.

May import: every other room of ``rollout.change`` and the layers below it.
"""
