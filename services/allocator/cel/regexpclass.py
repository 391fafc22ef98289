"""Character classes as regexp/syntax reads and combines them: a class is a list of
rune ranges ``lo, hi, lo, hi, ...``; ``[...]``, ``\\d``, ``[:alpha:]``, ``\\p{Greek}``
and escaped runes are read into one, case folding widens it, negation complements
it, and ``a|b`` of two single-rune pieces merges into one class, as parse.go does.
"""

from __future__ import annotations

from services.allocator.cel.regexptables import (
    MAX_FOLD,
    MIN_FOLD,
    PERL_GROUPS,
    POSIX_GROUPS,
    simple_folds,
    unicode_table,
)
from services.allocator.cel.regexptree import (
    ANY_CHAR,
    ANY_CHAR_NOT_NL,
    CHAR_CLASS,
    CLASS_NL,
    ERR_INVALID_CHAR_RANGE,
    ERR_INVALID_ESCAPE,
    ERR_MISSING_BRACKET,
    ERR_TRAILING_BACKSLASH,
    FOLD_CASE,
    LITERAL,
    MAX_RUNE,
    PERL_X,
    UNICODE_GROUPS,
    Regexp,
    RegexpError,
)

# ------------------------------------------------------------------ ranges


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
    if (lo <= MIN_FOLD and hi >= MAX_FOLD) or hi < MIN_FOLD or lo > MAX_FOLD:
        r += [lo, hi]
        return
    if lo < MIN_FOLD:
        r += [lo, MIN_FOLD - 1]
        lo = MIN_FOLD
    if hi > MAX_FOLD:
        r += [MAX_FOLD + 1, hi]
        hi = MAX_FOLD
    fold = simple_folds()
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


def is_char_class(re: Regexp) -> bool:
    """Whether the piece matches one rune from a set (isCharClass): it may merge."""
    return (re.op == LITERAL and len(re.runes) == 1) or re.op in (
        CHAR_CLASS,
        ANY_CHAR_NOT_NL,
        ANY_CHAR,
    )


def merge_char_class(dst: Regexp, src: Regexp) -> None:
    """mergeCharClass: ``dst|src`` of two single-rune pieces as one class in dst."""
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


def clean_alt(re: Regexp) -> None:
    """cleanAlt: a merged class cleaned, and any-rune classes as their own ops."""
    if re.op != CHAR_CLASS:
        return
    re.runes = clean_class(re.runes)
    if re.runes == [0, MAX_RUNE]:
        re.runes, re.op = [], ANY_CHAR
    elif re.runes == [0, 0x09, 0x0B, MAX_RUNE]:
        re.runes, re.op = [], ANY_CHAR_NOT_NL


# ------------------------------------------------------------------ syntax


def is_alnum(c: str) -> bool:
    """ASCII letters and digits only, as Go's isalnum (str.isalnum takes every script)."""
    return "0" <= c <= "9" or "A" <= c <= "Z" or "a" <= c <= "z"


def _unhex(c: str) -> int:
    if "0" <= c <= "9":
        return ord(c) - 48
    if "a" <= c <= "f":
        return ord(c) - 87
    if "A" <= c <= "F":
        return ord(c) - 55
    return -1


def escape(s: str) -> tuple[int, str]:
    """parseEscape: the rune ``s`` (at a backslash) stands for, and the rest."""
    t = s[1:]
    if not t:
        raise RegexpError(ERR_TRAILING_BACKSLASH, "")
    c, t = t[0], t[1:]
    if ord(c) < 0x80 and not is_alnum(c):
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


def _class_char(s: str, whole_class: str) -> tuple[int, str]:
    if not s:
        raise RegexpError(ERR_MISSING_BRACKET, whole_class)
    if s[0] == "\\":
        return escape(s)
    return ord(s[0]), s[1:]


def _append_group(r: list[int], sign: int, ranges: list[int], flags: int) -> None:
    if flags & FOLD_CASE:
        folded: list[int] = []
        for i in range(0, len(ranges), 2):
            _append_folded_range(folded, ranges[i], ranges[i + 1])
        ranges = clean_class(folded)
    r += _negate(ranges) if sign < 0 else ranges


def perl_class_escape(s: str, r: list[int], flags: int) -> str | None:
    """``\\d`` ``\\s`` ``\\w`` (and negations) added to r: the rest, or None if not one."""
    if not flags & PERL_X or len(s) < 2 or s[0] != "\\":
        return None
    group = PERL_GROUPS.get(s[:2])
    if group is None:
        return None
    _append_group(r, *group, flags)
    return s[2:]


def _named_class(s: str, r: list[int], flags: int) -> str | None:
    if len(s) < 2 or s[:2] != "[:":
        return None
    i = s.find(":]", 2)
    if i < 0:
        return None
    name, rest = s[: i + 2], s[i + 2 :]
    group = POSIX_GROUPS.get(name)
    if group is None:
        raise RegexpError(ERR_INVALID_CHAR_RANGE, name)
    _append_group(r, *group, flags)
    return rest


def unicode_class(s: str, r: list[int], flags: int) -> str | None:
    """``\\pL``, ``\\p{Greek}``, ``\\P{^L}`` added to r: the rest, or None if not one."""
    if not flags & UNICODE_GROUPS or len(s) < 2 or s[0] != "\\" or s[1] not in "pP":
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
    found = unicode_table(name)
    if found is None:
        raise RegexpError(ERR_INVALID_CHAR_RANGE, seq)
    tab, fold, tsign = found
    if tsign < 0:
        sign = -sign
    if not flags & FOLD_CASE or fold is None:
        ranges = list(tab)
    else:
        ranges = clean_class(list(tab) + list(fold))
    r += _negate(clean_class(ranges)) if sign < 0 else ranges
    return t


def char_class(s: str, flags: int) -> tuple[Regexp, str]:
    """parseClass: the ``[...]`` at the start of s as one class, and the rest."""
    t = s[1:]
    re = Regexp(CHAR_CLASS, flags)
    sign = 1
    if t[:1] == "^":
        sign, t = -1, t[1:]
        if not flags & CLASS_NL:
            re.runes += [0x0A, 0x0A]
    cls = re.runes
    first = True
    while not t or t[0] != "]" or first:
        first = False
        if len(t) > 2 and t[0] == "[" and t[1] == ":":
            rest = _named_class(t, cls, flags)
            if rest is not None:
                t = rest
                continue
        rest = unicode_class(t, cls, flags)
        if rest is not None:
            t = rest
            continue
        rest = perl_class_escape(t, cls, flags)
        if rest is not None:
            t = rest
            continue
        rng = t
        lo, t = _class_char(t, s)
        hi = lo
        if len(t) >= 2 and t[0] == "-" and t[1] != "]":
            t = t[1:]
            hi, t = _class_char(t, s)
            if hi < lo:
                raise RegexpError(ERR_INVALID_CHAR_RANGE, rng[: len(rng) - len(t)])
        if flags & FOLD_CASE:
            _append_folded_range(cls, lo, hi)
        else:
            cls += [lo, hi]
    t = t[1:]
    cleaned = clean_class(cls)
    re.runes = _negate(cleaned) if sign < 0 else cleaned
    return re, t
