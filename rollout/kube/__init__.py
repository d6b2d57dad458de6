"""The only place that imports the ``kubernetes`` client (import-linter enforces it).

Modules are verbs: ``client`` (load a kubeconfig, retry transient API failures), ``rest`` (the API
groups as JSON over the kubeconfig's connection, without the client's typed models), ``nodes``
(cordon, pods, readiness, PDBs), ``evicting`` (one Eviction API request, its outcome named),
``leases`` (the cluster lock, its owner's side), ``handover`` (a rollback handed to that owner),
``lease_objects`` (the Lease both sides read and write), ``proxy`` (``/configz``, ``/healthz``,
``/metrics`` through the node proxy), ``cluster`` (all of it behind the orchestrator's
``Cluster`` Protocol), ``tenancy`` (requests as a tenant: impersonated, dry run; access reviews;
the policy's server-side apply).
"""
