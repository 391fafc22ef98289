"""The Kubernetes CEL libraries a DRA selector may use, for cel-expr-python.

Strings (ext version 2), ``cel.bind`` and optional values come with the
runtime. This module adds what Kubernetes adds (k8s.io/apiserver/pkg/cel/library):
the quantity and semver libraries, the lists library, the regex ``find`` /
``findAll`` functions and the ``sets`` extension. A Python exception raised by
an implementation becomes a CEL error value carrying its message, which is how
``quantity("x")`` fails at run time exactly like in Kubernetes.

The IP, CIDR and URL libraries are in netlib.py, cel-go's lists extension
(version 3) and the lists ``indexOf``/``lastIndexOf`` in listslib.py,
two-variable comprehensions in macros.py (a rewrite), the ``format`` library
in formatlib.py, the checks cel-go makes on literals in literals.py. Not
provided: the authz libraries (no request to authorize in a selector).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from cel_expr_python import cel

from services.allocator.cel import check as celcheck
from services.allocator.cel import equality, formatlib, goregexp, listslib, netlib, strformat
from services.allocator.cel import types as celtypes
from services.allocator.cel.regexptree import RegexpError
from services.allocator.cel.semver import Semver, SemverError
from services.core.kube.quantity import Quantity

Q = cel.Type(celtypes.QUANTITY_TYPE)
S = cel.Type(celtypes.SEMVER_TYPE)
T = cel.Type
LIST = cel.Type.List(cel.Type.DYN)


# ---------------------------------------------------------------- quantity


def _quantity(text: str) -> Any:
    return celtypes.quantity_message(Quantity.parse(text))


def _is_quantity(text: str) -> bool:
    try:
        Quantity.parse(text)
    except ValueError:
        return False
    return True


def _q(message: Any) -> Quantity:
    return celtypes.quantity_of(message)


def _as_integer(message: Any) -> int:
    value = _q(message).as_int64()
    if value is None:
        raise ValueError("cannot convert value to integer")
    return value


def _cmp_q(a: Any, b: Any) -> int:
    return _q(a).cmp(_q(b))


def _add_q(a: Any, b: Any) -> Any:
    return celtypes.quantity_message(_q(a).add(_q(b)))


def _add_int(a: Any, b: int) -> Any:
    return celtypes.quantity_message(_q(a).add(Quantity.from_int(b, "DecimalExponent")))


def _sub_q(a: Any, b: Any) -> Any:
    return celtypes.quantity_message(_q(a).sub(_q(b)))


def _sub_int(a: Any, b: int) -> Any:
    return celtypes.quantity_message(_q(a).sub(Quantity.from_int(b, "DecimalExponent")))


def _rep(q: Quantity) -> str:
    return f"{q.unscaled}|{q.exp}|{q.format}|{int(q.dec)}"


def _of_rep(text: str) -> Quantity:
    unscaled, exp, fmt, dec = text.split("|")
    return Quantity(int(unscaled), int(exp), fmt, dec == "1")  # type: ignore[arg-type]


def _qrep_int(rep: str, other: int, sign: int) -> str:
    q = _of_rep(rep)
    return _rep(q.add(Quantity.from_int(sign * other, q.format)))


def _qrep_q(rep: str, other: Any, sign: int) -> str:
    q, o = _of_rep(rep), (_of_rep(other) if isinstance(other, str) else _q(other))
    return _rep(q.add(o) if sign > 0 else q.sub(o))


def _qrep_as_integer(rep: str) -> int:
    value = _of_rep(rep).as_int64()
    if value is None:
        raise ValueError("cannot convert value to integer")
    return value


def _representation() -> list[cel.FunctionDecl]:
    """check.representation_edits' functions: a Quantity as Go holds it, in a string."""
    b, i, s = T.BOOL, T.INT, T.STRING
    return [
        _fn(celcheck.QREP, ("k8s_qrep", s, [s], False, lambda t: _rep(Quantity.parse(t)))),
        _fn(celcheck.QREP_OF, ("k8s_qrep_of", s, [Q], False, lambda m: _rep(_q(m)))),
        _fn(
            celcheck.QADD,
            ("k8s_qadd_q", s, [s, Q], False, lambda r, o: _qrep_q(r, o, 1)),
            ("k8s_qadd_int", s, [s, i], False, lambda r, o: _qrep_int(r, o, 1)),
            ("k8s_qadd_rep", s, [s, s], False, lambda r, o: _qrep_q(r, o, 1)),
        ),
        _fn(
            celcheck.QSUB,
            ("k8s_qsub_q", s, [s, Q], False, lambda r, o: _qrep_q(r, o, -1)),
            ("k8s_qsub_int", s, [s, i], False, lambda r, o: _qrep_int(r, o, -1)),
            ("k8s_qsub_rep", s, [s, s], False, lambda r, o: _qrep_q(r, o, -1)),
        ),
        _fn(
            celcheck.QIS_INT,
            ("k8s_qisint", b, [s], False, lambda r: _of_rep(r).as_int64() is not None),
        ),
        _fn(celcheck.QAS_INT, ("k8s_qasint", i, [s], False, _qrep_as_integer)),
    ]


# ---------------------------------------------------------------- semver


def _semver(text: str) -> Any:
    return celtypes.semver_message(Semver.parse(text))


def _semver_normalize(text: str, normalize: bool) -> Any:
    parse = Semver.parse_normalized if normalize else Semver.parse
    return celtypes.semver_message(parse(text))


def _is_semver(text: str, normalize: bool = False) -> bool:
    try:
        (Semver.parse_normalized if normalize else Semver.parse)(text)
    except SemverError:
        return False
    return True


def _cmp_s(a: Any, b: Any) -> int:
    return celtypes.semver_of(a).compare(celtypes.semver_of(b))


# ---------------------------------------------------------------- lists, regex, sets


def _is_sorted(items: list[Any]) -> bool:
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))


def _sum(items: list[Any]) -> Any:
    return sum(items) if items else 0


def _min(items: list[Any]) -> Any:
    if not items:
        raise ValueError("min called on empty list")
    return min(items)


def _max(items: list[Any]) -> Any:
    if not items:
        raise ValueError("max called on empty list")
    return max(items)


def _matches(text: str, pattern: str) -> bool:
    """``matches`` as cel-go runs it (Go's regexp); a bad computed pattern is its error."""
    return goregexp.matches(text, pattern)


def _format(text: str, args: list[Any]) -> str:
    """string.format with cel-go's run-time text (strformat.py)."""
    return strformat.format_string(text, list(args))


def _illegal(exc: RegexpError) -> ValueError:
    return ValueError(f"Illegal regex: {exc}")


def _find(text: str, pattern: str) -> str:
    try:
        return goregexp.find(text, pattern)
    except RegexpError as exc:
        raise _illegal(exc) from None


def _find_all(text: str, pattern: str, limit: int = -1) -> list[str]:
    try:
        return goregexp.find_all(text, pattern, limit)
    except RegexpError as exc:
        raise _illegal(exc) from None


def _sets_contains(a: list[Any], b: list[Any]) -> bool:
    return all(item in a for item in b)


def _sets_equivalent(a: list[Any], b: list[Any]) -> bool:
    return _sets_contains(a, b) and _sets_contains(b, a)


def _sets_intersects(a: list[Any], b: list[Any]) -> bool:
    return any(item in a for item in b)


# ---------------------------------------------------------------- equality


def _plain(value: Any) -> Any:
    return value


def _no_such_overload(value: Any) -> Any:
    """What cel-go says when a Semver or Quantity meets another type in ``==``."""
    raise TypeError("no such overload")


def _plain_decl() -> cel.FunctionDecl:
    """check.PLAIN: every value unchanged, except our message types (one runtime kind)."""
    overloads = [
        cel.Overload(f"k8s_plain_{name}", T.DYN, [kind], is_member=False, impl=_plain)
        for name, kind in equality.kinds().items()
        if name != "message"
    ]
    overloads.append(
        cel.Overload("k8s_plain_message", T.DYN, [Q], is_member=False, impl=_no_such_overload)
    )
    overloads.append(cel.Overload("k8s_plain_semver", T.DYN, [S], is_member=False))
    return cel.FunctionDecl(celcheck.PLAIN, overloads)


# ---------------------------------------------------------------- declarations


def _fn(
    name: str,
    *overloads: tuple[str, cel.Type, list[cel.Type], bool, Callable[..., Any]],
) -> cel.FunctionDecl:
    return cel.FunctionDecl(
        name,
        [
            cel.Overload(oid, ret, params, is_member=member, impl=impl)
            for oid, ret, params, member, impl in overloads
        ],
    )


def _compare(a: Any, b: Any) -> int:
    if isinstance(a, celtypes.QuantityMessage):
        return _cmp_q(a, b)
    return _cmp_s(a, b)


def _comparison(name: str, ret: cel.Type, result: Callable[[int], Any]) -> cel.FunctionDecl:
    """Quantity and Semver overloads of one comparison.

    The C++ runtime registers functions by argument *kind*, and every message is
    the same kind, so only the first overload carries an implementation, which
    dispatches on the message type; the type checker still sees both.
    """
    return cel.FunctionDecl(
        name,
        [
            cel.Overload(
                f"quantity_{name}",
                ret,
                [Q, Q],
                is_member=True,
                impl=lambda a, b: result(_compare(a, b)),
            ),
            cel.Overload(f"semver_{name}", ret, [S, S], is_member=True),
        ],
    )


def functions(typed_lists: bool = False, lists_extension: bool = True) -> list[cel.FunctionDecl]:
    """Every function declaration of the DRA environment beyond the runtime's own;
    ``typed_lists``: without the lists extension's element-typed functions, which the
    checking environment declares from listslib.typed_config(); ``lists_extension``
    False: without the lists extension at all (env.py says when)."""
    lists = listslib.functions(typed=typed_lists, extension=lists_extension)
    return _kubernetes() + _representation() + netlib.functions() + lists + formatlib.functions()


def _kubernetes() -> list[cel.FunctionDecl]:
    b, i, d, s = T.BOOL, T.INT, T.DOUBLE, T.STRING
    return [
        _fn("quantity", ("string_to_quantity", Q, [s], False, _quantity)),
        _fn("isQuantity", ("is_quantity_string", b, [s], False, _is_quantity)),
        _fn("sign", ("quantity_sign", i, [Q], False, lambda q: _q(q).sign())),
        _fn(
            "isInteger",
            ("quantity_is_integer", b, [Q], True, lambda q: _q(q).as_int64() is not None),
        ),
        _fn("asInteger", ("quantity_get_int", i, [Q], True, _as_integer)),
        _fn(
            "asApproximateFloat",
            ("quantity_get_float", d, [Q], True, lambda q: _q(q).as_approximate_float()),
        ),
        _fn(
            "add",
            ("quantity_add", Q, [Q, Q], True, _add_q),
            ("quantity_add_int", Q, [Q, i], True, _add_int),
        ),
        _fn(
            "sub",
            ("quantity_sub", Q, [Q, Q], True, _sub_q),
            ("quantity_sub_int", Q, [Q, i], True, _sub_int),
        ),
        _comparison("compareTo", i, lambda c: c),
        _comparison("isGreaterThan", b, lambda c: c == 1),
        _comparison("isLessThan", b, lambda c: c == -1),
        _fn(
            "semver",
            ("string_to_semver", S, [s], False, _semver),
            ("string_bool_to_semver", S, [s, b], False, _semver_normalize),
        ),
        _fn(
            "isSemver",
            ("is_semver_string", b, [s], False, _is_semver),
            ("is_semver_string_bool", b, [s, b], False, _is_semver),
        ),
        _fn("major", ("semver_major", i, [S], True, lambda v: int(v.major))),
        _fn("minor", ("semver_minor", i, [S], True, lambda v: int(v.minor))),
        _fn("patch", ("semver_patch", i, [S], True, lambda v: int(v.patch))),
        _fn("isSorted", ("list_is_sorted", b, [LIST], True, _is_sorted)),
        _fn("sum", ("list_sum", T.DYN, [LIST], True, _sum)),
        _fn("min", ("list_min", T.DYN, [LIST], True, _min)),
        _fn("max", ("list_max", T.DYN, [LIST], True, _max)),
        _fn("find", ("string_find", s, [s, s], True, _find)),
        _fn(celcheck.MATCHES, ("k8s_matches_string", b, [s, s], False, _matches)),
        _fn(celcheck.FORMAT, ("k8s_format_string", s, [s, LIST], False, _format)),
        _fn(
            "findAll",
            ("string_find_all", T.List(s), [s, s], True, _find_all),
            ("string_find_all_n", T.List(s), [s, s, i], True, _find_all),
        ),
        _plain_decl(),
        equality.declaration(),
        _fn("sets.contains", ("sets_contains", b, [LIST, LIST], False, _sets_contains)),
        _fn("sets.equivalent", ("sets_equivalent", b, [LIST, LIST], False, _sets_equivalent)),
        _fn("sets.intersects", ("sets_intersects", b, [LIST, LIST], False, _sets_intersects)),
    ]
