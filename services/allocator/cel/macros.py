"""What cel-expr-python cannot parse or declare, rewritten into what it can.

* Two-variable comprehensions (cel-go's ext.TwoVarComprehensions, in the
  Kubernetes 1.35 environment): ``l.all(i, v, p)``, ``exists``, ``existsOne``,
  ``transformList``, ``transformMap``, ``transformMapEntry``, over lists
  (index, element) and maps (key, value). Each becomes a one-variable macro over
  ``__k8s_entries(l)`` (a list of ``[i, v]`` pairs) with ``cel.bind`` naming the
  two variables, so every result and error is the same.
* Kubernetes' list ``indexOf`` / ``lastIndexOf``: renamed to functions that
  serve lists and strings (listslib.py).
* Ordering across numeric types (``1.5 > 1``, ``x + 1.5 > 0``), which cel-go
  allows (CrossTypeNumericComparisons) and cel-cpp's checker does not declare:
  ``<``, ``<=``, ``>``, ``>=`` become calls of listslib's :data:`ORDERING`
  functions, which order numbers of any kind and each other type with itself.
* The ``format`` library's optional results (formatlib.py):
  ``format.named(x)`` and ``f.validate(s)`` become
  ``optional.ofNonZeroValue(...)`` of a function returning a plain value.

:func:`rewrite` is only tried when a selector does not compile as written, so
errors in other selectors keep the runtime's words and columns.
"""

from __future__ import annotations

from services.allocator.cel.formatlib import NAMED, VALIDATE
from services.allocator.cel.listslib import INDEX_OF, LAST_INDEX_OF, ORDERING
from services.allocator.cel.parse import Node, ParseError, device_path, parse

ENTRIES = "__k8s_entries"
ZIP = "__k8s_zip"
MERGE = "__k8s_merge"
_E = "__k8s_e"
_KEPT = "__k8s_kept"
_RENAMED = {"indexOf": INDEX_OF, "lastIndexOf": LAST_INDEX_OF}
_TWO_VAR = ("all", "exists", "existsOne", "transformList", "transformMap", "transformMapEntry")


def rewrite(expression: str, for_check: bool = False) -> str | None:
    """The expression with the rewrites above, or None when there is nothing to rewrite.

    ``for_check``: the form to type-check instead, where ``all``, ``exists`` and
    ``existsOne`` stay comprehensions over their own range (so a range that is
    no list or map is refused as cel-go refuses it), both variables ``dyn``.
    """
    try:
        tree = parse(expression)
    except ParseError:
        return None
    renderer = _Renderer(expression, for_check)
    # The root's span leaves out parentheses around the whole expression.
    out = expression[: tree.start] + renderer.render(tree) + expression[tree.end :]
    return out if out != expression else None


def _two_var(node: Node) -> bool:
    if node.kind != "call" or not node.target or node.name not in _TWO_VAR:
        return False
    params = node.args[1:3]
    return len(node.args) in (4, 5) and all(p.kind == "ident" for p in params)


def _format_call(node: Node) -> str | None:
    """The function standing for ``format.named(x)`` or ``f.validate(s)``, if ``node``
    is one of them."""
    if node.kind != "call" or not node.target:
        return None
    base = node.args[0]
    if node.name == "named" and len(node.args) == 2:
        return NAMED if base.kind == "ident" and base.name == "format" else None
    return VALIDATE if node.name == "validate" and len(node.args) == 2 else None


def _device_domain(node: Node) -> bool:
    """``device.attributes[...]`` or ``device.capacity[...]``: a map."""
    return node.kind == "index" and device_path(node.args[0]) in (["attributes"], ["capacity"])


class _Renderer:
    def __init__(self, expression: str, for_check: bool = False) -> None:
        self.text = expression
        self.for_check = for_check

    def render(self, node: Node) -> str:
        if _two_var(node):
            return self._comprehension(node)
        optional = _format_call(node)
        if optional:
            args = node.args[1:] if optional == NAMED else node.args
            inner = ", ".join(self.render(arg) for arg in args)
            return f"optional.ofNonZeroValue({optional}({inner}))"
        if node.kind == "binary" and node.name in ORDERING:
            left, right = node.args
            gap = self.text[left.end : right.start]
            op = gap.index(node.name)
            # Parentheses around the left operand open before this node's span:
            # they close after the call instead, around all of it.
            closing = gap.count(")", 0, op)
            gap = gap[:op].replace(")", "") + "," + gap[op + len(node.name) :]
            name = ORDERING[node.name]
            return f"{name}({self.render(left)}{gap}{self.render(right)})" + ")" * closing
        out, pos = [], node.start
        for index, child in enumerate(sorted(node.args, key=lambda n: n.start)):
            gap = self.text[pos : child.start]
            if index == 1 and node.kind == "call" and node.target and node.name in _RENAMED:
                gap = gap.replace(f".{node.name}", f".{_RENAMED[node.name]}", 1)
            out += [gap, self.render(child)]
            pos = child.end
        tail = self.text[pos : node.end]
        if node.kind == "call" and node.target and node.name in _RENAMED and len(node.args) == 1:
            tail = tail.replace(f".{node.name}", f".{_RENAMED[node.name]}", 1)
        out.append(tail)
        return "".join(out)

    def _checked(self, name: str, target: Node, a: str, b: str, body: Node, e: str) -> str:
        """The checking form: the range's own comprehension, the variables typed as
        cel-go types them where the range is known to be a list (index int,
        element) or a map (key, value), ``dyn`` otherwise."""
        source = self.render(target)
        if target.kind == "list":
            first, second = "0", e
        elif target.kind == "map" or _device_domain(target):
            first, second = e, f"{source}[{e}]"
        else:
            first = second = f"dyn({e})"
        macro = "exists_one" if name == "existsOne" else name
        inner = self.render(body)
        return f"{source}.{macro}({e}, cel.bind({a}, {first}, cel.bind({b}, {second}, {inner})))"

    def _bound(self, e: str, first: str, second: str, body: Node) -> str:
        inner = self.render(body)
        return f"cel.bind({first}, {e}[0], cel.bind({second}, {e}[1], {inner}))"

    def _comprehension(self, node: Node) -> str:
        target, first, second, *rest = node.args
        entries = f"{ENTRIES}({self.render(target)})"
        # Names unique per macro: cel-cpp mixes up nested variables of one name.
        e, kept = f"{_E}{node.start}", f"{_KEPT}{node.start}"
        a, b = first.name, second.name
        if self.for_check and node.name in ("all", "exists", "existsOne"):
            return self._checked(node.name, target, a, b, rest[-1], e)
        last = self._bound(e, a, b, rest[-1])
        if node.name in ("all", "exists"):
            return f"{entries}.{node.name}({e}, {last})"
        if node.name == "existsOne":
            return f"{entries}.exists_one({e}, {last})"
        source = entries
        if len(rest) == 2:
            source = f"{entries}.filter({e}, {self._bound(e, a, b, rest[0])})"
        if node.name == "transformList":
            return f"{source}.map({e}, {last})"
        if node.name == "transformMap":
            return (
                f"cel.bind({kept}, {source}, "
                f"{ZIP}({kept}.map({e}, {e}[0]), {kept}.map({e}, {last})))"
            )
        return f"{MERGE}({source}.map({e}, {last}))"
