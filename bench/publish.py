"""Benchmark: the publisher on 1,000 simulated nodes (dgx-h100 and dgx-a100, DynamicMIG on).

Prints, without asserting anything:

1. render: every node's slices rendered once (no API), total time, slices/s;
2. publish: all nodes' inventories through the bus into a recording sink,
   time until every slice is written;
3. change -> slice written: one device change at a time (an XID on a random
   GPU of a random node, so one device's taints change), from the inventory
   put into KV ``inventory`` to the sink recording the write, p50/p99/max;
4. repeat: the same inventories again, which must cause zero writes;
5. peak RSS of this process (publisher + its in-process sink + the bus client).

The default sink is :class:`MemorySliceApi` (compressed storage, no watch
history). With ``--apiserver`` the publisher writes through the real
:class:`KubeSliceApi` to a Kubernetes 1.35 control plane started by
:class:`services.local.cluster.ControlPlane` (gates DRAPartitionableDevices and
DRADeviceTaints on, as the bench renders counters and taints; the Nodes are
created first, timed); a write counts once the API server has answered it, i.e.
the slice is stored. The control-plane processes are not in the peak RSS.
On the 2-core dev machine ``--apiserver`` takes about 2.5 min at 1,000 nodes
(control plane ~4 s, 1,000 Nodes ~2 s, the first 9,000 slice writes 75-95 s)
and about 30 s with ``--nodes 200``.
Usage: ``python bench/publish.py [--nodes 1000] [--changes 200] [--direct] [--apiserver]
[--workers 16] [--qps 500] [--burst 1000]`` (``--direct`` skips NATS and hands
inventories to the publisher in-process; the last three are the publisher's
``--workers``, ``--kube-api-qps`` and ``--kube-api-burst``; the defaults are its own).
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import random
import statistics
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import msgspec

from services.core.bus import subjects
from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.core.kube import client as kube
from services.core.kube.resource import ResourceSlice
from services.core.model import featuregates
from services.core.model.schemas import GpuHealth, NodeInventory, Xid
from services.local.natsserver import NatsServer
from services.offline.slices import fleet_inventory
from services.publisher.kubeapi import KubeSliceApi
from services.publisher.memoryapi import MemorySliceApi, Write
from services.publisher.render import RenderOptions, render_contents
from services.publisher.service import Publisher, PublisherConfig
from services.publisher.tuning import DEFAULT_BURST, DEFAULT_QPS, DEFAULT_WORKERS

if TYPE_CHECKING:
    from services.local.cluster import ControlPlane

# The publisher's heaviest pools: counter sets (DynamicMIG) and XID taints together.
# The reference refuses these gates together at start-up (so does featuregates.parse);
# the bench builds them directly to keep measuring that worst case.
GATES = "DynamicMIG=true,NVMLDeviceHealthCheck=true"
FLEETS = ("dgx-h100", "dgx-a100")
XIDS = (79, 48, 94, 63, 74)
#: API server gates the rendered slices need (counters of DynamicMIG, XID taints).
APISERVER_GATES = {"DRAPartitionableDevices": True, "DRADeviceTaints": True}
NODE_CREATE_CONCURRENCY = 16


def _node_name(i: int) -> str:
    return f"gpu-node-{i:04d}"


def _inventories(count: int) -> Iterator[NodeInventory]:
    """Each node booted from its fleet (one in two of each); made on demand, not kept."""
    for i in range(count):
        yield fleet_inventory(FLEETS[i % 2], _node_name(i), seed=i)


def _peak_rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def bench_render(count: int, options: RenderOptions) -> None:
    elapsed = 0.0
    slices = devices = 0
    for inv in _inventories(count):
        start = time.perf_counter()
        contents = render_contents(inv, options)
        elapsed += time.perf_counter() - start
        slices += len(contents)
        devices += sum(len(c.devices or []) for c in contents)
    print(
        f"render:  {count} nodes -> {slices} slices, {devices} devices in {elapsed:.3f} s "
        f"({slices / elapsed:,.0f} slices/s, {devices / elapsed:,.0f} devices/s, "
        f"{elapsed / count * 1e3:.2f} ms/node)"
    )


def _changed(inv: NodeInventory, rng: random.Random) -> NodeInventory:
    """One device's health changes: a new XID on a GPU that is published as a full GPU."""
    whole = [i for i, g in enumerate(inv.gpus) if not g.mig_enabled]
    index = rng.choice(whole)
    gpu = inv.gpus[index]
    xid = Xid(rng.choice(XIDS), time.time())
    gpus = list(inv.gpus)
    gpus[index] = msgspec.structs.replace(gpu, health=GpuHealth(xids=[*gpu.health.xids, xid]))
    return msgspec.structs.replace(inv, gpus=gpus)


class Recorder(Protocol):
    """What the bench reads of a sink: every write, with when it completed."""

    writes: list[Write]


class RecordingKubeSliceApi(KubeSliceApi):
    """The real API client; a write is recorded once the API server has answered it."""

    def __init__(self, api: kube.KubeApi) -> None:
        super().__init__(api)
        self.writes: list[Write] = []

    async def create(self, obj: ResourceSlice) -> ResourceSlice:
        stored = await super().create(obj)
        self.writes.append(Write("create", obj.metadata.name, obj.spec.node_name or "", _now()))
        return stored

    async def replace(self, obj: ResourceSlice) -> ResourceSlice:
        stored = await super().replace(obj)
        self.writes.append(Write("update", obj.metadata.name, obj.spec.node_name or "", _now()))
        return stored

    async def delete(self, name: str, *, uid: str | None, resource_version: str | None) -> None:
        await super().delete(name, uid=uid, resource_version=resource_version)
        self.writes.append(Write("delete", name, "", _now()))


def _now() -> float:
    return time.monotonic()


class Feed:
    """How inventories reach the publisher: through KV ``inventory``, or handed over directly."""

    def __init__(self, publisher: Publisher, bus: Bus | None) -> None:
        self.publisher, self.bus = publisher, bus

    async def put(self, inv: NodeInventory) -> None:
        if self.bus is None:
            self.publisher.set_inventory(inv.node, inv)
        else:
            await self.bus.kv_put(subjects.INVENTORY_BUCKET, subjects.inventory_key(inv.node), inv)


@dataclass
class Client:
    """The publisher's API client settings (its CLI's --workers, --kube-api-qps/-burst)."""

    workers: int = DEFAULT_WORKERS
    qps: float = DEFAULT_QPS
    burst: int = DEFAULT_BURST


async def bench_publish(
    count: int,
    changes: int,
    options: RenderOptions,
    direct: bool,
    apiserver: bool,
    client: Client | None = None,
) -> None:
    client = client or Client()
    if apiserver:
        print(f"client: {client.workers} workers, {client.qps:g} QPS, burst {client.burst}")
        async with _apiserver_sink(count, client) as (api, cp):
            await _publish(api, count, changes, options, direct, client.workers)
            # kubectl lists in its own process, so the listing stays out of our peak RSS.
            names = cp.kubectl("get", "resourceslices", "-o", "name", timeout=300).split()
            print(f"apiserver: {len(names)} slices stored")
        return
    memory = MemorySliceApi(minor=options.kube_minor, compress=True, history_size=0)
    await _publish(memory, count, changes, options, direct, client.workers)
    stored = memory.stored_bytes() / 2**20
    print(f"sink:    {memory.count()} slices stored, {stored:.1f} MiB compressed")


@asynccontextmanager
async def _apiserver_sink(
    count: int, client: Client
) -> AsyncIterator[tuple[RecordingKubeSliceApi, ControlPlane]]:
    """A control plane with ``count`` Nodes, and the publisher's client to it."""
    from services.local.cluster import ControlPlane as control_plane
    from services.local.kubebinary import build_controlplane as build

    start = time.perf_counter()
    cp = control_plane(build(), feature_gates=APISERVER_GATES).start()
    try:
        print(f"apiserver: control plane up in {time.perf_counter() - start:.1f} s ({cp.server})")
        api = RecordingKubeSliceApi(
            await kube.http_api(str(cp.kubeconfig), qps=client.qps, burst=client.burst)
        )
        try:
            start = time.perf_counter()
            await _create_nodes(api.api, count)
            elapsed = time.perf_counter() - start
            print(f"apiserver: {count} Nodes created in {elapsed:.1f} s")
            yield api, cp
        finally:
            await api.close()
    finally:
        cp.cleanup()


async def _create_nodes(api: kube.KubeApi, count: int) -> None:
    """Bare Nodes (the publisher needs only their UIDs as slice owners), a few at a time."""
    gate = asyncio.Semaphore(NODE_CREATE_CONCURRENCY)

    async def one(i: int) -> None:
        body = {"apiVersion": "v1", "kind": "Node", "metadata": {"name": _node_name(i)}}
        async with gate:
            await api.create("/api/v1/nodes", body)

    await asyncio.gather(*(one(i) for i in range(count)))


async def _publish(
    sink: MemorySliceApi | RecordingKubeSliceApi,
    count: int,
    changes: int,
    options: RenderOptions,
    direct: bool,
    workers: int = DEFAULT_WORKERS,
) -> None:
    config = PublisherConfig(
        render=options, kube_minor=options.kube_minor, force_registered=True, workers=workers
    )
    publisher = Publisher(sink, config)
    with tempfile.TemporaryDirectory() as tmp:
        nats = None if direct else NatsServer(Path(tmp) / "nats")
        bus = None
        if nats is not None:
            nats.start()
            nats.provision()
            bus = await Bus.connect(
                nats.url,
                name="bench",
                identity=Identity(Role.ADMIN),
                credentials=nats.credentials(Role.ADMIN),
            )
        service = asyncio.create_task(_serve(publisher, bus))
        try:
            feed = Feed(publisher, bus)
            await asyncio.sleep(0.2)
            _rss("start")
            await _initial(publisher, feed, sink, count)
            _rss("initial")
            await _changes(publisher, feed, sink, count, changes)
            _rss("changes")
            await _repeat(publisher, feed, sink)
            _rss("repeat")
        finally:
            service.cancel()
            await asyncio.gather(service, return_exceptions=True)
            if bus is not None:
                await bus.close()
            if nats is not None:
                nats.stop()


async def _serve(publisher: Publisher, bus: Bus | None) -> None:
    if bus is not None:
        await publisher.run(bus)
        return
    await asyncio.gather(*(publisher.work() for _ in range(publisher.config.workers)))


async def _initial(publisher: Publisher, feed: Feed, sink: Recorder, count: int) -> None:
    start = time.perf_counter()
    for inv in _inventories(count):
        await feed.put(inv)
    await _until(lambda: len(publisher.published) == count)
    await publisher.settle(timeout=600)
    elapsed = time.perf_counter() - start
    print(
        f"publish: {count} nodes, {len(sink.writes)} slice writes in {elapsed:.2f} s "
        f"({len(sink.writes) / elapsed:,.0f} writes/s, inventories built and fed included)"
    )


async def _changes(
    publisher: Publisher, feed: Feed, sink: Recorder, count: int, changes: int
) -> None:
    rng = random.Random(7)
    latencies: list[float] = []
    for _ in range(changes):
        node = _node_name(rng.randrange(count))
        current = publisher.inventory(node)
        assert current is not None
        changed = _changed(current, rng)
        before = len(sink.writes)
        start = time.monotonic()
        await feed.put(changed)
        await _until(functools.partial(_more_than, sink, before), timeout=10)
        latencies.append((sink.writes[before].at - start) * 1e3)
        await publisher.settle()
    print(
        f"change:  {changes} single-device changes -> slice written: "
        f"p50 {statistics.median(latencies):.1f} ms, p99 {_pct(latencies, 0.99):.1f} ms, "
        f"max {max(latencies):.1f} ms"
    )


async def _repeat(publisher: Publisher, feed: Feed, sink: Recorder) -> None:
    before = len(sink.writes)
    nodes = sorted(publisher.nodes)
    for node in nodes:
        inv = publisher.inventory(node)
        assert inv is not None
        await feed.put(inv)
    await asyncio.sleep(0.5)
    await publisher.settle()
    print(f"repeat:  the same {len(nodes)} inventories again -> {len(sink.writes) - before} writes")


def _more_than(sink: Recorder, writes: int) -> bool:
    return len(sink.writes) > writes


async def _until(condition: Callable[[], bool], timeout: float = 600.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise TimeoutError("benchmark step did not finish")
        await asyncio.sleep(0.001)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--changes", type=int, default=200)
    parser.add_argument("--kube-version", type=int, default=35, help="API minor (layout)")
    parser.add_argument(
        "--direct", action="store_true", help="no NATS: feed the publisher directly"
    )
    parser.add_argument("--render-only", action="store_true")
    parser.add_argument(
        "--apiserver",
        action="store_true",
        help="write to a real kube-apiserver (the local control plane), not the memory sink",
    )
    parser.add_argument("--workers", type=int, default=DEFAULT_WORKERS)
    parser.add_argument("--qps", type=float, default=DEFAULT_QPS, help="API client budget")
    parser.add_argument("--burst", type=int, default=DEFAULT_BURST)
    args = parser.parse_args()
    gates = featuregates.FeatureGates(
        {**featuregates.DEFAULTS, **{g.split("=")[0]: True for g in GATES.split(",")}}
    )
    options = RenderOptions(gates=gates, kube_minor=args.kube_version)
    print(f"gates {GATES}, API 1.{args.kube_version}, fleets {'/'.join(FLEETS)} alternating")
    bench_render(args.nodes, options)
    _rss("render")
    if not args.render_only:
        client = Client(args.workers, args.qps, args.burst)
        asyncio.run(
            bench_publish(args.nodes, args.changes, options, args.direct, args.apiserver, client)
        )
    sink = "API client" if args.apiserver else "sink"
    print(f"peak RSS: {_peak_rss_mib():.0f} MiB (this process: publisher, {sink}, bus client)")


def _rss(label: str) -> None:
    now = [
        ln for ln in Path("/proc/self/status").read_text().splitlines() if ln.startswith("VmRSS")
    ]
    print(f"  [{label}] {now[0].split()[1]} kB now, peak {_peak_rss_mib():.0f} MiB")


if __name__ == "__main__":
    main()
