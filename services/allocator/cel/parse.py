"""A small CEL parser: just enough syntax tree for what the CEL runtime does not tell us.

The runtime (cel-expr-python) compiles and evaluates; it exposes no syntax tree
and no cost tracking. We parse the same grammar here to (1) estimate the
worst-case cost like the Kubernetes API server does, (2) find the
``device.attributes[...]`` / ``device.capacity[...]`` lookups whose unknown
domain must read as an empty map, and (3) list the attribute names an
expression refers to, for "did you mean" hints. Syntax errors are left to the
runtime, whose messages users know; :class:`ParseError` only means "skip the
extras".
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass, field

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|//[^\n]*)
  | (?P<str>[rR]?[bB]?[rR]?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''
        |"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<num>0[xX][0-9a-fA-F]+[uU]?|(?:\d+\.\d*|\.\d+|\d+)(?:[eE][+-]?\d+)?[uU]?)
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|\.\?|\[\?|[-+*/%!<>?:.,()\[\]{}])
    """,
    re.VERBOSE | re.DOTALL,
)


class ParseError(ValueError):
    """The text is not CEL this parser understands."""


@dataclass(slots=True)
class Node:
    """One syntax-tree node. ``kind`` is one of: lit, ident, select, index, call,
    list, map, struct, unary, binary, cond. ``start``/``end`` index the source."""

    kind: str
    start: int
    end: int
    name: str = ""  # ident / select field / call function / operator
    value: object = None  # literal value
    args: list[Node] = field(default_factory=list)  # operands, call target first
    target: bool = False  # call written as a member call (target is args[0])
    optional: bool = False  # ``.?field`` or ``[?key]``

    def walk(self) -> Iterator[Node]:
        yield self
        for arg in self.args:
            yield from arg.walk()


@dataclass(slots=True)
class _Tok:
    kind: str
    text: str
    start: int
    end: int


def _tokens(text: str) -> list[_Tok]:
    out: list[_Tok] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ParseError(f"unexpected character {text[pos]!r} at {pos}")
        kind = m.lastgroup or ""
        if kind != "ws":
            out.append(_Tok(kind, m.group(), m.start(), m.end()))
        pos = m.end()
    out.append(_Tok("eof", "", len(text), len(text)))
    return out


def _string_value(raw: str) -> str | bytes:
    prefix = re.match(r"[rRbB]*", raw)
    flags = prefix.group().lower() if prefix else ""
    body = raw[len(flags) :]
    quote = body[:3] if body[:3] in ('"""', "'''") else body[0]
    inner = body[len(quote) : -len(quote)]
    if "r" not in flags:
        try:
            inner = inner.encode("latin-1", "backslashreplace").decode("unicode_escape")
        except UnicodeDecodeError as exc:
            raise ParseError(f"bad escape in {raw}") from exc
    return inner.encode() if "b" in flags else inner


_BINARY_LEVELS: tuple[tuple[str, ...], ...] = (
    ("||",),
    ("&&",),
    ("<", "<=", ">=", ">", "==", "!=", "in"),
    ("+", "-"),
    ("*", "/", "%"),
)


class _Parser:
    def __init__(self, text: str) -> None:
        self.toks = _tokens(text)
        self.i = 0

    def peek(self) -> _Tok:
        return self.toks[self.i]

    def take(self, text: str | None = None) -> _Tok:
        tok = self.toks[self.i]
        if text is not None and tok.text != text:
            raise ParseError(f"expected {text!r} at {tok.start}, found {tok.text!r}")
        self.i += 1
        return tok

    def at(self, *texts: str) -> bool:
        tok = self.peek()
        return tok.kind in ("op", "ident") and tok.text in texts

    def expr(self) -> Node:
        cond = self.binary(0)
        if self.at("?"):
            self.take()
            then = self.binary(0)
            self.take(":")
            other = self.expr()
            return Node("cond", cond.start, other.end, args=[cond, then, other])
        return cond

    def binary(self, level: int) -> Node:
        if level == len(_BINARY_LEVELS):
            return self.unary()
        left = self.binary(level + 1)
        while self.at(*_BINARY_LEVELS[level]):
            op = self.take().text
            right = self.binary(level + 1)
            left = Node("binary", left.start, right.end, name=op, args=[left, right])
        return left

    def unary(self) -> Node:
        if self.at("!", "-"):
            tok = self.take()
            operand = self.unary()
            if tok.text == "-" and operand.kind == "lit" and isinstance(operand.value, int | float):
                operand.value = -operand.value
                operand.start = tok.start
                return operand
            return Node("unary", tok.start, operand.end, name=tok.text, args=[operand])
        return self.member(self.primary())

    def member(self, node: Node) -> Node:
        while True:
            if self.at(".", ".?"):
                optional = self.take().text == ".?"
                name = self.take()
                if name.kind != "ident":
                    raise ParseError(f"expected a field name at {name.start}")
                if self.at("(") and not optional:
                    args, end = self.call_args()
                    node = Node("call", node.start, end, name=name.text, args=[node, *args])
                    node.target = True
                else:
                    node = Node("select", node.start, name.end, name=name.text, args=[node])
                    node.optional = optional
            elif self.at("[", "[?"):
                optional = self.take().text == "[?"
                key = self.expr()
                end = self.take("]").end
                node = Node("index", node.start, end, args=[node, key], optional=optional)
            elif self.at("{") and node.kind in ("ident", "select"):
                node = self.struct(node)
            else:
                return node

    def call_args(self) -> tuple[list[Node], int]:
        self.take("(")
        args: list[Node] = []
        while not self.at(")"):
            args.append(self.expr())
            if not self.at(")"):
                self.take(",")
        return args, self.take(")").end

    def primary(self) -> Node:
        tok = self.peek()
        if tok.kind == "ident":
            self.take()
            literals: dict[str, object] = {"true": True, "false": False, "null": None}
            if tok.text in literals:
                return Node("lit", tok.start, tok.end, value=literals[tok.text])
            if self.at("("):
                args, end = self.call_args()
                return Node("call", tok.start, end, name=tok.text, args=args)
            return Node("ident", tok.start, tok.end, name=tok.text)
        if tok.kind == "str":
            self.take()
            return Node("lit", tok.start, tok.end, value=_string_value(tok.text))
        if tok.kind == "num":
            self.take()
            return Node("lit", tok.start, tok.end, value=_number(tok.text))
        if tok.text == "(":
            self.take()
            inner = self.expr()
            self.take(")")
            return inner
        if tok.text == "[":
            return self.collection("[", "]", "list")
        if tok.text == "{":
            return self.collection("{", "}", "map")
        if tok.text == ".":  # leading-dot absolute name
            self.take()
            return self.primary()
        raise ParseError(f"unexpected {tok.text or 'end of input'!r} at {tok.start}")

    def collection(self, open_: str, close: str, kind: str) -> Node:
        start = self.take(open_).start
        args: list[Node] = []
        while not self.at(close):
            if self.at("?"):  # optional entry
                self.take()
            args.append(self.expr())
            if kind == "map":
                self.take(":")
                args.append(self.expr())
            if not self.at(close):
                self.take(",")
        return Node(kind, start, self.take(close).end, args=args)

    def struct(self, type_node: Node) -> Node:
        self.take("{")
        args: list[Node] = []
        while not self.at("}"):
            if self.at("?"):
                self.take()
            self.take()  # field name
            self.take(":")
            args.append(self.expr())
            if not self.at("}"):
                self.take(",")
        return Node("struct", type_node.start, self.take("}").end, args=args)


def _number(text: str) -> int | float:
    body = text.rstrip("uU")
    if body[:2].lower() == "0x":
        return int(body, 16)
    if any(c in body for c in ".eE"):
        return float(body)
    return int(body)


def parse(text: str) -> Node:
    """The syntax tree of ``text``; raises :class:`ParseError`."""
    parser = _Parser(text)
    node = parser.expr()
    if parser.peek().kind != "eof":
        raise ParseError(f"unexpected {parser.peek().text!r} at {parser.peek().start}")
    return node


def device_path(node: Node) -> list[str] | None:
    """``device.a.b`` as ``["a", "b"]``; None when ``node`` is not such a chain."""
    path: list[str] = []
    while node.kind == "select":
        path.append(node.name)
        node = node.args[0]
    if node.kind == "ident" and node.name == "device":
        return path[::-1]
    return None
