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
from datetime import datetime

from services.allocator.cel import goregexp
from services.allocator.cel.check import error_at
from services.allocator.cel.parse import Node

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


def literal_problem(expression: str, tree: Node) -> str | None:
    """The first compile-time or plan-time error cel-go reports for literal arguments."""
    for node in tree.walk():
        if node.kind != "call":
            continue
        args = node.args[1:] if node.target else node.args
        problem = _compile_time(node, args, expression) or _plan_time(node, args, expression)
        if problem:
            return problem
    return None


_CLAUSE = re.compile(r"%(\.\d+)?([a-zA-Z%])")
_NUMERIC_ONLY = {
    "d": ("decimal clause can only be used on integers", ("int", "uint")),
    "o": ("octal clause can only be used on integers", ("int", "uint")),
    "f": ("fixed-point clause can only be used on doubles", ("double",)),
}  # measured against kube-apiserver 1.35: %e is only checked at run time


def _format_problem(node: Node, expression: str) -> str | None:
    """cel-go's compile-time check of ``"<literal>".format([<literals>])``."""
    target, args = node.args[0], node.args[1:]
    if target.kind != "lit" or not isinstance(target.value, str):
        return None
    if len(args) != 1 or args[0].kind != "list":
        return None
    elements = args[0].args
    index = 0
    for match in _CLAUSE.finditer(target.value):
        verb = match.group(2)
        if verb == "%":
            continue
        if index >= len(elements):
            return None
        element = elements[index]
        index += 1
        rule = _NUMERIC_ONLY.get(verb)
        kind = _kind(element, expression)
        if rule is None or kind is None or kind in rule[1]:
            continue
        message = f"error during formatting: {rule[0]}, was given {kind}"
        return "compilation failed: " + error_at(expression, element.start, message)
    return None


def _kind(node: Node, expression: str) -> str | None:
    known, value = _literal(node, expression)
    if not known:
        return None
    if isinstance(value, tuple):
        return "uint"
    names = {bool: "bool", int: "int", float: "double", str: "string", bytes: "bytes"}
    return names.get(type(value))


def _compile_time(node: Node, args: list[Node], expression: str) -> str | None:
    if node.name == "format" and node.target:
        return _format_problem(node, expression)
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
            except goregexp.RegexpError as exc:
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
