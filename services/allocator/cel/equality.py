"""cel-go's ``==`` where its left operand may be a Semver, Quantity, IP, CIDR, URL
or Format and its right operand is computed.

cel-go asks the left operand's type for equality, and Kubernetes' types answer
``no such overload`` (an error) for any operand of another type (null aside,
which cel-go compares first: false). cel-cpp compares our messages with other
values as plain values: false. check.py rewrites such an ``A == B`` into
``__k8s_equal(A, B)``, declared here for every pair of runtime kinds (cel-cpp
dispatches on kinds; a ``dyn`` parameter matches none), which evaluates both
operands once, left first, and answers as cel-go does. A plain literal on the
right needs no pair: check.py's ``__k8s_plain`` (lib.py) handles it.
"""

from __future__ import annotations

import datetime
from typing import Any

from cel_expr_python import cel
from google.protobuf.message import Message

from services.allocator.cel import types as celtypes

EQUAL = "__k8s_equal"

T = cel.Type


def kinds() -> dict[str, cel.Type]:
    """One declared type per runtime kind; every message shares the last one."""
    return {
        "int": T.INT,
        "uint": T.UINT,
        "double": T.DOUBLE,
        "string": T.STRING,
        "bool": T.BOOL,
        "bytes": T.BYTES,
        "list": T.List(T.DYN),
        "map": T.Map(T.DYN, T.DYN),
        "null": T.NULL,
        "timestamp": T.TIMESTAMP,
        "duration": T.DURATION,
        "message": T(celtypes.QUANTITY_TYPE),
    }


def equal(left: Any, right: Any) -> bool:
    """``left == right`` as cel-go evaluates it with the Kubernetes types."""
    if isinstance(left, Message) and right is not None and type(right) is not type(left):
        raise TypeError("no such overload")
    return same(left, right)


def same(left: Any, right: Any) -> bool:
    """CEL's heterogeneous equality on values as cel-expr-python hands them over:
    numbers of any kind compare by value, bools only with bools, lists and maps
    element by element, anything else only with its own type."""
    if left is None or right is None:
        return left is None and right is None
    if isinstance(left, bool) or isinstance(right, bool):
        return type(left) is type(right) and left == right
    if isinstance(left, int | float) and isinstance(right, int | float):
        return left == right
    if isinstance(left, list) and isinstance(right, list):
        return len(left) == len(right) and all(same(a, b) for a, b in zip(left, right, strict=True))
    if isinstance(left, dict) and isinstance(right, dict):
        return len(left) == len(right) and all(
            key in right and same(value, right[key]) for key, value in left.items()
        )
    if isinstance(left, datetime.datetime | datetime.timedelta | str | bytes | Message):
        return type(left) is type(right) and bool(left == right)
    return False


def declaration() -> cel.FunctionDecl:
    """:data:`EQUAL` for every (kind, kind) pair."""
    types = kinds()
    return cel.FunctionDecl(
        EQUAL,
        [
            cel.Overload(f"k8s_equal_{a}_{b}", T.BOOL, [ta, tb], is_member=False, impl=equal)
            for a, ta in types.items()
            for b, tb in types.items()
        ],
    )
