"""Kubernetes ``resource.Quantity`` strings: parse them; write integers as the API server does.

A quantity we publish is read back from the API server in *its* canonical form,
so we write that form directly: then a slice read back compares equal to the
slice we rendered, and a restart causes no writes. The server re-parses what a
client sends, so Go's ``NewQuantity(n, BinarySI)`` followed by the round trip
yields: ``<m><Ki|Mi|Gi|Ti|Pi|Ei>`` when ``n`` is a multiple of 1024 (and
``|n| >= 1024``), otherwise the decimal-SI form (``1k``, ``98``, ``3G``).
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Literal

_BINARY_SUFFIXES = ("", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei")
_DECIMAL_SUFFIXES = {0: "", 3: "k", 6: "M", 9: "G", 12: "T", 15: "P", 18: "E"}

_SUFFIX_VALUES: dict[str, Fraction] = {
    **{s: Fraction(1024**i) for i, s in enumerate(_BINARY_SUFFIXES) if s},
    "n": Fraction(1, 10**9),
    "u": Fraction(1, 10**6),
    "m": Fraction(1, 10**3),
    "": Fraction(1),
    "k": Fraction(10**3),
    "M": Fraction(10**6),
    "G": Fraction(10**9),
    "T": Fraction(10**12),
    "P": Fraction(10**15),
    "E": Fraction(10**18),
}
_QUANTITY = re.compile(
    r"^(?P<num>[+-]?(?:\d+(?:\.\d*)?|\.\d+))"
    r"(?:(?P<suffix>Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE])|[eE](?P<exp>[+-]?\d+))?$"
)


class QuantityError(ValueError):
    """A string that is not a Kubernetes quantity."""


def format_int(value: int) -> str:
    """The API server's canonical string for the integer quantity ``value``."""
    if not -(2**63) <= value < 2**63:
        raise QuantityError(f"{value} does not fit a quantity's int64")
    if value == 0:
        return "0"
    magnitude = abs(value)
    sign = "-" if value < 0 else ""
    if magnitude >= 1024 and magnitude % 1024 == 0:
        power = 0
        while magnitude % 1024 == 0 and power < len(_BINARY_SUFFIXES) - 1:
            magnitude //= 1024
            power += 1
        return f"{sign}{magnitude}{_BINARY_SUFFIXES[power]}"
    exponent = 0
    while magnitude % 10 == 0:
        magnitude //= 10
        exponent += 1
    while exponent % 3:
        magnitude *= 10
        exponent -= 1
    return f"{sign}{magnitude}{_DECIMAL_SUFFIXES[exponent]}"


def parse(text: str) -> Fraction:
    """The exact value of a quantity string; raises :class:`QuantityError`.

    Two quantities are the same (as ``apiequality.Semantic`` sees them) when
    their parsed values are equal, whatever their spelling.
    """
    match = _QUANTITY.match(text) if isinstance(text, str) else None
    if match is None:
        raise QuantityError(f"{text!r} is not a quantity (e.g. 80Gi, 1k, 7)")
    number = Fraction(match["num"])
    if match["exp"] is not None:
        return number * Fraction(10) ** int(match["exp"])
    return number * _SUFFIX_VALUES[match["suffix"] or ""]


# ------------------------------------------------------------------ exact Kubernetes semantics
#
# ``Quantity`` mirrors k8s.io/apimachinery/pkg/api/resource.Quantity exactly: the
# same parser (including its odd corners: "." and "Mi" are zero), the same
# rounding up to nano units, the same canonical string, and the same internal
# split between the int64 fast path and the arbitrary-precision path, because
# ``asInteger``/``isInteger`` in CEL observe that split ("1000m" is not an
# integer there). The allocator's CEL environment and its capacity maths use it.

QuantityFormat = Literal["DecimalSI", "BinarySI", "DecimalExponent"]

_INT64_MAX = 2**63 - 1
_INT64_MIN = -(2**63)
_NANO_EXP = -9
_SPLIT_RE = "^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
ERR_FORMAT = f"quantities must match the regular expression '{_SPLIT_RE}'"
ERR_NUMERIC = "unable to parse numeric part of quantity"
ERR_SUFFIX = "unable to parse quantity's suffix"
_SUFFIX_CHARS = frozenset("eEinumkKMGTP")
_DIGITS = frozenset("0123456789")
_DEC_SUFFIX_EXP = {
    "n": -9,
    "u": -6,
    "m": -3,
    "": 0,
    "k": 3,
    "M": 6,
    "G": 9,
    "T": 12,
    "P": 15,
    "E": 18,
}
_BIN_SUFFIX_EXP = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_EXP_DEC_SUFFIX = {e: s for s, e in _DEC_SUFFIX_EXP.items()}
_EXP_BIN_SUFFIX = {e // 10: s for s, e in _BIN_SUFFIX_EXP.items()}


def _ten(power: int) -> int:
    """10**power for power >= 0, typed as int."""
    result: int = 10**power
    return result


def _fits_int64(value: int) -> bool:
    return _INT64_MIN <= value <= _INT64_MAX


def _split(text: str) -> tuple[bool, str, str, str, str]:
    """Go's ``parseQuantityString``: (positive, value, num, denom, suffix)."""
    positive, pos, end = True, 0, len(text)
    if text[0] in "+-":
        positive = text[0] == "+"
        pos = 1
    while pos < end and text[pos] == "0":
        pos += 1
    if pos >= end:
        return positive, "0", "0", "", ""
    start = pos
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    num = text[start:pos] or "0"
    if pos >= end:
        return positive, text, num, "", ""
    denom = ""
    if text[pos] == ".":
        pos += 1
        start = pos
        while pos < end and text[pos] in _DIGITS:
            pos += 1
        denom = text[start:pos]
        if pos >= end:
            return positive, text, num, denom, ""
    value = text[:pos]
    suffix_start = pos
    while pos < end and text[pos] in _SUFFIX_CHARS:
        pos += 1
    if pos < end and text[pos] in "+-":
        pos += 1
    while pos < end and text[pos] in _DIGITS:
        pos += 1
    if pos < end:
        raise QuantityError(ERR_FORMAT)
    return positive, value, num, denom, text[suffix_start:]


def _interpret(suffix: str) -> tuple[int, int, QuantityFormat]:
    """(base, exponent, format) of a suffix, as Go's ``quantitySuffixer.interpret``."""
    if suffix in _DEC_SUFFIX_EXP:
        return 10, _DEC_SUFFIX_EXP[suffix], "DecimalSI"
    if suffix in _BIN_SUFFIX_EXP:
        return 2, _BIN_SUFFIX_EXP[suffix], "BinarySI"
    if len(suffix) > 1 and suffix[0] in "eE":
        digits = suffix[1:]
        body = digits[1:] if digits[0] in "+-" else digits
        if body and all(c in _DIGITS for c in body):
            return 10, int(digits), "DecimalExponent"
    raise QuantityError(ERR_SUFFIX)


def _decimal_value(value: str) -> tuple[int, int]:
    """``inf.Dec.SetString``: a signed decimal as (unscaled, exponent)."""
    sign = -1 if value.startswith("-") else 1
    body = value.lstrip("+-")
    whole, _, frac = body.partition(".")
    digits = (whole + frac) or "0"
    if not all(c in _DIGITS for c in digits):
        raise QuantityError(ERR_NUMERIC)
    return sign * int(digits), -len(frac)


class Quantity:
    """An exact Kubernetes quantity: ``unscaled * 10**exp`` plus its format.

    ``dec`` records whether Go would hold the value as ``inf.Dec`` (slow path)
    rather than ``int64Amount``; only :meth:`as_int64` looks at it.
    """

    __slots__ = ("dec", "exp", "format", "unscaled")

    def __init__(
        self, unscaled: int, exp: int = 0, fmt: QuantityFormat = "DecimalSI", dec: bool = False
    ) -> None:
        self.unscaled = unscaled
        self.exp = exp
        self.format: QuantityFormat = fmt
        self.dec = dec

    # ---------------------------------------------------------- construction

    @classmethod
    def parse(cls, text: str) -> Quantity:
        """Go's ``resource.ParseQuantity``; raises :class:`QuantityError` with Go's message."""
        if not isinstance(text, str) or text == "":
            raise QuantityError(ERR_FORMAT)
        if text == "0":
            return cls(0)
        positive, value, num, denom, suffix = _split(text)
        base, exponent, fmt = _interpret(suffix)
        precision, scale, mantissa = 0, 0, 1
        if fmt == "BinarySI":
            if exponent >= 0 and not denom:
                mantissa = 1 << exponent
                precision = 15 - len(num) - int(exponent * 3 / 10) - 1
            else:
                precision = -1
        else:
            scale = exponent
            precision = 18 - (len(num) + len(denom))
        if precision >= 0:
            scale -= len(denom)
            if scale >= _NANO_EXP:
                result = int(num + denom) * mantissa
                if _fits_int64(result):
                    return cls(result if positive else -result, scale, fmt)
        return cls._parse_slow(value, base, exponent, fmt)

    @classmethod
    def _parse_slow(cls, value: str, base: int, exponent: int, fmt: QuantityFormat) -> Quantity:
        unscaled, exp = _decimal_value(value)
        if base == 10:
            exp += exponent
        else:
            unscaled *= 1 << exponent
        negative = unscaled < 0
        unscaled = abs(unscaled)
        if unscaled != 0:  # round up to whole nano units
            if exp >= _NANO_EXP:
                unscaled *= 10 ** (exp - _NANO_EXP)
            else:
                unscaled = -(-unscaled // 10 ** (_NANO_EXP - exp))
            exp = _NANO_EXP
        if fmt == "BinarySI" and unscaled > _INT64_MAX * 10 ** (-exp):  # Go caps binary at int64
            unscaled, exp = _INT64_MAX, 0
        if fmt == "BinarySI" and 0 < unscaled < 10 ** (-exp):  # below 1: no binary form
            fmt = "DecimalSI"
        return cls(-unscaled if negative else unscaled, exp, fmt, dec=True)

    @classmethod
    def from_int(cls, value: int, fmt: QuantityFormat = "BinarySI") -> Quantity:
        """Go's ``resource.NewQuantity(value, format)``."""
        if not _fits_int64(value):
            raise QuantityError(f"{value} does not fit a quantity's int64")
        return cls(value, 0, fmt)

    # ---------------------------------------------------------- value

    def nanos(self) -> int:
        """The exact value in units of 10**-9 (values never go finer than that)."""
        shift: int = self.exp - _NANO_EXP
        if shift >= 0:
            return self.unscaled * _ten(shift)
        return self.unscaled // _ten(-shift)  # not produced by parse

    def sign(self) -> int:
        return (self.unscaled > 0) - (self.unscaled < 0)

    def is_zero(self) -> bool:
        return self.unscaled == 0

    def cmp(self, other: Quantity) -> int:
        a, b = self.nanos(), other.nanos()
        return (a > b) - (a < b)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Quantity) and self.nanos() == other.nanos()

    def __hash__(self) -> int:
        return hash(self.nanos())

    def __lt__(self, other: Quantity) -> bool:
        return self.cmp(other) < 0

    def as_int64(self) -> int | None:
        """Go's ``AsInt64``: None where Go reports false (Dec form, negative scale, overflow)."""
        if self.dec or self.exp < 0:
            return None
        value = self.unscaled * 10**self.exp
        return value if _fits_int64(value) else None

    def value_ceil(self) -> int:
        """Go's ``Value()``: the value rounded up to an integer."""
        nanos = self.nanos()
        return -(-nanos // 10**9)

    def as_approximate_float(self) -> float:
        if self.exp == 0:
            return float(self.unscaled)
        return float(self.unscaled) * float(f"1e{self.exp}")

    # ---------------------------------------------------------- arithmetic

    def add(self, other: Quantity) -> Quantity:
        """Go's ``q.Add(y)`` on a copy of ``q``."""
        fmt = other.format if self.is_zero() else self.format
        if not self.dec and not other.dec:
            if other.unscaled == 0:
                return Quantity(self.unscaled, self.exp, fmt)
            if self.unscaled == 0:
                return Quantity(other.unscaled, other.exp, fmt)
            exp = min(self.exp, other.exp)
            total = self.unscaled * 10 ** (self.exp - exp) + other.unscaled * 10 ** (
                other.exp - exp
            )
            scaled_ok = _fits_int64(self.unscaled * 10 ** (self.exp - exp)) and _fits_int64(
                other.unscaled * 10 ** (other.exp - exp)
            )
            if scaled_ok and _fits_int64(total):
                return Quantity(total, exp, fmt)
        exp = min(self.exp, other.exp)
        total = self.unscaled * 10 ** (self.exp - exp) + other.unscaled * 10 ** (other.exp - exp)
        return Quantity(total, exp, fmt, dec=True)

    def neg(self) -> Quantity:
        return Quantity(-self.unscaled, self.exp, self.format, self.dec)

    def sub(self, other: Quantity) -> Quantity:
        fmt = other.format if self.is_zero() else self.format
        result = self.add(other.neg())
        result.format = fmt
        return result

    # ---------------------------------------------------------- canonical form

    def __str__(self) -> str:
        """Go's ``Quantity.String()``: the canonical form."""
        if self.unscaled == 0:
            return "0"
        fmt = self.format
        nanos = self.nanos()
        if fmt == "BinarySI":
            if -1024 * 10**9 < nanos < 1024 * 10**9 or nanos % 10**9:
                fmt = "DecimalSI"
            else:
                number, power = nanos // 10**9, 0
                while abs(number) >= 1024 and number % 1024 == 0:
                    number //= 1024
                    power += 1
                return f"{number}{_EXP_BIN_SUFFIX.get(power, '')}"
        mantissa, exp = self.unscaled, self.exp
        while abs(mantissa) >= 10 and mantissa % 10 == 0:
            mantissa //= 10
            exp += 1
        while exp % 3:
            mantissa *= 10
            exp -= 1
        if fmt == "DecimalExponent":
            return f"{mantissa}e{exp}" if exp else str(mantissa)
        return f"{mantissa}{_EXP_DEC_SUFFIX.get(exp, '')}"

    def __repr__(self) -> str:
        return f"Quantity({str(self)!r})"


def canonical(text: str) -> str:
    """The canonical spelling of a quantity string (what the API server stores)."""
    return str(Quantity.parse(text))


__all__ = ["Quantity", "QuantityError", "canonical", "format_int", "parse"]
