"""Go's Unicode tables as regexp/syntax consults them: named classes (``\\p{Greek}``,
``\\pL``, ``\\p{Letter}``), simple case folding, and the Perl and POSIX groups.

The tables are Go's own (Unicode 15.0.0, data/gounicode.json, written by
data/gounicode.go), so a class means here what it means to kube-scheduler, not
what Python's or RE2's newer tables say.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from services.allocator.cel.regexptree import MAX_RUNE

MIN_FOLD, MAX_FOLD = 0x0041, 0x1E943  # the runes simple folding moves at all

_ANY = [0, MAX_RUNE]
_ASCII = [0, 0x7F]
_ASCII_FOLD = [0, 0x7F, 0x17F, 0x17F, 0x212A, 0x212A]


@lru_cache(maxsize=1)
def _data() -> dict[str, Any]:
    text = resources.files("services.allocator.cel").joinpath("data/gounicode.json").read_text()
    data: dict[str, Any] = json.loads(text)
    return data


@lru_cache(maxsize=1)
def simple_folds() -> dict[int, int]:
    """unicode.SimpleFold as a map, for loops over many runes (absent: folds to itself)."""
    pairs = _data()["simpleFold"]
    return {pairs[i]: pairs[i + 1] for i in range(0, len(pairs), 2)}


def simple_fold(r: int) -> int:
    """unicode.SimpleFold: the next rune of r's case-folding orbit (r itself if none)."""
    return simple_folds().get(r, r)


def min_fold_rune(r: int) -> int:
    """minFoldRune: the smallest rune of r's orbit, how a case-folded literal is kept."""
    if r < MIN_FOLD or r > MAX_FOLD:
        return r
    m, r0 = r, r
    r = simple_fold(r)
    while r != r0:
        m = min(m, r)
        r = simple_fold(r)
    return m


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
def unicode_table(name: str) -> tuple[tuple[int, ...], tuple[int, ...] | None, int] | None:
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


def _perl_groups() -> dict[str, tuple[int, list[int]]]:
    digit, space = [0x30, 0x39], [0x9, 0xA, 0xC, 0xD, 0x20, 0x20]
    word = [0x30, 0x39, 0x41, 0x5A, 0x5F, 0x5F, 0x61, 0x7A]
    groups: dict[str, tuple[int, list[int]]] = {}
    for letter, ranges in (("d", digit), ("s", space), ("w", word)):
        groups["\\" + letter] = (1, ranges)
        groups["\\" + letter.upper()] = (-1, ranges)
    return groups


def _posix_groups() -> dict[str, tuple[int, list[int]]]:
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
        "word": [0x30, 0x39, 0x41, 0x5A, 0x5F, 0x5F, 0x61, 0x7A],
        "xdigit": [0x30, 0x39, 0x41, 0x46, 0x61, 0x66],
    }
    groups: dict[str, tuple[int, list[int]]] = {}
    for name, ranges in posix.items():
        groups[f"[:{name}:]"] = (1, ranges)
        groups[f"[:^{name}:]"] = (-1, ranges)
    return groups


#: ``\d`` ``\s`` ``\w`` and their negations: (sign, ranges).
PERL_GROUPS = _perl_groups()
#: ``[:alpha:]`` and the rest, ``[:^alpha:]`` negated: (sign, ranges).
POSIX_GROUPS = _posix_groups()
