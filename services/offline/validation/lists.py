"""How kube-apiserver walks a list, a set and a map's keys (validateSlice, validateSet,
validateMap), which is where releases differ most in what they report."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol, TypeVar

from services.offline.validation.fields import duplicate, too_many
from services.offline.validation.rules import LATEST, Rules

T = TypeVar("T")


class _Named(Protocol):
    @property
    def name(self) -> str: ...


def by_name(item: _Named) -> str:
    """The key of a set whose items are unique by name."""
    return item.name


def duplicates(
    keys: Iterable[Any], path: str, rules: Rules = LATEST, field: str = "", shown: Any = None
) -> list[str]:
    """validateSet's uniqueness check: every repeat after the first, at its index (1.34:
    at the key's own field, ``requests[1].name``, as its itemKey names it). ``shown``
    prints a key as field.Duplicate does, when that is not the key itself."""
    seen: set[Any] = set()
    errors: list[str] = []
    suffix = f".{field}" if field and rules.minor < 35 else ""
    for i, key in enumerate(keys):
        if key in seen:
            errors.append(duplicate(f"{path}[{i}]{suffix}", shown(key) if shown else key))
        seen.add(key)
    return errors


def check_list(
    items: Sequence[T],
    limit: int,
    path: str,
    rules: Rules,
    check: Callable[[int, T], list[str]],
) -> tuple[list[str], bool]:
    """validateSlice: each item's errors, then Too many past ``limit`` (negative: none).
    From 1.35 Too many is the only error of a list past its limit (the check stops
    there, "for DOS protection"); 1.34 checks every item first and adds Too many after
    them. The flag says whether the caller goes on (validateSet's uniqueness check)."""
    over = 0 <= limit < len(items)
    if over and rules.minor >= 35:
        return [too_many(path, len(items), limit)], False
    errors = [e for i, item in enumerate(items) for e in check(i, item)]
    if over:
        errors.append(too_many(path, len(items), limit))
    return errors, True


def check_set(
    items: Sequence[T],
    limit: int,
    path: str,
    rules: Rules,
    check: Callable[[int, T], list[str]],
    key: Callable[[T], Any],
    field: str = "",
) -> list[str]:
    """validateSet: :func:`check_list`, then every repeated key (``field``: the key's field)."""
    errors, going_on = check_list(items, limit, path, rules, check)
    if going_on:
        errors += duplicates(map(key, items), path, rules, field)
    return errors


def key_path(path: str, key: str, limit: int, rules: Rules) -> str:
    """Where validateMap reports a bad key: up to 1.35 at the key (``attributes[k]``, a
    key longer than ``limit`` cut in the middle, truncateIfTooLong), from 1.36 at the
    map itself."""
    if rules.minor >= 36:
        return path
    limit = max(limit, 16)
    if len(key) > limit:
        rest = limit - 3
        key = key[: (rest + 1) // 2] + "..." + key[len(key) - rest // 2 :]
    return f"{path}[{key}]"
