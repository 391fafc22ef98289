"""The DRA CEL environment: compile a selector once, evaluate it against devices.

Mirrors k8s.io/dynamic-resource-allocation/cel (release 1.35):

* one variable ``device`` with ``driver``, ``attributes[domain][name]`` and
  ``capacity[domain][name]`` (a Quantity), plus ``allowMultipleAllocations``
  when DRAConsumableCapacity is on; an attribute name without a domain belongs
  to the driver's domain; ``version`` attributes are Semver values;
* looking up an unknown domain yields an empty map (Kubernetes wraps the maps
  so that a miss returns ``{}``); we get the same by compiling
  ``device.attributes[k]`` as ``device.attributes[?k].orValue(dyn({}))``;
* an unknown attribute is a runtime error ``no such key: <name>``;
* the expression must have type bool (or dyn, checked at run time);
* the cost limit is enforced by a static worst-case estimate (celcost);
* with DRAListTypeAttributes (``list_attributes``, Kubernetes 1.36+) a list
  attribute (``ints``, ``bools``, ``strings``, ``versions``) is a CEL list
  (versions as Semver values), attribute values are typed ``dyn`` (so a
  selector may return one as it is) and ``includes`` tests membership
  (dynamic-resource-allocation/cel compile.go, ``library.IncludesOption``);
* a derived attribute (1.37, DRADerivedAttributes) is an expression of the
  same environment that must give a scalar (bool, int, string, semver) or a
  list of them; :meth:`CelEnvironment.derive` turns its value into a
  DeviceAttribute as ``valToDeviceAttribute`` does.

Why cel-expr-python (the CEL C++ runtime) and not celpy: measured on this
machine with the selector ``device.attributes["gpu.nvidia.com"].productName ==
"NVIDIA H100 80GB HBM3" && device.capacity["gpu.nvidia.com"].memory
.compareTo(quantity("40Gi")) >= 0``, cel-expr-python evaluates in 13-30 us
(Quantity as a typed message, comparison in Python), celpy (pure Python) in
about 650 us, 20-50x slower; allocation evaluates selectors on thousands of
devices, so that factor is the allocator's throughput.

Compiled programs are cached by expression. Evaluation takes a prepared
activation per device (see :meth:`CelEnvironment.activation`), since a device
is matched against many selectors.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_optional, ext_strings

from services.allocator.cel import check as celcheck
from services.allocator.cel import cost as celcost
from services.allocator.cel import equality, listslib
from services.allocator.cel import lib as cellib
from services.allocator.cel import literals as celliterals
from services.allocator.cel import macros as celmacros
from services.allocator.cel import types as celtypes
from services.allocator.cel.parse import Node, ParseError, device_path, parse
from services.allocator.cel.semver import Semver
from services.core.kube.quantity import Quantity
from services.core.kube.resource import Device, DeviceAttribute

DEVICE_FIELDS = ("driver", "attributes", "capacity")
MULTI_ALLOC_FIELD = "allowMultipleAllocations"

#: k8s.io/apiserver/pkg/cel/environment/base.go: the Kubernetes minor that brought
#: cel-go's lists extension (``ext.Lists(ext.ListsVersion(3))``: ``slice``, ``flatten``,
#: ``sort``, ``reverse``, ``distinct``, ``lists.range``) into the base environment.
LISTS_EXTENSION_SINCE = 34


def lists_extension(new_expressions: int | None) -> bool:
    """Whether an environment declares the lists extension. ``new_expressions``: the
    minor of the kube-apiserver whose NewExpressions environment (what validation
    compiles a new object's selectors in) it is; that environment offers only what
    came by its compatibility version, one minor back (DefaultCompatibilityVersion,
    the binary's MinCompatibilityVersion), so kube-apiserver 1.34 (compatibility 1.33)
    refuses ``sort()`` that 1.35 accepts. None: the StoredExpressions environment,
    every library (what kube-scheduler evaluates stored selectors in)."""
    return new_expressions is None or new_expressions - 1 >= LISTS_EXTENSION_SINCE


class CelError(Exception):
    """A selector that cannot be compiled (``kind="compile"``) or failed on a device."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class Reference:
    """``device.attributes["domain"].name`` (or ``capacity``) as written in a selector."""

    map_name: str  # "attributes" or "capacity"
    domain: str | None  # None when the key is not a literal
    name: str | None


Fact = tuple[str, ...]  # ("driver",), ("allowMultipleAllocations",), (map, domain, name)


@dataclass(slots=True)
class Selector:
    """A compiled selector; ``error`` is set instead of a program when it does not compile."""

    expression: str
    program: Any = None
    error: str | None = None
    cost: int | None = None
    references: list[Reference] = field(default_factory=list)
    # The device facts the result depends on, when that is all it depends on
    # (see :func:`signature`); None: evaluate on every device.
    facts: tuple[Fact, ...] | None = None


@dataclass(frozen=True, slots=True)
class DeviceInput:
    """What a selector sees of one device (cel.Device upstream)."""

    driver: str
    device: Device


def _status_text(text: str) -> str:
    """Strip the absl status code cel-expr-python puts around messages."""
    text = re.sub(r"^[A-Z_]+: ", "", text.strip())
    return re.sub(r" \[[A-Z_]+\]$", "", text)


def runtime_message(text: str) -> str:
    """A cel-cpp runtime error in the words cel-go (and so kube-scheduler) uses."""
    text = _status_text(text)
    missing = re.fullmatch(r'Key not found in map : "?(.*?)"?', text)
    if missing:
        return f"no such key: {missing.group(1)}"
    if text.startswith("No matching overloads found"):
        return "no such overload" + text.removeprefix("No matching overloads found").replace(
            " : ", ": ", 1
        )
    if text == "divide by zero":
        return "division by zero"
    return text


_CONVERSIONS = frozenset(("int", "uint", "double", "string", "bytes", "bool"))
_UNKNOWN_TYPE_NAMES = ("google.protobuf.Any", "ERROR", "error")


def _type_name(t: Any) -> str:
    """A type as cel-go prints it: ``list(string)``, ``optional_type(kubernetes.URL)``."""
    name = re.sub(r"[A-Za-z_][\w.]*", _type_word, str(t.name()))
    name = name.replace("<", "(").replace(">", ")").replace(",", ", ").replace(",  ", ", ")
    return {"list": "list(dyn)", "map": "map(dyn, dyn)"}.get(name, name)


def _type_word(match: re.Match[str]) -> str:
    """Builtin type names in lower case; message names (with a dot) as they are."""
    word = match.group()
    return word if "." in word else word.lower()


class CelEnvironment:
    """One compiler per feature set, with a cache of compiled selectors."""

    def __init__(
        self,
        consumable_capacity: bool = False,
        cost_limit: int = celcost.COST_LIMIT,
        list_attributes: bool = False,
        new_expressions: int | None = None,
    ):
        """``new_expressions``: the NewExpressions environment of that kube-apiserver
        minor (see :func:`lists_extension`); None: the StoredExpressions one."""
        self.consumable_capacity = consumable_capacity
        self.list_attributes = list_attributes
        self.cost_limit = cost_limit
        self.fields = DEVICE_FIELDS + ((MULTI_ALLOC_FIELD,) if consumable_capacity else ())
        lists = lists_extension(new_expressions)
        self._env = _new_env(
            {}, extra=[_includes(by_kind=True)] if list_attributes else [], lists=lists
        )
        self._typed = _new_env(
            _typed_variables(consumable_capacity, list_attributes),
            checking=True,
            extra=[_includes(by_kind=False)] if list_attributes else [],
            lists=lists,
        )
        self._cache: dict[str, Selector] = {}
        self._derived: dict[str, Selector] = {}

    # ------------------------------------------------------------ compile

    def compile(self, expression: str) -> Selector:
        cached = self._cache.get(expression)
        if cached is None:
            cached = self._compile(expression)
            self._cache[expression] = cached
        return cached

    def compile_derived(self, expression: str) -> Selector:
        """A derived attribute's expression, compiled as the scheduler compiles it
        (stored expressions: a list result is allowed whatever the gates)."""
        cached = self._derived.get(expression)
        if cached is None:
            cached = self._compile(expression, derived=True)
            self._derived[expression] = cached
        return cached

    def _compile(self, expression: str, derived: bool = False) -> Selector:
        selector = Selector(expression)
        typed_source = expression
        try:
            checked = self._env.compile(expression)
        except RuntimeError as exc:
            rewritten = celmacros.rewrite(expression)
            try:
                checked = self._env.compile(rewritten) if rewritten else None
            except RuntimeError:
                checked = None
            if checked is None or rewritten is None:
                selector.error = "compilation failed: " + _status_text(str(exc))
                return selector
            typed_source = celmacros.rewrite(expression, for_check=True) or rewritten
            expression = rewritten
        try:
            tree = parse(expression)
        except ParseError:
            selector.program = checked  # the runtime understood it; skip the extras
            return selector
        problem = self._check_fields(tree) or self._check_types(
            expression, tree, checked, typed_source, derived
        )
        if problem:
            selector.error = problem
            return selector
        selector.cost = celcost.estimate(tree)
        if selector.cost > self.cost_limit:
            selector.error = (
                f"too complex, exceeds cost limit (estimated cost {selector.cost}, "
                f"limit {self.cost_limit})"
            )
            return selector
        selector.references = _references(tree)
        selector.facts = signature(tree)
        selector.program = self._program(expression, tree, checked)
        return selector

    def _check_types(
        self, expression: str, tree: Node, checked: Any, typed_source: str, derived: bool = False
    ) -> str | None:
        """Kubernetes' static checks: typed ``device`` fields, the result type and
        homogeneous literals (see :mod:`services.allocator.cel.check`).
        ``typed_source`` is the text to type-check (macros.py's checking form)."""
        mixed = celcheck.heterogeneous_literal(expression, tree)
        if mixed:
            return "compilation failed: " + mixed
        problem = celliterals.literal_problem(expression, tree) or self._folded(expression, tree)
        if problem:
            return problem
        if typed_source != expression:
            try:
                tree = parse(typed_source)
            except ParseError:
                typed_source, tree = expression, tree
        typed = celcheck.typed_rewrite(typed_source, tree)
        if typed != expression or _typed_lists(tree):
            try:
                checked = self._typed.compile(typed)
            except RuntimeError as exc:
                return "compilation failed: " + _kubernetes_names(_status_text(str(exc)))
        out = checked.return_type()
        if derived:
            return _derived_type_problem(out)
        # An attribute value has Kubernetes' "unknown type" (google.protobuf.Any,
        # which cel-cpp reports as an error type): a selector may return one as
        # it is, and it is checked at run time; dyn is refused, as in cel-go,
        # unless attributes are typed dyn (DRAListTypeAttributes).
        if out == cel.Type.BOOL or str(out.name()) in _UNKNOWN_TYPE_NAMES:
            return None
        if self.list_attributes and out == cel.Type.DYN:
            return None
        return f"must evaluate to bool or the unknown type, not {_type_name(out)}"

    def _folded(self, expression: str, tree: Node) -> str | None:
        """cel-go folds a type conversion of a constant when it plans the program; one
        that fails (``uint(dyn(b'x'))``) fails the program, which the API server refuses."""
        for node in tree.walk():
            if node.kind != "call" or node.target or node.name not in _CONVERSIONS:
                continue
            if any(n.kind == "ident" or n.target for n in node.walk()):
                continue
            try:
                result = self._env.compile(expression[node.start : node.end]).eval()
            except RuntimeError:
                continue
            if result.type() == cel.Type.ERROR:
                message = runtime_message(str(result.value()))
                return celliterals.INSTANTIATION + message
        return None

    def _program(self, expression: str, tree: Node, checked: Any) -> Any:
        """The program to run: unknown domains read as ``{}``, and cel-go's equality
        for Semver and Quantity operands (kept out if the rewrite does not compile)."""
        domains = _default_domain_edits(expression, tree) + celcheck.runtime_edits(expression, tree)
        for edits in (domains + celcheck.equality_edits(expression, tree), domains):
            if not edits:
                return checked
            try:
                return self._env.compile(celcheck.apply_edits(expression, edits))
            except RuntimeError:
                continue
        return checked

    def _check_fields(self, tree: Node) -> str | None:
        for node in tree.walk():
            if node.kind == "select" and node.args[0].kind == "ident":
                if node.args[0].name == "device" and node.name not in self.fields:
                    return (
                        f"compilation failed: ERROR: <input>:1:{node.start + 1}: "
                        f"undefined field '{node.name}'"
                    )
        return None

    # ------------------------------------------------------------ evaluate

    def activation(self, device: DeviceInput) -> Any:
        """The ``device`` variable for one device; raises :class:`CelError` on a bad attribute."""
        attributes: dict[str, dict[str, Any]] = {}
        for name, attr in (device.device.attributes or {}).items():
            domain, ident = split_name(name, device.driver)
            if attr.version is not None or attr.versions is not None:
                try:
                    if attr.versions is not None:
                        value: Any = [
                            celtypes.semver_message(Semver.parse(v)) for v in attr.versions
                        ]
                    else:
                        value = celtypes.semver_message(Semver.parse(attr.version or ""))
                except ValueError as exc:
                    raise CelError(
                        "runtime", f"attribute {name}: parse semantic version: {exc}"
                    ) from exc
            else:
                try:
                    value = attr.value()
                except ValueError as exc:
                    raise CelError(
                        "runtime", f"attribute {name}: unsupported attribute value"
                    ) from exc
            attributes.setdefault(domain, {})[ident] = value
        capacity: dict[str, dict[str, Any]] = {}
        for name, cap in (device.device.capacity or {}).items():
            domain, ident = split_name(name, device.driver)
            capacity.setdefault(domain, {})[ident] = celtypes.quantity_message(
                Quantity.parse(cap.value)
            )
        data: dict[str, Any] = {
            "driver": device.driver,
            "attributes": attributes,
            "capacity": capacity,
        }
        if self.consumable_capacity:
            data[MULTI_ALLOC_FIELD] = bool(device.device.allow_multiple_allocations)
        return self._env.Activation({"device": data})

    def derive(self, selector: Selector, activation: Any) -> DeviceAttribute:
        """Evaluate a compiled derived attribute (valToDeviceAttribute); raises
        :class:`CelError` (kind ``runtime`` for evaluation and conversion)."""
        if selector.program is None:
            raise CelError("compile", selector.error or "not compiled")
        try:
            result = selector.program.eval(activation)
        except RuntimeError as exc:
            raise CelError("runtime", _status_text(str(exc))) from exc
        if result.type() == cel.Type.ERROR:
            raise CelError("runtime", runtime_message(str(result.value())))
        return _device_attribute(_plain(result.value()))

    def matches(self, selector: Selector, activation: Any) -> bool:
        """Evaluate a compiled selector; raises :class:`CelError` (kind ``runtime``)."""
        if selector.program is None:
            raise CelError("compile", selector.error or "not compiled")
        try:
            result = selector.program.eval(activation)
        except RuntimeError as exc:  # cel-cpp's own limits, e.g. its comprehension budget
            raise CelError("runtime", _status_text(str(exc))) from exc
        kind = result.type()
        if kind == cel.Type.BOOL:
            return bool(result.value())
        if kind == cel.Type.ERROR:
            raise CelError("runtime", runtime_message(str(result.value())))
        name = _type_name(kind)
        raise CelError(
            "runtime",
            f"CEL result of type {name} could not be converted to bool: "
            f"type conversion error from '{name}' to 'bool'",
        )


def _typed_lists(tree: Node) -> bool:
    """Whether the expression calls a lists function typed only in the checking env."""
    return any(n.kind == "call" and n.name in listslib.TYPED for n in tree.walk())


def split_name(name: str, driver: str) -> tuple[str, str]:
    """A qualified attribute name as (domain, id); a bare name is in the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


def _is_device_map(node: Node) -> bool:
    return device_path(node) in (["attributes"], ["capacity"])


def _default_domain_edits(expression: str, tree: Node) -> list[celcheck.Edit]:
    """Rewrite ``device.attributes[k]`` as ``device.attributes[?k].orValue(dyn({}))``."""
    edits: list[celcheck.Edit] = []
    for node in tree.walk():
        if node.kind == "index" and not node.optional and _is_device_map(node.args[0]):
            bracket = expression.index("[", node.args[0].end)
            edits += [(bracket + 1, bracket + 1, "?"), (node.end, node.end, ".orValue(dyn({}))")]
    return edits


def _new_env(
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


_ANY = cel.Type("google.protobuf.Any")  # Kubernetes' AnyType for attribute values


def _typed_variables(consumable_capacity: bool, list_attributes: bool = False) -> dict[str, Any]:
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


def _kubernetes_names(text: str) -> str:
    """Our message types by the names Kubernetes gives them, in cel-go's words."""
    text = text.replace(celtypes.QUANTITY_TYPE, "kubernetes.Quantity")
    text = text.replace(celtypes.SEMVER_TYPE, "kubernetes.Semver")
    return text.replace("cannot be the range of", "cannot be range of")


def signature(tree: Node) -> tuple[Fact, ...] | None:
    """The facts of a device an expression reads, if it reads nothing else of it.

    True when every use of ``device`` is ``device.driver``,
    ``device.allowMultipleAllocations``, or a lookup with literal keys
    ``device.attributes["domain"].name`` / ``["domain"]["name"]`` (the same for
    ``capacity``, optional forms included). Then two devices with equal facts
    get the same result (or the same error), so a result can be shared. Any
    other use (a whole map, a computed key, a variable named ``device``) gives
    None.
    """
    facts: list[Fact] = []

    def visit(node: Node) -> bool:
        fact = _fact(node)
        if fact is not None:
            if fact not in facts:
                facts.append(fact)
            return True
        if node.kind == "ident" and node.name == "device":
            return False
        return all(visit(arg) for arg in node.args)

    return tuple(facts) if visit(tree) else None


def _fact(node: Node) -> Fact | None:
    if node.kind == "select" and node.args[0].kind == "ident" and node.args[0].name == "device":
        return (node.name,) if node.name in ("driver", MULTI_ALLOC_FIELD) else None
    if node.kind == "select":
        base, name = node.args[0], node.name
    elif node.kind == "index" and _string_literal(node.args[1]):
        base, name = node.args[0], str(node.args[1].value)
    else:
        return None
    if base.kind != "index" or not _is_device_map(base.args[0]):
        return None
    key = base.args[1]
    if not _string_literal(key):
        return None
    path = device_path(base.args[0]) or [""]
    return (path[0], str(key.value), name)


def _string_literal(node: Node) -> bool:
    return node.kind == "lit" and isinstance(node.value, str)


def device_facts(device: DeviceInput) -> dict[Fact, object] | None:
    """What :func:`signature` facts read, per device; None when building the device's
    activation would fail (then every selector fails on it, as in Kubernetes)."""
    facts: dict[Fact, object] = {("driver",): device.driver}
    facts[(MULTI_ALLOC_FIELD,)] = bool(device.device.allow_multiple_allocations)
    for name, attr in (device.device.attributes or {}).items():
        domain, ident = split_name(name, device.driver)
        if attr.version is not None:
            if not _semver_ok(attr.version):
                return None
            value: object = ("version", attr.version)
        elif attr.int_ is not None:
            value = ("int", attr.int_)
        elif attr.bool_ is not None:
            value = ("bool", attr.bool_)
        elif attr.string is not None:
            value = ("string", attr.string)
        elif attr.versions is not None:
            if not all(_semver_ok(v) for v in attr.versions):
                return None
            value = ("versions", tuple(attr.versions))
        else:
            lists = (("ints", attr.ints), ("bools", attr.bools), ("strings", attr.strings))
            found = next(((kind, tuple(v)) for kind, v in lists if v is not None), None)
            if found is None:
                return None
            value = found
        facts[("attributes", domain, ident)] = value
    for name, cap in (device.device.capacity or {}).items():
        if not _quantity_ok(cap.value):
            return None
        domain, ident = split_name(name, device.driver)
        facts[("capacity", domain, ident)] = cap.value
    return facts


@lru_cache(maxsize=1024)
def _quantity_ok(text: str) -> bool:
    try:
        Quantity.parse(text)
    except ValueError:
        return False
    return True


@lru_cache(maxsize=1024)
def _semver_ok(text: str) -> bool:
    try:
        Semver.parse(text)
    except ValueError:
        return False
    return True


def _references(tree: Node) -> list[Reference]:
    """Every attribute/capacity lookup spelled out in the expression."""
    refs: list[Reference] = []
    for node in tree.walk():
        base: Node | None = None
        name: str | None = None
        if node.kind == "select":
            base, name = node.args[0], node.name
        elif node.kind == "index" and node.args[1].kind == "lit":
            base, name = node.args[0], str(node.args[1].value)
        if base is None or base.kind != "index" or not _is_device_map(base.args[0]):
            continue
        key = base.args[1]
        domain = str(key.value) if key.kind == "lit" else None
        path = device_path(base.args[0]) or [""]
        refs.append(Reference(path[0], domain, name))
    return refs


# ------------------------------------------------------------------ list attributes


def _includes_impl(target: Any, arg: Any) -> bool:
    """library.includes: membership in a list (CEL equality), equality for anything else."""
    if isinstance(target, list | tuple):
        return any(equality.same(item, arg) for item in target)
    return equality.same(target, arg)


def _includes(by_kind: bool) -> Any:
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


# ------------------------------------------------------------------ derived attributes

_DERIVED_SCALARS = ("bool", "int", "string", "dyn", "error", "google.protobuf.Any")


def _derived_type_problem(out: Any) -> str | None:
    """validateOutputType for a derived attribute (stored expressions: lists allowed)."""
    name = _type_name(out)
    inner = name[5:-1] if name.startswith("list(") and name.endswith(")") else None
    for candidate in (name, inner):
        if candidate in _DERIVED_SCALARS or candidate == celtypes.SEMVER_TYPE:
            return None
    shown = _kubernetes_names(name)
    return (
        "must evaluate to a primitive scalar (string, integer, boolean, semver) or a list of "
        f"these scalars, not {shown}"
    )


def _plain(value: Any) -> Any:
    """A cel-expr-python result as plain Python (lists element by element)."""
    if isinstance(value, list | tuple):
        return [_plain(getattr(v, "value", lambda v=v: v)()) for v in value]
    return value


_GO_TYPES = {bool: "bool", int: "int64", str: "string", float: "float64", bytes: "[]uint8"}


def _go_type(value: Any) -> str:
    if isinstance(value, celtypes.SemverMessage):
        return "semver.Version"
    return _GO_TYPES.get(type(value), type(value).__name__)


def _device_attribute(value: Any) -> DeviceAttribute:
    """valToDeviceAttribute: a scalar or a list of one scalar type; an empty list is
    an empty string list."""
    if isinstance(value, bool):
        return DeviceAttribute(bool_=value)
    if isinstance(value, int):
        return DeviceAttribute(int_=value)
    if isinstance(value, str):
        return DeviceAttribute(string=value)
    if isinstance(value, celtypes.SemverMessage):
        return DeviceAttribute(version=str(celtypes.semver_of(value)))
    if isinstance(value, list):
        if not value:
            return DeviceAttribute(strings=[])
        first = value[0]
        kinds: tuple[tuple[type, str, str], ...] = (
            (bool, "bools", "bool"),
            (int, "ints", "int"),
            (str, "strings", "string"),
        )
        for kind, field_name, word in kinds:
            if type(first) is kind:
                for i, item in enumerate(value):
                    if type(item) is not kind:
                        raise CelError(
                            "runtime",
                            f"expected list element at index {i} to be {word}, "
                            f"got {_go_type(item)}",
                        )
                attribute = DeviceAttribute()
                setattr(attribute, field_name, list(value))
                return attribute
        if isinstance(first, celtypes.SemverMessage):
            versions = []
            for i, item in enumerate(value):
                if not isinstance(item, celtypes.SemverMessage):
                    raise CelError(
                        "runtime",
                        f"expected list element at index {i} to be semver, got {_go_type(item)}",
                    )
                versions.append(str(celtypes.semver_of(item)))
            return DeviceAttribute(versions=versions)
        raise CelError("runtime", f"unsupported list element type: {_go_type(first)}")
    raise CelError("runtime", f"unsupported CEL return type: {_go_type(value)}")
