"""The change: plan, batches, preflight, the apply / promote / rollback / resume engine, journal.

Owns everything from a plan file to nodes on the new config (or restored): ``plan`` (the plan file's
schema, parsed once into a typed value), ``planning`` (strategy, batches), ``gate_config`` (the
plan's ``gate:`` section, the gate evaluates with it), ``inventory`` (the Ansible inventory),
``preparing`` (preflight: facts, checks, preview), ``rendering`` (one node's change from its facts),
``previewing`` (the admission preview), ``orchestrator`` (the engine: batches, gate, rollback),
``context`` (what every step takes, and ``KindSteps``, the seam every kind of change plugs into),
``kinds`` (which kind runs), ``kubelet_config`` (the first kind's own steps), ``applying`` (a node's
forward path), ``resuming`` (finishing an interrupted change), ``draining``, ``shipping`` (node
writes through the playbooks), ``verifying``, ``restoring``, ``windows``, ``journal`` (the record's
lines), ``entries`` (the typed payload of every entry, with the schema version), ``replaying`` (the
entries as node states) and ``progress``; and a GPU pool's tenant isolation: ``tenancy`` (the
tenancy file, the admission policy rendered from it), ``tenancy_checks`` (the file against the live
cluster), ``tenancy_audit`` (every rule tried as the tenants; preflight's refusal of a change while
it fails).

May import: ``rollout.kube``, ``rollout.ansible``, ``rollout.kubelet`` and the bottom modules
(``errors``, ``models``, ``protocols``, ``verdicts``, ``samples``, ``interrupt``, ``durations``,
``assets``). Never ``gate``, ``evidence``, ``lab`` or ``cli``: the engine asks the gate through
the ``Gate`` Protocol, and the CLI wires the two together.
"""
