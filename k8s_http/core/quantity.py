"""Kubernetes quantities (resource.Quantity) as exact numbers.

The apiserver stores a quantity in canonical form, so what a controller
applied ("1000m", "1024Mi") and what it reads back ("1", "1Gi") may be spelled
differently: compare them by value, never as strings. Exact (`Fraction`), so
that no rounding makes two different quantities equal or two equal ones differ.
Non-negative quantities only (what resource requests and limits accept).
"""

from __future__ import annotations

import functools
import re
from fractions import Fraction

__all__ = ["parse_quantity", "same_quantity"]

# The grammar of resource.Quantity, without the sign: a CRD schema may carry the
# same pattern (manifests/base/crd.yaml does for My's resources).
_QUANTITY = re.compile(
    r"^\+?(?P<number>[0-9]+(\.[0-9]*)?|\.[0-9]+)"
    r"(?P<suffix>[KMGTPE]i|[numkMGTPE]|[eE][-+]?[0-9]+)?$")
_SUFFIXES: dict[str, Fraction] = {
    "": Fraction(1),
    "n": Fraction(1, 10**9), "u": Fraction(1, 10**6), "m": Fraction(1, 10**3),
    "k": Fraction(10**3), "M": Fraction(10**6), "G": Fraction(10**9),
    "T": Fraction(10**12), "P": Fraction(10**15), "E": Fraction(10**18),
    "Ki": Fraction(2**10), "Mi": Fraction(2**20), "Gi": Fraction(2**30),
    "Ti": Fraction(2**40), "Pi": Fraction(2**50), "Ei": Fraction(2**60),
}
# Bound the exponent form ("1e400000" would be a needlessly big number to build).
_MAX_EXPONENT = 30


def parse_quantity(value: object) -> Fraction:
    """A Kubernetes quantity as an exact number; ValueError if it is not one.

    Exact (Fraction) so that "1000m" == "1" and "1Gi" == "1024Mi" compare equal.
    The message says what is wrong with the value, not where it was found: the
    caller names the field.
    """
    if isinstance(value, bool):
        raise ValueError("a quantity is a number or a string, not a boolean")
    if isinstance(value, int):
        if value < 0:
            raise ValueError("must not be negative")
        return Fraction(value)
    if not isinstance(value, str):
        raise ValueError("must be a string such as 100m or 256Mi")
    return _parse_text(value)


# Quantity texts repeat across objects ("100m", "64Mi"), and each object's are
# parsed at every validation and apply check: remembered, a bounded number.
# (A Fraction is immutable; a ValueError is raised again, never remembered.)
@functools.lru_cache(maxsize=1024)
def _parse_text(value: str) -> Fraction:
    match = _QUANTITY.match(value)
    if not match:
        raise ValueError(f"{value!r} is not a quantity (examples: 100m, 0.5, 256Mi, 1G)")
    number = Fraction(match.group("number"))
    suffix = match.group("suffix") or ""
    # "E" alone is exa and "Ei" exbi; only an e/E followed by digits is an exponent.
    if suffix[:1] in ("e", "E") and suffix[1:] not in ("", "i"):
        exponent = int(suffix[1:])
        if abs(exponent) > _MAX_EXPONENT:
            raise ValueError(f"{value!r}: exponent out of range")
        return number * Fraction(10) ** exponent
    return number * _SUFFIXES[suffix]


def same_quantity(a: object, b: object) -> bool:
    """Equal by value when both are quantities; otherwise compared as they are."""
    if type(a) is str and a == b:
        # The same text is the same value, or the same non-quantity: equal either
        # way. The usual case (needs_apply on every reconcile), without Fractions.
        return True
    try:
        return parse_quantity(a) == parse_quantity(b)
    except ValueError:
        return a == b
