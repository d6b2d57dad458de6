"""Evidence for the people who approve a change: runbook, report, evidence checks, charts.

Owns ``runbook`` (the change-window runbook), ``report`` (HTML/Markdown report of a change),
``checks`` (pure checks over collected node data), ``svg`` (inline charts) and ``templating``
(the Jinja2 environment over the templates shipped in ``rollout/data/templates``).

May import: ``rollout.gate``, ``rollout.change``, ``rollout.kubelet`` and the bottom modules.
Never ``lab`` or ``cli``.
"""
