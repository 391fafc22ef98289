"""Many simulated GPU nodes in one process, for bench/scale.py.

    python -m bench.scalenodes --nats-url URL --access DIR --kubeconfig FILE
                               --first 0 --count 1000

A cluster of thousands of nodes does not fit this machine as a process per
node, so one process hosts ``--count`` of them; each is still a node of its
own on the bus, with its own identities and subjects, and the production code
on the bus side:

- discovery: its simulated fleet's inventory put in KV ``inventory`` as the
  node's discovery identity (the connection then closed: discovery's only bus
  traffic after start is a changed inventory, which the bench sends itself);
- the kubelet plugin: the presence record put as the node's front identity
  (:class:`~services.kubeletplugin.presence.Presence`), and each prepare and
  unprepare forwarded by the real :class:`~services.kubeletplugin.forwarder.Forwarder`;
- the preparer: the real :class:`~services.preparer.service.PreparerService`
  as the node's preparer identity: requests served, claim events numbered and
  stored by its EventSink, holdings announced in KV. Only the device work is
  left out (its engine takes the devices from the claim's allocation and
  records them in a checkpoint file, no CDI spec): bench/peer.py and
  bench/prepare.py measure that part.

In the kubelet's place, one watch of Pods and one of ResourceClaims per process
(a kubelet watches its own node's pods; thousands of watches would measure this
machine, not the driver): a pod bound to one of our nodes is prepared once every
claim it uses is allocated and reserved for it, and unprepared once it is gone.

Prints one line ``ready ...`` once every node is on the bus and both watches are synced;
stops on SIGTERM.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Coroutine, Iterable
from pathlib import Path
from typing import Any

from services.core.bus import subjects
from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.core.bus.natsauth import AccessDir
from services.core.kit import heap
from services.core.kube import client as kube
from services.core.kube.informer import Informer
from services.core.kube.pods import Pod
from services.core.kube.resource import ResourceClaim
from services.core.model import nvidia
from services.core.model.schemas import ClaimRef, PreparedDevice
from services.kubeletplugin.forwarder import Forwarder
from services.kubeletplugin.presence import Presence
from services.offline.slices import fleet_inventory
from services.preparer.checkpoint import PREPARE_COMPLETED, ClaimEntry
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.service import PreparerService

FLEETS = ("dgx-h100", "dgx-a100")
CONNECT_CONCURRENCY = 32
PREPARE_BUDGET_S = 45.0  # the kubelet's deadline for one call


def node_name(i: int) -> str:
    return f"gpu-node-{i:05d}"


def fleet_of(i: int) -> str:
    return FLEETS[i % len(FLEETS)]


class BusOnlyEngine:
    """A preparer engine without device work: the claim's allocated devices of our
    driver on this node, remembered in its checkpoint file."""

    def __init__(self, node: str, claims: dict[str, ResourceClaim], root: Path) -> None:
        self.node = node
        self.claims = claims  # uid -> claim, shared by every node of the process
        self._store = CheckpointStore(root / f"{node}.json", boot_id="bench")
        self._store.load()

    @property
    def store(self) -> CheckpointStore:
        return self._store

    async def prepare(self, ref: ClaimRef, deadline: float | None = None) -> list[PreparedDevice]:
        claim = self.claims.get(ref.uid)
        status = claim.status if claim else None
        allocation = status.allocation if status else None
        results = (allocation.devices.results if allocation and allocation.devices else None) or []
        mine = [r for r in results if r.driver == nvidia.DRIVER_NAME]
        entry = ClaimEntry(
            state=PREPARE_COMPLETED,
            namespace=ref.namespace,
            name=ref.name,
            allocation=allocation,
            started_at=time.time(),
            completed_at=time.time(),
        )
        await self._store.put(ref.uid, entry)
        return [
            PreparedDevice(
                request_names=[r.request],
                pool_name=r.pool,
                device_name=r.device,
                cdi_device_ids=[f"{nvidia.DRIVER_NAME}/claim={ref.uid}-{r.device}"],
            )
            for r in mine
        ]

    async def unprepare(self, ref: ClaimRef) -> None:
        if ref.uid in self._store.claims:
            await self._store.remove(ref.uid)


class SimNode:
    """One node's bus side: its front and preparer connections and services."""

    def __init__(self, index: int, claims: dict[str, ResourceClaim], root: Path) -> None:
        self.index = index
        self.name = node_name(index)
        self.engine = BusOnlyEngine(self.name, claims, root)
        self.front: Bus | None = None
        self.preparer: Bus | None = None
        self.service: PreparerService | None = None
        self.forwarder: Forwarder | None = None
        self.prepared: dict[str, list[ClaimRef]] = {}  # pod uid -> its claims

    async def start(self, url: str, access: AccessDir) -> None:
        async def connect(role: Role) -> Bus:
            identity = Identity(role, self.name)
            return await Bus.connect(
                url,
                name=f"{role}-{self.name}",
                identity=identity,
                credentials=access.credentials(identity),
            )

        discovery = await connect(Role.DISCOVERY)
        try:
            inv = fleet_inventory(fleet_of(self.index), self.name, seed=self.index)
            await discovery.kv_put(
                subjects.INVENTORY_BUCKET, subjects.inventory_key(self.name), inv
            )
        finally:
            await discovery.close()
        self.preparer = await connect(Role.PREPARER)
        self.service = PreparerService(self.preparer, self.engine, self.name)
        await self.service.start()
        self.front = await connect(Role.FRONT)
        self.forwarder = Forwarder(self.front, self.name)
        endpoint = f"/var/lib/kubelet/plugins/{nvidia.DRIVER_NAME}/dra.sock"
        await Presence(self.front, self.name, nvidia.DRIVER_NAME, endpoint).announce()

    async def close(self) -> None:
        if self.service is not None:
            await self.service.close()
        for bus in (self.front, self.preparer):
            if bus is not None:
                await bus.close()


class Kubelets:
    """The kubelets of our nodes: prepare a bound pod's claims, unprepare a gone pod's."""

    def __init__(self, nodes: dict[str, SimNode], claims: dict[str, ResourceClaim]) -> None:
        self.nodes = nodes
        self.claims = claims
        self.by_name: dict[str, ResourceClaim] = {}  # namespace/name -> claim
        self.waiting: dict[str, Pod] = {}  # pod uid -> bound pod whose claims are not ready
        self.tasks: set[asyncio.Task[None]] = set()

    async def on_claim(self, old: ResourceClaim | None, new: ResourceClaim | None) -> None:
        claim = new or old
        assert claim is not None
        key = f"{claim.metadata.namespace}/{claim.metadata.name}"
        if new is None:
            self.by_name.pop(key, None)
            self.claims.pop(claim.metadata.uid or "", None)
            return
        self.by_name[key] = new
        self.claims[new.metadata.uid or ""] = new
        for pod in list(self.waiting.values()):
            self._try_prepare(pod)

    async def on_pod(self, old: Pod | None, new: Pod | None) -> None:
        if new is None:
            assert old is not None
            self.waiting.pop(old.metadata.uid or "", None)
            self._unprepare(old)
            return
        if new.spec.node_name in self.nodes and not new.metadata.deletion_timestamp:
            self._try_prepare(new)

    def _refs(self, pod: Pod) -> list[ClaimRef] | None:
        """The pod's claims once each is allocated and reserved for it, else None."""
        names = pod.claim_names()
        wanted = len(pod.spec.resource_claims or [])
        if len(names) < wanted:
            return None  # a template's claim not created (or not in the pod status) yet
        refs = []
        for name in names:
            claim = self.by_name.get(f"{pod.metadata.namespace}/{name}")
            status = claim.status if claim else None
            reserved = {r.uid for r in (status.reserved_for if status else None) or []}
            if claim is None or status is None or status.allocation is None:
                return None
            if pod.metadata.uid not in reserved:
                return None
            refs.append(
                ClaimRef(
                    uid=claim.metadata.uid or "",
                    namespace=claim.metadata.namespace or "",
                    name=name,
                )
            )
        return refs

    def _try_prepare(self, pod: Pod) -> None:
        uid = pod.metadata.uid or ""
        node = self.nodes.get(pod.spec.node_name or "")
        if node is None or uid in node.prepared:
            return
        refs = self._refs(pod)
        if refs is None:
            self.waiting[uid] = pod
            return
        self.waiting.pop(uid, None)
        node.prepared[uid] = refs
        self._spawn(self._call(node, "prepare", refs))

    def _unprepare(self, pod: Pod) -> None:
        node = self.nodes.get(pod.spec.node_name or "")
        refs = node.prepared.pop(pod.metadata.uid or "", None) if node else None
        if node is not None and refs:
            self._spawn(self._call(node, "unprepare", refs))

    async def _call(self, node: SimNode, op: str, refs: list[ClaimRef]) -> None:
        assert node.forwarder is not None
        call = node.forwarder.prepare if op == "prepare" else node.forwarder.unprepare
        results = await call(refs, PREPARE_BUDGET_S)
        for uid, result in results.items():
            if result.error:
                print(f"{op} {uid} on {node.name}: {result.error}", file=sys.stderr, flush=True)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(work)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)


async def start_nodes(nodes: Iterable[SimNode], url: str, access: AccessDir) -> None:
    gate = asyncio.Semaphore(CONNECT_CONCURRENCY)

    async def one(node: SimNode) -> None:
        async with gate:
            await node.start(url, access)

    await asyncio.gather(*(one(n) for n in nodes))


async def run(args: argparse.Namespace) -> None:
    access = AccessDir(Path(args.access))
    root = Path(tempfile.mkdtemp(prefix="scalenodes-"))
    try:
        await _serve(args, access, root)
    finally:
        shutil.rmtree(root, ignore_errors=True)  # every node's checkpoint and CDI files


async def _serve(args: argparse.Namespace, access: AccessDir, root: Path) -> None:
    claims: dict[str, ResourceClaim] = {}
    nodes = {
        n.name: n
        for n in (SimNode(i, claims, root) for i in range(args.first, args.first + args.count))
    }
    started = time.perf_counter()
    await start_nodes(nodes.values(), args.nats_url, access)
    kubelets = Kubelets(nodes, claims)
    api = await kube.http_api(args.kubeconfig, qps=1000, burst=2000)
    claim_watch = Informer(
        api,
        "resourceclaims",
        "/apis/resource.k8s.io/v1/resourceclaims",
        ResourceClaim,
        on_change=kubelets.on_claim,
    )
    pod_watch = Informer(
        api,
        "pods",
        "/api/v1/pods",
        Pod,
        params={"fieldSelector": "spec.nodeName!="},
        on_change=kubelets.on_pod,
    )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    watches = [asyncio.create_task(claim_watch.run()), asyncio.create_task(pod_watch.run())]
    await claim_watch.synced.wait()
    await pod_watch.synced.wait()
    # One process holds 1,250 nodes' heap, whose full collections took 1-2 s each during
    # the churn; a node's own processes hold one node's. So what start-up made is frozen
    # once ready (frozen as it went, each host ended 0.4 GiB larger: 1.37 GiB, not 0.93).
    heap.settle("every node started")
    elapsed = time.perf_counter() - started
    print(f"ready {len(nodes)} nodes in {elapsed:.1f} s", flush=True)
    await stop.wait()
    for task in watches:
        task.cancel()
    await asyncio.gather(*watches, return_exceptions=True)
    await asyncio.gather(*(n.close() for n in nodes.values()), return_exceptions=True)
    await api.close()


class _WithError(logging.Formatter):
    """The bus logs what went wrong as an ``error`` field: said on the line too."""

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        error = getattr(record, "error", None)
        return f"{text}: {error}" if error else text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nats-url", required=True)
    parser.add_argument("--access", required=True, help="the bus's access directory")
    parser.add_argument("--kubeconfig", required=True)
    parser.add_argument("--first", type=int, default=0)
    parser.add_argument("--count", type=int, required=True)
    logging.basicConfig(level=logging.WARNING)
    logging.getLogger().handlers[0].setFormatter(_WithError())
    asyncio.run(run(parser.parse_args()))


if __name__ == "__main__":
    main()
