"""What a DRA CEL environment declares: the ``device`` variable, its typed fields for
checking, the functions and extensions, and ``includes`` for list attributes.

Two environments are built from these (:class:`.env.CelEnvironment`): the runtime
one, where ``device`` is a map of dyn, and one that only type-checks, where each
``device.<field>`` is a variable typed as Kubernetes types it.
"""

from __future__ import annotations

from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from services.allocator.cel import equality, listslib
from services.allocator.cel import lib as cellib
from services.allocator.cel import types as celtypes

#: k8s.io/apiserver/pkg/cel/environment/base.go: the Kubernetes minor that brought
#: cel-go's lists extension (``ext.Lists(ext.ListsVersion(3))``: ``slice``, ``flatten``,
#: ``sort``, ``reverse``, ``distinct``, ``lists.range``) into the base environment.
LISTS_EXTENSION_SINCE = 34

_ANY = cel.Type("google.protobuf.Any")  # Kubernetes' AnyType for attribute values


def lists_extension(new_expressions: int | None) -> bool:
    """Whether an environment declares the lists extension. ``new_expressions``: the
    minor of the kube-apiserver whose NewExpressions environment (what validation
    compiles a new object's selectors in) it is; that environment offers only what
    came by its compatibility version, one minor back (DefaultCompatibilityVersion,
    the binary's MinCompatibilityVersion), so kube-apiserver 1.34 (compatibility 1.33)
    refuses ``sort()`` that 1.35 accepts. None: the StoredExpressions environment,
    every library (what kube-scheduler evaluates stored selectors in)."""
    return new_expressions is None or new_expressions - 1 >= LISTS_EXTENSION_SINCE


def new_env(
    typed: dict[str, Any],
    checking: bool = False,
    extra: list[Any] | None = None,
    lists: bool = True,
) -> Any:
    """The runtime environment, or (``checking``) the one that only type-checks:
    typed ``device`` fields and the lists extension typed by element (``lists``:
    whether the lists extension is there at all)."""
    return cel.NewEnv(
        celtypes.POOL,
        config=listslib.typed_config(lists) if checking else None,
        variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN), **typed},
        extensions=[
            ext_strings.ExtStrings(2),
            ext_bindings.ExtBindings(),
            ext_optional.ExtOptional(),
        ],
        functions=cellib.functions(typed_lists=checking, lists_extension=lists) + (extra or []),
    )


def typed_variables(consumable_capacity: bool, list_attributes: bool = False) -> dict[str, Any]:
    """``device.<field>`` as Kubernetes types it, one variable per field (check.py):
    an attribute value is the unknown type, or ``dyn`` with list attributes."""
    string = cel.Type.STRING
    value = cel.Type.DYN if list_attributes else _ANY
    variables = {
        "device_driver": string,
        "device_attributes": cel.Type.Map(string, cel.Type.Map(string, value)),
        "device_capacity": cel.Type.Map(string, cel.Type.Map(string, cellib.Q)),
    }
    if consumable_capacity:
        variables["device_allowMultipleAllocations"] = cel.Type.BOOL
    return variables


def _includes_impl(target: Any, arg: Any) -> bool:
    """library.includes: membership in a list (CEL equality), equality for anything else."""
    if isinstance(target, list | tuple):
        return any(equality.same(item, arg) for item in target)
    return equality.same(target, arg)


def includes(by_kind: bool) -> Any:
    """``<dyn>.includes(<dyn>)``: one dyn overload to type-check; at run time one per
    pair of runtime kinds (cel-cpp dispatches on kinds, a dyn parameter matches none)."""
    if not by_kind:
        dyn = cel.Type.DYN
        overloads = [cel.Overload("list_includes_dyn_dyn", cel.Type.BOOL, [dyn, dyn], True)]
    else:
        kinds = equality.kinds()
        overloads = [
            cel.Overload(
                f"list_includes_{a}_{b}", cel.Type.BOOL, [ta, tb], True, impl=_includes_impl
            )
            for a, ta in kinds.items()
            for b, tb in kinds.items()
        ]
    return cel.FunctionDecl("includes", overloads)
