"""Quantities print like Go's ``Quantity.String()``, so the memory manager's message matches."""

from __future__ import annotations

import pytest

from rollout.kubelet import quantity


@pytest.mark.parametrize(
    ("text", "canonical"),
    [
        ("100Mi", "100Mi"),
        ("16Gi", "16Gi"),
        ("1.5Gi", "1536Mi"),
        ("1024", "1024"),
        ("500m", "500m"),
        ("1000m", "1"),
        ("1G", "1G"),
        ("0", "0"),
        ("1e3", "1e3"),
    ],
)
def test_canonical(text: str, canonical: str) -> None:
    assert str(quantity.parse(text)) == canonical


def test_sum_takes_the_first_nonzero_format() -> None:
    total = quantity.Quantity(quantity.parse("0").value) + quantity.parse("16Gi")
    assert str(total + quantity.parse("100Mi")) == "16484Mi"


@pytest.mark.parametrize("bad", ["", "1 Gi", "Gi", "1GB", "--1"])
def test_rejects(bad: str) -> None:
    with pytest.raises(quantity.QuantityError, match="quantities must match"):
        quantity.parse(bad)
