"""The parsed form of a Go regular expression: regexp/syntax's ``Regexp`` node, its ops
and flags, and the error ``regexp.Compile`` words a refusal with.

The numbers are Go's own: the parser compares ops by value (a pseudo-op on its
stack sorts after every real one), so they must stay in this order.
"""

from __future__ import annotations

from dataclasses import dataclass, field

MAX_RUNE = 0x10FFFF

# Ops, numbered as in regexp/syntax (their order matters to the parser).
NO_MATCH, EMPTY_MATCH, LITERAL, CHAR_CLASS, ANY_CHAR_NOT_NL, ANY_CHAR = 1, 2, 3, 4, 5, 6
BEGIN_LINE, END_LINE, BEGIN_TEXT, END_TEXT, WORD_BOUNDARY, NO_WORD_BOUNDARY = 7, 8, 9, 10, 11, 12
CAPTURE, STAR, PLUS, QUEST, REPEAT, CONCAT, ALTERNATE = 13, 14, 15, 16, 17, 18, 19

FOLD_CASE, CLASS_NL, DOT_NL, ONE_LINE, NON_GREEDY, PERL_X, UNICODE_GROUPS = (
    1,
    4,
    8,
    16,
    32,
    64,
    128,
)
PERL = CLASS_NL | ONE_LINE | PERL_X | UNICODE_GROUPS

ERR_INVALID_CHAR_RANGE = "invalid character class range"
ERR_INVALID_ESCAPE = "invalid escape sequence"
ERR_INVALID_NAMED_CAPTURE = "invalid named capture"
ERR_INVALID_PERL_OP = "invalid or unsupported Perl syntax"
ERR_INVALID_REPEAT_OP = "invalid nested repetition operator"
ERR_INVALID_REPEAT_SIZE = "invalid repeat count"
ERR_MISSING_BRACKET = "missing closing ]"
ERR_MISSING_PAREN = "missing closing )"
ERR_MISSING_REPEAT_ARGUMENT = "missing argument to repetition operator"
ERR_TRAILING_BACKSLASH = "trailing backslash at end of expression"
ERR_UNEXPECTED_PAREN = "unexpected )"
ERR_NESTING_DEPTH = "expression nests too deeply"
ERR_LARGE = "expression too large"


class RegexpError(ValueError):
    """A pattern Go's regexp refuses, worded as ``regexp.Compile``'s error."""

    def __init__(self, code: str, expr: str) -> None:
        super().__init__(f"error parsing regexp: {code}: `{expr}`")
        self.code = code
        self.expr = expr


@dataclass(eq=False, slots=True)
class Regexp:
    op: int
    flags: int = 0
    runes: list[int] = field(default_factory=list)  # literal runes, or class ranges lo, hi, ...
    subs: list[Regexp] = field(default_factory=list)
    min: int = 0
    max: int = 0
    cap: int = 0
    name: str = ""
    size: int = -1  # the parser's memo of calcSize / calcHeight
    height: int = -1


# ------------------------------------------------------------------ measures


def calc_size(re: Regexp, force: bool = False) -> int:
    """calcSize: the program size Go estimates for the tree, memoised in each node
    (``force``: recompute this node, whose subtrees the parser just changed)."""
    if not force and re.size >= 0:
        return re.size
    op = re.op
    size = 0
    if op == LITERAL:
        size = len(re.runes)
    elif op in (CAPTURE, STAR):
        size = 2 + calc_size(re.subs[0])
    elif op in (PLUS, QUEST):
        size = 1 + calc_size(re.subs[0])
    elif op == CONCAT:
        size = sum(calc_size(s) for s in re.subs)
    elif op == ALTERNATE:
        size = sum(calc_size(s) for s in re.subs) + max(0, len(re.subs) - 1)
    elif op == REPEAT:
        sub = calc_size(re.subs[0])
        if re.max == -1:
            size = 2 + sub if re.min == 0 else 1 + re.min * sub
        else:
            size = re.max * sub + (re.max - re.min)
    re.size = max(1, size)
    return re.size


def calc_height(re: Regexp, force: bool = False) -> int:
    """calcHeight: the tree's depth, memoised in each node like :func:`calc_size`."""
    if not force and re.height >= 0:
        return re.height
    h = 1
    for sub in re.subs:
        h = max(h, 1 + calc_height(sub))
    re.height = h
    return h


def repeat_is_valid(re: Regexp, n: int) -> bool:
    """repeatIsValid: nested counted repetitions multiply to at most ``n``."""
    if re.op == REPEAT:
        m = re.max
        if m == 0:
            return True
        if m < 0:
            m = re.min
        if m > n:
            return False
        if m > 0:
            n //= m
    return all(repeat_is_valid(sub, n) for sub in re.subs)
