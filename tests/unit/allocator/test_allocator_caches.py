"""The allocator's speed-ups must not change a single outcome.

* Selector results are shared between devices with the same *facts* (the
  attribute and capacity values an expression reads) only when the expression
  reads nothing else of the device.
* Available counters are kept up to date by each commit instead of being
  recomputed; they must equal a recomputation.
* Gathering a node's pools through the slice index keeps input order.
* A claim shape skips the nodes already known not to fit it, and still falls
  through to the first node that fits, in name order.
* The claim watcher keeps one engine while only allocations change (they come
  and go with every pod); it must answer as an engine built afresh each time.
"""

from __future__ import annotations

import random
from typing import Any

import msgspec
import pytest

from services.allocator.cel.env import CelEnvironment
from services.allocator.cel.parse import parse
from services.allocator.cel.selector import signature
from services.allocator.structured import snapshot
from services.allocator.structured.engine import Engine
from services.allocator.structured.errors import AllocationError
from services.allocator.structured.features import Features, defaults
from services.allocator.structured.pools import Node, gather_pools
from services.allocator.structured.search import allocate
from services.allocator.structured.snapshot import Inputs, OfflineAllocator
from services.allocator.structured.state import AllocatedState
from services.allocator.watcher.pending import ClusterAllocator
from services.core.kube.resource import (
    DeviceClass,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceSlice,
)

DRIVER = "gpu.nvidia.com"


@pytest.mark.parametrize(
    ("expression", "facts"),
    [
        ('device.driver == "x"', [("driver",)]),
        (
            'device.attributes["gpu.nvidia.com"].type == "gpu" && '
            'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
            [("attributes", DRIVER, "type"), ("capacity", DRIVER, "memory")],
        ),
        ('device.attributes["d"]["name"] == 1', [("attributes", "d", "name")]),
        ('has(device.attributes["d"].name)', [("attributes", "d", "name")]),
        ('device.attributes[?"d"].?name.orValue(0) == 1', [("attributes", "d", "name")]),
        (
            'cel.bind(x, device.attributes["d"].a, x == 1 || x == 2)',
            [("attributes", "d", "a")],
        ),
    ],
)
def test_expressions_that_read_only_facts(expression: str, facts: list[tuple[str, ...]]) -> None:
    assert signature(parse(expression)) == tuple(facts)


@pytest.mark.parametrize(
    "expression",
    [
        '"name" in device.attributes["d"]',  # the whole map
        'device.attributes["d"].size() > 2',
        "device.attributes[device.driver].type == 1",  # a computed domain
        'device.attributes["d"][device.driver] == 1',  # a computed name
        "[1, 2].exists(device, device == 1)",  # a variable named device
        "device.attributes.exists(d, true)",
        'size(device.capacity) == 1 && device.driver == "x"',
    ],
)
def test_expressions_that_read_more_are_evaluated_per_device(expression: str) -> None:
    assert signature(parse(expression)) is None
    assert CelEnvironment().compile(expression).facts is None


def _slice(
    node: str, devices: list[dict[str, Any]], pool: str | None = None, **spec: Any
) -> ResourceSlice:
    body: dict[str, Any] = {
        "driver": DRIVER,
        "pool": {"name": pool or node, "generation": 1, "resourceSliceCount": 1},
        "devices": devices,
        **spec,
    }
    if not any(k in spec for k in ("allNodes", "nodeSelector", "sharedCounters")):
        body["nodeName"] = node
    return msgspec.convert({"metadata": {"name": f"{pool or node}-s"}, "spec": body}, ResourceSlice)


def _gpu(name: str, memory: str, version: str = "12.0.0") -> dict[str, Any]:
    return {
        "name": name,
        "attributes": {"type": {"string": "gpu"}, "cudaDriverVersion": {"version": version}},
        "capacity": {"memory": {"value": memory}},
    }


def _class(name: str = "gpu", expression: str = 'device.driver == "gpu.nvidia.com"') -> DeviceClass:
    return msgspec.convert(
        {"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": expression}}]}},
        DeviceClass,
    )


def _claim(name: str, selector: str | None = None, count: int = 1) -> ResourceClaim:
    exactly: dict[str, Any] = {"deviceClassName": "gpu", "count": count}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}},
        },
        ResourceClaim,
    )


def _devices(engine: Engine, claim: ResourceClaim, node: str) -> list[str]:
    allocation = allocate(engine, claim, Node(node))
    if allocation is None:
        return []
    engine.commit(allocation)
    return [r.device for r in (allocation.devices.results if allocation.devices else None) or []]


MEMORY_40 = 'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0'


def test_shared_results_follow_the_facts_not_the_device() -> None:
    slices = [
        _slice(
            "n1",
            [
                _gpu("small-0", "24Gi"),
                _gpu("big-0", "80Gi"),
                _gpu("small-1", "24Gi"),
                _gpu("big-1", "80Gi"),
            ],
        )
    ]
    engine = Engine({"gpu": _class()}, slices, Features())
    assert _devices(engine, _claim("a", MEMORY_40), "n1") == ["big-0"]
    assert _devices(engine, _claim("b", MEMORY_40), "n1") == ["big-1"]
    assert _devices(engine, _claim("c", MEMORY_40), "n1") == []
    assert _devices(engine, _claim("d"), "n1") == ["small-0"]


def test_a_device_with_a_bad_version_still_fails_its_selectors() -> None:
    """Upstream builds a device's whole attribute map first: a version that does not
    parse fails every selector on that device, even one that never reads it."""
    slices = [_slice("n1", [_gpu("good", "80Gi"), _gpu("bad", "80Gi", version="not-a-version")])]
    engine = Engine({"gpu": _class()}, slices, Features())
    assert _devices(engine, _claim("a", MEMORY_40), "n1") == ["good"]
    with pytest.raises(AllocationError, match="parse semantic version"):
        allocate(engine, _claim("b", MEMORY_40), Node("n1"))


def _partitionable(node: str) -> list[ResourceSlice]:
    counters = _slice(
        node,
        [],
        pool=node,
        sharedCounters=[{"name": "set", "counters": {"slices": {"value": "4"}}}],
    )
    counters.spec.devices = None
    counters.spec.pool.resource_slice_count = 2
    counters.metadata.name = f"{node}-counters"
    parts = _slice(
        node,
        [
            {
                "name": f"part-{i}",
                "attributes": {"type": {"string": "gpu"}},
                "consumesCounters": [
                    {"counterSet": "set", "counters": {"slices": {"value": str(size)}}}
                ],
            }
            for i, size in enumerate([2, 1, 2, 1, 1])
        ],
        pool=node,
    )
    parts.spec.pool.resource_slice_count = 2
    return [counters, parts]


def test_counters_kept_by_commits_equal_a_recomputation() -> None:
    features = Features(partitionable_devices=True)
    slices = _partitionable("n1")
    engine = Engine({"gpu": _class()}, slices, features)
    assert _devices(engine, _claim("a"), "n1") == ["part-0"]
    assert _devices(engine, _claim("b"), "n1") == ["part-1"]
    assert _devices(engine, _claim("c", count=2), "n1") == []  # part-2 (2) does not fit
    assert _devices(engine, _claim("d"), "n1") == ["part-3"]
    assert _devices(engine, _claim("e"), "n1") == []
    pool = engine.view(Node("n1")).pools[0]
    kept = engine.available_counters(pool)
    fresh = Engine({"gpu": _class()}, slices, features, AllocatedState())
    fresh.state = engine.state
    assert fresh.available_counters(fresh.view(Node("n1")).pools[0]) == kept
    assert kept == {"set": {"slices": 0}}


def test_pools_keep_input_order_across_node_and_shared_slices() -> None:
    slices = [
        _slice("n2", [_gpu("a", "1Gi")]),
        _slice("any", [_gpu("b", "1Gi")], pool="everywhere", allNodes=True),
        _slice("n1", [_gpu("c", "1Gi")]),
        _slice(
            "sel",
            [_gpu("d", "1Gi")],
            pool="labelled",
            nodeSelector={
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["z1"]}]}
                ]
            },
        ),
        _slice("n1", [_gpu("e", "1Gi")], pool="n1-second"),
    ]
    old = defaults(35)  # Go map order upstream: gpudra keeps first appearance
    pools = gather_pools(slices, Node("n1", {"zone": "z1"}), old)
    assert [p.name for p in pools] == ["everywhere", "n1", "labelled", "n1-second"]
    assert [p.name for p in gather_pools(slices, Node("n2"), old)] == ["n2", "everywhere"]
    assert [p.name for p in gather_pools(slices, None, old)] == ["everywhere"]
    # 1.36+ incubating/experimental sort pools by driver and name (sortPoolsByID).
    pools = gather_pools(slices, Node("n1", {"zone": "z1"}), Features())
    assert [p.name for p in pools] == ["everywhere", "labelled", "n1", "n1-second"]


def test_full_nodes_are_skipped_but_first_fit_in_name_order_holds() -> None:
    inputs = Inputs(
        classes={"gpu": _class()},
        slices=[_slice(n, [_gpu("g0", "1Gi"), _gpu("g1", "1Gi")]) for n in ("n3", "n1", "n2")],
        claims=[_claim(f"c{i}") for i in range(7)],
    )
    outcomes = OfflineAllocator(inputs, Features()).run()
    assert [o.node for o in outcomes] == ["n1", "n1", "n2", "n2", "n3", "n3", None]
    last = outcomes[-1]
    assert last.status == "unschedulable"
    assert last.explanation is not None and last.explanation.nodes == 3


def _mixed_cluster() -> list[ResourceSlice]:
    """Plain GPUs on three nodes, partitions drawing on counters on a fourth, and a
    pool every node sees (a freed device there concerns every node)."""
    slices = [_slice(n, [_gpu("g0", "40Gi"), _gpu("g1", "80Gi")]) for n in ("n1", "n2", "n3")]
    slices += _partitionable("n4")
    slices.append(_slice("any", [_gpu("shared", "80Gi")], pool="everywhere", allNodes=True))
    return slices


def _in_use(claim: ResourceClaim, uid: str, outcome_allocation: Any) -> ResourceClaim:
    used = msgspec.structs.replace(claim, status=ResourceClaimStatus(allocation=outcome_allocation))
    used.metadata = msgspec.structs.replace(claim.metadata, name=uid, uid=uid)
    return used


def _other_memory(slice_: ResourceSlice) -> ResourceSlice:
    """A copy whose first GPU has the other memory size (40 <-> 80 Gi), and whose second
    GPU is gone, or back."""
    copy = msgspec.convert(msgspec.to_builtins(slice_), ResourceSlice)
    devices = copy.spec.devices or []
    memory = (devices[0].capacity or {})["memory"]
    memory.value = "80Gi" if memory.value == "40Gi" else "40Gi"
    if len(devices) > 1:
        copy.spec.devices = devices[:1]
    elif copy.spec.node_name:
        copy.spec.devices = [*devices, msgspec.convert(_gpu("g1", "80Gi"), type(devices[0]))]
    return copy


PROBES = [
    _claim("p1"),
    _claim("p2", count=2),
    _claim("p3", count=3),
    _claim("p80", MEMORY_40.replace("40Gi", "80Gi")),
    _claim("p2x80", MEMORY_40.replace("40Gi", "80Gi"), count=2),
]


@pytest.mark.parametrize(("seed", "log_kept"), [(0, 4096), (1, 4096), (2, 4096), (3, 4096), (4, 0)])
def test_the_kept_engine_answers_as_a_fresh_one_while_allocations_come_and_go(
    seed: int, log_kept: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Also while slices change: a node's own (its GPUs' memory, a GPU gone or back), or
    the pool every node sees (the engine then starts over). With ``log_kept`` 0 the log
    of changed nodes starts again every few steps."""
    monkeypatch.setattr(snapshot, "LOG_KEPT", log_kept)
    rng = random.Random(seed)
    features = Features(partitionable_devices=True)
    classes, slices = [_class()], _mixed_cluster()
    kept = ClusterAllocator(features)
    in_use: dict[str, ResourceClaim] = {}
    version = 0
    for step in range(100):
        if rng.random() < 0.25:
            index = rng.choice([0, 1, 2, len(slices) - 1])
            slices[index] = _other_memory(slices[index])
            version += 1
        kept.update(1, version, step, classes, slices, list(in_use.values()), [])
        fresh = ClusterAllocator(features)
        fresh.update(1, version, step, classes, slices, list(in_use.values()), [])
        for probe in PROBES:
            a, b = kept.explain(probe), fresh.explain(probe)
            assert (a.status, a.node, a.allocation) == (b.status, b.node, b.allocation), step
            lines = (a.explanation.lines() if a.explanation else None) == (
                b.explanation.lines() if b.explanation else None
            )
            assert lines, (step, probe.metadata.name)
        # Next: a few claims deleted, scheduled or moved (same uid, new devices) at once,
        # each placed on a node drawn at random.
        for _ in range(rng.randint(1, 3)):
            action = rng.random()
            if in_use and action < 0.4:
                del in_use[rng.choice(sorted(in_use))]
                continue
            uid = rng.choice(sorted(in_use)) if in_use and action < 0.55 else f"c{step}-{action}"
            others = [c for u, c in in_use.items() if u != uid]
            placer = OfflineAllocator(
                Inputs(classes={"gpu": classes[0]}, slices=slices, claims=others), features
            )
            node = rng.choice(placer.nodes(None))
            placed = placer.allocate(rng.choice(PROBES), [node])
            if placed.status == "allocated":
                in_use[uid] = _in_use(placed.claim, uid, placed.allocation)
