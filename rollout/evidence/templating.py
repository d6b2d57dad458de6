"""Jinja2 for the runbook and the report, from templates shipped in the package.

One environment, strict about undefined names (a typo in a template must fail a test, not print an
empty cell), autoescaping only for HTML.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jinja2

_ENVS: dict[bool, jinja2.Environment] = {}


def _env(html: bool) -> jinja2.Environment:
    if html not in _ENVS:
        _ENVS[html] = jinja2.Environment(
            loader=jinja2.PackageLoader("rollout", "data/templates"),
            undefined=jinja2.StrictUndefined,
            autoescape=html,
            trim_blocks=True,
            lstrip_blocks=True,
            keep_trailing_newline=True,
        )
    return _ENVS[html]


def render_template(name: str, context: Mapping[str, Any], html: bool = False) -> str:
    """Render a packaged template (``rollout/data/templates/<name>``)."""
    return _env(html).get_template(name).render(**context)
