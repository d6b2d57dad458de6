"""The durable record of a change: journal, typed entries, replay, the cluster mirror.

- ``journal``: the journal: every step written before and after, fsynced, its lock and blob store.
- ``entries``: the typed payload of every journal entry, with the schema version.
- ``replay``: a journal's entries folded into every node's state (``ChangeStatus``).
- ``opening``: the record as every command opens it: local cache, cluster record, mirror.
- ``cluster_mirror``: the journal mirrored into the cluster, and the local cache rebuilt from it.
- ``change_outcomes``: how a change ends, as a value, and the exit code it gives.

May import: ``rollout.kube`` and the bottom modules; nothing else of ``rollout.change``.
"""
