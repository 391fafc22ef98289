# ruff: noqa: RUF001, RUF002 (the multiplication sign is what Go prints)
"""``string.format`` as cel-go runs it (ext/formatting.go, strings extension v2).

cel-cpp's ``format`` writes its own text, and cel-go's differs in most clauses:
``%s`` of a double is Go's ``%g`` (``1.23456789e+08``), lists and maps quote their
strings (``["a", 2.500000]``) and maps sort their keys, ``%f`` and ``%e`` go through
golang.org/x/text's printer for ``en_US`` (``1,234.57``, ``1.500000×10⁰⁰``, ``∞``;
and ``%e`` takes its precision as a width, so it always has six decimals). A
selector comparing such text would be allocated by one and not the other, so
env.py runs every ``"...".format([...])`` through :func:`format_string` (a
rewrite, check.runtime_edits). Compile-time checks are literals.py's.
"""

from __future__ import annotations

import math
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any

DEFAULT_PRECISION = 6
_SUPERSCRIPT = str.maketrans("0123456789-", "⁰¹²³⁴⁵⁶⁷⁸⁹⁻")


class FormatError(ValueError):
    """A run-time error of string.format, in cel-go's words."""


def format_string(text: str, args: list[Any]) -> str:
    """parseFormatString with cel-go's run-time clauses."""
    out: list[str] = []
    i, index = 0, 0
    while i < len(text):
        if text[i] != "%":
            out.append(text[i])
            i += 1
            continue
        if text[i + 1 : i + 2] == "%":
            out.append("%")
            i += 2
            continue
        if index >= len(args):
            raise FormatError(f"index {index} out of range")
        if i + 1 >= len(text):
            raise FormatError("unexpected end of string")
        read, verb, precision = _clause(text[i + 1 :])
        try:
            out.append(_CLAUSES[verb](args[index], precision))
        except FormatError as exc:
            raise FormatError(f"error during formatting: {exc}") from None
        i += 1 + read
        index += 1
    return "".join(out)


def _clause(text: str) -> tuple[int, str, int | None]:
    i = 0
    precision: int | None = None
    if text[:1] == ".":
        i = 1
        while i < len(text) and text[i].isascii() and text[i].isdigit():
            i += 1
        if i >= len(text):
            raise FormatError(
                "could not parse formatting clause: error while parsing precision: "
                "could not find end of precision specifier"
            )
        if i == 1:
            raise FormatError(
                "could not parse formatting clause: error while parsing precision: error while "
                'converting precision to integer: strconv.Atoi: parsing "": invalid syntax'
            )
        precision = int(text[1:i])
    verb = text[i]
    if verb not in _CLAUSES:
        raise FormatError(
            f'could not parse formatting clause: unrecognized formatting clause "{verb}"'
        )
    return i + 1, verb, precision


# ------------------------------------------------------------------ kinds and names


def type_name(value: Any) -> str:
    """cel-go's TypeName of a run-time value."""
    if value is None:
        return "null_type"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "double"
    if isinstance(value, str):
        return "string"
    if isinstance(value, (bytes, bytearray)):
        return "bytes"
    if isinstance(value, list):
        return "list"
    if isinstance(value, dict):
        return "map"
    if isinstance(value, datetime):
        return "google.protobuf.Timestamp"
    if isinstance(value, timedelta):
        return "google.protobuf.Duration"
    if _is_type(value):
        return "type"
    descriptor = getattr(value, "DESCRIPTOR", None)
    full = getattr(descriptor, "full_name", "")
    return {
        "gpudra.cel.Quantity": "kubernetes.Quantity",
        "gpudra.cel.Semver": "kubernetes.Semver",
    }.get(full, full or type(value).__name__)


def _is_type(value: Any) -> bool:
    return type(value).__name__ == "Type" and hasattr(value, "name")


def _type_text(value: Any) -> str:
    name = str(value.name())
    return name if "." in name else name.lower()


# ------------------------------------------------------------------ Go's texts


def go_g(value: float) -> str:
    """Go's ``%g`` (strconv 'g', shortest): ``1.5``, ``1e+06``, ``1.23456789e+08``."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    if value == 0:
        return "-0" if math.copysign(1.0, value) < 0 else "0"
    sign, digits, exponent = Decimal(repr(value)).normalize().as_tuple()
    text = "".join(str(d) for d in digits)
    assert isinstance(exponent, int)
    point = len(text) + exponent  # digits before the decimal point
    exp = point - 1
    prefix = "-" if sign else ""
    if exp < -4 or exp >= 6:  # shortest: %e below 1e-4 and from 1e6
        mantissa = text[0] + ("." + text[1:] if len(text) > 1 else "")
        return f"{prefix}{mantissa}e{'-' if exp < 0 else '+'}{abs(exp):02d}"
    if point <= 0:
        return f"{prefix}0.{'0' * -point}{text}"
    if point >= len(text):
        return f"{prefix}{text}{'0' * (point - len(text))}"
    return f"{prefix}{text[:point]}.{text[point:]}"


def go_quote(text: str) -> str:
    """strconv.Quote."""
    out = ['"']
    for ch in text:
        code = ord(ch)
        if ch in '"\\':
            out.append("\\" + ch)
        elif ch in _C_ESCAPES:
            out.append(_C_ESCAPES[ch])
        elif code < 0x20 or code == 0x7F:
            out.append(f"\\x{code:02x}")
        elif ch.isprintable() or ch == " ":
            out.append(ch)
        elif code <= 0xFFFF:
            out.append(f"\\u{code:04x}")
        else:
            out.append(f"\\U{code:08x}")
    out.append('"')
    return "".join(out)


_C_ESCAPES = {
    "\a": "\\a",
    "\b": "\\b",
    "\f": "\\f",
    "\n": "\\n",
    "\r": "\\r",
    "\t": "\\t",
    "\v": "\\v",
}


def _group(whole: str) -> str:
    digits = whole.lstrip("-")
    groups: list[str] = []
    while len(digits) > 3:
        groups.insert(0, digits[-3:])
        digits = digits[:-3]
    groups.insert(0, digits)
    return ("-" if whole.startswith("-") else "") + ",".join(groups)


def _special(value: float) -> str | None:
    """x/text's NaN and infinities."""
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "∞" if value > 0 else "-∞"
    return None


def x_text_fixed(value: float, precision: int) -> str:
    """message.Printer("en_US").Sprintf("%.<p>f"): grouped thousands, ∞, NaN."""
    special = _special(value)
    if special is not None:
        return special
    if value == 0:
        value = 0.0  # the printer drops a negative zero's sign
    text = f"{value:.{precision}f}"
    whole, _, fraction = text.partition(".")
    return _group(whole) + ("." + fraction if fraction else "")


def x_text_scientific(value: float, width: int) -> str:
    """message.Printer("en_US").Sprintf("%<width>e"): ``1.500000×10⁰⁰``."""
    special = _special(value)
    if special is not None:
        return special.rjust(width)
    if value == 0:
        value = 0.0
    mantissa, _, exponent = f"{value:.6e}".partition("e")
    sign = "-" if exponent.startswith("-") else ""
    digits = exponent.lstrip("+-")
    return f"{mantissa}×10{(sign + digits).translate(_SUPERSCRIPT)}".rjust(width)


# ------------------------------------------------------------------ clauses


def _string(value: Any, precision: int | None = None) -> str:
    """FormatString."""
    if isinstance(value, list):
        return _list(value)
    if isinstance(value, dict):
        return _map(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        return go_g(value)
    if isinstance(value, str):
        return value
    if isinstance(value, (bytes, bytearray)):
        try:
            return bytes(value).decode()
        except UnicodeDecodeError:
            raise FormatError("invalid UTF-8 in bytes, cannot convert to string") from None
    if isinstance(value, datetime):
        return _timestamp(value)
    if isinstance(value, timedelta):
        return _duration(value)
    if _is_type(value):
        return _type_text(value)
    raise FormatError(
        "string clause can only be used on strings, bools, bytes, ints, doubles, maps, lists, "
        f"types, durations, and timestamps, was given {type_name(value)}"
    )


def _timestamp(value: datetime) -> str:
    """time.RFC3339Nano in UTC."""
    text = value.strftime("%Y-%m-%dT%H:%M:%S")
    if value.microsecond:
        text += f".{value.microsecond:06d}".rstrip("0")
    return text + "Z"


def _duration(value: timedelta) -> str:
    seconds = Decimal(value.days * 86400 + value.seconds) + Decimal(value.microseconds) / 10**6
    text = format(seconds.normalize(), "f")
    return (text if "." not in text else text.rstrip("0").rstrip(".")) + "s"


def _element(value: Any) -> str:
    """clauseForType then quoteForCEL, for a list element or map value."""
    if isinstance(value, bool) or value is None or _is_type(value):
        return _string(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        text = f"{value:.{DEFAULT_PRECISION}f}"
        if math.isnan(value) or math.isinf(value):
            return go_quote("NaN" if math.isnan(value) else ("+Inf" if value > 0 else "-Inf"))
        return text
    if isinstance(value, str):
        return go_quote(value)
    if isinstance(value, (bytes, bytearray)):
        return "b" + go_quote(_string(value))
    if isinstance(value, datetime):
        return f"timestamp({go_quote(_timestamp(value))})"
    if isinstance(value, timedelta):
        return f"duration({go_quote(_duration(value))})"
    if isinstance(value, list):
        return _list(value)
    if isinstance(value, dict):
        return _map(value)
    raise FormatError(f"no formatting function for {type_name(value)}")


def _list(values: list[Any]) -> str:
    return "[" + ", ".join(_element(v) for v in values) + "]"


def _map(values: dict[Any, Any]) -> str:
    pairs = []
    for key, value in values.items():
        if isinstance(key, str):
            text = go_quote(key)
        elif isinstance(key, bool):
            text = "true" if key else "false"
        elif isinstance(key, int):
            text = str(key)
        else:
            raise FormatError(f"no formatting function for map key of type {type_name(key)}")
        pairs.append((text, _element(value)))
    pairs.sort(key=lambda pair: pair[0])
    return "{" + ", ".join(f"{k}:{v}" for k, v in pairs) + "}"


def _decimal(value: Any, precision: int | None = None) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    raise FormatError(f"decimal clause can only be used on integers, was given {type_name(value)}")


def _float_argument(value: Any, clause: str) -> float:
    if isinstance(value, str) and value in ("NaN", "Infinity", "-Infinity"):
        return float(value.replace("Infinity", "inf"))
    if isinstance(value, float):
        return value
    raise FormatError(f"{clause} clause can only be used on doubles, was given {type_name(value)}")


def _fixed(value: Any, precision: int | None) -> str:
    number = _float_argument(value, "fixed-point")
    return x_text_fixed(number, DEFAULT_PRECISION if precision is None else precision)


def _scientific(value: Any, precision: int | None) -> str:
    number = _float_argument(value, "scientific")
    return x_text_scientific(number, DEFAULT_PRECISION if precision is None else precision)


def _binary(value: Any, precision: int | None = None) -> str:
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return format(value, "b")
    raise FormatError(
        f"only integers and bools can be formatted as binary, was given {type_name(value)}"
    )


def _hex(upper: bool) -> Any:
    def clause(value: Any, precision: int | None = None) -> str:
        if isinstance(value, str):
            text = value.encode().hex()
        elif isinstance(value, (bytes, bytearray)):
            text = bytes(value).hex()
        elif isinstance(value, int) and not isinstance(value, bool):
            text = format(value, "x")
        else:
            raise FormatError(
                "only integers, byte buffers, and strings can be formatted as hex, was given "
                + type_name(value)
            )
        return text.upper() if upper else text

    return clause


def _octal(value: Any, precision: int | None = None) -> str:
    if isinstance(value, int) and not isinstance(value, bool):
        return format(value, "o")
    raise FormatError(f"octal clause can only be used on integers, was given {type_name(value)}")


_CLAUSES: dict[str, Any] = {
    "s": _string,
    "d": _decimal,
    "f": _fixed,
    "e": _scientific,
    "b": _binary,
    "x": _hex(False),
    "X": _hex(True),
    "o": _octal,
}
