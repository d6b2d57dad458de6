"""The node step's defaults are one set: the ``DEFAULTS`` literal of the role's
``rollout_kubelet_step`` module. Its Ansible options, its DOCUMENTATION, the plain-ssh path's
bound (``rollout.change.engine.node_runner``) and the role's ``defaults/main.yml`` must say the
same, or an ``ansible-playbook`` run and a direct run of the same step would wait differently. Each
assertion below fails when one of them diverges. Runtime: well under 1 s.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from rollout.ansible import direct
from rollout.change.engine import node_runner

ROLE = Path(__file__).resolve().parents[2] / "playbooks/roles/rollout_kubelet"


def _module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("rollout_kubelet_step", direct._module())
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _role_defaults() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load((ROLE / "defaults/main.yml").read_text())
    return doc


def test_the_tool_reads_the_modules_own_defaults() -> None:
    assert direct.step_defaults() == _module().DEFAULTS
    assert set(direct.step_defaults()) == {
        "force",
        "daemon_reload",
        "healthz_retries",
        "healthz_delay",
        "healthz_timeout",
        "systemctl_timeout",
    }


@pytest.mark.parametrize("option", sorted(direct.step_defaults()))
def test_the_roles_defaults_main_yml_says_the_same(option: str) -> None:
    role = _role_defaults()
    var = f"{direct.ROLE_PREFIX}{option}"
    assert var in role, f"defaults/main.yml has no {var}"
    want = direct.step_defaults()[option]
    assert role[var] == want and isinstance(role[var], bool) == isinstance(want, bool), (
        f"defaults/main.yml {var}: {role[var]!r}, the module's DEFAULTS: {want!r}"
    )


def test_the_modules_options_and_documentation_say_the_same(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    mod = _module()
    documented = yaml.safe_load(mod.DOCUMENTATION)["options"]
    seen: dict[str, Any] = {}

    class Capture:
        def __init__(self, argument_spec: dict[str, Any], **_: Any) -> None:
            seen.update(argument_spec)
            raise SystemExit(0)

    monkeypatch.setattr(mod, "AnsibleModule", Capture)
    with pytest.raises(SystemExit):
        mod.main()
    for option, value in mod.DEFAULTS.items():
        spec = seen[option]
        assert spec["default"] == value and spec["type"] == type(value).__name__, (option, spec)
        doc = documented[option]
        assert doc["default"] == value and doc["type"] == spec["type"], (option, doc)


def test_the_direct_paths_role_variables_and_bound_follow_them() -> None:
    role = _role_defaults()
    for var, arg in node_runner._ROLE_VARS.items():
        assert var == f"{direct.ROLE_PREFIX}{arg}" and var in role, var
        assert arg in direct.step_defaults(), arg
    # every option an inventory may set reaches a direct run, and is kept for a direct restore
    assert set(node_runner._ROLE_VARS.values()) == set(direct.step_defaults()) - {"force"}
    assert set(node_runner._ROLE_VARS) <= set(node_runner._KEPT)
    d = direct.step_defaults()
    bound = (
        3 * d["systemctl_timeout"]
        + d["healthz_retries"] * (d["healthz_delay"] + d["healthz_timeout"])
        + 30
    )
    assert node_runner._direct_timeout({}) == bound
    assert node_runner._direct_timeout({"healthz_retries": 1}) < bound
