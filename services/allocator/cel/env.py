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
is matched against many selectors. What a compiled selector holds and reads of a
device is :mod:`.selector`; what the environments declare, :mod:`.declarations`;
cel-go's wording of errors and types, :mod:`.messages`; derived attributes'
types and values, :mod:`.derived`.
"""

from __future__ import annotations

from typing import Any

from cel_expr_python import cel

from services.allocator.cel import check as celcheck
from services.allocator.cel import cost as celcost
from services.allocator.cel import listslib
from services.allocator.cel import literals as celliterals
from services.allocator.cel import macros as celmacros
from services.allocator.cel import types as celtypes
from services.allocator.cel.declarations import includes, lists_extension, new_env, typed_variables
from services.allocator.cel.derived import device_attribute, output_problem, plain
from services.allocator.cel.messages import (
    kubernetes_names,
    runtime_message,
    status_text,
    type_name,
)
from services.allocator.cel.parse import Node, ParseError, parse
from services.allocator.cel.selector import (
    MULTI_ALLOC_FIELD,
    CelError,
    DeviceInput,
    Selector,
    is_device_map,
    references,
    signature,
    split_name,
)
from services.allocator.cel.semver import Semver
from services.core.kube.quantity import Quantity
from services.core.kube.resource import DeviceAttribute

DEVICE_FIELDS = ("driver", "attributes", "capacity")

_CONVERSIONS = frozenset(("int", "uint", "double", "string", "bytes", "bool"))
_UNKNOWN_TYPE_NAMES = ("google.protobuf.Any", "ERROR", "error")


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
        self._env = new_env(
            {}, extra=[includes(by_kind=True)] if list_attributes else [], lists=lists
        )
        self._typed = new_env(
            typed_variables(consumable_capacity, list_attributes),
            checking=True,
            extra=[includes(by_kind=False)] if list_attributes else [],
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
                selector.error = "compilation failed: " + status_text(str(exc))
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
        selector.references = references(tree)
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
                return "compilation failed: " + kubernetes_names(status_text(str(exc)))
        out = checked.return_type()
        if derived:
            return output_problem(out)
        # An attribute value has Kubernetes' "unknown type" (google.protobuf.Any,
        # which cel-cpp reports as an error type): a selector may return one as
        # it is, and it is checked at run time; dyn is refused, as in cel-go,
        # unless attributes are typed dyn (DRAListTypeAttributes).
        if out == cel.Type.BOOL or str(out.name()) in _UNKNOWN_TYPE_NAMES:
            return None
        if self.list_attributes and out == cel.Type.DYN:
            return None
        return f"must evaluate to bool or the unknown type, not {type_name(out)}"

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
            raise CelError("runtime", status_text(str(exc))) from exc
        if result.type() == cel.Type.ERROR:
            raise CelError("runtime", runtime_message(str(result.value())))
        return device_attribute(plain(result.value()))

    def matches(self, selector: Selector, activation: Any) -> bool:
        """Evaluate a compiled selector; raises :class:`CelError` (kind ``runtime``)."""
        if selector.program is None:
            raise CelError("compile", selector.error or "not compiled")
        try:
            result = selector.program.eval(activation)
        except RuntimeError as exc:  # cel-cpp's own limits, e.g. its comprehension budget
            raise CelError("runtime", status_text(str(exc))) from exc
        kind = result.type()
        if kind == cel.Type.BOOL:
            return bool(result.value())
        if kind == cel.Type.ERROR:
            raise CelError("runtime", runtime_message(str(result.value())))
        name = type_name(kind)
        raise CelError(
            "runtime",
            f"CEL result of type {name} could not be converted to bool: "
            f"type conversion error from '{name}' to 'bool'",
        )


def _typed_lists(tree: Node) -> bool:
    """Whether the expression calls a lists function typed only in the checking env."""
    return any(n.kind == "call" and n.name in listslib.TYPED for n in tree.walk())


def _default_domain_edits(expression: str, tree: Node) -> list[celcheck.Edit]:
    """Rewrite ``device.attributes[k]`` as ``device.attributes[?k].orValue(dyn({}))``."""
    edits: list[celcheck.Edit] = []
    for node in tree.walk():
        if node.kind == "index" and not node.optional and is_device_map(node.args[0]):
            bracket = expression.index("[", node.args[0].end)
            edits += [(bracket + 1, bracket + 1, "?"), (node.end, node.end, ".orValue(dyn({}))")]
    return edits
