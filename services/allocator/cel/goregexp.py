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

So the pattern goes through a port of ``regexp/syntax``'s parser
(:mod:`.regexpparser`: the same acceptance and error codes, ``error parsing
regexp: <code>: `<expr>```, over the tree of :mod:`.regexptree`, the classes of
:mod:`.regexpclass` and Go's own Unicode tables, :mod:`.regexptables`), and
:mod:`.regexpwriter` writes the parsed tree back as an RE2 pattern in which every
class is spelled out as code point ranges and case folding is expanded, so the
RE2 that runs it (google-re2) consults no table of its own: the answers are
Go's. This module compiles that pattern once and matches as Go's ``regexp``
does.
"""

from __future__ import annotations

import sys
from functools import lru_cache
from typing import Any

import re2  # type: ignore[import-untyped]

from services.allocator.cel.regexpparser import MAX_HEIGHT, parse
from services.allocator.cel.regexptree import RegexpError
from services.allocator.cel.regexpwriter import translate


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
