"""A port of Go's regexp/syntax parser (parse.go, ``syntax.Parse(pattern, syntax.Perl)``):
the same acceptance, the same tree and the same error codes
(``error parsing regexp: <code>: `<expr>```), limits included.

Not ported: the factoring of common prefixes in alternations, which changes
only the size estimate behind ``expression too large`` (a pattern near 3.3
million instructions may be refused here and not by Go).
"""

from __future__ import annotations

from services.allocator.cel.regexpclass import (
    char_class,
    clean_alt,
    escape,
    is_alnum,
    is_char_class,
    merge_char_class,
    perl_class_escape,
    unicode_class,
)
from services.allocator.cel.regexptables import min_fold_rune
from services.allocator.cel.regexptree import (
    ALTERNATE,
    ANY_CHAR,
    ANY_CHAR_NOT_NL,
    BEGIN_LINE,
    BEGIN_TEXT,
    CAPTURE,
    CHAR_CLASS,
    CONCAT,
    DOT_NL,
    EMPTY_MATCH,
    END_LINE,
    END_TEXT,
    ERR_INVALID_ESCAPE,
    ERR_INVALID_NAMED_CAPTURE,
    ERR_INVALID_PERL_OP,
    ERR_INVALID_REPEAT_OP,
    ERR_INVALID_REPEAT_SIZE,
    ERR_LARGE,
    ERR_MISSING_PAREN,
    ERR_MISSING_REPEAT_ARGUMENT,
    ERR_NESTING_DEPTH,
    ERR_UNEXPECTED_PAREN,
    FOLD_CASE,
    LITERAL,
    NO_MATCH,
    NO_WORD_BOUNDARY,
    NON_GREEDY,
    ONE_LINE,
    PERL,
    PERL_X,
    PLUS,
    QUEST,
    REPEAT,
    STAR,
    WORD_BOUNDARY,
    Regexp,
    RegexpError,
    calc_height,
    calc_size,
    repeat_is_valid,
)

MAX_HEIGHT = 1000
MAX_SIZE = (128 << 20) // 40
MAX_RUNES = (128 << 20) // 4
MAX_REPEAT = 1000

_LEFT_PAREN, _VERTICAL_BAR = 128, 129  # pseudo-ops on the parse stack, after every op


class _Limit(Exception):
    """ErrLarge / ErrNestingDepth: reported against the whole expression."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


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
        if calc_size(re, True) > MAX_SIZE:
            raise _Limit(ERR_LARGE)
        if calc_height(re, True) > MAX_HEIGHT:
            raise _Limit(ERR_NESTING_DEPTH)

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
            r = min_fold_rune(r)
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
        if op == REPEAT and (lo >= 2 or hi >= 2) and not repeat_is_valid(re, MAX_REPEAT):
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
            clean_alt(subs[-1])
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
            and is_char_class(st[n - 1])
            and is_char_class(st[n - 3])
        ):
            re1, re3 = st[n - 1], st[n - 3]
            if re1.op > re3.op:
                re1, re3 = re3, re1
                st[n - 3] = re3
            merge_char_class(re3, re1)
            st.pop()
            return True
        if n >= 2 and st[n - 2].op == _VERTICAL_BAR:
            if n >= 3:
                clean_alt(st[n - 3])
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
            if not name or not all(c == "_" or is_alnum(c) for c in name):
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
            cls, t = char_class(t, p.flags)
            p.push(cls)
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
    after = unicode_class(t, runes, p.flags) if len(t) >= 2 and t[1] in "pP" else None
    if after is None:
        after = perl_class_escape(t, runes, p.flags)
    if after is not None:
        p.push(Regexp(CHAR_CLASS, p.flags, runes))
        return after
    r, rest = escape(t)
    p.literal(r)
    return rest
