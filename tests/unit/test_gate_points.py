"""Where the gate runs, derived once (``rollout.change.engine.orchestrator.gate_points``): apply
gates once after its last canary batch over the whole canary, in the canary's recorded order;
promote after each batch when the change has a gate, else never. Pure; runtime well under 1 s.
"""

from __future__ import annotations

import pytest

from rollout.change.engine.orchestrator import gate_points
from rollout.change.plan.batches import Batch

BATCHES = [Batch(("c2", "c1"), True), Batch(("c3",), True), Batch(("a", "b"), False)]
CANARY = ("c2", "c1", "c3")


@pytest.mark.parametrize("has_gate", [True, False])
def test_apply_gates_once_after_the_last_canary_batch_over_the_whole_canary(
    has_gate: bool,
) -> None:
    # also without a gate section: the default gate journals its Successful verdict there
    assert gate_points(BATCHES, CANARY, promoted=False, has_gate=has_gate) == {1: CANARY}


def test_apply_without_a_canary_batch_never_gates() -> None:
    plain = [Batch(("a",), False), Batch(("b",), False)]
    assert gate_points(plain, (), promoted=False, has_gate=True) == {}
    assert gate_points([], (), promoted=False, has_gate=True) == {}


def test_promote_gates_after_each_batch_over_it_when_the_change_has_a_gate() -> None:
    later = [Batch(("a", "b"), False), Batch(("d",), False)]
    assert gate_points(later, CANARY, promoted=True, has_gate=True) == {0: ("a", "b"), 1: ("d",)}
    assert gate_points(later, CANARY, promoted=True, has_gate=False) == {}


def test_the_canary_keeps_its_recorded_order() -> None:
    # resume passed tuple(set(canary)) before: the order of a set of str follows the hash seed,
    # so a resumed gate's nodes could differ in order from the canary that unfinished_gate
    # looks its verdict up by
    many = tuple(f"n{i}" for i in range(20, 0, -1))
    got = gate_points([Batch(many, True)], many, promoted=False, has_gate=True)
    assert got == {0: many}
