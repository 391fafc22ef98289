"""Which resource pools a node can allocate from (GatherPools, Kubernetes 1.34-1.37).

A pool is the set of slices one driver publishes under one pool name. Only the
newest generation counts; a pool is *incomplete* while fewer slices of that
generation exist than ``resourceSliceCount`` says (nothing is allocated from
it), *invalid* when two of its devices share a name or its counters do not add
up (nothing is allocated from it either), and *obsolete* when a newer
generation exists that has no slice for this node (then it is ignored).

Order decides "first solution wins". Up to 1.35, and in 1.36/1.37's stable
allocator, upstream keeps pools in a Go map, so their order is random; we keep
the order in which pools first appear in the input, and slices in input order.
From 1.36 the incubating and experimental allocators sort pools by driver and
pool name and a pool's slices by name (pools pools_incubating.go
``sortPoolsByID``, ``sortSlicesByName``); so do we for those
(:class:`~services.allocator.structured.variant.Variant`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from services.allocator.structured.features import Features
from services.allocator.structured.variant import Variant
from services.core.kube.quantity import Quantity
from services.core.kube.resource import NodeSelector, NodeSelectorRequirement, ResourceSlice


class NodeSelectorError(ValueError):
    """A node selector that Kubernetes would refuse to evaluate."""


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    labels: dict[str, str] = field(default_factory=dict)
    # status.declaredFeatures (1.35+, NodeDeclaredFeatures): what the node's kubelet
    # supports, e.g. DRAOptionalNodeOperations.
    declared_features: frozenset[str] = frozenset()


#: The node a selector is matched against when no node is given: upstream's
#: allocator always has one, and reference-allocator (like ``gpudra allocate``
#: without nodes) uses an unnamed node without labels, which ``DoesNotExist`` and
#: ``NotIn`` match.
ANONYMOUS = Node("")


def _requirement_matches(req: NodeSelectorRequirement, value: str | None) -> bool:
    values = req.values or []
    op = req.operator
    if op in ("In", "NotIn"):
        if not values:
            raise NodeSelectorError(f"{req.key}: values must be non-empty for operator {op}")
        return (value in values) if op == "In" else (value not in values)
    if op in ("Exists", "DoesNotExist"):
        if values:
            raise NodeSelectorError(f"{req.key}: values must be empty for operator {op}")
        return (value is not None) == (op == "Exists")
    if op in ("Gt", "Lt"):
        if len(values) != 1 or not values[0].lstrip("-").isdigit():
            raise NodeSelectorError(f"{req.key}: operator {op} needs one integer value")
        if value is None or not value.lstrip("-").isdigit():
            return False
        return int(value) > int(values[0]) if op == "Gt" else int(value) < int(values[0])
    raise NodeSelectorError(f"{req.key}: {op!r} is not a valid node selector operator")


def selector_matches(selector: NodeSelector, node: Node) -> bool:
    """nodeaffinity.NodeSelector.Match: terms are ORed, requirements within a term ANDed."""
    matched = False
    for term in selector.node_selector_terms:
        exprs, fields = term.match_expressions or [], term.match_fields or []
        for req in fields:
            if req.key != "metadata.name":
                raise NodeSelectorError(f"{req.key}: not a supported field selector key")
        ok = bool(exprs or fields)
        for req in exprs:
            ok = _requirement_matches(req, node.labels.get(req.key)) and ok
        for req in fields:
            ok = _requirement_matches(req, node.name) and ok
        matched = matched or ok
    return matched


def node_matches(
    node: Node | None, node_name: str | None, all_nodes: bool | None, selector: NodeSelector | None
) -> bool:
    if node_name:
        return node is not None and node.name == node_name
    if all_nodes:
        return True
    if selector is not None:
        return selector_matches(selector, node or ANONYMOUS)
    return False


@dataclass(slots=True)
class Pool:
    driver: str
    name: str
    incomplete: bool = False
    invalid: str | None = None
    slices: list[ResourceSlice] = field(default_factory=list)  # device slices for this node
    other_slices: list[ResourceSlice] = field(default_factory=list)  # same pool, not this node
    counter_sets: dict[str, dict[str, Quantity]] = field(default_factory=dict)

    @property
    def key(self) -> tuple[str, str]:
        return (self.driver, self.name)

    def label(self) -> str:
        return f"{self.driver}/{self.name}"


def _slice_for_node(
    slice_: ResourceSlice, node: Node | None, features: Features, variant: Variant
) -> bool | None:
    """True/False: relevant or not; None: skipped outright (unknown kind or gated off)."""
    spec = slice_.spec
    if not features.partitionable_devices and (
        spec.per_device_node_selection is not None or spec.shared_counters
    ):
        return None
    if (
        variant.ignores_compatibility_group_slices
        and not features.compatibility_groups
        and uses_compatibility_groups(slice_)
    ):
        return None
    if spec.shared_counters and variant.counter_slices_everywhere:
        return True
    if spec.node_name or spec.all_nodes or spec.node_selector is not None:
        return node_matches(node, spec.node_name, spec.all_nodes, spec.node_selector)
    if spec.per_device_node_selection:
        return any(
            node_matches(node, d.node_name, d.all_nodes, d.node_selector)
            for d in spec.devices or []
        )
    return None


def uses_compatibility_groups(slice_: ResourceSlice) -> bool:
    """sliceUsesCompatibilityGroups (1.37)."""
    return any(
        c.compatibility_groups for d in slice_.spec.devices or [] for c in d.consumes_counters or []
    )


PoolCache = dict[tuple[object, ...], Pool]


class SliceIndex:
    """The slices, indexed once so that gathering one node's pools touches only its slices.

    Slices published for one ``nodeName`` are looked up by that name; every
    other slice (counters, ``allNodes``, node selectors, per-device selection)
    is checked for each node. Input order is kept: it decides pool order.
    """

    def __init__(self, slices: list[ResourceSlice]) -> None:
        self.slices = slices
        self.by_node: dict[str, list[tuple[int, ResourceSlice]]] = {}
        self.shared: list[tuple[int, ResourceSlice]] = []
        self.by_pool: dict[tuple[str, str], list[ResourceSlice]] = {}
        for i, slice_ in enumerate(slices):
            spec = slice_.spec
            self.by_pool.setdefault((spec.driver, spec.pool.name), []).append(slice_)
            if spec.node_name and not spec.shared_counters:
                self.by_node.setdefault(spec.node_name, []).append((i, slice_))
            else:
                self.shared.append((i, slice_))

    def for_node(self, node: Node | None) -> list[ResourceSlice]:
        """The slices that may concern ``node``, in input order."""
        own = self.by_node.get(node.name, []) if node is not None else []
        if not own:
            return [s for _, s in self.shared]
        if not self.shared:
            return [s for _, s in own]
        return [s for _, s in sorted(own + self.shared, key=lambda pair: pair[0])]


def gather_pools(
    slices: list[ResourceSlice] | SliceIndex,
    node: Node | None,
    features: Features,
    cache: PoolCache | None = None,
) -> list[Pool]:
    """The pools ``node`` can use; raises :class:`NodeSelectorError` on a bad selector.

    ``cache`` shares built pools between nodes: a pool built from the same slices
    is the same whichever node asks (counter slices are seen from every node).
    Pools with binding-condition devices come after every other pool (1.35
    experimental on; so the allocator prefers devices that need no binding
    conditions), and in 1.34/1.35's experimental allocator such slices also
    come after the others of their pool.
    """
    variant = Variant.of(features)
    index = slices if isinstance(slices, SliceIndex) else SliceIndex(slices)
    built: PoolCache = {} if cache is None else cache
    grouped: dict[tuple[str, str], list[ResourceSlice]] = {}
    deferred: list[ResourceSlice] = []
    for slice_ in index.for_node(node):
        if not _slice_for_node(slice_, node, features, variant):
            continue
        if (
            variant.binding_slices_last
            # 1.35 adds a slice with sharedCounters at once; 1.34 defers it like any
            # other (there devices and their counter sets share a slice).
            and (variant.minor < 35 or not slice_.spec.shared_counters)
            and _has_binding_conditions(slice_)
        ):
            deferred.append(slice_)
            continue
        _group(grouped, slice_)
    for slice_ in deferred:
        _group(grouped, slice_)
    pools = _pools(index, grouped, built, features, variant)
    if variant.pools_sorted:
        pools.sort(key=lambda p: (p.driver, p.name))
    if not variant.binding_pools_last:
        return pools
    return [p for p in pools if not _pool_binds(p)] + [p for p in pools if _pool_binds(p)]


def _has_binding_conditions(slice_: ResourceSlice) -> bool:
    return any(d.binding_conditions is not None for d in slice_.spec.devices or [])


def _pool_binds(pool: Pool) -> bool:
    return any(_has_binding_conditions(s) for s in pool.slices)


def _group(grouped: dict[tuple[str, str], list[ResourceSlice]], slice_: ResourceSlice) -> None:
    """addSlice: keep the newest generation of each pool."""
    key = (slice_.spec.driver, slice_.spec.pool.name)
    current = grouped.get(key)
    generation = slice_.spec.pool.generation
    if current is None or generation > current[0].spec.pool.generation:
        grouped[key] = [slice_]
    elif generation == current[0].spec.pool.generation:
        current.append(slice_)


def _pools(
    index: SliceIndex,
    grouped: dict[tuple[str, str], list[ResourceSlice]],
    built: PoolCache,
    features: Features,
    variant: Variant,
) -> list[Pool]:
    pools: list[Pool] = []
    for (driver, name), members in grouped.items():
        wanted = members[0].spec.pool.resource_slice_count
        if variant.pools_by_node_slices:
            pool = _cached(built, driver, name, members, features, None, variant)
            pools.append(pool)
            continue
        if len(members) == wanted:
            pools.append(_cached(built, driver, name, members, features, None, variant))
            continue
        newer, same_generation = _pool_slices(
            index.by_pool.get((driver, name), []), members[0].spec.pool.generation
        )
        if newer:
            continue  # obsolete: a newer generation has no slice for this node
        if variant.ignores_compatibility_group_slices and not features.compatibility_groups:
            same_generation = [s for s in same_generation if not uses_compatibility_groups(s)]
        if len(same_generation) != wanted:
            pools.append(Pool(driver, name, incomplete=True))
            continue
        pools.append(_cached(built, driver, name, members, features, same_generation, variant))
    return pools


def _cached(
    built: PoolCache,
    driver: str,
    name: str,
    members: list[ResourceSlice],
    features: Features,
    all_members: list[ResourceSlice] | None,
    variant: Variant,
) -> Pool:
    key = (
        driver,
        name,
        tuple(id(s) for s in members),
        tuple(id(s) for s in all_members) if all_members is not None else None,
    )
    pool = built.get(key)
    if pool is None:
        pool = built[key] = _build(driver, name, members, features, all_members, variant)
    return pool


def _pool_slices(
    pool_slices: list[ResourceSlice], generation: int
) -> tuple[bool, list[ResourceSlice]]:
    """checkSlicesInPool over the pool's own slices: a newer generation exists, or the
    slices of ``generation``."""
    same: list[ResourceSlice] = []
    for slice_ in pool_slices:
        if slice_.spec.pool.generation > generation:
            return True, []
        if slice_.spec.pool.generation == generation:
            same.append(slice_)
    return False, same


def _build(
    driver: str,
    name: str,
    members: list[ResourceSlice],
    features: Features,
    all_members: list[ResourceSlice] | None,
    variant: Variant,
) -> Pool:
    """buildPool: device slices (by name from 1.36), counter sets, the pool's other slices."""
    pool = Pool(driver, name)
    if variant.pools_by_node_slices:
        # 1.34 (poolIsInvalid): every slice holds devices (and maybe its own counters).
        pool.slices = members
        pool.incomplete = len(members) != members[0].spec.pool.resource_slice_count
        seen_1_34: set[str] = set()
        for slice_ in members:
            for device in slice_.spec.devices or []:
                if device.name in seen_1_34:
                    pool.invalid = f"duplicate device name {device.name}"
                    return pool
                seen_1_34.add(device.name)
        return pool
    if variant.pools_sorted:
        members = sorted(members, key=lambda s: s.metadata.name)
    if features.partitionable_devices:
        device_slices = [s for s in members if not s.spec.shared_counters]
        counter_slices = [s for s in members if s.spec.shared_counters]
    else:
        device_slices, counter_slices = members, []
    others: list[ResourceSlice] = []
    if all_members is not None and len(all_members) > len(members):
        ours = {id(s) for s in members}
        for slice_ in all_members:
            if id(slice_) in ours:
                continue
            # 1.37 incubating/experimental see a counter slice of another node only here.
            if features.partitionable_devices and slice_.spec.shared_counters:
                counter_slices.append(slice_)
            else:
                others.append(slice_)
    seen: set[str] = set()
    for slice_ in device_slices:
        for device in slice_.spec.devices or []:
            if device.name in seen:
                pool.invalid = f"duplicate device name {device.name}"
                return pool
            seen.add(device.name)
    pool.slices = device_slices
    if not features.partitionable_devices:
        return pool
    for slice_ in counter_slices:
        for counter_set in slice_.spec.shared_counters or []:
            if counter_set.name in pool.counter_sets:
                pool.invalid = f"duplicate counter set name {counter_set.name}"
                return pool
            pool.counter_sets[counter_set.name] = {
                k: Quantity.parse(c.value) for k, c in counter_set.counters.items()
            }
    pool.invalid = _counter_problem(pool.counter_sets, members)
    if pool.invalid or not others:
        return pool
    pool.other_slices = others
    pool.invalid = _counter_problem(pool.counter_sets, pool.other_slices)
    return pool


def _counter_problem(
    counter_sets: dict[str, dict[str, Quantity]], slices: list[ResourceSlice]
) -> str | None:
    for slice_ in slices:
        for device in slice_.spec.devices or []:
            for consumption in device.consumes_counters or []:
                counters = counter_sets.get(consumption.counter_set)
                if counters is None:
                    return f"counter set {consumption.counter_set} not found"
                for counter in consumption.counters:
                    if counter not in counters:
                        return (
                            f"counter {counter} not found in counter set {consumption.counter_set}"
                        )
    return None
