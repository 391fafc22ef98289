"""Benchmark: a cluster of N simulated GPU nodes on one bus, under a claim churn.

    python bench/scale.py [--nodes 100 1000 5000] [--rate 5] [--duration 120]
                          [--lifetime 20] [--unsatisfiable 0.1] [--nodes-per-host 1250]

Per N, on this machine: the real control plane (etcd, kube-apiserver,
kube-scheduler, kube-controller-manager), a 3-server NATS JetStream cluster
(TLS, one nkey identity per component with production's permissions, streams
and buckets with 3 replicas), the real publisher and claim watcher processes,
and N nodes hosted ``--nodes-per-host`` to a process (bench/scalenodes.py: each
node its own discovery, front and preparer identity; the production bus code,
no device work). Prints, without asserting anything:

1. nodes: N Nodes created; the node hosts on the bus;
2. first publish: the publisher started with every inventory and presence in KV,
   from its first slice stored (ResourceSlices counted by the API server) to its
   last "slices synced" log line (its metrics are not scraped meanwhile: a scrape
   takes its CPU), slices/s, and the API server's and the publisher's CPU per
   write from its first write (the publisher's also from its start: reading the
   bus, listing);
3. limit: the same ResourceSlices (copies under another driver name) created by
   a plain client at ``--ingest-concurrency`` in flight, slices/s and the API
   server's CPU per write, then deleted; the publisher's first publish as a ratio
   of it;
4. changes: one device change (an XID) on each of ``--changes`` nodes at once,
   until the publisher's rewrites are stored: writes/s as a ratio of the limit;
5. the claim watcher started, and its first explanation (a pod nothing fits),
   whose CPU is printed apart: it classifies every node once, which the
   explanations after it no longer do;
6. churn: ``--rate`` pods per second for ``--duration`` s, each with a claim from
   a template (a share ``--unsatisfiable`` asking for a GPU no node has), deleted
   ``--lifetime`` s after creation; then until every claim is gone. From the
   CLAIMS stream: events per claim life, pod created -> allocated -> prepared
   p50/p99 (the events' store times; created -> allocated is the controller
   manager's and the scheduler's, allocated -> prepared the watcher's event, the
   bus and the node's); from the servers: bus messages and bytes
   per claim life (every server's in + out, so routes and replication count),
   JetStream storage per claim and its growth per hour at that rate; the claim
   watcher's CPU per claim event and per explanation
   (``gpudra_allocator_explain_cpu_seconds_total``); the publisher's writes;
   kube-scheduler's attempts by result with their mean wall time and its active
   queue (sampled from its metrics), which tell its delay from gpudra's;
7. peak RSS (and CPU over the whole run) of each central process.

The defaults are what a 5,000-node cluster sees: 40,000 GPUs whose jobs run about
two hours each start about 5.5 pods a second. The scheduler and controller manager
get a larger API budget (``CLIENT_BUDGET``), as large clusters give them. On the
2-core development machine 100, 1,000 and 5,000 nodes take about 5, 7 and 15 min
and 5,000 nodes about 15 GiB of memory (nats-server, the node hosts, the API server).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import math
import os
import random
import re
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench.prepare import cpu_seconds, interrupt_on_sigterm, peak_rss_mb  # noqa: E402
from bench.scalenodes import fleet_of, node_name  # noqa: E402
from services.core.bus import subjects  # noqa: E402
from services.core.bus.access import Identity, Role  # noqa: E402
from services.core.bus.client import Bus  # noqa: E402
from services.core.kube import client as kube  # noqa: E402
from services.core.model.schemas import (  # noqa: E402
    ClaimEvent,
    GpuHealth,
    NodeInventory,
    Xid,
    decode,
)
from services.local.cluster import ControlPlane  # noqa: E402
from services.local.clusteradmin import ready_node  # noqa: E402
from services.local.component import Process  # noqa: E402
from services.local.kubebinary import build_controlplane  # noqa: E402
from services.local.natsserver import NatsCluster  # noqa: E402
from services.local.ports import free_port  # noqa: E402
from services.offline.slices import fleet_inventory  # noqa: E402

SLICES = "/apis/resource.k8s.io/v1/resourceslices"
NAMESPACE = "scale"
PLAIN_DRIVER = "plain.bench.gpudra.dev"
PLAIN_LABEL = "bench.gpudra.dev/plain"
NODE_ROLES = (Role.DISCOVERY, Role.PREPARER, Role.FRONT)
CENTRAL_ROLES = (Role.PUBLISHER, Role.ALLOCATOR, Role.AUDITOR)
GB = 1024**3
#: The controller manager's and scheduler's API budget, as large clusters raise it: at their
#: defaults (20 and 50 requests/s) 5 pods/s queued the claim controller to 18 s (p99).
CLIENT_BUDGET = ("--kube-api-qps=200", "--kube-api-burst=400")


# ------------------------------------------------------------------ measuring


def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q / 100 * (len(ordered) - 1)))]


def scrape(port: int) -> dict[str, float]:
    """A Prometheus text page, summed per metric name and label set."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    return parse_metrics(text)


def scrape_scheduler(cp: ControlPlane) -> dict[str, float]:
    """kube-scheduler's metrics (its secure port, as the admin)."""
    port = cp.ports["scheduler"]
    return parse_metrics(cp.component_get(port, "/metrics", as_admin=True, timeout=10))


def parse_metrics(text: str) -> dict[str, float]:
    found: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            try:
                found[name] = float(value)
            except ValueError:
                continue
    return found


def metric(page: dict[str, float], name: str, **labels: str) -> float:
    """The sum of ``name``'s series whose labels include ``labels``."""
    total = 0.0
    for key, value in page.items():
        base, _, rest = key.partition("{")
        if base != name:
            continue
        if all(f'{k}="{v}"' in rest for k, v in labels.items()):
            total += value
    return total


def varz(port: int) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/varz", timeout=10) as reply:
        result: dict[str, Any] = json.loads(reply.read())
        return result


@dataclass
class Traffic:
    msgs: int = 0
    bytes: int = 0

    @classmethod
    def of(cls, nats: NatsCluster) -> Traffic:
        total = cls()
        for server in nats.servers:
            assert server.monitor_port is not None
            v = varz(server.monitor_port)
            total.msgs += v["in_msgs"] + v["out_msgs"]
            total.bytes += v["in_bytes"] + v["out_bytes"]
        return total

    def __sub__(self, other: Traffic) -> Traffic:
        return Traffic(self.msgs - other.msgs, self.bytes - other.bytes)


@dataclass
class Central:
    """The processes whose cost grows with the cluster, by name and PID."""

    pids: dict[str, int] = field(default_factory=dict)

    def cpu(self) -> dict[str, float]:
        return {name: _cpu(pid) for name, pid in self.pids.items()}

    def report(self, wall: float) -> None:
        print("  process           peak RSS      CPU (s)   CPU share of one core")
        now = self.cpu()
        for name, pid in self.pids.items():
            used = now[name]
            rss = _rss(pid)
            print(f"  {name:<16} {rss:8.0f} MiB {used:9.1f}   {used / wall:6.1%}")


def _cpu(pid: int) -> float:
    try:
        return cpu_seconds(pid)
    except OSError:
        return math.nan


def _rss(pid: int) -> float:
    try:
        return peak_rss_mb(pid)
    except OSError:
        return math.nan


# ------------------------------------------------------------------ the cluster


@dataclass
class Cluster:
    root: Path
    nodes: int
    cp: ControlPlane
    nats: NatsCluster
    central: Central
    gates: str
    publisher_args: list[str]
    procs: list[Process] = field(default_factory=list)
    ports: dict[str, int] = field(default_factory=dict)

    def spawn(self, name: str, argv: list[str], pid_name: str = "") -> Process:
        process = Process.start(name, argv, self.root / f"{name}.log", cwd=REPO)
        self.procs.append(process)
        if pid_name:
            self.central.pids[pid_name] = process.pid
        return process

    def service(self, role: Role, *args: str) -> Process:
        port = self.ports[str(role)] = free_port()
        argv = [sys.executable, "-m", "services.cli", str(role),
                *self.nats.client_argv(role), "--log-level", "info", "--metrics-port",
                str(port), "--kubeconfig", str(self.cp.kubeconfig), *args]  # fmt: skip
        return self.spawn(str(role), argv, str(role))

    async def connect(self, role: Role, node: str = "") -> Bus:
        """A bus client as ``role`` (of ``node``), with that identity's permissions."""
        identity = Identity(role, node)
        credentials = self.nats.access.credentials(identity)
        return await Bus.connect(
            self.nats.url, name=f"bench-{identity.name}", identity=identity, credentials=credentials
        )

    def stop(self) -> None:
        """Every process started here at once (a node host closes 1,250 nodes' buses)."""
        with ThreadPoolExecutor(max(1, len(self.procs))) as pool:
            list(pool.map(lambda p: p.stop(20), reversed(self.procs)))
        self.nats.stop()
        self.cp.stop()


@contextmanager
def cluster(n: int, args: argparse.Namespace) -> Iterator[Cluster]:
    root = Path(tempfile.mkdtemp(prefix=f"gpudra-scale-{n}-"))
    nats = NatsCluster(root / "nats", monitor=True)
    # Every identity before the servers start: their config is written once, not
    # reloaded for each of the 3N node identities.
    nats.access.ensure()
    for i in range(n):
        for role in NODE_ROLES:
            nats.access.user(Identity(role, node_name(i)))
    for role in CENTRAL_ROLES:
        nats.access.user(Identity(role))
    gates = {"DRADeviceTaints": True, "DRAPartitionableDevices": True}
    cp = ControlPlane(
        build_controlplane(),
        workdir=root / "cp",
        feature_gates=gates,
        verbosity=1,
        extra_args={name: CLIENT_BUDGET for name in ("kube-controller-manager", "kube-scheduler")},
    )
    workers = ["--workers", str(args.publisher_workers)] if args.publisher_workers else []
    c = Cluster(root, n, cp, nats, Central(), args.publisher_gates, workers)
    try:
        start = time.perf_counter()
        nats.start(timeout=120)
        nats.provision(timeout=120)
        for i, server in enumerate(nats.servers):
            assert server.pid is not None
            c.central.pids[f"nats-server-{i}"] = server.pid
        cp.start()
        cp.apply((REPO / "deploy" / "deviceclasses.yaml").read_text())
        for proc in cp.processes:
            c.central.pids[proc.name] = proc.pid
        print(f"  up: NATS cluster ({3 * n + 3} identities) and control plane "
              f"in {time.perf_counter() - start:.1f} s")  # fmt: skip
        yield c
    finally:
        c.stop()
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
        else:
            print(f"  kept: {root}")


async def create_nodes(api: kube.KubeApi, n: int) -> None:
    """Ready Nodes as a kubelet registers them (status kept, no not-ready taint)."""
    gate = asyncio.Semaphore(32)

    async def one(i: int) -> None:
        body = ready_node(node_name(i), {}, "v1.37.0")
        async with gate:
            await api.create("/api/v1/nodes", body)
            await api.patch(f"/api/v1/nodes/{node_name(i)}", {"spec": {"taints": None}})

    await asyncio.gather(*(one(i) for i in range(n)))


async def count_slices(api: kube.KubeApi, selector: str = "") -> int:
    params = {"limit": "1"}
    if selector:
        params["labelSelector"] = selector
    raw = await api.get(f"{SLICES}?" + "&".join(f"{k}={v}" for k, v in params.items()))
    listing = json.loads(raw)
    return len(listing["items"]) + int(listing["metadata"].get("remainingItemCount") or 0)


async def list_slices(api: kube.KubeApi) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = []
    token = ""
    while True:
        query = "limit=500" + (f"&continue={token}" if token else "")
        listing = json.loads(await api.get(f"{SLICES}?{query}"))
        found += listing["items"]
        token = listing["metadata"].get("continue") or ""
        if not token:
            return found


async def until(check: Callable[[], Awaitable[bool]], timeout: float, every: float = 0.5) -> None:
    """Until ``await check()`` is true; raises after ``timeout``."""
    deadline = time.perf_counter() + timeout
    while not await check():
        if time.perf_counter() > deadline:
            raise TimeoutError(f"not done within {timeout} s")
        await asyncio.sleep(every)


def apiserver_cpu(c: Cluster) -> float:
    return sum(_cpu(c.central.pids[name]) for name in ("kube-apiserver", "etcd"))


# ------------------------------------------------------------------ phases


async def start_node_hosts(c: Cluster, per_host: int) -> None:
    start = time.perf_counter()
    hosts = []
    for first in range(0, c.nodes, per_host):
        count = min(per_host, c.nodes - first)
        argv = [sys.executable, "-m", "bench.scalenodes", "--nats-url", c.nats.url,
                "--access", str(c.nats.access.root), "--kubeconfig", str(c.cp.kubeconfig),
                "--first", str(first), "--count", str(count)]  # fmt: skip
        name = f"nodes-{first}"
        hosts.append((name, c.spawn(name, argv)))
    for name, proc in hosts:
        log = c.root / f"{name}.log"
        while "ready " not in log.read_text(errors="replace"):
            if not proc.running():
                raise RuntimeError(f"{name} exited: {log.read_text()[-2000:]}")
            await asyncio.sleep(0.5)
        c.central.pids[name] = proc.pid
    print(f"  nodes: {c.nodes} on the bus in {len(hosts)} host process(es) "
          f"in {time.perf_counter() - start:.1f} s")  # fmt: skip


async def first_publish(c: Cluster, api: kube.KubeApi) -> float:
    """The publisher's start, until it says every node is published."""
    before = apiserver_cpu(c)
    start = time.time()
    publisher = c.service(Role.PUBLISHER, "--feature-gates", c.gates, *c.publisher_args)

    none_at = start  # when the last listing that found no slice was sent
    before_writes = (0.0, before)  # the publisher's and the API server's CPU then

    async def written() -> bool:
        nonlocal none_at, before_writes
        sent, used = time.time(), (_cpu(publisher.pid), apiserver_cpu(c))
        if await count_slices(api) > 0:
            return True
        none_at, before_writes = sent, used
        return False

    log = c.root / "publisher.log"

    async def done() -> bool:  # its log, not its metrics: a scrape takes the publisher's CPU
        return log.read_text(errors="replace").count('"slices synced"') >= c.nodes

    # The first write came after the last listing that found none was sent: timing from
    # there counts a little more than the writing (a listing can wait behind them). The
    # end is the publisher's last "slices synced" line (one per node written).
    await until(written, timeout=600, every=0.05)
    first = none_at
    await until(done, timeout=3600, every=0.5)
    end = _synced(log)[-1]
    elapsed, writing = end - start, end - first
    cpu = apiserver_cpu(c) - before_writes[1]
    own = _cpu(publisher.pid)  # from its start: reading the bus, listing, rendering, writing
    expected = await count_slices(api)
    rate = expected / writing
    print(f"  first publish: {expected} slices ({expected / c.nodes:.1f}/node) in "
          f"{elapsed:.1f} s from the publisher's start, {writing:.1f} s from its first "
          f"write = {rate:.0f} slices/s; API server + etcd CPU "
          f"{cpu / expected * 1e3:.2f} ms/slice, the publisher's own "
          f"{(own - before_writes[0]) / expected * 1e3:.2f} ms/slice while writing "
          f"({own / expected * 1e3:.2f} from its start)")  # fmt: skip
    return rate


def _synced(log: Path) -> list[float]:
    """When the publisher logged each "slices synced" (epoch seconds, in order)."""
    return [
        datetime.datetime.strptime(json.loads(line)["ts"], "%Y-%m-%dT%H:%M:%S.%f%z").timestamp()
        for line in log.read_text(errors="replace").splitlines()
        if '"slices synced"' in line
    ]


async def plain_ingest(c: Cluster, api: kube.KubeApi, concurrency: int) -> float:
    """The same slices, created by a plain client as fast as the API server takes them."""
    bodies = []
    for item in await list_slices(api):
        spec = dict(item["spec"])
        spec["driver"] = PLAIN_DRIVER
        meta = {"name": "plain-" + item["metadata"]["name"], "labels": {PLAIN_LABEL: "1"},
                "ownerReferences": item["metadata"].get("ownerReferences")}  # fmt: skip
        bodies.append({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSlice",
                       "metadata": meta, "spec": spec})  # fmt: skip
    queue = iter(bodies)
    before = apiserver_cpu(c)
    start = time.perf_counter()
    own = time.process_time()

    async def worker() -> None:
        for body in queue:
            await api.create(SLICES, body)

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    elapsed = time.perf_counter() - start
    own = time.process_time() - own
    cpu = apiserver_cpu(c) - before
    rate = len(bodies) / elapsed
    print(f"  limit: a plain client ({concurrency} in flight) created the same {len(bodies)} "
          f"slices in {elapsed:.1f} s = {rate:.0f} slices/s; API server + etcd CPU "
          f"{cpu / len(bodies) * 1e3:.2f} ms/slice, the client's own "
          f"{own / len(bodies) * 1e3:.2f} ms/slice")  # fmt: skip

    async def gone() -> bool:
        if await count_slices(api, f"{PLAIN_LABEL}%3D1") == 0:
            return True
        try:  # one collection delete; thousands may outlast a request's timeout: again
            await api.delete(f"{SLICES}?labelSelector={PLAIN_LABEL}%3D1")
        except kube.ApiError:
            pass
        return False

    await until(gone, timeout=1800, every=5.0)
    return rate


def changed(inv: NodeInventory, rng: random.Random) -> NodeInventory:
    """An XID on one whole GPU: that device's taints change, one slice is rewritten."""
    whole = [i for i, g in enumerate(inv.gpus) if not g.mig_enabled]
    index = rng.choice(whole)
    gpu = inv.gpus[index]
    gpus = list(inv.gpus)
    health = GpuHealth(xids=[*gpu.health.xids, Xid(79, time.time())])
    gpus[index] = msgspec.structs.replace(gpu, health=health)
    return msgspec.structs.replace(inv, gpus=gpus)


async def change_burst(c: Cluster, count: int, limit: float) -> None:
    """One XID on each of ``count`` nodes at once (each by its discovery identity)."""
    rng = random.Random(7)
    chosen = rng.sample(range(c.nodes), min(count, c.nodes))
    invs = {i: changed(fleet_inventory(fleet_of(i), node_name(i), seed=i), rng) for i in chosen}
    buses = {i: await c.connect(Role.DISCOVERY, node_name(i)) for i in chosen}
    writes_before = metric(scrape(c.ports["publisher"]), "gpudra_publisher_slice_writes_total")
    start = time.perf_counter()
    await asyncio.gather(*(
        buses[i].kv_put(subjects.INVENTORY_BUCKET, subjects.inventory_key(node_name(i)), inv)
        for i, inv in invs.items()
    ))  # fmt: skip

    async def written() -> bool:
        page = scrape(c.ports["publisher"])
        return metric(page, "gpudra_publisher_slice_writes_total") - writes_before >= len(invs)

    await until(written, timeout=600, every=0.2)
    elapsed = time.perf_counter() - start
    for bus in buses.values():
        await bus.close()
    rate = len(invs) / elapsed
    print(f"  changes: an XID on {len(invs)} nodes at once -> their slices rewritten in "
          f"{elapsed:.2f} s = {rate:.0f} writes/s ({rate / limit:.2f}x the limit)")  # fmt: skip


@dataclass
class Churn:
    created: dict[str, float] = field(default_factory=dict)  # pod name -> wall time
    unsatisfiable: set[str] = field(default_factory=set)
    queued: list[float] = field(default_factory=list)  # kube-scheduler's active queue, sampled


def pod_body(name: str, template: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": "registry.k8s.io/pause:3.10",
                            "resources": {"claims": [{"name": "gpu"}]}}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}],
        },
    }  # fmt: skip


def template(name: str, selector: str = "") -> dict[str, Any]:
    exactly: dict[str, Any] = {"deviceClassName": "gpu.nvidia.com"}
    if selector:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
    }


PODS = f"/api/v1/namespaces/{NAMESPACE}/pods"
CLAIMS = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaims"


async def templates(api: kube.KubeApi) -> None:
    """The namespace and the claim templates: a GPU, and a GPU no node has."""
    await api.create("/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": NAMESPACE}})  # fmt: skip
    path = f"/apis/resource.k8s.io/v1/namespaces/{NAMESPACE}/resourceclaimtemplates"
    await api.create(path, template("gpu"))
    none = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA B999"'
    await api.create(path, template("gpu-none", none))


async def settled(api: kube.KubeApi) -> bool:
    """No pod and no claim left in the bench's namespace."""
    left = json.loads(await api.get(f"{CLAIMS}?limit=1"))
    listing = json.loads(await api.get(f"{PODS}?limit=1"))
    return not left["items"] and not listing["items"]


async def first_explanation(c: Cluster, api: kube.KubeApi) -> None:
    """One pod nothing fits, before the churn: the watcher's first explanation
    classifies every device of every node once; later ones only the nodes whose
    devices' use changed. Printed apart, as what a watcher's start costs."""
    before = scrape(c.ports["allocator"])
    await api.create(PODS, pod_body("first", "gpu-none"))

    async def explained() -> bool:
        page = scrape(c.ports["allocator"])
        return _delta(page, before, "gpudra_allocator_explanations_total") >= 1

    await until(explained, timeout=600)
    cpu = _delta(scrape(c.ports["allocator"]), before, "gpudra_allocator_explain_cpu_seconds_total")
    print(f"  watcher: its first explanation (every node classified once): {cpu * 1e3:.0f} ms CPU")
    await api.delete(f"{PODS}/first", {"gracePeriodSeconds": 0})
    await until(lambda: settled(api), timeout=600, every=1.0)


async def churn(c: Cluster, api: kube.KubeApi, args: argparse.Namespace) -> Churn:
    result = Churn()
    rng = random.Random(11)
    tasks: list[asyncio.Task[None]] = []

    async def life(name: str, kind: str) -> None:
        result.created[name] = time.time()
        await api.create(PODS, pod_body(name, kind))
        await asyncio.sleep(args.lifetime)
        await api.delete(f"{PODS}/{name}", {"gracePeriodSeconds": 0})

    total = int(args.rate * args.duration)
    sampling = asyncio.create_task(sample_queue(c, result.queued))
    start = time.perf_counter()
    for k in range(total):
        delay = start + k / args.rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        name = f"p-{k:06d}"
        kind = "gpu"
        if rng.random() < args.unsatisfiable:
            kind = "gpu-none"
            result.unsatisfiable.add(name)
        tasks.append(asyncio.create_task(life(name, kind)))
    await asyncio.gather(*tasks)
    sampling.cancel()
    await until(lambda: settled(api), timeout=600, every=1.0)
    return result


async def sample_queue(c: Cluster, into: list[float], every: float = 2.0) -> None:
    """kube-scheduler's active queue every ``every`` s: pods it has not got to yet."""
    while True:
        page = await asyncio.to_thread(scrape_scheduler, c.cp)
        into.append(metric(page, "scheduler_pending_pods", queue="active"))
        await asyncio.sleep(every)


async def claim_events(c: Cluster) -> list[tuple[ClaimEvent, float, int]]:
    """Every stored claim event, with its store time and size, oldest first."""
    from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

    bus = await c.connect(Role.AUDITOR)
    try:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE)
        sub = await bus.js.pull_subscribe(
            subjects.claim_events_all(), stream=subjects.CLAIMS_STREAM, config=config
        )
        found = []
        pending = (await sub.consumer_info()).num_pending or 0
        while pending > 0:
            for msg in await sub.fetch(min(pending, 256), timeout=30):
                event = decode(msg.data, ClaimEvent)
                found.append((event, msg.metadata.timestamp.timestamp(), len(msg.data)))
                pending -= 1
        await sub.unsubscribe()
        return found
    finally:
        await bus.close()


async def stream_bytes(c: Cluster) -> tuple[int, int]:
    bus = await c.connect(Role.AUDITOR)
    try:
        info = await bus.js.stream_info(subjects.CLAIMS_STREAM)
        return info.state.bytes, info.state.messages
    finally:
        await bus.close()


_POD = re.compile(r"^(p-\d{6})-gpu-")


def report_churn(
    run: Churn, events: list[tuple[ClaimEvent, float, int]], args: argparse.Namespace
) -> None:
    by_claim: dict[str, list[tuple[ClaimEvent, float, int]]] = {}
    for item in events:
        by_claim.setdefault(item[0].claim.uid, []).append(item)
    allocated, prepared, node_side, counts = [], [], [], []
    for items in by_claim.values():
        found = _POD.match(items[0][0].claim.name)
        if found is None or found.group(1) not in run.created:
            continue
        created = run.created[found.group(1)]
        counts.append(len(items))
        times: dict[str, float] = {}
        for event, stored, _ in items:
            if event.event in ("allocated", "prepared") and event.outcome == "ok":
                times.setdefault(event.event, stored)
        if "allocated" in times:
            allocated.append((times["allocated"] - created) * 1e3)
        if "prepared" in times:
            prepared.append((times["prepared"] - created) * 1e3)
        if len(times) == 2:
            node_side.append((times["prepared"] - times["allocated"]) * 1e3)
    lives = len(run.created)
    print(f"  churn: {lives} pods at {args.rate}/s ({len(run.unsatisfiable)} unsatisfiable), "
          f"{len(by_claim)} claims with events, {statistics.mean(counts or [0]):.1f} "
          f"events per claim life")  # fmt: skip
    print(f"  pod created -> allocated  p50 {pct(allocated, 50):7.0f} ms  "
          f"p99 {pct(allocated, 99):7.0f} ms  ({len(allocated)})")  # fmt: skip
    print(f"  pod created -> prepared   p50 {pct(prepared, 50):7.0f} ms  "
          f"p99 {pct(prepared, 99):7.0f} ms  ({len(prepared)})")  # fmt: skip
    print(f"  allocated -> prepared     p50 {pct(node_side, 50):7.0f} ms  "
          f"p99 {pct(node_side, 99):7.0f} ms  (the allocated event stored by the claim "
          f"watcher -> the node's prepared event stored)")  # fmt: skip


@dataclass
class Reading:
    """What the bus, the CLAIMS stream and the central processes had counted at one time."""

    at: float
    traffic: Traffic
    stored: tuple[int, int]  # CLAIMS bytes, messages
    watcher: dict[str, float]
    publisher: dict[str, float]
    scheduler: dict[str, float]
    cpu: dict[str, float]

    @classmethod
    async def take(cls, c: Cluster) -> Reading:
        return cls(
            time.perf_counter(),
            Traffic.of(c.nats),
            await stream_bytes(c),
            scrape(c.ports["allocator"]),
            scrape(c.ports["publisher"]),
            scrape_scheduler(c.cp),
            c.central.cpu(),
        )


async def idle_traffic(c: Cluster, seconds: float) -> tuple[float, float]:
    """The bus's messages and bytes per second with no claim moving."""
    before, start = Traffic.of(c.nats), time.perf_counter()
    await asyncio.sleep(seconds)
    idle = Traffic.of(c.nats) - before
    wall = time.perf_counter() - start
    print(f"  bus idle: {idle.msgs / wall:.0f} messages/s, {idle.bytes / wall / 1024:.0f} "
          f"KiB/s (all 3 servers, in + out)")  # fmt: skip
    return idle.msgs / wall, idle.bytes / wall


def report_scheduler(
    a: dict[str, float], b: dict[str, float], queued: list[float], wall: float
) -> None:
    """kube-scheduler's attempts during the churn and their wall time (scheduling and
    binding): what limits created -> allocated when it, not gpudra, is behind."""
    parts = []
    for result in ("scheduled", "unschedulable", "error"):
        count = _delta(b, a, "scheduler_schedule_attempts_total", result=result)
        took = _delta(b, a, "scheduler_scheduling_attempt_duration_seconds_sum", result=result)
        parts.append(f"{count:.0f} {result} ({took / max(count, 1) * 1e3:.0f} ms each)")
    print(f"  kube-scheduler: attempts {', '.join(parts)}; its active queue up to "
          f"{max(queued, default=0):.0f} pods (median {pct(queued, 50):.0f})")  # fmt: skip
    print(f"  kube-scheduler: where its attempts' time went: {scheduler_phases(a, b)}")
    cpu = _delta(b, a, "process_cpu_seconds_total")
    print(f"  kube-scheduler: {cpu:.1f} s of CPU over the churn's {wall:.0f} s, "
          f"{cpu / wall:.0%} of a core")  # fmt: skip


#: kube-scheduler's extension points timed whole (FrameworkExtensionPointDuration); Filter,
#: run per node, is timed per plugin in a sample of its cycles only. A placed pod's
#: attempt ends when it is bound: its PreBind and Bind are in the attempt's time.
WHOLE_POINTS = (
    "PreFilter", "PostFilter", "PreScore", "Score", "Reserve", "Permit", "PreBind", "Bind",
)  # fmt: skip


def scheduler_phases(a: dict[str, float], b: dict[str, float]) -> str:
    """Seconds per extension point over the churn: what grows with the nodes. Filter is
    the attempts' time less the points timed whole (with the scheduler's own work between
    them); its split by plugin comes from the sampled per-plugin timings."""
    attempts = _delta(b, a, "scheduler_scheduling_attempt_duration_seconds_sum")
    whole = {point: _delta(b, a, "scheduler_framework_extension_point_duration_seconds_sum",
                           extension_point=point) for point in WHOLE_POINTS}  # fmt: skip
    name = "scheduler_plugin_execution_duration_seconds_sum"
    plugins: dict[str, float] = {}
    for key in b:
        if key.startswith(name + "{") and 'extension_point="Filter"' in key:
            plugin = key.split('plugin="', 1)[1].split('"', 1)[0]
            plugins[plugin] = plugins.get(plugin, 0.0) + b[key] - a.get(key, 0.0)
    sampled = sum(plugins.values())
    top = sorted(plugins.items(), key=lambda kv: -kv[1])[:3]
    split = ", ".join(f"{p} {v / sampled:.0%}" for p, v in top) if sampled else "none sampled"
    timed = ", ".join(f"{point} {v:.1f} s" for point, v in whole.items() if v >= 0.05)
    return (
        f"{attempts:.1f} s in all; {timed}; Filter (the rest) "
        f"{attempts - sum(whole.values()):.1f} s, by plugin (sampled): {split}"
    )


def report_costs(
    a: Reading,
    b: Reading,
    idle: tuple[float, float],
    lives: int,
    rate: float,
    limit: float,
    queued: list[float],
) -> None:
    wall = b.at - a.at
    traffic = b.traffic - a.traffic
    msgs, size = traffic.msgs - idle[0] * wall, traffic.bytes - idle[1] * wall
    print(f"  bus: {msgs / lives:.0f} messages, {size / lives / 1024:.1f} KiB per claim life "
          f"beyond idle (all 3 servers, in + out; {traffic.msgs / lives:.0f} and "
          f"{traffic.bytes / lives / 1024:.1f} KiB with it)")  # fmt: skip
    grown = b.stored[0] - a.stored[0]
    per_hour = grown / lives * rate * 3600
    print(f"  CLAIMS: {grown / lives:.0f} B and {(b.stored[1] - a.stored[1]) / lives:.1f} "
          f"messages per claim life; {per_hour / GB:.2f} GiB/h per replica at "
          f"{rate} claims/s")  # fmt: skip
    ev = _delta(b.watcher, a.watcher, "gpudra_allocator_claim_events_total")
    ex = _delta(b.watcher, a.watcher, "gpudra_allocator_explanations_total")
    ex_cpu = _delta(b.watcher, a.watcher, "gpudra_allocator_explain_cpu_seconds_total")
    snap = _delta(b.watcher, a.watcher, "gpudra_allocator_explain_cpu_seconds_total",
                  phase="snapshot")  # fmt: skip
    total = b.cpu["allocator"] - a.cpu["allocator"]
    print(f"  watcher: {ev:.0f} claim events, {ex:.0f} explanations; CPU "
          f"{(total - ex_cpu) / max(ev, 1) * 1e3:.2f} ms per claim event, "
          f"{ex_cpu / max(ex, 1) * 1e3:.2f} ms per explanation "
          f"({snap / max(ex, 1) * 1e3:.2f} ms of it the snapshot); "
          f"{total / wall:.1%} of a core")  # fmt: skip
    report_scheduler(a.scheduler, b.scheduler, queued, wall)
    writes = _delta(b.publisher, a.publisher, "gpudra_publisher_slice_writes_total")
    print(f"  publisher during churn: {writes:.0f} slice writes "
          f"({writes / wall:.2f}/s, {writes / wall / limit:.4f}x the limit)")  # fmt: skip


async def run_size(n: int, args: argparse.Namespace) -> None:
    print(f"\n== {n} nodes ==", flush=True)
    run_start = time.perf_counter()
    with cluster(n, args) as c:
        api = await kube.http_api(str(c.cp.kubeconfig), qps=100000, burst=100000)
        try:
            start = time.perf_counter()
            await create_nodes(api, n)
            print(f"  nodes: {n} Nodes created in {time.perf_counter() - start:.1f} s")
            await start_node_hosts(c, args.nodes_per_host)
            rate = await first_publish(c, api)
            limit = await plain_ingest(c, api, args.ingest_concurrency)
            print(f"  first publish / limit: {rate / limit:.2f}x")
            await change_burst(c, args.changes, limit)
            if not args.rate * args.duration:
                return  # no churn asked for
            threshold = f"{args.pending_threshold}s"
            c.service(Role.ALLOCATOR, "--pending-threshold", threshold)
            await until(lambda: _logged(c, "allocator", "claim watcher synced"), 600)
            await templates(api)
            await first_explanation(c, api)
            idle = await idle_traffic(c, args.idle)
            before = await Reading.take(c)
            run = await churn(c, api, args)
            after = await Reading.take(c)
            report_churn(run, await claim_events(c), args)
            report_costs(before, after, idle, len(run.created), args.rate, limit, run.queued)
            c.central.report(time.perf_counter() - run_start)
        finally:
            await api.close()


def _delta(now: dict[str, float], then: dict[str, float], name: str, **labels: str) -> float:
    return metric(now, name, **labels) - metric(then, name, **labels)


async def _logged(c: Cluster, name: str, text: str) -> bool:
    return text in (c.root / f"{name}.log").read_text(errors="replace")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[100, 1000, 5000])
    parser.add_argument("--rate", type=float, default=5.0, help="pods (claims) per second")
    parser.add_argument("--duration", type=float, default=120.0, help="seconds of churn")
    parser.add_argument("--lifetime", type=float, default=20.0, help="seconds a pod lives")
    parser.add_argument("--unsatisfiable", type=float, default=0.1)
    parser.add_argument("--pending-threshold", type=float, default=5.0)
    parser.add_argument("--nodes-per-host", type=int, default=1250)
    parser.add_argument("--ingest-concurrency", type=int, default=64)
    parser.add_argument("--changes", type=int, default=500)
    parser.add_argument("--idle", type=float, default=20.0, help="seconds of idle bus measured")
    parser.add_argument(
        "--publisher-gates",
        default="NVMLDeviceHealthCheck=true",
        help="the publisher's --feature-gates (health on: an XID becomes a device taint)",
    )
    parser.add_argument("--publisher-workers", type=int, default=0, help="0: its default")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    return parser.parse_args(argv)


async def main(args: argparse.Namespace) -> None:
    print(f"bench/scale.py: load {os.getloadavg()[0]:.1f}, {os.cpu_count()} cores")
    for n in args.nodes:
        await run_size(n, args)


if __name__ == "__main__":
    interrupt_on_sigterm()  # stopped: every process it started too, by PID
    asyncio.run(main(parse_args()))
