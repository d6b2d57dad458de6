"""Running the playbooks: the only package that imports ``ansible_runner``.

The orchestrator talks to nodes through :class:`rollout.ansible.runner.AnsibleRunner` (or any
object with the same methods), so its logic is testable with a tiny fake and the lab proves the
real thing. ``hosts`` is the inventory a change runs on (``inventory`` reads a plain INI one
in-process); ``outcomes`` turns a run's events into per-host results (pure); ``gathering``
collects node facts over plain ssh without Ansible.
"""
