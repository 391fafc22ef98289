"""Worst-case cost of a DRA selector, approximating cel-go's static estimator.

The API server refuses a selector whose estimated cost exceeds
``CELSelectorExpressionMaxCost`` (1,000,000), and kube-scheduler stops one whose
actual cost does. Our CEL runtime tracks no cost, so we estimate statically,
with the bounds Kubernetes declares for the ``device`` variable (at most 32
attributes or capacities per device, strings of at most 64 characters) and the
cost factors of cel-go (0.1 per string character traversed, 10/30/40 for list,
map and message literals, one unit per step of a comprehension). The estimate
is an upper bound of what the expression can cost on any device, so an
expression that passes here never exceeds the limit at run time; it is not
cel-go's exact number.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from services.allocator.cel.formatlib import NAMED, VALIDATE
from services.allocator.cel.listslib import INDEX_OF, LAST_INDEX_OF
from services.allocator.cel.parse import Node, device_path

COST_LIMIT = 1_000_000
MAX_ENTRIES = 32  # attributes + capacities per device
MAX_STRING = 64  # attribute string / version length
MAX_DRIVER = 63
UNKNOWN_SIZE = MAX_STRING  # a value of unknown origin: bounded like a device string
# What cel-go cannot bound: a field or element of an attribute value (Kubernetes'
# unknown type) or of a function's result. Scanning one is over any limit.
UNBOUNDED = 10**10
_TRAVERSAL = 0.1

_COMPREHENSIONS = {"all", "exists", "exists_one", "filter", "map"}
_STRING_SCANS = {
    "contains",
    "startsWith",
    "endsWith",
    "lowerAscii",
    "upperAscii",
    "trim",
    "replace",
    "substring",
    "charAt",
    "indexOf",
    "lastIndexOf",
    "split",
    "join",
    "reverse",
    "format",
}
_CONSTRUCTORS = {"semver", "quantity", "ip", "cidr", "url"}
_REGEX = {"matches", "find", "findAll"}
# Number and bool results of the Kubernetes types' methods: a size of their own.
_SCALAR_ACCESSORS = set(
    "family major minor patch sign asInteger isInteger asApproximateFloat prefixLength "
    "compareTo isGreaterThan isLessThan isLoopback isUnspecified isGlobalUnicast "
    "isLinkLocalMulticast isLinkLocalUnicast containsIP containsCIDR".split()
)
_LIST_SCANS = {"isSorted", "sum", "min", "max", "indexOf", "lastIndexOf"}


@dataclass(frozen=True, slots=True)
class Estimate:
    cost: int
    size: int  # max length of the string / list / map the node yields


def _scan(size: int) -> int:
    return math.ceil(size * _TRAVERSAL)


def estimate(node: Node) -> int:
    """The worst-case cost of evaluating ``node`` on any valid device."""
    return _Estimator().visit(node, {}).cost


class _Estimator:
    def visit(self, node: Node, scope: dict[str, int]) -> Estimate:
        handler = getattr(self, f"_{node.kind}")
        result: Estimate = handler(node, scope)
        return result

    def _lit(self, node: Node, scope: dict[str, int]) -> Estimate:
        value = node.value
        return Estimate(0, len(value) if isinstance(value, str | bytes) else 1)

    def _ident(self, node: Node, scope: dict[str, int]) -> Estimate:
        return Estimate(1, scope.get(node.name, MAX_ENTRIES if node.name == "device" else 1))

    def _select(self, node: Node, scope: dict[str, int]) -> Estimate:
        inner = self.visit(node.args[0], scope)
        path = device_path(node)
        if path == ["driver"]:
            size = MAX_DRIVER
        elif path in (["attributes"], ["capacity"]):
            size = MAX_ENTRIES
        elif node.optional and _device_domain(node.args[0]):
            size = UNBOUNDED  # measured: cel-go keeps no size through an optional
        else:
            size = _member_size(node.args[0], scope)
        return Estimate(inner.cost + 1, size)

    def _index(self, node: Node, scope: dict[str, int]) -> Estimate:
        inner = self.visit(node.args[0], scope)
        key = self.visit(node.args[1], scope)
        base = node.args[0]
        if device_path(base) in (["attributes"], ["capacity"]):
            size = MAX_ENTRIES
        elif node.optional and _device_domain(base):
            size = UNBOUNDED
        else:
            size = _member_size(base, scope)
        return Estimate(inner.cost + key.cost + 1, size)

    def _list(self, node: Node, scope: dict[str, int]) -> Estimate:
        return Estimate(10 + sum(self.visit(a, scope).cost for a in node.args), len(node.args))

    def _map(self, node: Node, scope: dict[str, int]) -> Estimate:
        cost = 30 + sum(self.visit(a, scope).cost for a in node.args)
        return Estimate(cost, len(node.args) // 2)

    def _struct(self, node: Node, scope: dict[str, int]) -> Estimate:
        return Estimate(40 + sum(self.visit(a, scope).cost for a in node.args), 1)

    def _unary(self, node: Node, scope: dict[str, int]) -> Estimate:
        inner = self.visit(node.args[0], scope)
        return Estimate(inner.cost + 1, inner.size)

    def _cond(self, node: Node, scope: dict[str, int]) -> Estimate:
        cond, then, other = (self.visit(a, scope) for a in node.args)
        return Estimate(cond.cost + max(then.cost, other.cost), max(then.size, other.size))

    def _binary(self, node: Node, scope: dict[str, int]) -> Estimate:
        left, right = (self.visit(a, scope) for a in node.args)
        base = left.cost + right.cost
        if node.name in ("&&", "||"):
            return Estimate(base, 1)
        if node.name == "+":
            size = left.size + right.size
            return Estimate(base + 1 + _scan(size), size)
        if node.name == "in":
            return Estimate(base + 1 + right.size, 1)
        if node.name in ("==", "!=") and any(_is_type_value(a, scope) for a in node.args):
            return Estimate(COST_LIMIT + 1, 1)  # measured: any comparison of types is over
        if node.name in ("==", "!=", "<", "<=", ">", ">="):
            smaller = min(left.size, right.size)
            if smaller >= UNBOUNDED and _unsized_pair_over(node):
                return Estimate(UNBOUNDED, 1)
            # A value without a size (a Semver, a Quantity) compares in one step.
            return Estimate(base + 1 + (_scan(smaller) if smaller < UNBOUNDED else 0), 1)
        return Estimate(base + 1, 1)

    def _call(self, node: Node, scope: dict[str, int]) -> Estimate:
        name = node.name
        if name in _COMPREHENSIONS and node.target and len(node.args) >= 3:
            return self._comprehension(node, scope)
        if name == "bind" and node.args and node.args[0].kind == "ident" and len(node.args) == 4:
            init = self.visit(node.args[2], scope)
            body = self.visit(node.args[3], {**scope, node.args[1].name: init.size})
            return Estimate(init.cost + body.cost, body.size)
        if name == "has" and len(node.args) == 1:
            return self.visit(node.args[0], scope)
        if name in _CONSTRUCTORS and not node.target:
            # Measured: cel-go keeps no size for these values, so scanning one (after
            # dyn()) is over the limit.
            return Estimate(sum(self.visit(a, scope).cost for a in node.args) + 1, UNBOUNDED)
        if _format_value(node) or _optional_none(node):
            return Estimate(sum(self.visit(a, scope).cost for a in node.args) + 1, UNBOUNDED)
        if name == VALIDATE:
            # Kubernetes scales validate's cost by the Format's size, which it does
            # not know (library/cost.go): every call is over the limit.
            return Estimate(UNBOUNDED, 1)
        if name == "type" and not node.target:
            # A type has no size in cel-go: comparing one is over the limit (_binary),
            # formatting one is not (measured against reference-allocator 1.37).
            return Estimate(sum(self.visit(a, scope).cost for a in node.args) + 1, UNBOUNDED)
        if name in (INDEX_OF, LAST_INDEX_OF) and node.target and _string_list(node.args[0]):
            # Measured against kube-apiserver 1.35: Kubernetes' list indexOf over
            # strings is estimated with strings of unbounded size, over the limit.
            return Estimate(COST_LIMIT + 1, 1)
        args = [self.visit(a, scope) for a in node.args]
        base = sum(a.cost for a in args)
        first = args[0].size if args else 1
        if name in _REGEX:
            pattern = args[1].size if len(args) > 1 else 1
            return Estimate(base + 1 + _scan(first) * max(1, math.ceil(pattern * 0.25)), first)
        if name in _LIST_SCANS and node.target and name not in _STRING_SCANS:
            return Estimate(base + 1 + first, 1)
        if name in ("startsWith", "endsWith") and node.target:
            # cel-go prices only the prefix or suffix, not the string it is looked for in.
            return Estimate(base + 1 + _scan(sum(a.size for a in args[1:])), 1)
        if name in _STRING_SCANS:
            size = first + 1 if name == "split" else first
            return Estimate(base + 1 + _scan(sum(a.size for a in args)), size)
        if name in ("contains", "equivalent", "intersects") and len(args) == 2:  # sets.*
            return Estimate(base + 1 + args[0].size * args[1].size, 1)
        if name in _SCALAR_ACCESSORS and node.target:
            return Estimate(base + 1, 1)
        return Estimate(base + 1, max((a.size for a in args), default=1))

    def _comprehension(self, node: Node, scope: dict[str, int]) -> Estimate:
        target = self.visit(node.args[0], scope)
        var = node.args[1].name if node.args[1].kind == "ident" else ""
        inner = {**scope, var: UNKNOWN_SIZE}
        step = sum(self.visit(a, inner).cost for a in node.args[2:]) + 1
        return Estimate(target.cost + 1 + target.size * step, target.size)


def _format_value(node: Node) -> bool:
    """``format.<name>()`` or ``format.named(x)`` (as macros.py rewrites it): a
    Format, whose size cel-go does not know."""
    if node.kind != "call":
        return False
    if node.name == NAMED:
        return True
    return node.target and node.args[0].kind == "ident" and node.args[0].name == "format"


def _optional_none(node: Node) -> bool:
    """``optional.none()``, which cel-go gives no size (measured: comparing it with
    ``format.named(x)`` is over the limit)."""
    return (
        node.kind == "call"
        and node.name == "none"
        and node.target
        and node.args[0].kind == "ident"
        and node.args[0].name == "optional"
    )


def _unsized_pair_over(node: Node) -> bool:
    """Two values without a size compared. Kubernetes prices ``==`` of two
    Quantities, Semvers, IPs, CIDRs, URLs or Formats as about one step, but cel-go
    prices ``!=``, and ``==`` of other types (optionals, ``dyn``, two different
    types), by their unknown sizes: over the limit (measured against
    kube-apiserver 1.35: ``quantity("1") != quantity("2")``,
    ``ip("1.2.3.4") == dyn(cidr("1.2.3.0/24"))``)."""
    if node.name != "==":
        return True
    kinds = [_unsized_kind(side) for side in node.args]
    if "" in kinds:
        return True
    return None not in kinds and kinds[0] != kinds[1]


_KIND_OF_CALL = {"quantity": "quantity", "semver": "semver", "ip": "ip", "cidr": "cidr"}
_KIND_OF_CALL |= {"url": "url", "masked": "cidr", NAMED: "format"}


def _unsized_kind(node: Node) -> str | None:
    """The Kubernetes type of a value without a size, where its form tells: ""
    for an optional or ``dyn`` (never one of them), None when unknown."""
    if node.kind != "call":
        return None
    if node.name == "dyn" and not node.target:
        return ""
    if node.target and node.args[0].kind == "ident" and node.args[0].name == "optional":
        return ""
    if node.name == "value" and node.target and _unsized_kind(node.args[0]) == "":
        inner = node.args[0]  # optional.of(x).value(), format.named(x).value()
        return _unsized_kind(inner.args[1]) if len(inner.args) == 2 else None
    if node.target and node.args[0].kind == "ident" and node.args[0].name == "format":
        return "format"
    if node.name == "ip" and node.target:
        return "ip"
    if node.name in ("add", "sub", "value") and node.target:
        return _unsized_kind(node.args[0])
    return _KIND_OF_CALL.get(node.name)


def _string_list(node: Node) -> bool:
    """A list known to hold strings: a literal with a string element, or ``split``'s result."""
    if node.kind == "list":
        return any(a.kind == "lit" and isinstance(a.value, str) for a in node.args)
    return node.kind == "call" and node.name == "split"


_TYPE_NAMES = frozenset("int uint double bool string bytes list map null_type type".split())


def _is_type_value(node: Node, scope: dict[str, int]) -> bool:
    """``type(x)`` or a type's name (``int``, ``string``, ...)."""
    if node.kind == "call" and node.name == "type" and not node.target:
        return True
    return node.kind == "ident" and node.name in _TYPE_NAMES and node.name not in scope


def _device_domain(node: Node) -> bool:
    """``device.attributes[d]`` / ``device.capacity[d]``: one domain's map."""
    return node.kind == "index" and device_path(node.args[0]) in (["attributes"], ["capacity"])


def _member_size(base: Node, scope: dict[str, int]) -> int:
    """The size of ``base.x`` / ``base[x]``: an attribute or capacity of a device, or
    an element of a literal or a variable, is bounded; anything deeper is not."""
    if base.kind == "index" and device_path(base.args[0]) in (["attributes"], ["capacity"]):
        return UNKNOWN_SIZE
    if base.kind in ("list", "map", "lit") or (base.kind == "ident" and base.name in scope):
        return UNKNOWN_SIZE
    return UNBOUNDED
