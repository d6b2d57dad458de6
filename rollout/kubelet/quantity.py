"""Resource quantities ("100Mi", "500m", "1.5G"), parsed and printed like ``resource.Quantity``.

The Memory Manager compares the sum of ``reservedMemory`` with kube-reserved + system-reserved +
eviction-hard and prints both sides with ``Quantity.String()``; to quote that message exactly we
need the same canonical form ("16484Mi", "1G", "0").
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from fractions import Fraction
from typing import Literal

Format = Literal["BinarySI", "DecimalSI", "DecimalExponent"]

_BINARY = {"Ki": 1, "Mi": 2, "Gi": 3, "Ti": 4, "Pi": 5, "Ei": 6}
_DECIMAL = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_RE = re.compile(r"([+-]?(?:\d+\.?\d*|\.\d+))(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?\d+)?")

_SYNTAX = (
    "quantities must match the regular expression '^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$'"
)


class QuantityError(ValueError):
    """A string the kubelet would not parse as a quantity."""


@dataclass(frozen=True)
class Quantity:
    """An exact quantity and the format its first spelling chose."""

    value: Fraction
    format: Format = "DecimalSI"

    def __add__(self, other: Quantity) -> Quantity:
        # Quantity.Add: a zero receiver takes the addend's format.
        fmt = other.format if self.value == 0 else self.format
        return Quantity(self.value + other.value, fmt)

    def __str__(self) -> str:
        return canonical(self)


def parse(text: str | int | float) -> Quantity:
    """Parse a quantity like ``resource.ParseQuantity``.

    Raises:
        QuantityError: with the kubelet's wording, ``quantities must match the regular expression``.
    """
    if isinstance(text, bool):
        raise QuantityError(_SYNTAX)
    if isinstance(text, int | float):
        return Quantity(Fraction(str(text)), "DecimalSI")
    m = _RE.fullmatch(text.strip())
    if not m or not text.strip():
        raise QuantityError(_SYNTAX)
    number = Fraction(m.group(1))
    suffix = m.group(2) or ""
    if suffix in _BINARY:
        return Quantity(number * 1024 ** _BINARY[suffix], "BinarySI")
    if suffix in _DECIMAL:
        return Quantity(number * Fraction(10) ** _DECIMAL[suffix], "DecimalSI")
    return Quantity(number * Fraction(10) ** int(suffix[1:]), "DecimalExponent")


def canonical(q: Quantity) -> str:
    """``Quantity.String()``: the shortest exact spelling in the quantity's format."""
    v = q.value
    if v == 0:
        return "0"
    sign = "-" if v < 0 else ""
    v = abs(v)
    if q.format == "BinarySI" and v.denominator == 1 and v >= 1024:
        n = int(v)
        for suffix, power in sorted(_BINARY.items(), key=lambda kv: -kv[1]):
            if n % 1024**power == 0:
                return f"{sign}{n // 1024**power}{suffix}"
        return f"{sign}{n}"
    # DecimalSI (and BinarySI values that are fractional or below 1024): largest exponent of 1000
    # that keeps the mantissa an integer.
    for suffix, exp in sorted(_DECIMAL.items(), key=lambda kv: -kv[1]):
        mantissa = v / Fraction(10) ** exp
        if mantissa.denominator == 1:
            if q.format == "DecimalExponent":
                return f"{sign}{mantissa.numerator}" + (f"e{exp}" if exp else "")
            return f"{sign}{mantissa.numerator}{suffix}"
    # Finer than nano: the kubelet rounds up to 1n.
    return f"{sign}{-(-v * 10**9 // 1)}n"
