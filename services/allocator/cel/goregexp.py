"""Regular expressions as Go's regexp (and so cel-go and Kubernetes) reads and runs them.

CEL's ``matches`` and Kubernetes' ``find`` / ``findAll`` use Go's ``regexp``:
RE2 syntax as Go's ``regexp/syntax`` parses it (Go 1.26 here, the toolchain that
builds the control plane: ``(?i)``, ``(?s)``, ``(?m)``, ``(?U)``, named groups
``(?P<x>)`` and ``(?<x>)``, ``\\pL``, ``\\p{Greek}``, ``\\p{Letter}``, POSIX classes,
``\\Q...\\E``, ``\\z``; refused: backreferences, lookaround, ``\\Z``, ``\\C``,
possessive and stacked repetitions, counts over 1000, nesting deeper than 1000),
Unicode 15.0.0 classes and simple case folding, leftmost-first matching in linear
time. Python's ``re`` knows neither the syntax nor the semantics, and the RE2 that
cel-cpp and google-re2 carry has newer Unicode tables and accepts ``\\C``.

So :func:`parse` is a port of ``regexp/syntax``'s parser (parse.go: the same
acceptance and error codes, ``error parsing regexp: <code>: `<expr>```), and
:func:`translate` writes the parsed tree back as an RE2 pattern in which every
class is spelled out as code point ranges from Go's own tables
(data/gounicode.json, written by data/gounicode.go) and case folding is
expanded, so the RE2 that runs it (google-re2) consults no table of its own:
the answers are Go's. Not ported: the parser's factoring of common prefixes in
alternations, which changes only the size estimate behind ``expression too
large`` (a pattern near 3.3 million instructions may be refused here and not
by Go).
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field
from functools import lru_cache
from importlib import resources
from typing import Any

import re2  # type: ignore[import-untyped]

MAX_RUNE = 0x10FFFF
MAX_HEIGHT = 1000
MAX_SIZE = (128 << 20) // 40
MAX_RUNES = (128 << 20) // 4
MAX_REPEAT = 1000

# Ops, numbered as in regexp/syntax (their order matters to the parser).
NO_MATCH, EMPTY_MATCH, LITERAL, CHAR_CLASS, ANY_CHAR_NOT_NL, ANY_CHAR = 1, 2, 3, 4, 5, 6
BEGIN_LINE, END_LINE, BEGIN_TEXT, END_TEXT, WORD_BOUNDARY, NO_WORD_BOUNDARY = 7, 8, 9, 10, 11, 12
CAPTURE, STAR, PLUS, QUEST, REPEAT, CONCAT, ALTERNATE = 13, 14, 15, 16, 17, 18, 19
_LEFT_PAREN, _VERTICAL_BAR = 128, 129  # pseudo-ops on the parse stack

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


class _Limit(Exception):
    """ErrLarge / ErrNestingDepth: reported against the whole expression."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


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


# ------------------------------------------------------------------ Unicode tables


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    text = resources.files("services.allocator.cel").joinpath("data/gounicode.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@lru_cache(maxsize=1)
def _fold() -> dict[int, int]:
    pairs = _data()["simpleFold"]
    return {pairs[i]: pairs[i + 1] for i in range(0, len(pairs), 2)}


def simple_fold(r: int) -> int:
    """unicode.SimpleFold: the next rune of r's case-folding orbit (r itself if none)."""
    return _fold().get(r, r)


_MIN_FOLD, _MAX_FOLD = 0x0041, 0x1E943


def _table_ranges(flat: list[int]) -> list[int]:
    out: list[int] = []
    for i in range(0, len(flat), 3):
        lo, hi, stride = flat[i], flat[i + 1], flat[i + 2]
        if stride == 1:
            out += [lo, hi]
        else:
            for c in range(lo, hi + 1, stride):
                out += [c, c]
    return out


_ANY = [0, MAX_RUNE]
_ASCII = [0, 0x7F]
_ASCII_FOLD = [0, 0x7F, 0x17F, 0x17F, 0x212A, 0x212A]


def _canonical_name(name: str) -> str:
    """regexp/syntax's canonicalName: first letter upper, the rest lower, no _ - or space."""
    out: list[str] = []
    first = True
    for c in name:
        if c in "_- ":
            continue
        if first:
            out.append(c.upper() if "a" <= c <= "z" else c)
            first = False
        else:
            out.append(c.lower() if "A" <= c <= "Z" else c)
    return "".join(out)


@lru_cache(maxsize=1)
def _aliases() -> dict[str, str]:
    return {_canonical_name(k): v for k, v in _data()["categoryAliases"].items()}


@lru_cache(maxsize=512)
def _unicode_table(name: str) -> tuple[tuple[int, ...], tuple[int, ...] | None, int] | None:
    """unicodeTable: (ranges, fold ranges, sign), or None for an unknown name."""
    data = _data()
    name = _canonical_name(name)
    if name == "Any":
        return tuple(_ANY), tuple(_ANY), 1
    if name == "Assigned":
        cn = tuple(_table_ranges(data["cn"]))
        return cn, cn, -1
    if name == "Ascii":
        return tuple(_ASCII), tuple(_ASCII_FOLD), 1
    if name == "Lc":
        name = "LC"
    for tables, folds in (("categories", "foldCategory"), ("scripts", "foldScript")):
        if name in data[tables]:
            fold = data[folds].get(name)
            return (
                tuple(_table_ranges(data[tables][name])),
                tuple(_table_ranges(fold)) if fold is not None else None,
                1,
            )
    actual = _aliases().get(name)
    if actual:
        fold = data["foldCategory"].get(actual)
        return (
            tuple(_table_ranges(data["categories"][actual])),
            tuple(_table_ranges(fold)) if fold is not None else None,
            1,
        )
    return None


_PERL_GROUPS: dict[str, tuple[int, list[int]]] = {}
_POSIX_GROUPS: dict[str, tuple[int, list[int]]] = {}


def _groups() -> None:
    digit, space, word = [0x30, 0x39], [0x9, 0xA, 0xC, 0xD, 0x20, 0x20], []
    word = [0x30, 0x39, 0x41, 0x5A, 0x5F, 0x5F, 0x61, 0x7A]
    for letter, ranges in (("d", digit), ("s", space), ("w", word)):
        _PERL_GROUPS["\\" + letter] = (1, ranges)
        _PERL_GROUPS["\\" + letter.upper()] = (-1, ranges)
    posix = {
        "alnum": [0x30, 0x39, 0x41, 0x5A, 0x61, 0x7A],
        "alpha": [0x41, 0x5A, 0x61, 0x7A],
        "ascii": [0x0, 0x7F],
        "blank": [0x9, 0x9, 0x20, 0x20],
        "cntrl": [0x0, 0x1F, 0x7F, 0x7F],
        "digit": [0x30, 0x39],
        "graph": [0x21, 0x7E],
        "lower": [0x61, 0x7A],
        "print": [0x20, 0x7E],
        "punct": [0x21, 0x2F, 0x3A, 0x40, 0x5B, 0x60, 0x7B, 0x7E],
        "space": [0x9, 0xD, 0x20, 0x20],
        "upper": [0x41, 0x5A],
        "word": word,
        "xdigit": [0x30, 0x39, 0x41, 0x46, 0x61, 0x66],
    }
    for name, ranges in posix.items():
        _POSIX_GROUPS[f"[:{name}:]"] = (1, ranges)
        _POSIX_GROUPS[f"[:^{name}:]"] = (-1, ranges)


_groups()


# ------------------------------------------------------------------ classes


def clean_class(r: list[int]) -> list[int]:
    """Sort and merge the ranges (cleanClass)."""
    pairs = sorted(((r[i], r[i + 1]) for i in range(0, len(r), 2)), key=lambda p: (p[0], -p[1]))
    out: list[int] = []
    for lo, hi in pairs:
        if out and lo <= out[-1] + 1:
            out[-1] = max(out[-1], hi)
        else:
            out += [lo, hi]
    return out


def _append_folded_range(r: list[int], lo: int, hi: int) -> None:
    if (lo <= _MIN_FOLD and hi >= _MAX_FOLD) or hi < _MIN_FOLD or lo > _MAX_FOLD:
        r += [lo, hi]
        return
    if lo < _MIN_FOLD:
        r += [lo, _MIN_FOLD - 1]
        lo = _MIN_FOLD
    if hi > _MAX_FOLD:
        r += [_MAX_FOLD + 1, hi]
        hi = _MAX_FOLD
    fold = _fold()
    r += [lo, hi]
    for c in range(lo, hi + 1):
        f = fold.get(c, c)
        while f != c:
            r += [f, f]
            f = fold.get(f, f)


def _negate(r: list[int]) -> list[int]:
    """The complement of a clean class (negateClass)."""
    out: list[int] = []
    next_lo = 0
    for i in range(0, len(r), 2):
        lo, hi = r[i], r[i + 1]
        if next_lo <= lo - 1:
            out += [next_lo, lo - 1]
        next_lo = hi + 1
    if next_lo <= MAX_RUNE:
        out += [next_lo, MAX_RUNE]
    return out


def _match_rune(re: Regexp, r: int) -> bool:
    if re.op == LITERAL:
        return len(re.runes) == 1 and re.runes[0] == r
    if re.op == CHAR_CLASS:
        return any(re.runes[i] <= r <= re.runes[i + 1] for i in range(0, len(re.runes), 2))
    if re.op == ANY_CHAR_NOT_NL:
        return r != 0x0A
    return re.op == ANY_CHAR


def _is_char_class(re: Regexp) -> bool:
    return (re.op == LITERAL and len(re.runes) == 1) or re.op in (
        CHAR_CLASS,
        ANY_CHAR_NOT_NL,
        ANY_CHAR,
    )


def _merge_char_class(dst: Regexp, src: Regexp) -> None:
    if dst.op == ANY_CHAR:
        return
    if dst.op == ANY_CHAR_NOT_NL:
        if _match_rune(src, 0x0A):
            dst.op = ANY_CHAR
        return
    if dst.op == CHAR_CLASS:
        if src.op == LITERAL:
            _append_literal(dst.runes, src.runes[0], src.flags)
        else:
            dst.runes += src.runes
        return
    # both literal
    if src.runes[0] == dst.runes[0] and src.flags == dst.flags:
        return
    first, dst.runes = dst.runes[0], []
    dst.op = CHAR_CLASS
    _append_literal(dst.runes, first, dst.flags)
    _append_literal(dst.runes, src.runes[0], src.flags)


def _append_literal(r: list[int], x: int, flags: int) -> None:
    if flags & FOLD_CASE:
        _append_folded_range(r, x, x)
    else:
        r += [x, x]


def _clean_alt(re: Regexp) -> None:
    if re.op != CHAR_CLASS:
        return
    re.runes = clean_class(re.runes)
    if re.runes == [0, MAX_RUNE]:
        re.runes, re.op = [], ANY_CHAR
    elif re.runes == [0, 0x09, 0x0B, MAX_RUNE]:
        re.runes, re.op = [], ANY_CHAR_NOT_NL


# ------------------------------------------------------------------ parser


def _is_alnum(c: str) -> bool:
    return "0" <= c <= "9" or "A" <= c <= "Z" or "a" <= c <= "z"


def _unhex(c: str) -> int:
    if "0" <= c <= "9":
        return ord(c) - 48
    if "a" <= c <= "f":
        return ord(c) - 87
    if "A" <= c <= "F":
        return ord(c) - 55
    return -1


class _Parser:
    def __init__(self, whole: str) -> None:
        self.flags = PERL
        self.stack: list[Regexp] = []
        self.num_cap = 0
        self.whole = whole
        self.num_runes = 0

    # limits -------------------------------------------------------------

    def _check_limits(self, re: Regexp) -> None:
        if self.num_runes > MAX_RUNES:
            raise _Limit(ERR_LARGE)
        if self._calc_size(re, True) > MAX_SIZE:
            raise _Limit(ERR_LARGE)
        if self._calc_height(re, True) > MAX_HEIGHT:
            raise _Limit(ERR_NESTING_DEPTH)

    def _calc_size(self, re: Regexp, force: bool) -> int:
        if not force and re.size >= 0:
            return re.size
        op = re.op
        size = 0
        if op == LITERAL:
            size = len(re.runes)
        elif op in (CAPTURE, STAR):
            size = 2 + self._calc_size(re.subs[0], False)
        elif op in (PLUS, QUEST):
            size = 1 + self._calc_size(re.subs[0], False)
        elif op == CONCAT:
            size = sum(self._calc_size(s, False) for s in re.subs)
        elif op == ALTERNATE:
            size = sum(self._calc_size(s, False) for s in re.subs) + max(0, len(re.subs) - 1)
        elif op == REPEAT:
            sub = self._calc_size(re.subs[0], False)
            if re.max == -1:
                size = 2 + sub if re.min == 0 else 1 + re.min * sub
            else:
                size = re.max * sub + (re.max - re.min)
        re.size = max(1, size)
        return re.size

    def _calc_height(self, re: Regexp, force: bool) -> int:
        if not force and re.height >= 0:
            return re.height
        h = 1
        for sub in re.subs:
            h = max(h, 1 + self._calc_height(sub, False))
        re.height = h
        return h

    # stack --------------------------------------------------------------

    def push(self, re: Regexp) -> Regexp:
        self.num_runes += len(re.runes)
        self.stack.append(re)
        self._check_limits(re)
        return re

    def op(self, op: int) -> Regexp:
        return self.push(Regexp(op, self.flags))

    def literal(self, r: int) -> None:
        if self.flags & FOLD_CASE:
            r = _min_fold_rune(r)
        self.push(Regexp(LITERAL, self.flags, [r]))

    def repeat(self, op: int, lo: int, hi: int, before: str, after: str, last_repeat: str) -> str:
        flags = self.flags
        if self.flags & PERL_X:
            if after[:1] == "?":
                after = after[1:]
                flags ^= NON_GREEDY
            if last_repeat:
                stacked = last_repeat[: len(last_repeat) - len(after)]
                raise RegexpError(ERR_INVALID_REPEAT_OP, stacked)
        if not self.stack or self.stack[-1].op >= _LEFT_PAREN:
            raise RegexpError(ERR_MISSING_REPEAT_ARGUMENT, before[: len(before) - len(after)])
        re = Regexp(op, flags, subs=[self.stack[-1]], min=lo, max=hi)
        self.stack[-1] = re
        self._check_limits(re)
        if op == REPEAT and (lo >= 2 or hi >= 2) and not _repeat_is_valid(re, MAX_REPEAT):
            raise RegexpError(ERR_INVALID_REPEAT_SIZE, before[: len(before) - len(after)])
        return after

    def _split(self) -> list[Regexp]:
        i = len(self.stack)
        while i > 0 and self.stack[i - 1].op < _LEFT_PAREN:
            i -= 1
        subs = self.stack[i:]
        del self.stack[i:]
        return subs

    def concat(self) -> Regexp:
        subs = self._split()
        if not subs:
            return self.push(Regexp(EMPTY_MATCH))
        return self.push(self._collapse(subs, CONCAT))

    def alternate(self) -> Regexp:
        subs = self._split()
        if subs:
            _clean_alt(subs[-1])
        if not subs:
            return self.push(Regexp(NO_MATCH))
        return self.push(self._collapse(subs, ALTERNATE))

    def _collapse(self, subs: list[Regexp], op: int) -> Regexp:
        if len(subs) == 1:
            return subs[0]
        re = Regexp(op)
        for sub in subs:
            re.subs += sub.subs if sub.op == op else [sub]
        return re

    def swap_vertical_bar(self) -> bool:
        st = self.stack
        n = len(st)
        if (
            n >= 3
            and st[n - 2].op == _VERTICAL_BAR
            and _is_char_class(st[n - 1])
            and _is_char_class(st[n - 3])
        ):
            re1, re3 = st[n - 1], st[n - 3]
            if re1.op > re3.op:
                re1, re3 = re3, re1
                st[n - 3] = re3
            _merge_char_class(re3, re1)
            st.pop()
            return True
        if n >= 2 and st[n - 2].op == _VERTICAL_BAR:
            if n >= 3:
                _clean_alt(st[n - 3])
            st[n - 2], st[n - 1] = st[n - 1], st[n - 2]
            return True
        return False

    def vertical_bar(self) -> None:
        self.concat()
        if not self.swap_vertical_bar():
            self.op(_VERTICAL_BAR)

    def right_paren(self) -> None:
        self.concat()
        if self.swap_vertical_bar():
            self.stack.pop()
        self.alternate()
        if len(self.stack) < 2:
            raise RegexpError(ERR_UNEXPECTED_PAREN, self.whole)
        re1, re2 = self.stack[-1], self.stack[-2]
        del self.stack[-2:]
        if re2.op != _LEFT_PAREN:
            raise RegexpError(ERR_UNEXPECTED_PAREN, self.whole)
        self.flags = re2.flags
        if re2.cap == 0:
            self.push(re1)
        else:
            re2.op = CAPTURE
            re2.subs = [re1]
            self.push(re2)

    # pieces -------------------------------------------------------------

    def perl_flags(self, s: str) -> str:
        t = s
        starts_p = len(t) > 4 and t[2] == "P" and t[3] == "<"
        starts_name = len(t) > 3 and t[2] == "<"
        if starts_p or starts_name:
            expr_start = 4 if starts_p else 3
            end = t.find(">")
            if end < 0:
                raise RegexpError(ERR_INVALID_NAMED_CAPTURE, s)
            capture, name = t[: end + 1], t[expr_start:end]
            if not name or not all(c == "_" or _is_alnum(c) for c in name):
                raise RegexpError(ERR_INVALID_NAMED_CAPTURE, capture)
            self.num_cap += 1
            re = self.op(_LEFT_PAREN)
            re.cap, re.name = self.num_cap, name
            return t[end + 1 :]
        t = t[2:]
        flags = self.flags
        sign = 1
        saw_flag = False
        while t:
            c, t = t[0], t[1:]
            if c == "i":
                flags |= FOLD_CASE
                saw_flag = True
            elif c == "m":
                flags &= ~ONE_LINE
                saw_flag = True
            elif c == "s":
                flags |= DOT_NL
                saw_flag = True
            elif c == "U":
                flags |= NON_GREEDY
                saw_flag = True
            elif c == "-":
                if sign < 0:
                    break
                sign = -1
                flags = ~flags
                saw_flag = False
            elif c in ":)":
                if sign < 0:
                    if not saw_flag:
                        break
                    flags = ~flags
                if c == ":":
                    self.op(_LEFT_PAREN)
                self.flags = flags
                return t
            else:
                break
        raise RegexpError(ERR_INVALID_PERL_OP, s[: len(s) - len(t)])

    def escape(self, s: str) -> tuple[int, str]:
        t = s[1:]
        if not t:
            raise RegexpError(ERR_TRAILING_BACKSLASH, "")
        c, t = t[0], t[1:]
        if ord(c) < 0x80 and not _is_alnum(c):
            return ord(c), t
        if c in "1234567" and (not t or not "0" <= t[0] <= "7"):
            pass  # a backreference: not supported
        elif c in "01234567":
            r = ord(c) - 48
            for _ in range(2):
                if not t or not "0" <= t[0] <= "7":
                    break
                r = r * 8 + ord(t[0]) - 48
                t = t[1:]
            return r, t
        elif c == "x" and t:
            c, t = t[0], t[1:]
            if c == "{":
                nhex, r = 0, 0
                while True:
                    if not t:
                        raise RegexpError(ERR_INVALID_ESCAPE, s[: len(s) - len(t)])
                    c, t = t[0], t[1:]
                    if c == "}":
                        break
                    v = _unhex(c)
                    if v < 0:
                        raise RegexpError(ERR_INVALID_ESCAPE, s[: len(s) - len(t)])
                    r = r * 16 + v
                    if r > MAX_RUNE:
                        raise RegexpError(ERR_INVALID_ESCAPE, s[: len(s) - len(t)])
                    nhex += 1
                if nhex == 0:
                    raise RegexpError(ERR_INVALID_ESCAPE, s[: len(s) - len(t)])
                return r, t
            x = _unhex(c)
            if not t:
                raise RegexpError(ERR_INVALID_ESCAPE, s[: len(s) - len(t)])
            c, t = t[0], t[1:]
            y = _unhex(c)
            if x >= 0 and y >= 0:
                return x * 16 + y, t
        elif c in "afnrtv":
            return {"a": 7, "f": 12, "n": 10, "r": 13, "t": 9, "v": 11}[c], t
        raise RegexpError(ERR_INVALID_ESCAPE, s[: len(s) - len(t)])

    def class_char(self, s: str, whole_class: str) -> tuple[int, str]:
        if not s:
            raise RegexpError(ERR_MISSING_BRACKET, whole_class)
        if s[0] == "\\":
            return self.escape(s)
        return ord(s[0]), s[1:]

    def _append_group(self, r: list[int], sign: int, ranges: list[int]) -> None:
        if self.flags & FOLD_CASE:
            folded: list[int] = []
            for i in range(0, len(ranges), 2):
                _append_folded_range(folded, ranges[i], ranges[i + 1])
            ranges = clean_class(folded)
        r += _negate(ranges) if sign < 0 else ranges

    def perl_class_escape(self, s: str, r: list[int]) -> str | None:
        if not self.flags & PERL_X or len(s) < 2 or s[0] != "\\":
            return None
        group = _PERL_GROUPS.get(s[:2])
        if group is None:
            return None
        self._append_group(r, *group)
        return s[2:]

    def named_class(self, s: str, r: list[int]) -> str | None:
        if len(s) < 2 or s[:2] != "[:":
            return None
        i = s.find(":]", 2)
        if i < 0:
            return None
        name, rest = s[: i + 2], s[i + 2 :]
        group = _POSIX_GROUPS.get(name)
        if group is None:
            raise RegexpError(ERR_INVALID_CHAR_RANGE, name)
        self._append_group(r, *group)
        return rest

    def unicode_class(self, s: str, r: list[int]) -> str | None:
        if not self.flags & UNICODE_GROUPS or len(s) < 2 or s[0] != "\\" or s[1] not in "pP":
            return None
        sign = -1 if s[1] == "P" else 1
        t = s[2:]
        c, t = (t[0], t[1:]) if t else ("", "")
        if c != "{":
            seq = s[: len(s) - len(t)]
            name = seq[2:]
        else:
            end = s.find("}")
            if end < 0:
                raise RegexpError(ERR_INVALID_CHAR_RANGE, s)
            seq, t = s[: end + 1], s[end + 1 :]
            name = s[3:end]
        if name[:1] == "^":
            sign, name = -sign, name[1:]
        found = _unicode_table(name)
        if found is None:
            raise RegexpError(ERR_INVALID_CHAR_RANGE, seq)
        tab, fold, tsign = found
        if tsign < 0:
            sign = -sign
        if not self.flags & FOLD_CASE or fold is None:
            ranges = list(tab)
        else:
            ranges = clean_class(list(tab) + list(fold))
        r += _negate(clean_class(ranges)) if sign < 0 else ranges
        return t

    def char_class(self, s: str) -> str:
        t = s[1:]
        re = Regexp(CHAR_CLASS, self.flags)
        sign = 1
        if t[:1] == "^":
            sign, t = -1, t[1:]
            if not self.flags & CLASS_NL:
                re.runes += [0x0A, 0x0A]
        cls = re.runes
        first = True
        while not t or t[0] != "]" or first:
            first = False
            if len(t) > 2 and t[0] == "[" and t[1] == ":":
                rest = self.named_class(t, cls)
                if rest is not None:
                    t = rest
                    continue
            rest = self.unicode_class(t, cls)
            if rest is not None:
                t = rest
                continue
            rest = self.perl_class_escape(t, cls)
            if rest is not None:
                t = rest
                continue
            rng = t
            lo, t = self.class_char(t, s)
            hi = lo
            if len(t) >= 2 and t[0] == "-" and t[1] != "]":
                t = t[1:]
                hi, t = self.class_char(t, s)
                if hi < lo:
                    raise RegexpError(ERR_INVALID_CHAR_RANGE, rng[: len(rng) - len(t)])
            if self.flags & FOLD_CASE:
                _append_folded_range(cls, lo, hi)
            else:
                cls += [lo, hi]
        t = t[1:]
        cleaned = clean_class(cls)
        re.runes = _negate(cleaned) if sign < 0 else cleaned
        self.push(re)
        return t


def _min_fold_rune(r: int) -> int:
    if r < _MIN_FOLD or r > _MAX_FOLD:
        return r
    m, r0 = r, r
    r = simple_fold(r)
    while r != r0:
        m = min(m, r)
        r = simple_fold(r)
    return m


def _repeat_is_valid(re: Regexp, n: int) -> bool:
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
    return all(_repeat_is_valid(sub, n) for sub in re.subs)


def _parse_int(s: str) -> tuple[int, str] | None:
    if not s or not "0" <= s[0] <= "9":
        return None
    if len(s) >= 2 and s[0] == "0" and "0" <= s[1] <= "9":
        return None
    i = 0
    while i < len(s) and "0" <= s[i] <= "9":
        i += 1
    digits, rest = s[:i], s[i:]
    n = 0
    for d in digits:
        if n >= 100_000_000:
            n = -1
            break
        n = n * 10 + ord(d) - 48
    return n, rest


def _parse_repeat(s: str) -> tuple[int, int, str] | None:
    """{min} / {min,} / {min,max}: (min, max (-1: none), rest), or None when not one."""
    if not s or s[0] != "{":
        return None
    got = _parse_int(s[1:])
    if got is None:
        return None
    lo, s = got
    if not s:
        return None
    if s[0] != ",":
        hi = lo
    else:
        s = s[1:]
        if not s:
            return None
        if s[0] == "}":
            hi = -1
        else:
            got = _parse_int(s)
            if got is None:
                return None
            hi, s = got
            if hi < 0:
                lo = -1
    if not s or s[0] != "}":
        return None
    return lo, hi, s[1:]


def parse(pattern: str) -> Regexp:
    """``syntax.Parse(pattern, syntax.Perl)``; raises :class:`RegexpError` as Go does."""
    try:
        return _parse(pattern)
    except _Limit as limit:
        raise RegexpError(limit.code, pattern) from None


def _parse(s: str) -> Regexp:
    p = _Parser(s)
    t = s
    last_repeat = ""
    while t:
        repeat = ""
        c = t[0]
        if c == "(":
            if p.flags & PERL_X and len(t) >= 2 and t[1] == "?":
                t = p.perl_flags(t)
            else:
                p.num_cap += 1
                p.op(_LEFT_PAREN).cap = p.num_cap
                t = t[1:]
        elif c == "|":
            p.vertical_bar()
            t = t[1:]
        elif c == ")":
            p.right_paren()
            t = t[1:]
        elif c == "^":
            p.op(BEGIN_TEXT if p.flags & ONE_LINE else BEGIN_LINE)
            t = t[1:]
        elif c == "$":
            p.op(END_TEXT if p.flags & ONE_LINE else END_LINE)
            t = t[1:]
        elif c == ".":
            p.op(ANY_CHAR if p.flags & DOT_NL else ANY_CHAR_NOT_NL)
            t = t[1:]
        elif c == "[":
            t = p.char_class(t)
        elif c in "*+?":
            op = {"*": STAR, "+": PLUS, "?": QUEST}[c]
            before = t
            t = p.repeat(op, 0, 0, before, t[1:], last_repeat)
            repeat = before
        elif c == "{":
            before = t
            parsed = _parse_repeat(t)
            if parsed is None:
                p.literal(ord("{"))
                t = t[1:]
            else:
                lo, hi, after = parsed
                if lo < 0 or lo > MAX_REPEAT or hi > MAX_REPEAT or (hi >= 0 and lo > hi):
                    raise RegexpError(ERR_INVALID_REPEAT_SIZE, before[: len(before) - len(after)])
                t = p.repeat(REPEAT, lo, hi, before, after, last_repeat)
                repeat = before
        elif c == "\\":
            t = _backslash(p, t)
        else:
            p.literal(ord(c))
            t = t[1:]
        last_repeat = repeat
    p.concat()
    if p.swap_vertical_bar():
        p.stack.pop()
    p.alternate()
    if len(p.stack) != 1:
        raise RegexpError(ERR_MISSING_PAREN, s)
    return p.stack[0]


_SIMPLE_ESCAPES = {"A": BEGIN_TEXT, "b": WORD_BOUNDARY, "B": NO_WORD_BOUNDARY, "z": END_TEXT}


def _backslash(p: _Parser, t: str) -> str:
    if p.flags & PERL_X and len(t) >= 2:
        c = t[1]
        if c in _SIMPLE_ESCAPES:
            p.op(_SIMPLE_ESCAPES[c])
            return t[2:]
        if c == "C":
            raise RegexpError(ERR_INVALID_ESCAPE, t[:2])
        if c == "Q":
            lit, _, rest = t[2:].partition("\\E")
            for ch in lit:
                p.literal(ord(ch))
            return rest
    runes: list[int] = []
    after = p.unicode_class(t, runes) if len(t) >= 2 and t[1] in "pP" else None
    if after is None:
        after = p.perl_class_escape(t, runes)
    if after is not None:
        p.push(Regexp(CHAR_CLASS, p.flags, runes))
        return after
    r, rest = p.escape(t)
    p.literal(r)
    return rest


# ------------------------------------------------------------------ RE2 pattern


def _rune(r: int) -> str:
    return f"\\x{{{r:x}}}"


_SURROGATES = (0xD800, 0xDFFF)


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


# ------------------------------------------------------------------ matching


@lru_cache(maxsize=512)
def _compiled(pattern: str) -> Any:
    options = re2.Options()
    options.max_mem = 1 << 30  # Go allows programs of up to 3.3 million instructions
    options.log_errors = False
    limit = sys.getrecursionlimit()
    # The tree may be MAX_HEIGHT deep, and parse and translate walk it recursively.
    sys.setrecursionlimit(max(limit, 3 * MAX_HEIGHT + 1000))
    try:
        text = translate(parse(pattern))
    finally:
        sys.setrecursionlimit(limit)
    return re2.compile(text.encode(), options)


def check(pattern: str) -> None:
    """Raise :class:`RegexpError` when Go's ``regexp.Compile`` refuses ``pattern``."""
    _compiled(pattern)


def valid(pattern: str) -> bool:
    try:
        _compiled(pattern)
    except RegexpError:
        return False
    return True


def _search(compiled: Any, data: bytes, pos: int) -> tuple[int, int] | None:
    """The leftmost-first match at or after ``pos`` that starts between two runes.

    RE2 also tries an empty-width assertion inside a UTF-8 sequence (``\\B`` holds
    between two continuation bytes); Go steps rune by rune and never does. A match
    that starts there is the leftmost only because none starts at a rune boundary
    before it, so the search goes on from the next boundary.
    """
    while True:
        found = compiled.search(data, pos)
        if found is None:
            return None
        start, stop = found.span()
        if start >= len(data) or data[start] & 0xC0 != 0x80:
            return start, stop
        pos = start + 1
        while pos < len(data) and data[pos] & 0xC0 == 0x80:
            pos += 1


def matches(text: str, pattern: str) -> bool:
    """``regexp.MatchString``: whether the pattern matches anywhere in text."""
    return _search(_compiled(pattern), text.encode(), 0) is not None


def find(text: str, pattern: str) -> str:
    """``(*Regexp).FindString``: the leftmost-first match, or ""."""
    data = text.encode()
    found = _search(_compiled(pattern), data, 0)
    return "" if found is None else data[found[0] : found[1]].decode()


def find_all(text: str, pattern: str, n: int = -1) -> list[str]:
    """``(*Regexp).FindAllString(text, n)``: successive non-overlapping matches; an empty
    match right after a previous match is skipped; n < 0 means all."""
    compiled = _compiled(pattern)
    data = text.encode()
    if n < 0:
        n = len(data) + 1
    out: list[str] = []
    pos, prev_end, end = 0, -1, len(data)
    while len(out) < n and pos <= end:
        found = _search(compiled, data, pos)
        if found is None:
            break
        start, stop = found
        accept = True
        if stop == pos:
            if start == prev_end:
                accept = False
            pos += _rune_width(data, pos) if pos < end else 1
        else:
            pos = stop
        prev_end = stop
        if accept:
            out.append(data[start:stop].decode())
    return out


def _rune_width(data: bytes, pos: int) -> int:
    lead = data[pos]
    if lead < 0x80:
        return 1
    if lead >= 0xF0:
        return 4
    if lead >= 0xE0:
        return 3
    return 2
