"""What cel-go finds wrong with literal arguments before any device is seen.

Kubernetes compiles selectors with cel-go's literal validators (duration,
timestamp and regex literals are checked at compile time) and plans programs
with constant folding, so a conversion of a literal that cannot succeed
(``int("abc")``, ``uint(-1)``) or a ``find`` with a pattern that does not parse
fails when the program is built. The API server refuses such a selector; the
CEL runtime here would only fail it on each device. :func:`literal_problem`
gives the error cel-go gives, in its words.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from datetime import datetime
from functools import lru_cache
from typing import Any

from services.allocator.cel import goregexp
from services.allocator.cel.check import error_at, typed_rewrite
from services.allocator.cel.declarations import new_env, typed_variables
from services.allocator.cel.messages import kubernetes_names, type_name
from services.allocator.cel.parse import Node, ParseError, parse
from services.allocator.cel.regexptree import RegexpError

INSTANTIATION = "program instantiation failed: "
_INT64 = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1
_BOOL_TEXT = {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}
_DURATION = re.compile(r"[-+]?((\d+(\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h))+|[-+]?0")
_TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}[Tt]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})")


def _literal(node: Node, expression: str) -> tuple[bool, object]:
    """(True, value) for a literal, including a negated number; (False, None) otherwise."""
    if node.kind == "lit":
        text = expression[node.start : node.end]
        if isinstance(node.value, int) and text.lower().endswith("u"):
            return True, ("uint", node.value)
        return True, node.value
    if node.kind == "unary" and node.name == "-" and node.args[0].kind == "lit":
        value = node.args[0].value
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return True, -value
    return False, None


def literal_problem(expression: str, tree: Node, type_of: TypeOf | None = None) -> str | None:
    """The first compile-time or plan-time error cel-go reports for literal arguments;
    ``type_of`` gives an argument's checked type name (None: dyn or not known)."""
    types = type_of or _checked_types(expression)
    for node in tree.walk():
        if node.kind != "call":
            continue
        args = node.args[1:] if node.target else node.args
        problem = _compile_time(node, args, expression, types) or _plan_time(node, args, expression)
        if problem:
            return problem
    return None


# cel-go's string.format validator (ext/formatting.go, strings extension version 2):
# the kinds each clause accepts (dyn always passes), and its words.
_CLAUSES = {
    "d": (("int", "uint"), "decimal clause can only be used on integers"),
    "o": (("int", "uint"), "octal clause can only be used on integers"),
    "f": (("double", "string"), "fixed-point clause can only be used on doubles"),
    "e": (("double", "string"), "scientific clause can only be used on doubles"),
    "b": (("int", "uint", "bool"), "only integers and bools can be formatted as binary"),
    "x": (
        ("int", "uint", "string", "bytes"),
        "only integers, byte buffers, and strings can be formatted as hex",
    ),
    "s": (
        (
            "list map int uint double bool string google.protobuf.Timestamp bytes "
            "google.protobuf.Duration type null_type"
        ).split(),
        "string clause can only be used on strings, bools, bytes, ints, doubles, maps, "
        "lists, types, durations, and timestamps",
    ),
}
_CLAUSES["X"] = _CLAUSES["x"]

TypeOf = Callable[[Node], "str | None"]


def _format_problem(node: Node, expression: str, type_of: TypeOf) -> str | None:
    """cel-go's compile-time check of ``"<literal>".format([...])``: each clause parsed
    and checked against the checked type of its argument, the count of arguments."""
    target, args = node.args[0], node.args[1:]
    if target.kind != "lit" or not isinstance(target.value, str):
        return None
    if len(args) != 1 or args[0].kind != "list":
        return None
    elements = args[0].args
    call = expression.index("(", target.end)  # cel-go reports call errors at its '('
    text, i, index, requested = target.value, 0, 0, 0
    while i < len(text):
        if text[i] != "%":
            i += 1
            continue
        if text[i + 1 : i + 2] == "%":
            i += 2
            continue
        requested += 1
        if i + 1 >= len(text):
            return _at(expression, call, "unexpected end of string")
        if index >= len(elements):
            return _at(expression, call, f"index {index} out of range")
        read, verb, problem = _clause(text[i + 1 :])
        if problem:
            return _at(expression, call, f"could not parse formatting clause: {problem}")
        bad = _clause_type(verb, elements[index], type_of)
        if bad is not None:
            where, given = bad
            message = f"{_CLAUSES[verb][1]}, was given {given}"
            return _at(expression, where.start, f"error during formatting: {message}")
        i += 1 + read
        index += 1
    if len(elements) > requested:
        return _at(
            expression,
            call,
            "too many arguments supplied to string.format "
            f"(expected {requested}, got {len(elements)})",
        )
    return None


def _clause(text: str) -> tuple[int, str, str | None]:
    """parseFormattingClause: (characters read, verb, problem)."""
    i = 0
    if text[:1] == ".":
        i = 1
        while True:
            if i >= len(text):
                return (
                    0,
                    "",
                    "error while parsing precision: could not find end of precision specifier",
                )
            if not text[i].isascii() or not text[i].isdigit():
                break
            i += 1
        if i == 1:
            return (
                0,
                "",
                (
                    "error while parsing precision: error while converting precision to integer: "
                    'strconv.Atoi: parsing "": invalid syntax'
                ),
            )
    verb = text[i]
    if verb not in _CLAUSES:
        return 0, "", f'unrecognized formatting clause "{verb}"'
    return i + 1, verb, None


def _clause_type(verb: str, element: Node, type_of: TypeOf) -> tuple[Node, str] | None:
    """(the element at fault, its type name) when the clause does not take it."""
    allowed = _CLAUSES[verb][0]
    given = type_of(element)
    if given is None or given == "dyn":
        return None
    if given.split("(")[0] not in allowed:
        return element, given.split("(")[0]
    if verb == "s" and element.kind in ("list", "map"):
        for sub in element.args:  # a map's args alternate key, value
            bad = _clause_type("s", sub, type_of)
            if bad is not None:
                return bad
    return None


def _at(expression: str, offset: int, message: str) -> str:
    return "compilation failed: " + error_at(expression, offset, message)


def _kind(node: Node, expression: str) -> str | None:
    known, value = _literal(node, expression)
    if not known:
        return None
    if isinstance(value, tuple):
        return "uint"
    names = {bool: "bool", int: "int", float: "double", str: "string", bytes: "bytes"}
    return names.get(type(value))


def _checked_types(expression: str) -> TypeOf:
    """An argument's type as cel-go's checker gives it: literals by their form, anything
    else compiled on its own in the typed environment (None when that fails, e.g. for a
    comprehension's variable, which the check then lets pass as dyn)."""

    def type_of(node: Node) -> str | None:
        if node.kind == "list":
            return "list"
        if node.kind == "map":
            return "map"
        if node.kind == "lit":
            return "null_type" if node.value is None else _kind(node, expression)
        return _compiled_type(expression[node.start : node.end])

    return type_of


@lru_cache(maxsize=1024)
def _compiled_type(text: str) -> str | None:
    try:
        typed = typed_rewrite(text, parse(text))
        checked = _typed_env().compile(typed)
    except (ParseError, RuntimeError):
        return None
    name = kubernetes_names(type_name(checked.return_type()))
    return _GO_TYPE_NAMES.get(name, name)


_GO_TYPE_NAMES: dict[str, str | None] = {
    "error": "google.protobuf.Any",  # cel-cpp's name for Kubernetes' attribute value type
    "timestamp": "google.protobuf.Timestamp",
    "duration": "google.protobuf.Duration",
    "null": "null_type",
}


@lru_cache(maxsize=1)
def _typed_env() -> Any:
    return new_env(typed_variables(True), checking=True)


def _compile_time(node: Node, args: list[Node], expression: str, type_of: TypeOf) -> str | None:
    if node.name == "format" and node.target:
        return _format_problem(node, expression, type_of)
    if node.name == "matches" and not node.target and len(args) == 2:
        # cel-go's ValidateRegexLiterals checks the call's first argument, which in
        # the function form is the text, not the pattern.
        args = args[:1]
    if len(args) != 1 or args[0].kind != "lit" or not isinstance(args[0].value, str):
        return None
    value = args[0].value
    if node.name == "duration" and not node.target and not _DURATION.fullmatch(value):
        message = "invalid duration argument"
    elif node.name == "timestamp" and not node.target and not _timestamp_ok(value):
        message = "invalid timestamp argument"
    elif node.name == "matches" and not _regex_ok(value):
        message = "invalid matches argument"
    else:
        return None
    return "compilation failed: " + error_at(expression, args[0].start, message)


def _plan_time(node: Node, args: list[Node], expression: str) -> str | None:
    regex = None
    if node.name in ("find", "findAll") and node.target and args:
        regex = args[0]
    elif node.name == "matches" and len(node.args) == 2:
        regex = node.args[1]  # the planner compiles a literal pattern (either form)
    if regex is not None:
        if regex.kind == "lit" and isinstance(regex.value, str):
            try:
                goregexp.check(regex.value)
            except RegexpError as exc:
                return f"{INSTANTIATION}{exc}"
        return None
    if node.target or len(args) != 1 or node.name not in ("int", "uint", "double", "bool"):
        return None
    known, value = _literal(args[0], expression)
    if not known:
        return None
    problem = _conversion(node.name, value)
    return INSTANTIATION + problem if problem else None


def _conversion(target: str, value: object) -> str | None:
    """cel-go's error converting a constant, or None when it converts."""
    if isinstance(value, tuple):  # a uint literal
        value = value[1]
        if target == "int" and isinstance(value, int) and value > _INT64[1]:
            return "integer overflow"
        return None
    if isinstance(value, str):
        return (
            None if _parses(target, value) else f"type conversion error from 'string' to '{target}'"
        )
    if isinstance(value, float):
        if target == "int" and (not math.isfinite(value) or not _INT64[0] <= value < 2.0**63):
            return "integer overflow"
        if target == "uint" and (not math.isfinite(value) or not 0 <= value < 2.0**64):
            return "unsigned integer overflow"
    if isinstance(value, int) and not isinstance(value, bool) and target == "uint" and value < 0:
        return "unsigned integer overflow"
    return None


def _parses(target: str, text: str) -> bool:
    if target == "bool":
        return text in _BOOL_TEXT
    try:
        if target == "double":
            float(text)
            return True
        number = int(text, 10)
    except ValueError:
        return False
    if target == "int":
        return _INT64[0] <= number <= _INT64[1]
    return 0 <= number <= _UINT64_MAX


def _timestamp_ok(text: str) -> bool:
    if not _TIMESTAMP.fullmatch(text):
        return False
    try:
        datetime.fromisoformat(text.replace("z", "Z").replace("t", "T").replace("Z", "+00:00"))
    except ValueError:
        return False
    return True


def _regex_ok(pattern: str) -> bool:
    return goregexp.valid(pattern)
