"""A parsed Go regexp written back as an RE2 pattern that consults no table of its own.

Every class is spelled out as code point ranges from Go's tables and every
case-folded literal as its folding orbit, so the RE2 that runs the pattern
(google-re2, whose Unicode tables are newer than Go's) gives Go's answers.
"""

from __future__ import annotations

from services.allocator.cel.regexpclass import clean_class
from services.allocator.cel.regexptables import simple_fold
from services.allocator.cel.regexptree import (
    ALTERNATE,
    ANY_CHAR,
    ANY_CHAR_NOT_NL,
    BEGIN_LINE,
    BEGIN_TEXT,
    CAPTURE,
    CHAR_CLASS,
    CONCAT,
    EMPTY_MATCH,
    END_LINE,
    END_TEXT,
    FOLD_CASE,
    LITERAL,
    NO_MATCH,
    NO_WORD_BOUNDARY,
    NON_GREEDY,
    PLUS,
    QUEST,
    STAR,
    WORD_BOUNDARY,
    Regexp,
)

_SURROGATES = (0xD800, 0xDFFF)


def _rune(r: int) -> str:
    return f"\\x{{{r:x}}}"


def _class(ranges: list[int]) -> str:
    """A class as explicit ranges; surrogates left out (no UTF-8 text holds one)."""
    parts: list[str] = []
    ranges = clean_class(ranges)
    for i in range(0, len(ranges), 2):
        lo, hi = ranges[i], ranges[i + 1]
        for a, b in ((lo, min(hi, _SURROGATES[0] - 1)), (max(lo, _SURROGATES[1] + 1), hi)):
            if a <= b:
                parts.append(_rune(a) if a == b else f"{_rune(a)}-{_rune(b)}")
    if not parts:
        return "[^\\x{0}-\\x{10ffff}]"
    return "[" + "".join(parts) + "]"


def _orbit(r: int) -> list[int]:
    out = [r, r]
    f = simple_fold(r)
    while f != r:
        out += [f, f]
        f = simple_fold(f)
    return clean_class(out)


def _atom(re: Regexp) -> bool:
    """Whether the translation is one atom a repetition may follow as it is."""
    if re.op == LITERAL:
        return len(re.runes) == 1
    return re.op in (NO_MATCH, EMPTY_MATCH, CHAR_CLASS, ANY_CHAR_NOT_NL, ANY_CHAR, CAPTURE)


def _group(re: Regexp) -> str:
    return f"(?:{translate(re)})"


def translate(re: Regexp) -> str:
    """The tree as an RE2 pattern that needs no Unicode table and no case folding."""
    op = re.op
    if op == NO_MATCH:
        return _class([])
    if op == EMPTY_MATCH:
        return "(?:)"
    if op == LITERAL:
        if re.flags & FOLD_CASE:
            return "".join(_class(_orbit(r)) for r in re.runes)
        return "".join(_rune(r) for r in re.runes)
    if op == CHAR_CLASS:
        return _class(re.runes)
    simple = {
        ANY_CHAR_NOT_NL: "[^\\n]",
        ANY_CHAR: "(?s:.)",
        BEGIN_LINE: "(?m:^)",
        END_LINE: "(?m:$)",
        BEGIN_TEXT: "\\A",
        END_TEXT: "\\z",
        WORD_BOUNDARY: "\\b",
        NO_WORD_BOUNDARY: "\\B",
    }
    if op in simple:
        return simple[op]
    if op == CAPTURE:
        return f"({translate(re.subs[0])})"
    if op == CONCAT:
        return "".join(_group(s) if s.op == ALTERNATE else translate(s) for s in re.subs)
    if op == ALTERNATE:
        return "|".join(translate(s) for s in re.subs)
    lazy = "?" if re.flags & NON_GREEDY else ""
    inner = translate(re.subs[0]) if _atom(re.subs[0]) else _group(re.subs[0])
    if op == STAR:
        return f"{inner}*{lazy}"
    if op == PLUS:
        return f"{inner}+{lazy}"
    if op == QUEST:
        return f"{inner}?{lazy}"
    if re.max == -1:
        return f"{inner}{{{re.min},}}{lazy}"
    if re.min == re.max:
        return f"{inner}{{{re.min}}}{lazy}"
    return f"{inner}{{{re.min},{re.max}}}{lazy}"
