"""Seeded scenarios for the differential test, and an independent check of allocations.

A scenario is a small cluster of its own, for one Kubernetes minor and one set
of its gates: 1-3 nodes whose ResourceSlices our publisher's renderer produced
(``gpudra slices``, every fleet profile, with and without DynamicMIG or VFIO),
sometimes with device taints, DeviceTaintRules and binding conditions;
DeviceClasses; claims with random CEL selectors over our attributes (strings,
quantities, semvers, ``has``, ``in``, misspelt names), counts, ``All``,
adminAccess, firstAvailable, tolerations, capacity requests,
matchAttribute / distinctAttribute constraints, opaque configs; and claims
that are already allocated. For 1.37 also what its new gates bring, written
whether the gate is on or not (the API server drops what a gate does not
allow, as a user's manifests meet a cluster): list attributes
(``numaNode`` as a list, as the reference driver publishes it, and selectors
with ``includes``/``exists`` on lists), derived attributes and constraints on
them, counter compatibility groups, slices that skip node operations and
Nodes that declare the feature, fractional capacity ranges, and a pool
selected by a ``DoesNotExist`` node selector. Each scenario renames the driver
(``s<N>.gpu.nvidia.com``) and prefixes its node and class names, so many
scenarios share one input file without touching each other's devices.

Every selector (and derived attribute) is generated together with a Python
function that has CEL's semantics (errors included), so :func:`check` can
verify an allocation without our CEL environment or our engine: devices exist
on the node, satisfy class and request selectors, counts and All,
constraints (values, or sets of values where the release compares sets;
distinctAttribute pairwise from 1.37, for presence only before, where
upstream enforces it per request), taints (the slice's and the rules'),
skipped node operations, compatibility groups, no device used twice,
counters not exceeded.

tests/e2e/allocator/test_differential_scenarios.py checks the generator and the checker
themselves; tests/e2e/allocator/test_differential_allocator.py runs both allocators.
"""

from __future__ import annotations

import dataclasses
import functools
import io
import json
import math
import random
import re
from collections.abc import Callable, Iterable
from contextlib import redirect_stdout
from dataclasses import dataclass, field
from typing import Any

from services.allocator.structured.features import (
    ALLOCATION_GATES,
    DEVICE_TAINT_RULES,
    Features,
    accepted_sets,
    parse,
)
from services.allocator.structured.variant import Variant
from services.cli import main as gpudra

TEMPLATE_NODE = "tmplnode"


FLEETS = ("dgx-a100", "dgx-h100", "h200x8", "l4x4", "mixed")


# Driver gates of the rendered slices; after ";" a --consumable-shares mode
# (shared devices with capacity request policies, as the publisher renders them).
DRIVER_GATES = (
    "",
    "",
    "DynamicMIG=true",
    "PassthroughSupport=true",
    "ConsumableShares=true;memory",
    "ConsumableShares=true;4",
)


RK = "resource.kubernetes.io"


# Every Kubernetes 1.35 gate that changes structured allocation (the ones
# services/allocator/structured/features.py knows), in all 64 combinations,
# each written out in full; the first is 1.35's defaults.
KUBE_GATES = (
    "DRAAdminAccess",
    "DRAPrioritizedList",
    "DRAPartitionableDevices",
    "DRADeviceTaints",
    "DRAConsumableCapacity",
    "DRADeviceBindingConditions",
)
_DEFAULT_ON = 0b000011  # DRAAdminAccess, DRAPrioritizedList


def _gate_set(bits: int) -> str:
    return ",".join(
        f"{name}={'true' if bits >> i & 1 else 'false'}" for i, name in enumerate(KUBE_GATES)
    )


GATE_SETS = tuple(_gate_set(bits ^ _DEFAULT_ON) for bits in range(2 ** len(KUBE_GATES)))


def gate_sets(minor: int) -> tuple[str, ...]:
    """Every ``--feature-gates`` value 1.<minor> accepts over the gates that change
    allocation (locked gates fixed, dependent gates together; features.accepted_sets).
    Up to 1.36, where DRADeviceTaintRules is off by default, it is varied too, so the
    generated DeviceTaintRules are applied in some batches (1.37 applies them wherever
    DRADeviceTaints is on; a hand-written case turns them off)."""
    if minor >= 37:
        return tuple(accepted_sets(minor))
    sets = accepted_sets(minor, (*ALLOCATION_GATES, DEVICE_TAINT_RULES))
    if minor < 35:
        # 1.34's allocator with DRAConsumableCapacity (alpha there) checks a device's
        # capacity against another device of its slice, panicking past the slice's end,
        # and compares distinctAttribute values by pointer (docs/differences.md); gpudra
        # gives the right outcome, so 1.34's seeded scenarios keep the gate off.
        sets = [s for s in sets if "DRAConsumableCapacity=true" not in s]
    return tuple(sets)


ERR = object()  # a CEL evaluation error


Tri = Any  # True, False or ERR


@dataclass(frozen=True)
class Dev:
    """One device as the checker sees it."""

    driver: str
    pool: str
    node: str
    name: str
    attributes: dict[tuple[str, str], tuple[str, Any]]  # (domain, id) -> (kind, value)
    capacity: dict[tuple[str, str], str]
    taints: tuple[dict[str, Any], ...]
    consumes: tuple[tuple[str, str, int], ...]  # (counter set, counter, value)
    skips_node_operations: bool = False  # its slice has skipNodeOperations
    groups: tuple[tuple[str, frozenset[str]], ...] = ()  # (counter set, compatibility groups)

    @property
    def id(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


def _split(name: str, driver: str) -> tuple[str, str]:
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


_SUFFIX = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "k": 10**3, "M": 10**6, "G": 10**9}


def quantity(text: str) -> int:
    """The integer quantities our renderer writes (``81559Mi``, ``7``)."""
    match = re.fullmatch(r"(\d+)([KMGT]i|[kMG])?", text)
    if match is None:
        raise ValueError(f"unexpected quantity {text!r}")
    return int(match.group(1)) * _SUFFIX.get(match.group(2) or "", 1)


def milli(text: str) -> int:
    """A quantity in milli units, fractions (``0.25``) included."""
    match = re.fullmatch(r"(\d+)(?:\.(\d+))?([KMGT]i|[kMG])?", text)
    if match is None:
        raise ValueError(f"unexpected quantity {text!r}")
    whole, frac, suffix = match.group(1), match.group(2) or "", match.group(3) or ""
    value = (int(whole) * 1000 + int((frac + "000")[:3])) * _SUFFIX.get(suffix, 1)
    return value


def devices_of(slices: Iterable[dict[str, Any]]) -> list[Dev]:
    out = []
    for slice_ in slices:
        spec = slice_["spec"]
        driver = spec["driver"]
        for device in spec.get("devices") or []:
            attributes = {}
            for name, attr in (device.get("attributes") or {}).items():
                ((kind, value),) = attr.items()
                attributes[_split(name, driver)] = (kind, value)
            capacity = {
                _split(name, driver): cap["value"]
                for name, cap in (device.get("capacity") or {}).items()
            }
            consumes = tuple(
                (c["counterSet"], counter, quantity(v["value"]))
                for c in device.get("consumesCounters") or []
                for counter, v in c["counters"].items()
            )
            groups = tuple(
                (c["counterSet"], frozenset(c.get("compatibilityGroups") or ()))
                for c in device.get("consumesCounters") or []
            )
            out.append(
                Dev(
                    driver,
                    spec["pool"]["name"],
                    spec.get("nodeName") or "",
                    device["name"],
                    attributes,
                    capacity,
                    tuple(device.get("taints") or ()),
                    consumes,
                    bool(spec.get("skipNodeOperations")),
                    groups,
                )
            )
    return out


@dataclass(frozen=True)
class Sel:
    """A CEL expression and a Python function with the same meaning (ERR for errors)."""

    cel: str
    fn: Callable[[Dev], Tri]


def _and(a: Tri, b: Tri) -> Tri:
    if a is False or b is False:
        return False
    if a is ERR or b is ERR:
        return ERR
    return True


def _or(a: Tri, b: Tri) -> Tri:
    if a is True or b is True:
        return True
    if a is ERR or b is ERR:
        return ERR
    return False


def _not(a: Tri) -> Tri:
    return a if a is ERR else not a


def _attr(dev: Dev, domain: str, name: str) -> Any:
    found = dev.attributes.get((domain, name))
    return ERR if found is None else found[1]


def _with(value: Any, fn: Callable[[Any], Tri]) -> Tri:
    """``fn(value)``, or the error when looking the value up failed."""
    return value if value is ERR else fn(value)


def _semver(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("-")[0].split("."))


def atoms(
    d: str,
    rng: random.Random,
    facts: dict[str, list[str]],
    lists: bool = False,
    minor: int = 35,
) -> list[Callable[[], Sel]]:
    """Selector makers over driver domain ``d``; ``facts`` lists values seen in the slices;
    ``lists``: list attributes may exist (DRAListTypeAttributes), so selectors test them;
    ``minor``: the release, whose API server must accept them (1.34 has no lists
    extension, so no ``sort()``)."""
    attrs = f'device.attributes["{d}"]'

    def product() -> Sel:
        value = rng.choice([*facts["productName"], "NVIDIA Nonexistent GPU"])
        return Sel(
            f'{attrs}.productName == "{value}"',
            lambda dev: _with(_attr(dev, d, "productName"), lambda v: v == value),
        )

    def product_prefix() -> Sel:
        prefix = rng.choice(["NVIDIA A", "NVIDIA H", "NVIDIA L"])
        return Sel(
            f'{attrs}.productName.startsWith("{prefix}")',
            lambda dev: _with(_attr(dev, d, "productName"), lambda v: v.startswith(prefix)),
        )

    def memory() -> Sel:
        gib = rng.choice([5, 10, 20, 24, 40, 48, 80, 100])
        op = rng.choice([">=", "<"])

        def fn(dev: Dev) -> Tri:
            value = dev.capacity.get((d, "memory"))
            if value is None:
                return ERR
            ge = quantity(value) >= gib * 2**30
            return ge if op == ">=" else not ge

        cel = f'device.capacity["{d}"].memory.compareTo(quantity("{gib}Gi")) {op} 0'
        return Sel(cel, fn)

    def has_memory() -> Sel:
        gib = rng.choice([10, 40, 80])
        cel = (
            f'has(device.capacity["{d}"].memory) && '
            f'device.capacity["{d}"].memory.isGreaterThan(quantity("{gib}Gi"))'
        )

        def fn(dev: Dev) -> Tri:
            value = dev.capacity.get((d, "memory"))
            return value is not None and quantity(value) > gib * 2**30

        return Sel(cel, fn)

    def compute() -> Sel:
        version = rng.choice(["7.5.0", "8.0.0", "8.9.0", "9.0.0"])
        cel = f'{attrs}.cudaComputeCapability.isGreaterThan(semver("{version}"))'

        def fn(dev: Dev) -> Tri:
            value = _attr(dev, d, "cudaComputeCapability")
            return value if value is ERR else _semver(value) > _semver(version)

        return Sel(cel, fn)

    def driver_major() -> Sel:
        major = rng.choice([12, 13])
        cel = f"{attrs}.cudaDriverVersion.major() >= {major}"

        def fn(dev: Dev) -> Tri:
            value = _attr(dev, d, "cudaDriverVersion")
            return value if value is ERR else _semver(value)[0] >= major

        return Sel(cel, fn)

    def profile() -> Sel:
        prefix = rng.choice(["1g", "2g", "3g", "4g", "7g"])
        cel = f'has({attrs}.profile) && {attrs}.profile.startsWith("{prefix}")'

        def fn(dev: Dev) -> Tri:
            value = dev.attributes.get((d, "profile"))
            return value is not None and value[1].startswith(prefix)

        return Sel(cel, fn)

    def profile_in() -> Sel:
        chosen = rng.sample(facts["profile"], min(len(facts["profile"]), rng.randint(1, 3)))
        listed = ", ".join(f'"{p}"' for p in chosen)
        return Sel(
            f"{attrs}.profile in [{listed}]",
            lambda dev: _with(_attr(dev, d, "profile"), lambda v: v in chosen),
        )

    def numa() -> Sel:
        node = rng.choice([0, 1])
        cel = (
            f'has(device.attributes["{RK}"].numaNode) && '
            f'device.attributes["{RK}"].numaNode == {node}'
        )

        def fn(dev: Dev) -> Tri:
            value = dev.attributes.get((RK, "numaNode"))
            return value is not None and value[1] == node

        return Sel(cel, fn)

    def architecture() -> Sel:
        chosen = rng.sample(["Ampere", "Hopper", "Ada Lovelace", "Blackwell"], 2)
        listed = ", ".join(f'"{a}"' for a in chosen)
        return Sel(
            f"{attrs}.architecture in [{listed}]",
            lambda dev: _with(_attr(dev, d, "architecture"), lambda v: v in chosen),
        )

    def brand() -> Sel:
        return Sel(
            f'{attrs}.brand.lowerAscii() == "nvidia"',
            lambda dev: _with(_attr(dev, d, "brand"), lambda v: v.lower() == "nvidia"),
        )

    def misspelt() -> Sel:
        return Sel(f'{attrs}.productname == "x"', lambda dev: ERR)

    def other_domain() -> Sel:  # an unknown domain reads as an empty map
        return Sel(
            'has(device.attributes["example.com"].x) || device.driver != ""',
            lambda dev: dev.driver != "",
        )

    # The Kubernetes CEL environment beyond the basics (issue 16): cel-go's
    # equality for Semver operands, the lists and IP libraries, two-variable
    # comprehensions, quantity and string functions.
    def semver_equals_string() -> Sel:  # a Semver on the left: "no such overload"
        return Sel(f'{attrs}.driverVersion == "570.124.6"', lambda dev: ERR)

    def string_equals_semver() -> Sel:  # a string on the left: false
        return Sel(
            f'"570.124.6" == {attrs}.driverVersion',
            lambda dev: _with(_attr(dev, d, "driverVersion"), lambda v: False),
        )

    def memory_is_integer() -> Sel:
        def fn(dev: Dev) -> Tri:
            return ERR if dev.capacity.get((d, "memory")) is None else True

        return Sel(f'device.capacity["{d}"].memory.isInteger()', fn)

    def name_words() -> Sel:
        words = f'{attrs}.productName.split(" ")' + (".sort()" if minor >= 35 else "")
        return Sel(
            f"{words}.size() > 2",
            lambda dev: _with(_attr(dev, d, "productName"), lambda v: len(v.split(" ")) > 2),
        )

    def two_variables() -> Sel:
        name = rng.choice(["profile", "uuid", "parentUUID"])
        return Sel(
            f'device.attributes["{d}"].exists(k, v, k == "{name}")',
            lambda dev: (d, name) in dev.attributes,
        )

    def index_of() -> Sel:
        part = rng.choice(["H1", "A100", "L4"])
        return Sel(
            f'{attrs}.productName.indexOf("{part}") >= 0',
            lambda dev: _with(_attr(dev, d, "productName"), lambda v: part in v),
        )

    def not_an_ip() -> Sel:
        return Sel(
            f'!isIP(device.attributes["{RK}"].pciBusID)',
            lambda dev: _with(_attr(dev, RK, "pciBusID"), lambda v: True),
        )

    # List attributes (1.36+, DRAListTypeAttributes): numaNode may be a list of ints.
    def numa_includes() -> Sel:
        node = rng.choice([0, 1])
        cel = (
            f'has(device.attributes["{RK}"].numaNode) && '
            f'device.attributes["{RK}"].numaNode.includes({node})'
        )

        def fn(dev: Dev) -> Tri:
            value = dev.attributes.get((RK, "numaNode"))
            if value is None:
                return False
            return node in value[1] if isinstance(value[1], list) else value[1] == node

        return Sel(cel, fn)

    def numa_all() -> Sel:
        cel = (
            f'has(device.attributes["{RK}"].numaNode) && '
            f'device.attributes["{RK}"].numaNode.all(n, n < 2)'
        )

        def fn(dev: Dev) -> Tri:
            value = dev.attributes.get((RK, "numaNode"))
            if value is None:
                return False
            return all(n < 2 for n in value[1]) if isinstance(value[1], list) else ERR

        return Sel(cel, fn)

    def numa_in() -> Sel:
        node = rng.choice([0, 1])
        return Sel(
            f'{node} in device.attributes["{RK}"].numaNode',
            lambda dev: _with(
                _attr(dev, RK, "numaNode"), lambda v: node in v if isinstance(v, list) else ERR
            ),
        )

    common = [product, product_prefix, memory, has_memory, compute, driver_major]
    common += [numa, architecture, brand, profile, other_domain]
    common += [string_equals_semver, memory_is_integer, name_words, two_variables, index_of]
    rare = [misspelt, semver_equals_string, not_an_ip]
    rare += [profile_in] if facts["profile"] else []
    if lists:
        common += [numa_includes, numa_includes, numa_all]
        rare += [numa_in]
    return common * 4 + rare


def selector(
    d: str, rng: random.Random, facts: dict[str, list[str]], lists: bool = False, minor: int = 35
) -> Sel:
    makers = atoms(d, rng, facts, lists, minor)
    first = rng.choice(makers)()
    roll = rng.random()
    if roll < 0.55:
        return first
    second = rng.choice(makers)()
    if roll < 0.75:
        return Sel(f"({first.cel}) && ({second.cel})", lambda v: _and(first.fn(v), second.fn(v)))
    if roll < 0.9:
        return Sel(f"({first.cel}) || ({second.cel})", lambda v: _or(first.fn(v), second.fn(v)))
    return Sel(f"!({first.cel})", lambda v: _not(first.fn(v)))


@functools.cache
def rendered(fleet: str, gates: str, minor: int = 37) -> str:
    """Our publisher's slices for a node named TEMPLATE_NODE, as JSON text: the 1.37
    layout, which 1.35 and 1.36 take too, or 1.34's (counters beside their devices)."""
    argv = ["slices", "--fleet", fleet, "--node", TEMPLATE_NODE, "-o", "json"]
    if minor < 35:
        argv += ["--kube-version", f"1.{minor}"]
    gates, _, shares = gates.partition(";")
    if gates:
        argv += ["--feature-gates", gates]
    if shares:
        argv += ["--consumable-shares", shares]
    out = io.StringIO()
    with redirect_stdout(out):
        assert gpudra(argv) == 0
    return json.dumps(json.loads(out.getvalue())["items"])


@dataclass
class Scenario:
    index: int
    seed: int
    gates: str
    driver: str
    nodes: list[str]
    classes: dict[str, Sel]  # name -> its one selector
    slices: list[dict[str, Any]]
    claims: list[dict[str, Any]]  # in input order; some already allocated
    request_selectors: dict[tuple[str, str], list[Sel]] = field(default_factory=dict)
    class_configs: dict[str, dict[str, Any]] = field(default_factory=dict)
    minor: int = 35
    node_objects: list[dict[str, Any]] = field(default_factory=list)
    taint_rules: list[dict[str, Any]] = field(default_factory=list)
    # (claim, request) -> derived attribute name -> its function on a device
    derived: dict[tuple[str, str], dict[str, Callable[[Dev], Any]]] = field(default_factory=dict)

    @property
    def namespace(self) -> str:
        return f"s{self.index:03d}"

    @functools.cached_property
    def features(self) -> Features:
        return parse(self.gates, self.minor)

    @functools.cached_property
    def variant(self) -> Variant:
        return Variant.of(self.features)

    def objects(self) -> list[dict[str, Any]]:
        classes = []
        for name, sel in self.classes.items():
            spec: dict[str, Any] = {"selectors": [{"cel": {"expression": sel.cel}}]}
            if name in self.class_configs:
                spec["config"] = [{"opaque": self.class_configs[name]}]
            classes.append(
                {
                    "apiVersion": "resource.k8s.io/v1",
                    "kind": "DeviceClass",
                    "metadata": {"name": name},
                    "spec": spec,
                }
            )
        return [*classes, *self.node_objects, *self.slices, *self.taint_rules, *self.claims]

    def devices(self) -> list[Dev]:
        """The devices as the allocator sees them: DeviceTaintRules applied where the
        release applies them."""
        devices = devices_of(self.slices)
        if not self.taint_rules or not _rules_on(self.features):
            return devices
        out = []
        for dev in devices:
            extra = tuple(
                r["spec"]["taint"] for r in self.taint_rules if _rule_selects(r, dev, self.minor)
            )
            out.append(dataclasses.replace(dev, taints=dev.taints + extra) if extra else dev)
        return out


def _rules_on(features: Features) -> bool:
    return features.device_taint_rules if features.minor >= 35 else features.device_taints


def _rule_selects(rule: dict[str, Any], dev: Dev, minor: int) -> bool:
    selector = rule["spec"].get("deviceSelector")
    if selector is None:
        return minor <= 36
    return all(
        selector.get(key) in (None, value)
        for key, value in (("driver", dev.driver), ("pool", dev.pool), ("device", dev.name))
    )


def generate(seed: int, index: int, gates: str, minor: int = 35) -> Scenario:
    """One scenario for Kubernetes 1.<minor> under ``gates``. What 1.35 scenarios drew
    from the seed before 1.37 existed is drawn the same way (``rng``); everything added
    since comes from a second stream (``more``)."""
    rng = random.Random(seed * 100_003 + index)
    more = random.Random(f"{seed}/{index}/{minor}")
    sc = Scenario(
        index=index,
        seed=seed,
        gates=gates,
        driver=f"s{index:03d}.gpu.nvidia.com",
        nodes=[],
        classes={},
        slices=[],
        claims=[],
        minor=minor,
    )
    for n in range(rng.choice([1, 1, 2, 2, 3])):
        node = f"{sc.namespace}-n{n}"
        sc.nodes.append(node)
        fleet, driver_gates = rng.choice(FLEETS), rng.choice(DRIVER_GATES)
        slices = json.loads(rendered(fleet, driver_gates, minor).replace(TEMPLATE_NODE, node))
        for slice_ in slices:
            slice_["spec"]["driver"] = sc.driver
        if rng.random() < 0.3:
            _taint(rng, slices, minor)
        if rng.random() < 0.25:
            _binding_conditions(rng, slices)
        _newer_slices(more, sc, node, slices)
        sc.slices += slices
    _newer_cluster(more, sc)
    devices = sc.devices()
    facts = {
        "productName": sorted({str(_attr(v, sc.driver, "productName")) for v in devices}),
        "profile": sorted({v.attributes[(sc.driver, "profile")][1] for v in devices
                           if (sc.driver, "profile") in v.attributes}),
    }  # fmt: skip
    d = sc.driver
    type_sel = f'device.driver == "{d}" && device.attributes["{d}"].type'
    for kind in ("gpu", "mig", "vfio"):
        sc.classes[f"{sc.namespace}-{kind}"] = Sel(f'{type_sel} == "{kind}"', _is_type(d, kind))
    sc.classes[f"{sc.namespace}-any"] = Sel(f'device.driver == "{d}"', lambda dev: dev.driver == d)
    for name in sc.classes:
        if rng.random() < 0.3:
            sc.class_configs[name] = _opaque(rng, d)
    for c in range(rng.randint(1, 6)):
        sc.claims.append(_bounded_claim(rng, sc, f"c{c}", facts, more))
    for e in range(rng.choice([0, 0, 1, 2])):
        existing = _existing(rng, sc, f"old{e}", devices)
        if existing is not None:
            sc.claims.insert(rng.randint(0, len(sc.claims)), existing)
    return sc


def _newer_slices(
    more: random.Random, sc: Scenario, node: str, slices: list[dict[str, Any]]
) -> None:
    """What 1.36/1.37 slices may carry: numaNode as a list (the reference driver with
    DRAListTypeAttributes), compatibility groups on counters, skipped node operations,
    fractional capacity ranges on shared devices."""
    if sc.minor < 36:
        return
    features = sc.features
    if features.list_type_attributes and more.random() < 0.6:
        for slice_ in slices:
            for device in slice_["spec"].get("devices") or []:
                numa = (device.get("attributes") or {}).get(f"{RK}/numaNode")
                if numa is not None and more.random() < 0.7:
                    value = numa["int"]
                    numa.clear()
                    numa["ints"] = [value] if more.random() < 0.6 else [value, 1 - value]
    if sc.minor < 37:
        return
    if more.random() < 0.4:
        for slice_ in slices:
            for device in slice_["spec"].get("devices") or []:
                for consumption in device.get("consumesCounters") or []:
                    groups = more.choice([[], [], ["small"], ["large"], ["small", "large"]])
                    if groups:
                        consumption["compatibilityGroups"] = groups
    if more.random() < 0.25:
        skip = more.choice(
            [["*"], ["NodeUnprepareResources"], ["NodePrepareResources", "NodeUnprepareResources"]]
        )
        for slice_ in slices:
            if slice_["spec"].get("devices"):
                slice_["spec"]["skipNodeOperations"] = skip
    if features.consumable_capacity and more.random() < 0.5:
        for slice_ in slices:
            for device in slice_["spec"].get("devices") or []:
                if device.get("allowMultipleAllocations") and more.random() < 0.6:
                    step = more.choice(["0.25", "0.5", "1"])
                    device.setdefault("capacity", {})["compute"] = {
                        "value": "2",
                        "requestPolicy": {
                            "default": step,
                            "validRange": {"min": step, "max": "2", "step": step},
                        },
                    }


def _newer_cluster(more: random.Random, sc: Scenario) -> None:
    """Objects beside the slices: Nodes (1.37: some declare DRAOptionalNodeOperations),
    DeviceTaintRules, and a pool every node sees through a DoesNotExist node selector
    (only where the release orders pools itself, so the comparison stays exact)."""
    if sc.minor >= 37 and any(s["spec"].get("skipNodeOperations") for s in sc.slices):
        for node in sc.nodes:
            if more.random() < 0.6:
                sc.node_objects.append(
                    {
                        "apiVersion": "v1",
                        "kind": "Node",
                        "metadata": {"name": node, "labels": {HOSTNAME: node}},
                        "status": {"declaredFeatures": ["DRAOptionalNodeOperations"]},
                    }
                )
    if sc.features.device_taints and more.random() < 0.3:
        devices = [v for v in devices_of(sc.slices)]
        for r in range(more.randint(1, 2)):
            dev = more.choice(devices)
            selector: dict[str, str] = {"driver": sc.driver}
            roll = more.random()
            if roll < 0.6:
                selector["device"] = dev.name
            elif roll < 0.8:
                selector["pool"] = dev.pool
            key, value = more.choice([("gpu.nvidia.com/xid", "79"), ("example.com/maint", "")])
            effect = more.choice(["NoSchedule", "None"])
            if sc.minor < 35:  # no effect None before 1.35
                effect = "NoSchedule"
            taint: dict[str, Any] = {"key": key, "effect": effect}
            if value:
                taint["value"] = value
            sc.taint_rules.append(
                {
                    "apiVersion": _TAINT_RULE_API[sc.minor],
                    "kind": "DeviceTaintRule",
                    "metadata": {"name": f"{sc.namespace}-rule{r}"},
                    "spec": {"deviceSelector": selector, "taint": taint},
                }
            )
    if sc.variant.pools_sorted and more.random() < 0.2:
        sc.slices.append(_everywhere_pool(sc))


HOSTNAME = "kubernetes.io/hostname"
_TAINT_RULE_API = {
    34: "resource.k8s.io/v1alpha3",
    35: "resource.k8s.io/v1alpha3",
    36: "resource.k8s.io/v1beta2",
    37: "resource.k8s.io/v1",
}


def _everywhere_pool(sc: Scenario) -> dict[str, Any]:
    """Two GPUs every node may use: a selector no node label fails (DoesNotExist)."""
    d = sc.driver
    devices = [
        {
            "name": f"shared-{i}",
            "attributes": {
                "type": {"string": "gpu"},
                "productName": {"string": "NVIDIA Shared GPU"},
                "uuid": {"string": f"GPU-{sc.namespace}-shared-{i}"},
            },
            "capacity": {"memory": {"value": "16Gi"}},
        }
        for i in range(2)
    ]
    selector = {"key": "example.com/excluded", "operator": "DoesNotExist"}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{sc.namespace}-everywhere"},
        "spec": {
            "driver": d,
            "pool": {
                "name": f"{sc.namespace}-everywhere",
                "generation": 1,
                "resourceSliceCount": 1,
            },
            "nodeSelector": {"nodeSelectorTerms": [{"matchExpressions": [selector]}]},
            "devices": devices,
        },
    }


def _is_type(driver: str, kind: str) -> Callable[[Dev], Tri]:
    return lambda dev: dev.driver == driver and _attr(dev, driver, "type") == kind


def _taint(rng: random.Random, slices: list[dict[str, Any]], minor: int) -> None:
    for slice_ in slices:
        devices = slice_["spec"].get("devices") or []
        if len(devices) > 64:  # 1.35: at most 64 devices in a slice with taints
            continue
        for device in devices:
            if rng.random() < 0.3:
                effect = rng.choice(["NoSchedule", "NoExecute", "None"])
                if effect == "None" and minor < 35:  # the effect came in 1.35
                    effect = "NoSchedule"
                device["taints"] = [{"key": "gpu.nvidia.com/xid", "value": "79", "effect": effect}]


def _binding_conditions(rng: random.Random, slices: list[dict[str, Any]]) -> None:
    """Binding conditions on some devices of one slice (dropped with the gate off;
    with it on, both allocators try such devices and their pools last)."""
    devices = rng.choice(slices)["spec"].get("devices") or []
    for device in devices:
        if rng.random() < 0.5:
            device["bindingConditions"] = ["attached"]
            device["bindingFailureConditions"] = ["failed"]


def _request_body(
    rng: random.Random,
    sc: Scenario,
    key: tuple[str, str],
    facts: dict[str, list[str]],
    more: random.Random | None = None,
) -> dict[str, Any]:
    kind = rng.choice(["gpu", "gpu", "mig", "mig", "vfio", "any"])
    body: dict[str, Any] = {"deviceClassName": f"{sc.namespace}-{kind}"}
    lists = sc.minor >= 36 and sc.features.list_type_attributes
    count = rng.choice([0, 0, 1, 1, 2])
    selectors = [selector(sc.driver, more or rng, facts, lists) if lists else
                 selector(sc.driver, rng, facts, minor=sc.minor) for _ in range(count)]  # fmt: skip
    if selectors:
        body["selectors"] = [{"cel": {"expression": s.cel}} for s in selectors]
        sc.request_selectors[key] = selectors
    if rng.random() < 0.08:
        body["allocationMode"] = "All"
    else:
        body["count"] = rng.choice([1, 1, 1, 1, 2, 2, 3, 4])
    if sc.features.consumable_capacity and rng.random() < 0.3:
        name = rng.choice(["memory", "shares"])
        value = rng.choice(["1Gi", "4Gi", "10Gi"] if name == "memory" else ["1", "2"])
        body["capacity"] = {"requests": {name: value}}
        if more is not None and sc.minor >= 37 and more.random() < 0.5:
            compute = more.choice(["0.3", "0.5", "1", "1.2"])
            if more.random() < 0.5:
                body["capacity"]["requests"] = {"compute": compute}
            else:
                body["capacity"]["requests"]["compute"] = compute
    if rng.random() < 0.25:
        toleration: dict[str, Any] = {"key": "gpu.nvidia.com/xid", "operator": "Exists"}
        if rng.random() < 0.5:
            toleration = {"key": "gpu.nvidia.com/xid", "operator": "Equal", "value": "79"}
        if rng.random() < 0.4:
            toleration["effect"] = rng.choice(["NoSchedule", "NoExecute"])
        body["tolerations"] = [toleration]
    if more is not None and sc.minor >= 37 and more.random() < 0.12:
        toleration = {"key": "example.com/maint", "operator": "Exists"}
        body["tolerations"] = [*body.get("tolerations", []), toleration]
    if more is not None and sc.minor >= 37 and more.random() < 0.3:
        # Plain requests too, so that what 1.37 added meets devices that fit.
        body.pop("selectors", None)
        sc.request_selectors.pop(key, None)
        body["deviceClassName"] = f"{sc.namespace}-{more.choice(['gpu', 'any', 'mig'])}"
    if more is not None and sc.minor >= 37 and more.random() < 0.3:
        chosen = more.sample(_derived_makers(sc), more.randint(1, 2))
        body["derivedAttributes"] = [{"name": n, "expression": e} for n, e, _ in chosen]
        sc.derived[key] = {n: fn for n, _, fn in chosen}
    return body


def _derived_makers(sc: Scenario) -> list[tuple[str, str, Callable[[Dev], Any]]]:
    """Derived attributes (1.37, DRADerivedAttributes): name, CEL, and the value as
    Python computes it ((kind, value) like Dev.attributes, or ERR)."""
    d = sc.driver

    def numa_set(dev: Dev) -> Any:
        value = dev.attributes.get((RK, "numaNode"))
        if value is None:
            return ("int", -1)
        return value

    def architecture(dev: Dev) -> Any:
        value = dev.attributes.get((d, "architecture"))
        return ERR if value is None else value

    def mem_class(dev: Dev) -> Any:
        value = dev.capacity.get((d, "memory"))
        if value is None:
            return ERR
        return ("string", "big" if quantity(value) >= 40 * 2**30 else "small")

    def major(dev: Dev) -> Any:
        value = dev.attributes.get((d, "cudaComputeCapability"))
        return ERR if value is None else ("int", _semver(value[1])[0])

    return [
        (
            f"{d}/numaSet",
            f'has(device.attributes["{RK}"].numaNode) ? device.attributes["{RK}"].numaNode : -1',
            numa_set,
        ),
        (f"{d}/arch", f'device.attributes["{d}"].architecture', architecture),
        (
            f"{d}/memClass",
            f'device.capacity["{d}"].memory.compareTo(quantity("40Gi")) >= 0 ? "big" : "small"',
            mem_class,
        ),
        (f"{d}/major", f'device.attributes["{d}"].cudaComputeCapability.major()', major),
    ]


SEARCH_LIMIT = 3000


def _bounded_claim(
    rng: random.Random,
    sc: Scenario,
    name: str,
    facts: dict[str, list[str]],
    more: random.Random | None = None,
) -> dict[str, Any]:
    devices = sc.devices()
    for _ in range(20):
        for table in (sc.request_selectors, sc.derived):
            for key in [k for k in table if k[0] == name]:
                del table[key]
        claim = _claim(rng, sc, name, facts, more)
        if _search_size(sc, claim, devices) <= SEARCH_LIMIT:
            return claim
    for table in (sc.request_selectors, sc.derived):
        for key in [k for k in table if k[0] == name]:
            del table[key]
    simple = {"name": "r0", "exactly": {"deviceClassName": f"{sc.namespace}-gpu"}}
    return {**claim, "spec": {"devices": {"requests": [simple]}}}


def _search_size(sc: Scenario, claim: dict[str, Any], devices: list[Dev]) -> int:
    """An upper bound of the device combinations a search may visit on the worst node."""
    name, worst = claim["metadata"]["name"], 0
    bodies = _bodies(claim)
    for node in sc.nodes:
        on_node = [v for v in devices if v.node == node]
        size = 1
        for request in claim["spec"]["devices"]["requests"]:
            keys = [
                k for k in bodies if k == request["name"] or k.startswith(request["name"] + "/")
            ]
            choices = 0
            for key in keys:
                body = bodies[key]
                matching = sum(1 for v in on_node if _matches(sc, name, key, body, v))
                count = matching if body.get("allocationMode") == "All" else body.get("count", 1)
                # Both visit orderings of devices, not just sets.
                choices += math.perm(matching, min(count, matching)) if matching else 0
            size *= max(1, choices)
        worst = max(worst, size)
    return worst


def _claim(
    rng: random.Random,
    sc: Scenario,
    name: str,
    facts: dict[str, list[str]],
    more: random.Random | None = None,
) -> dict[str, Any]:
    requests = []
    for r in range(rng.choice([1, 1, 1, 2, 2, 3])):
        request: dict[str, Any] = {"name": f"r{r}"}
        if rng.random() < 0.2 and sc.features.prioritized_list:
            subs = []
            for s in range(rng.randint(2, 3)):
                sub = _request_body(rng, sc, (name, f"r{r}/s{s}"), facts, more)
                if (
                    s > 0
                    and sub.get("allocationMode")
                    and sc.variant.later_subrequest_uses_first_data
                ):
                    # A later "All" subrequest is a documented deviation up to 1.35
                    # (docs/differences.md; tests/helpers/diffcases.py DEVIATIONS).
                    sub.pop("allocationMode")
                    sub["count"] = 1
                subs.append({"name": f"s{s}", **sub})
            request["firstAvailable"] = subs
        else:
            body = _request_body(rng, sc, (name, f"r{r}"), facts, more)
            if rng.random() < 0.05 and sc.features.admin_access:
                body["adminAccess"] = True
            request["exactly"] = body
        requests.append(request)
    devices: dict[str, Any] = {"requests": requests}
    constraints = []
    if rng.random() < 0.35:
        attribute = rng.choice(
            [
                f"{sc.driver}/productName",
                f"{RK}/pcieRoot",
                f"{sc.driver}/parentUUID",
                f"{sc.driver}/architecture",
                f"{RK}/numaNode",
                f"{sc.driver}/cudaComputeCapability",
            ]
        )
        constraint: dict[str, Any] = {"matchAttribute": attribute}
        if len(requests) > 1 and rng.random() < 0.5:
            constraint["requests"] = rng.sample([r["name"] for r in requests], 2)
        constraints.append(constraint)
    if sc.features.consumable_capacity and rng.random() < 0.4:
        attribute = rng.choice([f"{RK}/pciBusID", f"{sc.driver}/uuid", f"{RK}/pcieRoot"])
        constraints.append({"distinctAttribute": attribute})
    # Every derived attribute is compared by a constraint on its request (the API
    # server refuses one nothing compares).
    derived: dict[str, set[str]] = {}
    for (claim_name, request_name), table in sc.derived.items():
        if claim_name == name:
            for attribute in table:
                derived.setdefault(attribute, set()).add(request_name.split("/")[0])
    for attribute, scope in sorted(derived.items()):
        assert more is not None
        kind = more.choice(["matchAttribute", "matchAttribute", "distinctAttribute"])
        if kind == "distinctAttribute" and not sc.features.consumable_capacity:
            kind = "matchAttribute"
        constraint = {kind: attribute, "requests": sorted(scope)}
        if len(scope) == len(requests) and more.random() < 0.5:
            del constraint["requests"]
        constraints.append(constraint)
    if constraints:
        devices["constraints"] = constraints
    configs = []
    for _ in range(rng.choice([0, 0, 0, 1, 2])):
        config: dict[str, Any] = {"opaque": _opaque(rng, sc.driver)}
        if rng.random() < 0.6:
            names = [r["name"] for r in requests]
            names += [
                f"{r['name']}/{s['name']}" for r in requests for s in r.get("firstAvailable", [])
            ]
            config["requests"] = rng.sample(names, min(len(names), rng.randint(1, 2)))
        configs.append(config)
    if configs:
        devices["config"] = configs
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": sc.namespace},
        "spec": {"devices": devices},
    }


def _opaque(rng: random.Random, driver: str) -> dict[str, Any]:
    interval = rng.choice(["Default", "Short", "Medium", "Long"])
    return {
        "driver": driver,
        "parameters": {
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "GpuConfig",
            "sharing": {"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": interval}},
        },
    }


def _existing(
    rng: random.Random, sc: Scenario, name: str, devices: list[Dev]
) -> dict[str, Any] | None:
    """A claim allocated before: distinct devices, counters never overdrawn."""
    taken = {tuple(r[k] for k in ("driver", "pool", "device"))
             for c in sc.claims for r in _results(c)}  # fmt: skip
    used = _consumed([v for v in devices if v.id in taken])
    limits = counter_limits(sc.slices)
    node = rng.choice(sc.nodes)
    wanted = rng.randint(1, 3)
    chosen: list[Dev] = []
    for dev in rng.sample(devices, len(devices)):
        if len(chosen) >= wanted or dev.node != node or dev.id in taken:
            continue
        trial = _consumed([dev], used)
        if any(v > limits.get(k, 0) for k, v in trial.items()):
            continue
        used = trial
        chosen.append(dev)
    if not chosen:
        return None
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": sc.namespace},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "r",
                        "exactly": {"deviceClassName": f"{sc.namespace}-any", "count": len(chosen)},
                    }
                ]
            }
        },
        "status": {
            "allocation": {
                "devices": {
                    "results": [
                        {"request": "r", "driver": v.driver, "pool": v.pool, "device": v.name}
                        for v in chosen
                    ]
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [node]}
                            ]
                        }
                    ]
                },
            }
        },
    }


def _results(claim: dict[str, Any]) -> list[dict[str, Any]]:
    allocation = (claim.get("status") or {}).get("allocation") or {}
    return list((allocation.get("devices") or {}).get("results") or [])


CounterKey = tuple[str, str, str, str]  # driver, pool, counter set, counter


def counter_limits(slices: Iterable[dict[str, Any]]) -> dict[CounterKey, int]:
    limits: dict[CounterKey, int] = {}
    for slice_ in slices:
        spec = slice_["spec"]
        for counter_set in spec.get("sharedCounters") or []:
            for counter, value in counter_set["counters"].items():
                key = (spec["driver"], spec["pool"]["name"], counter_set["name"], counter)
                limits[key] = quantity(value["value"])
    return limits


def _consumed(
    devices: Iterable[Dev], start: dict[CounterKey, int] | None = None
) -> dict[CounterKey, int]:
    out = dict(start or {})
    for dev in devices:
        for counter_set, counter, value in dev.consumes:
            key = (dev.driver, dev.pool, counter_set, counter)
            out[key] = out.get(key, 0) + value
    return out


def _tolerated(taint: dict[str, Any], tolerations: list[dict[str, Any]]) -> bool:
    for t in tolerations:
        if t.get("effect") and t["effect"] != taint["effect"]:
            continue
        if t.get("key") and t["key"] != taint["key"]:
            continue
        if t.get("operator", "Equal") == "Exists":
            return True
        if (t.get("value") or "") == (taint.get("value") or ""):
            return True
    return False


def _gate(gates: str, name: str) -> bool:
    return f"{name}=true" in gates


def _bodies(claim: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Result request name -> its request body (``req`` or ``req/sub``)."""
    out = {}
    for request in claim["spec"]["devices"]["requests"]:
        if "exactly" in request:
            out[request["name"]] = request["exactly"]
        for sub in request.get("firstAvailable") or []:
            out[f"{request['name']}/{sub['name']}"] = sub
    return out


def _value(dev: Dev, attribute: str, derived: dict[str, Callable[[Dev], Any]] | None = None) -> Any:
    """The attribute a constraint compares: a derived one of the request, else the
    device's own (None when it has none)."""
    if derived and attribute in derived:
        return derived[attribute](dev)
    domain, _, ident = attribute.partition("/")
    return dev.attributes.get((domain, ident))


def _matches(sc: Scenario, claim: str, request: str, body: dict[str, Any], dev: Dev) -> bool:
    sels = [sc.classes[body["deviceClassName"]], *sc.request_selectors.get((claim, request), [])]
    return all(s.fn(dev) is True for s in sels)


def check(sc: Scenario, outcomes: dict[str, dict[str, Any]]) -> list[str]:
    """Problems with the allocations in ``outcomes`` (claim name -> output entry)."""
    problems: list[str] = []
    devices = {v.id: v for v in sc.devices()}
    in_use: dict[tuple[str, str, str], str] = {}
    allocated: list[Dev] = []
    for claim in sc.claims:
        for r in _results(claim):
            key = (r["driver"], r["pool"], r["device"])
            in_use[key] = claim["metadata"]["name"]
            allocated.append(devices[key])
    for claim in sc.claims:
        name = claim["metadata"]["name"]
        out = outcomes.get(name)
        if out is None or out["status"] != "allocated":
            continue
        where = f"{sc.namespace}/{name}"
        problems += [f"{where}: {p}" for p in _check_claim(sc, claim, out, devices)]
        for r in out["allocation"]["devices"]["results"]:
            key = (r["driver"], r["pool"], r["device"])
            if r.get("adminAccess") or r.get("shareID"):
                continue  # shares of one device: the exact comparison of choices covers them
            if key in in_use:
                problems.append(f"{where}: {'/'.join(key)} already used by {in_use[key]}")
            in_use[key] = name
            if key in devices:
                allocated.append(devices[key])
    if sc.features.partitionable_devices:
        limits = counter_limits(sc.slices)
        for counter, value in _consumed(allocated).items():
            if value > limits.get(counter, 0):
                problems.append(f"counter {counter} overdrawn: {value} > {limits.get(counter, 0)}")
        if sc.features.compatibility_groups:
            problems += _group_problems(sc, allocated)
    return problems


def _group_problems(sc: Scenario, allocated: list[Dev]) -> list[str]:
    """DRADeviceCompatibilityGroups: the devices drawing on one counter set either all
    have no groups, or all have groups with one in common (checked only where the
    claims allocated before the run already obey this)."""

    def faults(devs: list[Dev]) -> list[str]:
        sets: dict[tuple[str, str, str], list[frozenset[str]]] = {}
        for dev in devs:
            for counter_set, groups in dev.groups:
                sets.setdefault((dev.driver, dev.pool, counter_set), []).append(groups)
        out = []
        for key, members in sets.items():
            empty = [g for g in members if not g]
            common = set(members[0]).intersection(*members[1:]) if members else set()
            if empty and len(empty) != len(members):
                out.append(f"counter set {key}: devices with and without groups {members}")
            elif not empty and not common:
                out.append(f"counter set {key}: no group in common {members}")
        return out

    before = [d for c in sc.claims for r in _results(c) for d in devices_of(sc.slices)
              if d.id == (r["driver"], r["pool"], r["device"])]  # fmt: skip
    return [] if faults(before) else faults(allocated)


def _check_claim(
    sc: Scenario,
    claim: dict[str, Any],
    out: dict[str, Any],
    devices: dict[tuple[str, str, str], Dev],
) -> list[str]:
    problems = []
    name = claim["metadata"]["name"]
    node = out["node"]
    bodies = _bodies(claim)
    results = out["allocation"]["devices"]["results"]
    if len(results) > 32:
        problems.append(f"{len(results)} devices (limit 32)")
    chosen: dict[str, list[Dev]] = {}
    for r in results:
        dev = devices.get((r["driver"], r["pool"], r["device"]))
        body = bodies.get(r["request"])
        if dev is None or body is None:
            problems.append(f"unknown device or request in {r}")
            continue
        chosen.setdefault(r["request"], []).append(dev)
        if dev.node not in (node, ""):  # "": a pool every node sees
            problems.append(f"{dev.name} is on {dev.node}, not {node}")
        if dev.skips_node_operations and sc.features.optional_node_operations:
            if "DRAOptionalNodeOperations" not in _declared(sc, node):
                problems.append(f"{dev.name} skips node operations, {node} lacks the feature")
        if not _matches(sc, name, r["request"], body, dev):
            problems.append(f"{dev.name} does not satisfy request {r['request']}")
        if bool(r.get("adminAccess")) != bool(body.get("adminAccess")):
            problems.append(f"{dev.name}: adminAccess {r.get('adminAccess')} for {r['request']}")
        if sc.features.device_taints:
            for taint in dev.taints:
                if taint["effect"] != "None" and not _tolerated(taint, body.get("tolerations", [])):
                    problems.append(f"{dev.name}: taint {taint} not tolerated")
    for request in claim["spec"]["devices"]["requests"]:
        base = request["name"]
        used = [k for k in chosen if k == base or k.startswith(f"{base}/")]
        later = [f"{base}/{sub['name']}" for sub in (request.get("firstAvailable") or [])[1:]]
        if any(k in later and bodies[k].get("allocationMode") == "All" for k in used):
            # Upstream 1.35 goes on with the first subrequest after the first device
            # of a later "All" subrequest (reproduced on purpose): counts follow
            # the first subrequest; the choices are compared exactly instead.
            continue
        if len(used) != 1:
            problems.append(f"request {base}: results for {used or 'nothing'}")
            continue
        body, got = bodies[used[0]], chosen[used[0]]
        if body.get("allocationMode") == "All":
            want = {v.id for v in devices.values()
                    if v.node in (node, "") and _matches(sc, name, used[0], body, v)}  # fmt: skip
            if {v.id for v in got} != want and not _asks_capacity(sc, body):
                problems.append(f"request {used[0]} (All): got {len(got)}, matching {len(want)}")
        elif len(got) != body.get("count", 1):
            problems.append(f"request {used[0]}: {len(got)} devices, count {body.get('count', 1)}")
    for constraint in claim["spec"]["devices"].get("constraints") or []:
        scope = constraint.get("requests")
        attribute = constraint.get("matchAttribute") or constraint["distinctAttribute"]
        values = [
            _value(v, attribute, _derived(sc, name, k))
            for k, vs in chosen.items()
            for v in vs
            if not scope or k in scope or k.split("/")[0] in scope
        ]
        if "matchAttribute" in constraint and not _all_match(sc, values):
            problems.append(f"matchAttribute {attribute}: {values}")
        if "distinctAttribute" in constraint and not _all_distinct(sc, values):
            problems.append(f"distinctAttribute {attribute}: {values}")
    return problems


def _asks_capacity(sc: Scenario, body: dict[str, Any]) -> bool:
    """With consumable capacity, "All" leaves out devices whose capacity cannot hold the
    request (rounded by request policies; up to 1.36 also what other claims' shares
    hold): the exact comparison of choices covers those."""
    return sc.features.consumable_capacity


def _declared(sc: Scenario, node: str) -> list[str]:
    for obj in sc.node_objects:
        if obj["metadata"]["name"] == node:
            return list((obj.get("status") or {}).get("declaredFeatures") or [])
    return []


def _derived(sc: Scenario, claim: str, request: str) -> dict[str, Callable[[Dev], Any]]:
    return sc.derived.get((claim, request), {}) if sc.features.derived_attributes else {}


def _as_set(value: tuple[str, Any]) -> tuple[str, frozenset[Any]]:
    kind, raw = value
    base = {"ints": "int", "bools": "bool", "strings": "string", "versions": "version"}
    if kind in base:
        return base[kind], frozenset(raw)
    return kind, frozenset([raw])


def _sets(sc: Scenario) -> bool:
    return sc.variant.list_constraints and sc.features.list_type_attributes


def _all_match(sc: Scenario, values: list[Any]) -> bool:
    """Every device has the attribute; all scalars of one type and value (a list only as
    the first and only value), or as sets, one element in common."""
    if any(v is None or v is ERR for v in values):
        return False
    if _sets(sc):
        sets = [_as_set(v) for v in values]
        return len({k for k, _ in sets}) <= 1 and (
            not sets or bool(frozenset.intersection(*(s for _, s in sets)))
        )
    if len(values) <= 1:
        return True
    if any(isinstance(v[1], list) for v in values):
        return False
    return len(set(values)) == 1


def _all_distinct(sc: Scenario, values: list[Any]) -> bool:
    """Presence only up to 1.36 (upstream remembers one value per request); from 1.37
    pairwise different (as sets: pairwise disjoint)."""
    if any(v is None or v is ERR for v in values):
        return False
    if sc.variant.distinct_per_request:
        return True
    if _sets(sc):
        sets = [_as_set(v) for v in values]
        return all(
            a[0] != b[0] or not (a[1] & b[1]) for i, a in enumerate(sets) for b in sets[i + 1 :]
        )
    for i, a in enumerate(values):
        for b in values[:i]:
            if isinstance(a[1], list) or (not isinstance(b[1], list) and a == b):
                return False
    return True


def _gpu_only_scenario() -> Scenario:
    sc = generate(3, 0, "")
    sc.slices = json.loads(rendered("l4x4", "").replace(TEMPLATE_NODE, "s000-n0"))
    for slice_ in sc.slices:
        slice_["spec"]["driver"] = sc.driver
    sc.nodes = ["s000-n0"]
    sc.claims = [
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": "c", "namespace": sc.namespace},
            "spec": {
                "devices": {
                    "requests": [
                        {"name": "r", "exactly": {"deviceClassName": "s000-gpu", "count": 2}}
                    ],
                    "constraints": [{"matchAttribute": f"{sc.driver}/productName"}],
                }
            },
        }
    ]
    sc.request_selectors = {}
    return sc


def _outcome(sc: Scenario, devices: list[str], node: str = "s000-n0") -> dict[str, Any]:
    results = [
        {"request": "r", "driver": sc.driver, "pool": "s000-n0", "device": d} for d in devices
    ]
    return {
        "c": {"status": "allocated", "node": node, "allocation": {"devices": {"results": results}}}
    }


# Two claims kube-scheduler's PreFilter keeps waiting: their DeviceClass does not exist.
MISSING_CLASS_CLAIMS = """apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: nocls, namespace: ns}
spec:
  devices:
    requests:
    - name: gpu
      exactly: {deviceClassName: missing.example.com}
---
apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata: {name: sub, namespace: ns}
spec:
  devices:
    requests:
    - name: gpu
      firstAvailable: [{name: a, deviceClassName: missing.example.com}]
"""
