"""Type checks cel-expr-python leaves out, and the equality cel-go applies to our types.

Kubernetes declares ``device`` as an object type: ``driver`` a string,
``attributes`` a map of maps of dyn, ``capacity`` a map of maps of
``kubernetes.Quantity``, ``allowMultipleAllocations`` a bool. The runtime here
sees ``device`` as a map of dyn (it cannot declare an object with fields of
different types), so ``device.capacity["d"].memory == "x"`` and a selector
that returns ``device.driver`` would compile. :func:`typed_rewrite` spells
each ``device.<field>`` as a variable of its own with the same length
(``device_<field>``), so a second compile checks the types with the error
columns of the original text.

Kubernetes' environment also enables homogeneous aggregate literals
(``[1, "a"]`` does not compile): :func:`heterogeneous_literal` says where a list
literal mixes literal types, in cel-go's words.

At run time cel-go compares a Semver, Quantity, IP, CIDR, URL or Format only
with its own type: any other operand of ``==`` gives ``no such overload``
(cel-cpp answers false). :func:`equality_edits` rewrites each ``==`` whose left
side may hold one into a form that raises that error (lib.py, equality.py).
"""

from __future__ import annotations

import re

from services.allocator.cel.equality import EQUAL
from services.allocator.cel.parse import Node

TYPED_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")
PLAIN = "__k8s_plain"


Edit = tuple[int, int, str]  # replace text[start:end] with the string


def _device_field(node: Node, expression: str) -> bool:
    return (
        node.kind == "select"
        and not node.optional
        and node.args[0].kind == "ident"
        and node.args[0].name == "device"
        and node.name in TYPED_FIELDS
        and expression[node.start : node.end] == f"device.{node.name}"
    )


def typed_rewrite(expression: str, tree: Node) -> str:
    """The expression with every plain ``device.<field>`` as ``device_<field>``
    (except directly inside ``has()``, which needs a field selection)."""
    in_has = {
        id(arg)
        for node in tree.walk()
        if node.kind == "call" and node.name == "has"
        for arg in node.args
    }
    text = list(expression)
    for node in tree.walk():
        if _device_field(node, expression) and id(node) not in in_has:
            text[node.start + len("device")] = "_"
    return "".join(text)


_LITERAL_TYPES = {bool: "bool", int: "int", float: "double", str: "string", bytes: "bytes"}


def _literal_type(node: Node, expression: str) -> str | None:
    if node.kind != "lit" or node.value is None:
        return None
    name = _LITERAL_TYPES.get(type(node.value))
    if name == "int" and expression[node.start : node.end].lower().endswith("u"):
        return "uint"
    return name


def heterogeneous_literal(expression: str, tree: Node) -> str | None:
    """cel-go's error for the first list literal mixing literal element types (literals
    inside a ``format`` call are exempt: cel-go's string.format validator asks so)."""
    exempt = {
        id(inner)
        for node in tree.walk()
        if node.kind == "call" and node.target and node.name == "format"
        for arg in node.args[1:]
        for inner in arg.walk()
    }
    for node in tree.walk():
        if node.kind != "list" or id(node) in exempt:
            continue
        first: str | None = None
        for element in node.args:
            kind = _literal_type(element, expression)
            if kind is None:
                continue
            if first is None:
                first = kind
            elif kind != first:
                return error_at(
                    expression, element.start, f"expected type '{first}' but found '{kind}'"
                )
    return None


def error_at(expression: str, offset: int, message: str) -> str:
    line_no = expression.count("\n", 0, offset) + 1
    line_start = expression.rfind("\n", 0, offset) + 1
    line_end = expression.find("\n", offset)
    line = expression[line_start : line_end if line_end >= 0 else len(expression)]
    column = offset - line_start + 1
    return f"ERROR: <input>:{line_no}:{column}: {message}\n | {line}\n | {'.' * (column - 1)}^"


def _plain_literal(node: Node) -> bool:
    return node.kind == "lit" and node.value is not None


# Calls whose result is never a Semver, Quantity, IP, CIDR, URL or Format.
_NEVER_MESSAGE_CALLS = frozenset(
    (
        "size int uint double string bytes bool has contains startsWith endsWith matches "
        "lowerAscii upperAscii trim replace substring charAt indexOf lastIndexOf split join "
        "format find findAll isSorted compareTo isGreaterThan isLessThan isInteger asInteger "
        "asApproximateFloat sign major minor patch family isLoopback isUnspecified "
        "isLinkLocalMulticast isLinkLocalUnicast isGlobalUnicast prefixLength containsIP "
        "containsCIDR isQuantity isSemver isIP isCIDR isURL getScheme getHost getHostname "
        "getPort getEscapedPath getQuery all exists exists_one existsOne map filter "
        "hasValue timestamp duration"
    ).split()
)


def _may_hold_message(node: Node) -> bool:
    """Whether ``node`` may evaluate to one of our message types (by its form)."""
    if node.kind in ("lit", "list", "map", "unary", "binary"):
        return False
    return not (node.kind == "call" and node.name in _NEVER_MESSAGE_CALLS)


def _optional(node: Node) -> bool:
    """An optional value by its form: ``optional.x(...)``, ``m[?k]``, ``x.?f``."""
    if node.optional:
        return True
    return (
        node.kind == "call"
        and node.target
        and node.args[0].kind == "ident"
        and node.args[0].name == "optional"
    )


def equality_edits(expression: str, tree: Node) -> list[Edit]:
    """Edits giving ``A == B`` cel-go's answer when ``A`` holds a Semver, Quantity,
    IP, CIDR, URL or Format and ``B`` does not hold the same type (equality.py).

    Against a plain literal ``L``, ``A == L`` becomes ``__k8s_plain(A) == L``: A
    unchanged, unless it is one of our message types, which raises ``no such
    overload``. Against a computed ``B`` it becomes ``__k8s_equal(A, B)``, which
    evaluates both (B's error counts when A has none, as in cel-go) and compares
    as cel-go does. An optional ``B`` (whose kind cannot be declared) is taken as a
    literal, and an optional ``A`` is left as it is (never one of ours). Only the
    left operand's type decides in cel-go (its ``Equal`` is called), so ``"1.0.0"
    == semver`` stays false, null compares false, and ``!=`` never fails
    (measured against reference-allocator: ``semver != "x"`` is true). (Not
    ``cel.bind``: cel-cpp loses an error raised in a bind's initializer next to a
    comprehension over a function's result.)
    """
    edits: list[Edit] = []
    for node in tree.walk():
        if node.kind != "binary" or node.name != "==":
            continue
        left, right = node.args
        if _plain_literal(left) or not _may_hold_message(left):
            continue
        if (right.kind == "lit" and right.value is None) or _optional(left):
            continue
        if _plain_literal(right) or _optional(right):
            edits += [(left.start, left.start, f"{PLAIN}("), (left.end, left.end, ")")]
            continue
        gap = expression[left.end : right.start].replace("==", ",", 1)
        start = _before_parens(expression, left.start, gap.count(")", 0, gap.index(",")))
        edits += [
            (start, start, f"{EQUAL}("),
            (left.end, right.start, gap),
            (right.end, right.end, ")"),
        ]
    return edits


def _before_parens(expression: str, start: int, count: int) -> int:
    """Where the ``count`` parentheses opened just before ``start`` begin (an
    operand's span leaves out the parentheses around it)."""
    while count:
        start -= 1
        if expression[start] == "(":
            count -= 1
    return start


def apply_edits(expression: str, edits: list[Edit]) -> str:
    """Apply non-overlapping edits; at one position, insertions go before replacements."""
    ordered = sorted(edits, key=lambda e: (e[0], e[1] != e[0], e[1]))
    out: list[str] = []
    pos = 0
    for start, end, text in ordered:
        out.append(expression[pos:start])
        out.append(text)
        pos = max(pos, end)
    out.append(expression[pos:])
    return "".join(out)


MATCHES = "__k8s_matches"
_MEMBER_MATCHES = re.compile(r"\.\s*matches\s*\(")


def regex_edits(expression: str, tree: Node) -> list[Edit]:
    """Edits that run every ``matches`` with Go's regexp (goregexp.py) instead of the
    runtime's RE2: ``T.matches(P)`` and ``matches(T, P)`` become ``__k8s_matches(T, P)``.
    (Go refuses ``\\C`` and reads classes with Unicode 15.0 tables; the runtime's RE2
    accepts ``\\C``, has newer tables and a smaller program budget.)"""
    edits: list[Edit] = []
    for node in tree.walk():
        if node.kind != "call" or node.name != "matches" or len(node.args) != 2:
            continue
        if not node.target:
            edits.append((node.start, node.start + len("matches"), MATCHES))
            continue
        target, pattern = node.args
        gap = expression[target.end : pattern.start]
        call = _MEMBER_MATCHES.search(gap)
        if call is None:
            continue
        start = _before_parens(expression, target.start, gap.count(")", 0, call.start()))
        edits += [
            (start, start, f"{MATCHES}("),
            (target.end + call.start(), target.end + call.end(), ", "),
        ]
    return edits


# Quantity arithmetic ending in isInteger()/asInteger(), with Go's representation.
QREP, QREP_OF, QADD, QSUB, QIS_INT, QAS_INT = (
    "__k8s_qrep",
    "__k8s_qrep_of",
    "__k8s_qadd",
    "__k8s_qsub",
    "__k8s_qisint",
    "__k8s_qasint",
)
_ENDS = {"isInteger": QIS_INT, "asInteger": QAS_INT}
_STEPS = {"add": QADD, "sub": QSUB}
_METHOD = re.compile(r"\.\s*([A-Za-z_]+)\s*\(")


def representation_edits(expression: str, tree: Node) -> list[Edit]:
    """Edits that run ``R.add(a).sub(b).isInteger()`` (and ``asInteger``) on Go's
    representation of the quantity, where ``R`` is ``quantity("<literal>")`` or the
    chain does arithmetic.

    Go answers isInteger from how the quantity is held, not its value: ``1000m``
    (an int64 with scale -3), ``1Ei`` (parsed as a decimal) and a sum that once
    overflowed int64 are not integers there. A Quantity value in CEL here is its
    exact value only (equality compares it), so the chain is rewritten into
    functions that carry the representation as a string (lib.py):
    ``__k8s_qisint(__k8s_qsub(__k8s_qadd(__k8s_qrep("1Ei"), a), b))``; a
    ``quantity("<literal>")`` argument of ``add``/``sub`` keeps its representation too.
    """
    edits: list[Edit] = []
    for node in tree.walk():
        if node.kind != "call" or node.name not in _ENDS or not node.target:
            continue
        if len(node.args) != 1:
            continue
        chain: list[Node] = [node]
        root = node.args[0]
        while root.kind == "call" and root.target and root.name in _STEPS and len(root.args) == 2:
            chain.append(root)
            root = root.args[0]
        if not _literal_quantity(root) and len(chain) == 1:
            continue
        steps = _chain_edits(expression, chain)
        if steps is None:
            continue
        links, parens = steps
        # Each call's name goes before the parentheses around its receiver (and around
        # every receiver inside it): outermost first at one position.
        for i, call in enumerate(chain):
            start = _before_parens(expression, root.start, sum(parens[i:]))
            edits.append((start, start, f"{_name(call)}("))
        if _literal_quantity(root):
            edits.append((root.start, root.start + len("quantity"), QREP))
        else:
            edits += [(root.start, root.start, f"{QREP_OF}("), (root.end, root.end, ")")]
        edits += links
        for call in chain[1:]:
            if _literal_quantity(call.args[1]):
                arg = call.args[1]
                edits.append((arg.start, arg.start + len("quantity"), QREP))
    return edits


def _literal_quantity(node: Node) -> bool:
    return (
        node.kind == "call"
        and not node.target
        and node.name == "quantity"
        and len(node.args) == 1
        and node.args[0].kind == "lit"
        and isinstance(node.args[0].value, str)
    )


def _name(call: Node) -> str:
    return _ENDS.get(call.name) or _STEPS[call.name]


_LINK = re.compile(r"([\s)]*)\.\s*([A-Za-z_]+)\s*\(")


def _chain_edits(expression: str, chain: list[Node]) -> tuple[list[Edit], list[int]] | None:
    """``.add(`` -> ``, ``; ``.isInteger(`` -> nothing (its ``)`` closes the call), and
    how many parentheses close around each receiver; None when the text is not that."""
    edits: list[Edit] = []
    parens: list[int] = []
    for call in chain:
        target = call.args[0]
        stop = call.args[1].start if len(call.args) > 1 else call.end
        found = _LINK.match(expression, target.end, stop)
        if found is None or found.group(2) != call.name:
            return None
        parens.append(found.group(1).count(")"))
        replacement = ", " if call.name in _STEPS else ""
        edits.append((found.end(1), found.end(), replacement))
    return edits, parens


FORMAT = "__k8s_format"
_MEMBER_FORMAT = re.compile(r"\.\s*format\s*\(")


def format_edits(expression: str, tree: Node) -> list[Edit]:
    """``S.format(L)`` becomes ``__k8s_format(S, L)``: cel-go's run-time text
    (strformat.py), not cel-cpp's."""
    edits: list[Edit] = []
    for node in tree.walk():
        if node.kind != "call" or node.name != "format" or not node.target:
            continue
        if len(node.args) != 2:
            continue
        target, args = node.args
        if target.kind == "ident" and target.name == "format":
            continue  # format.named(...), Kubernetes' format library
        gap = expression[target.end : args.start]
        call = _MEMBER_FORMAT.search(gap)
        if call is None:
            continue
        start = _before_parens(expression, target.start, gap.count(")", 0, call.start()))
        edits += [
            (start, start, f"{FORMAT}("),
            (target.end + call.start(), target.end + call.end(), ", "),
        ]
    return edits


def runtime_edits(expression: str, tree: Node) -> list[Edit]:
    """Every rewrite of the program that gives Go's answers at run time (regexes, quantity
    representations, string.format's text); env.py applies them with its own."""
    return (
        regex_edits(expression, tree)
        + representation_edits(expression, tree)
        + format_edits(expression, tree)
    )
