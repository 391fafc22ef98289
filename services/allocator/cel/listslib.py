"""cel-go's lists extension at version 3 (ext.Lists(ext.ListsVersion(3)), in the
Kubernetes 1.35 environment) and Kubernetes' list ``indexOf`` / ``lastIndexOf``.

``slice``, ``flatten``, ``sort``, ``reverse``, ``distinct`` and ``lists.range``
are declared as they are there: the checking environment (env.py) types the
first five by element with a type parameter (:func:`typed_config`), while
programs run ``list(dyn)`` declarations, since cel-expr-python cannot call a
Python function through a type parameter. The lists ``indexOf`` / ``lastIndexOf`` cannot
be declared beside the strings extension's functions of the same name in
cel-expr-python, so a selector that needs them is compiled with the calls
renamed (macros.py) to :data:`INDEX_OF` / :data:`LAST_INDEX_OF`, which serve
strings and lists alike.
"""

from __future__ import annotations

import json
from typing import Any

from cel_expr_python import cel

ORDERING = {"<": "__k8s_lt", "<=": "__k8s_le", ">": "__k8s_gt", ">=": "__k8s_ge"}
INDEX_OF = "__k8s_indexOf"
LAST_INDEX_OF = "__k8s_lastIndexOf"
LIST = cel.Type.List(cel.Type.DYN)


def _slice(items: list[Any], start: int, end: int) -> list[Any]:
    if start < 0 or end < 0:
        raise ValueError(f"cannot slice({start}, {end}), negative indexes not supported")
    if start > end:
        raise ValueError(
            f"cannot slice({start}, {end}), start index must be less than or equal to end index"
        )
    if end > len(items):
        raise ValueError(f"cannot slice({start}, {end}), list is length {len(items)}")
    return list(items[start:end])


def _flatten(items: list[Any], depth: int = 1) -> list[Any]:
    if depth < 0:
        raise ValueError("level must be non-negative")
    out: list[Any] = []
    for item in items:
        if isinstance(item, list) and depth > 0:
            out.extend(_flatten(item, depth - 1))
        else:
            out.append(item)
    return out


def _sort(items: list[Any]) -> list[Any]:
    kinds = {type(item) for item in items}
    if len(kinds) > 1 and not kinds <= {int, float}:
        raise ValueError("list elements must have the same type")
    return sorted(items)


def _distinct(items: list[Any]) -> list[Any]:
    out: list[Any] = []
    for item in items:
        if not any(_same(item, seen) for seen in out):
            out.append(item)
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return bool(a == b)


def _index_of(target: Any, value: Any, offset: int | None = None) -> int:
    if isinstance(target, str):
        start = offset or 0
        if start < 0 or start > len(target):
            raise ValueError(f"index out of range: {start}")
        return target.find(value, start)
    return next((i for i, item in enumerate(target) if _same(item, value)), -1)


def _last_index_of(target: Any, value: Any, offset: int | None = None) -> int:
    if isinstance(target, str):
        end = len(target) if offset is None else offset + len(value)
        if offset is not None and (offset < 0 or offset > len(target)):
            raise ValueError(f"index out of range: {offset}")
        return target.rfind(value, 0, end)
    found = [i for i, item in enumerate(target) if _same(item, value)]
    return found[-1] if found else -1


def _entries(value: Any) -> list[list[Any]]:
    """Two-variable comprehensions (macros.py): [index, element] or [key, value] pairs."""
    if isinstance(value, dict):
        return [[k, v] for k, v in value.items()]
    return [[i, item] for i, item in enumerate(value)]


def _zip(keys: list[Any], values: list[Any]) -> dict[Any, Any]:
    return dict(zip(keys, values, strict=True))


def _merge(entries: list[dict[Any, Any]]) -> dict[Any, Any]:
    out: dict[Any, Any] = {}
    for entry in entries:
        for key, value in entry.items():
            if key in out:
                raise ValueError(f"insert failed: key {key} already exists")
            out[key] = value
    return out


def _by_kind(oid: str, ret: Any, impl: Any) -> list[tuple[str, Any, list[Any], bool, Any]]:
    """One overload per element kind: the runtime dispatches on kinds, and a ``dyn``
    parameter matches none at run time."""
    kinds = {
        "int": cel.Type.INT,
        "uint": cel.Type.UINT,
        "double": cel.Type.DOUBLE,
        "string": cel.Type.STRING,
        "bool": cel.Type.BOOL,
        "bytes": cel.Type.BYTES,
    }
    return [(f"{oid}_{name}", ret, [LIST, kind], True, impl) for name, kind in kinds.items()]


_ORDER_TESTS = {
    "__k8s_lt": lambda a, b: a < b,
    "__k8s_le": lambda a, b: a <= b,
    "__k8s_gt": lambda a, b: a > b,
    "__k8s_ge": lambda a, b: a >= b,
}


def _ordering() -> list[Any]:
    """macros.py's ordering calls: numbers of any two kinds (exactly, as cel-go's
    cross-type comparisons), and strings, bytes, bools, timestamps and durations
    each with their own kind."""
    t = cel.Type
    numbers = {"int": t.INT, "uint": t.UINT, "double": t.DOUBLE}
    pairs = [(f"{a}_{b}", x, y) for a, x in numbers.items() for b, y in numbers.items()]
    for name, kind in (
        ("string", t.STRING),
        ("bytes", t.BYTES),
        ("bool", t.BOOL),
        ("timestamp", t.TIMESTAMP),
        ("duration", t.DURATION),
    ):
        pairs.append((f"{name}_{name}", kind, kind))
    return [
        cel.FunctionDecl(
            fn,
            [
                cel.Overload(f"{fn}_{pair}", t.BOOL, [x, y], is_member=False, impl=test)
                for pair, x, y in pairs
            ],
        )
        for fn, test in _ORDER_TESTS.items()
    ]


def _decl(name: str, *overloads: tuple[str, Any, list[Any], bool, Any]) -> Any:
    return cel.FunctionDecl(
        name,
        [cel.Overload(o, r, p, is_member=m, impl=f) for o, r, p, m, f in overloads],
    )


# cel-go's comparable types, for which it declares ``sort``.
_COMPARABLE = ("int", "uint", "double", "bool", "duration", "timestamp", "string", "bytes")
TYPED = ("slice", "flatten", "sort", "reverse", "distinct")


_T = {"type_name": "T", "is_type_param": True}


def _list_of(element: dict[str, Any]) -> dict[str, Any]:
    return {"type_name": "list", "params": [element]}


def _overload(oid: str, target: dict[str, Any], result: dict[str, Any], *args: str) -> Any:
    out: dict[str, Any] = {"id": oid, "target": target, "return": result}
    if args:
        out["args"] = [{"type_name": a} for a in args]
    return out


def typed_config(extension: bool = True) -> Any:
    """The five functions typed by element as cel-go declares them (``T`` a type
    parameter, ``sort`` per comparable type), for type-checking only: the runtime
    cannot bind a type parameter, so programs run the ``list(dyn)`` declarations
    of :func:`functions` (env.py's checking environment takes these instead).
    ``extension`` False: none of them (an environment without the lists extension)."""
    if not extension:
        return None
    t, dyn = _list_of(_T), _list_of({"type_name": "dyn"})
    overloads = {
        "slice": [_overload("list_slice", t, t, "int", "int")],
        "flatten": [
            _overload("list_flatten", _list_of(t), t),
            _overload("list_flatten_int", dyn, dyn, "int"),
        ],
        "sort": [
            _overload(
                f"list_{name}_sort", _list_of({"type_name": name}), _list_of({"type_name": name})
            )
            for name in _COMPARABLE
        ],
        "reverse": [_overload("list_reverse", t, t)],
        "distinct": [_overload("list_distinct", t, t)],
    }
    config = {
        "name": "typed-lists",
        "functions": [{"name": name, "overloads": body} for name, body in overloads.items()],
    }
    return cel.NewEnvConfigFromYaml(json.dumps(config))  # JSON is YAML


#: What cel-go's lists extension declares (ext.Lists; ``sortBy`` is not modeled).
EXTENSION = (*TYPED, "lists.range")


def functions(typed: bool = False, extension: bool = True) -> list[Any]:
    """Every declaration; ``typed``: without the :data:`TYPED` ones (typed_config);
    ``extension`` False: without the lists extension's (:data:`EXTENSION`), as in an
    environment whose compatibility version predates it (env.py)."""
    i, s, dyn = cel.Type.INT, cel.Type.STRING, cel.Type.DYN
    pairs, anymap = cel.Type.List(LIST), cel.Type.Map(dyn, dyn)
    decls = [
        *_ordering(),
        _decl(
            "__k8s_entries",
            ("k8s_list_entries", pairs, [LIST], False, _entries),
            ("k8s_map_entries", pairs, [anymap], False, _entries),
        ),
        _decl("__k8s_zip", ("k8s_zip", anymap, [LIST, LIST], False, _zip)),
        _decl("__k8s_merge", ("k8s_merge", anymap, [cel.Type.List(anymap)], False, _merge)),
        _decl(
            INDEX_OF,
            ("k8s_string_index_of", i, [s, s], True, _index_of),
            ("k8s_string_index_of_offset", i, [s, s, i], True, _index_of),
            *_by_kind("k8s_list_index_of", i, _index_of),
        ),
        _decl(
            LAST_INDEX_OF,
            ("k8s_string_last_index_of", i, [s, s], True, _last_index_of),
            ("k8s_string_last_index_of_offset", i, [s, s, i], True, _last_index_of),
            *_by_kind("k8s_list_last_index_of", i, _last_index_of),
        ),
    ]
    if not extension:
        return decls
    decls.append(
        _decl(
            "lists.range", ("lists_range", cel.Type.List(i), [i], False, lambda n: list(range(n)))
        )
    )
    if typed:
        return decls
    return [
        *decls,
        _decl("slice", ("list_slice", LIST, [LIST, i, i], True, _slice)),
        _decl(
            "flatten",
            ("list_flatten", LIST, [LIST], True, _flatten),
            ("list_flatten_int", LIST, [LIST, i], True, _flatten),
        ),
        _decl("sort", ("list_sort", LIST, [LIST], True, _sort)),
        _decl("reverse", ("list_reverse", LIST, [LIST], True, lambda items: list(items)[::-1])),
        _decl("distinct", ("list_distinct", LIST, [LIST], True, _distinct)),
    ]
