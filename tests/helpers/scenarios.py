"""Seeded scenarios for the differential test, and an independent check of allocations.

A scenario is a small cluster of its own: 1-3 nodes whose ResourceSlices our
publisher's renderer produced (``gpudra slices``, every fleet profile, with and
without DynamicMIG or VFIO), sometimes with device taints; DeviceClasses;
claims with random CEL selectors over our attributes (strings, quantities,
semvers, ``has``, ``in``, misspelt names), counts, ``All``, adminAccess,
firstAvailable, tolerations, matchAttribute / distinctAttribute constraints;
and claims that are already allocated. Each scenario renames the driver
(``s<N>.gpu.nvidia.com``) and prefixes its node and class names, so many
scenarios share one input file without touching each other's devices.

Every selector is generated together with a Python predicate that has CEL's
semantics (errors included), so :func:`check` can verify an allocation without
our CEL environment or our engine: devices exist on the node, satisfy class
and request selectors, counts and All, constraints, taints, no device used
twice, counters not exceeded. (distinctAttribute is checked for presence only:
upstream 1.35 enforces it per request, see services/allocator/structured/constraints.py.)

tests/e2e/test_differential_scenarios.py checks the generator and the checker
themselves; tests/e2e/test_differential_allocator.py runs both allocators.
"""

from __future__ import annotations

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


def atoms(d: str, rng: random.Random, facts: dict[str, list[str]]) -> list[Callable[[], Sel]]:
    """Selector makers over driver domain ``d``; ``facts`` lists values seen in the slices."""
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
        return Sel(
            f'{attrs}.productName.split(" ").sort().size() > 2',
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

    common = [product, product_prefix, memory, has_memory, compute, driver_major]
    common += [numa, architecture, brand, profile, other_domain]
    common += [string_equals_semver, memory_is_integer, name_words, two_variables, index_of]
    rare = [misspelt, semver_equals_string, not_an_ip]
    rare += [profile_in] if facts["profile"] else []
    return common * 4 + rare


def selector(d: str, rng: random.Random, facts: dict[str, list[str]]) -> Sel:
    makers = atoms(d, rng, facts)
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
def rendered(fleet: str, gates: str) -> str:
    """Our publisher's slices for a node named TEMPLATE_NODE, as JSON text."""
    argv = ["slices", "--fleet", fleet, "--node", TEMPLATE_NODE, "-o", "json"]
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

    @property
    def namespace(self) -> str:
        return f"s{self.index:03d}"

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
        return [*classes, *self.slices, *self.claims]

    def devices(self) -> list[Dev]:
        return devices_of(self.slices)


def generate(seed: int, index: int, gates: str) -> Scenario:
    rng = random.Random(seed * 100_003 + index)
    sc = Scenario(
        index=index,
        seed=seed,
        gates=gates,
        driver=f"s{index:03d}.gpu.nvidia.com",
        nodes=[],
        classes={},
        slices=[],
        claims=[],
    )
    for n in range(rng.choice([1, 1, 2, 2, 3])):
        node = f"{sc.namespace}-n{n}"
        sc.nodes.append(node)
        fleet, driver_gates = rng.choice(FLEETS), rng.choice(DRIVER_GATES)
        slices = json.loads(rendered(fleet, driver_gates).replace(TEMPLATE_NODE, node))
        for slice_ in slices:
            slice_["spec"]["driver"] = sc.driver
        if rng.random() < 0.3:
            _taint(rng, slices)
        if rng.random() < 0.25:
            _binding_conditions(rng, slices)
        sc.slices += slices
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
        sc.claims.append(_bounded_claim(rng, sc, f"c{c}", facts))
    for e in range(rng.choice([0, 0, 1, 2])):
        existing = _existing(rng, sc, f"old{e}", devices)
        if existing is not None:
            sc.claims.insert(rng.randint(0, len(sc.claims)), existing)
    return sc


def _is_type(driver: str, kind: str) -> Callable[[Dev], Tri]:
    return lambda dev: dev.driver == driver and _attr(dev, driver, "type") == kind


def _taint(rng: random.Random, slices: list[dict[str, Any]]) -> None:
    for slice_ in slices:
        devices = slice_["spec"].get("devices") or []
        if len(devices) > 64:  # 1.35: at most 64 devices in a slice with taints
            continue
        for device in devices:
            if rng.random() < 0.3:
                effect = rng.choice(["NoSchedule", "NoExecute", "None"])
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
    rng: random.Random, sc: Scenario, key: tuple[str, str], facts: dict[str, list[str]]
) -> dict[str, Any]:
    kind = rng.choice(["gpu", "gpu", "mig", "mig", "vfio", "any"])
    body: dict[str, Any] = {"deviceClassName": f"{sc.namespace}-{kind}"}
    selectors = [selector(sc.driver, rng, facts) for _ in range(rng.choice([0, 0, 1, 1, 2]))]
    if selectors:
        body["selectors"] = [{"cel": {"expression": s.cel}} for s in selectors]
        sc.request_selectors[key] = selectors
    if rng.random() < 0.08:
        body["allocationMode"] = "All"
    else:
        body["count"] = rng.choice([1, 1, 1, 1, 2, 2, 3, 4])
    if _gate(sc.gates, "DRAConsumableCapacity") and rng.random() < 0.3:
        name = rng.choice(["memory", "shares"])
        value = rng.choice(["1Gi", "4Gi", "10Gi"] if name == "memory" else ["1", "2"])
        body["capacity"] = {"requests": {name: value}}
    if rng.random() < 0.25:
        toleration: dict[str, Any] = {"key": "gpu.nvidia.com/xid", "operator": "Exists"}
        if rng.random() < 0.5:
            toleration = {"key": "gpu.nvidia.com/xid", "operator": "Equal", "value": "79"}
        if rng.random() < 0.4:
            toleration["effect"] = rng.choice(["NoSchedule", "NoExecute"])
        body["tolerations"] = [toleration]
    return body


SEARCH_LIMIT = 3000


def _bounded_claim(
    rng: random.Random, sc: Scenario, name: str, facts: dict[str, list[str]]
) -> dict[str, Any]:
    devices = sc.devices()
    for _ in range(20):
        for key in [k for k in sc.request_selectors if k[0] == name]:
            del sc.request_selectors[key]
        claim = _claim(rng, sc, name, facts)
        if _search_size(sc, claim, devices) <= SEARCH_LIMIT:
            return claim
    for key in [k for k in sc.request_selectors if k[0] == name]:
        del sc.request_selectors[key]
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
    rng: random.Random, sc: Scenario, name: str, facts: dict[str, list[str]]
) -> dict[str, Any]:
    requests = []
    for r in range(rng.choice([1, 1, 1, 2, 2, 3])):
        request: dict[str, Any] = {"name": f"r{r}"}
        if rng.random() < 0.2 and _gate(sc.gates, "DRAPrioritizedList"):
            subs = []
            for s in range(rng.randint(2, 3)):
                sub = _request_body(rng, sc, (name, f"r{r}/s{s}"), facts)
                if s > 0 and sub.pop("allocationMode", None):
                    # A later "All" subrequest is a documented deviation
                    # (docs/differences.md; tests/helpers/diffcases.py DEVIATIONS).
                    sub["count"] = 1
                subs.append({"name": f"s{s}", **sub})
            request["firstAvailable"] = subs
        else:
            body = _request_body(rng, sc, (name, f"r{r}"), facts)
            if rng.random() < 0.05 and _gate(sc.gates, "DRAAdminAccess"):
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
    if "DRAConsumableCapacity=true" in sc.gates and rng.random() < 0.4:
        attribute = rng.choice([f"{RK}/pciBusID", f"{sc.driver}/uuid", f"{RK}/pcieRoot"])
        constraints.append({"distinctAttribute": attribute})
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


def _value(dev: Dev, attribute: str) -> tuple[str, Any] | None:
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
    if _gate(sc.gates, "DRAPartitionableDevices"):
        limits = counter_limits(sc.slices)
        for counter, value in _consumed(allocated).items():
            if value > limits.get(counter, 0):
                problems.append(f"counter {counter} overdrawn: {value} > {limits.get(counter, 0)}")
    return problems


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
        if dev.node != node:
            problems.append(f"{dev.name} is on {dev.node}, not {node}")
        if not _matches(sc, name, r["request"], body, dev):
            problems.append(f"{dev.name} does not satisfy request {r['request']}")
        if bool(r.get("adminAccess")) != bool(body.get("adminAccess")):
            problems.append(f"{dev.name}: adminAccess {r.get('adminAccess')} for {r['request']}")
        if _gate(sc.gates, "DRADeviceTaints"):
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
                    if v.node == node and _matches(sc, name, used[0], body, v)}  # fmt: skip
            if {v.id for v in got} != want:
                problems.append(f"request {used[0]} (All): got {len(got)}, matching {len(want)}")
        elif len(got) != body.get("count", 1):
            problems.append(f"request {used[0]}: {len(got)} devices, count {body.get('count', 1)}")
    for constraint in claim["spec"]["devices"].get("constraints") or []:
        scope = constraint.get("requests")
        devs = [v for k, vs in chosen.items() for v in vs
                if not scope or k in scope or k.split("/")[0] in scope]  # fmt: skip
        if "matchAttribute" in constraint:
            values = [_value(v, constraint["matchAttribute"]) for v in devs]
            if None in values or len(set(values)) > 1:
                problems.append(f"matchAttribute {constraint['matchAttribute']}: {values}")
        if "distinctAttribute" in constraint:
            # Only presence: upstream 1.35 remembers one value per request, so two
            # devices of one request may share a value (reproduced by our engine on
            # purpose; the exact comparison of choices covers it).
            values = [_value(v, constraint["distinctAttribute"]) for v in devs]
            if None in values:
                problems.append(f"distinctAttribute {constraint['distinctAttribute']}: {values}")
    return problems


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
