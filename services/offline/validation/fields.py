"""kube-apiserver's error wording (apimachinery's field.Error), so a what-if run
refuses an object in the very words a cluster would."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any


def _go(value: Any) -> str:
    """A value as field.Error prints it (%q for strings, %d for numbers, JSON otherwise)."""
    if isinstance(value, str):
        return json.dumps(value)
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    return json.dumps(value, separators=(",", ":"))


def invalid(path: str, value: Any, detail: str) -> str:
    return f"{path}: Invalid value: {_go(value)}: {detail}"


def required(path: str, detail: str = "") -> str:
    return f"{path}: Required value" + (f": {detail}" if detail else "")


def forbidden(path: str, detail: str) -> str:
    return f"{path}: Forbidden: {detail}"


def internal(path: str, detail: str) -> str:
    return f"{path}: Internal error: {detail}"


def too_many(path: str, count: int, limit: int) -> str:
    return f"{path}: Too many: {count}: must have at most {limit} items"


def too_long(path: str, limit: int) -> str:
    return f"{path}: Too long: may not be more than {limit} bytes"


def duplicate(path: str, value: Any) -> str:
    return f"{path}: Duplicate value: {_go(value)}"


def not_supported(path: str, value: Any, supported: Iterable[str]) -> str:
    choices = ", ".join(json.dumps(v) for v in supported)
    return f"{path}: Unsupported value: {_go(value)}: supported values: {choices}"


def not_found(path: str, value: Any) -> str:
    return f"{path}: Not found: {_go(value)}"
