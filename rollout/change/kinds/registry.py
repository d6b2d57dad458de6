"""Which kind of change the engine runs: the context's, else the kubelet-config change; and the
kind a journal names (``resume``, ``rollback``).

Why its own module: the engine modules ask :func:`kind_of` for the steps of the kind in hand;
``rollout.change.engine.context`` cannot name the first kind itself (the kind takes the context), so
the default lives here, once.
"""

from __future__ import annotations

from collections.abc import Mapping

from rollout.change.engine.context import Context, KindSteps
from rollout.change.kinds.allocation_path import ALLOCATION_PATH
from rollout.change.kinds.kubelet_config import KUBELET_CONFIG
from rollout.change.record.entries import ChangeBegin
from rollout.errors import InputError


def kind_of(ctx: Context) -> KindSteps:
    """The steps of the change in hand: the context's kind, else the kubelet-config change."""
    return ctx.kind if ctx.kind is not None else KUBELET_CONFIG


def kind_name(kind: KindSteps) -> str | None:
    """The name the change-level ``begin`` records for ``kind`` (``ChangeBegin.kind``; None for
    the kubelet-config change, whose journals never named it)."""
    return None if kind.name == KUBELET_CONFIG.name else kind.name


KNOWN: dict[str, KindSteps] = {
    KUBELET_CONFIG.name: KUBELET_CONFIG,
    ALLOCATION_PATH.name: ALLOCATION_PATH,
}
"""Every kind this version of rollout runs, by name (a new kind adds itself here)."""


def recorded_kind(info: ChangeBegin, known: Mapping[str, KindSteps] | None = None) -> KindSteps:
    """The kind a change's ``begin`` info names, from ``known`` (name -> kind; default
    :data:`KNOWN`); a journal that names none is the kubelet-config change's.

    Raises:
        InputError: the journal names a kind this version of rollout does not know.
    """
    name = info.kind or KUBELET_CONFIG.name
    kinds = {KUBELET_CONFIG.name: KUBELET_CONFIG, **(KNOWN if known is None else known)}
    if name not in kinds:
        raise InputError(
            f"the change's journal names kind {name!r}, which this version of rollout does not "
            f"know ({', '.join(sorted(kinds))}); use the version that wrote it"
        )
    return kinds[name]
