"""A GPU pool's tenant isolation: the tenancy file, its checks, its audit.

- ``policy``: the tenancy file, and the ValidatingAdmissionPolicies rendered from it.
- ``live_checks``: what the tenancy file names, checked against the live API server.
- ``audit``: every rule tried as the tenants; preflight's refusal while it fails.

May import: ``rollout.kube`` and the layers below it; nothing else of ``rollout.change``.
"""
