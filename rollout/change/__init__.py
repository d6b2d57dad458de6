"""The change: everything from a plan file to nodes on the new config (or restored), in rooms.

Each room is a sub-package whose docstring names its modules and what it may import; an
import-linter contract (``pyproject.toml``) keeps one direction between them, top to bottom:

- ``commands``: what ``apply``, ``promote``, ``migrate``, ``resume`` and ``rollback`` build
  around the engine below the CLI (the change session, the options, progress, stages).
- ``preflight``: every fact gathered and checked before anything is touched.
- ``kinds``: the kinds of change (the kubelet-config change, the allocation-path change), each
  only its own steps and plan section, and the registry of which kind runs.
- ``engine``: the skeleton every kind runs through (batches, canary, gate, windows, forward,
  restore, resume, drain, the node runner) and ``KindSteps``, the seam a kind plugs into.
- ``plan``: what the change is, read from the plan file (the schema, batches, windows, and
  each section's value).
- ``record``: the durable record (journal, typed entries, replay, the cluster mirror, outcomes);
  and beside it ``tenancy``: a GPU pool's tenant isolation (the tenancy file, its checks, its
  audit), which preflight refuses a change on.

The fleet as it is and drift live above in ``rollout.fleet``; the Ansible inventory in
``rollout.ansible.hosts``; the admission preview in ``rollout.kubelet.admission``.

May import: ``rollout.kube``, ``rollout.ansible``, ``rollout.kubelet`` and the bottom modules
(``errors``, ``models``, ``protocols``, ``verdicts``, ``samples``, ``interrupt``, ``durations``,
``assets``, ``fanout``, ``retrying``). Never ``fleet``, ``gate``, ``evidence``, ``bench``, ``lab``
or ``cli``: the engine asks the gate through the ``Gate`` Protocol, and the CLI wires the two
together.
"""
