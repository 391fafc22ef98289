"""The publisher service: inventories and plugin presence on the bus in, ResourceSlices out.

It keeps what it needs per node (the inventory, whether the kubelet plugin is
registered) and a set of dirty nodes that a few workers sync, one node at a
time each. A node is published while it has an inventory and a registered
plugin (or ``force_registered``); otherwise its slices are removed, because the
kubelet wipes a driver's slices 30 s after its plugin goes and would fight us.

Inputs (:mod:`.inputs`): KV ``inventory`` (one NodeInventory per node), KV ``presence``
(PluginPresence per node and driver), KV ``prepared`` (NodePreparedDevices per
node: the twin of a prepared GPU or VFIO device is withdrawn until unprepare);
and a watch on our ResourceSlices so that a slice someone else changes or
deletes is put back. A full resync lists every
slice of the driver at start-up (removing slices of nodes that are gone) and
then periodically.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import msgspec
from opentelemetry import trace

from services.core.bus.client import Bus
from services.core.kit import heap
from services.core.kit.backoff import Backoff
from services.core.kube import claimstatus
from services.core.kube.client import ApiError
from services.core.kube.informer import watch_forever
from services.core.model import computedomain as cd
from services.core.model import domainnode, featuregates, nvidia
from services.core.model.schemas import NodeInventory
from services.core.telemetry import tracing
from services.publisher import metrics
from services.publisher.inputs import BusInputs
from services.publisher.poolplan import fingerprint
from services.publisher.reconcile import NodeNotFound, Reconciler, SyncFailed
from services.publisher.render import (
    NO_HOLDINGS,
    Holdings,
    RenderError,
    RenderOptions,
    SliceContent,
    render_contents,
    render_domain_contents,
)
from services.publisher.sliceapi import SliceApi, WatchEvent
from services.publisher.tuning import DEFAULT_WORKERS

log = logging.getLogger(__name__)
_tracer = tracing.tracer("gpudra.publisher")
_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(NodeInventory)


@dataclass
class PublisherConfig:
    render: RenderOptions = field(default_factory=RenderOptions)
    kube_minor: int | None = None  # None: ask the API server
    force_registered: bool = False  # publish without a kubelet plugin presence record
    # Whose slices: the GPU driver's (rendered from the inventory) or compute-domain.nvidia.com's
    # (channel-0 and daemon-0 on every node with an inventory where its plugin is registered).
    driver: str = nvidia.DRIVER_NAME
    workers: int = DEFAULT_WORKERS
    # compute-domain.nvidia.com only: binding conditions on the channel devices
    # (services/domains/binding.py): auto (Kubernetes 1.36+), on, off.
    binding_conditions: str = "auto"
    resync_s: float = 600.0
    retry_failed_s: float = 5.0


class Publisher:
    """Turns node state into synced slices; :meth:`run` wires it to the bus."""

    def __init__(
        self, api: SliceApi, config: PublisherConfig, reconciler: Reconciler | None = None
    ) -> None:
        self.api = api
        self.config = config
        self.reconciler = reconciler or Reconciler(api, driver=config.driver)
        # Inventories are kept encoded: a thousand nodes of decoded structs are
        # millions of objects that every full GC pass walks (pauses of 300 ms).
        self._inventories: dict[str, bytes] = {}
        self.present: dict[str, float] = {}  # node -> when its plugin registered
        self.holdings: dict[str, Holdings] = {}  # node -> what its prepared claims hold
        self.published: set[str] = set()  # nodes whose slices we made exist
        self.seen: set[str] = set()  # nodes with slices seen in a listing or the watch
        self.on_synced: Callable[[str, float], None] | None = None  # (node, seconds dirty)
        # Told every inventory change (the clique labeler, when it is on).
        self.on_inventory: Callable[[str, NodeInventory | None], None] | None = None
        self._dirty: dict[str, float] = {}  # node -> when it became dirty
        self._busy: set[str] = set()
        self._events_while_busy: dict[str, list[WatchEvent]] = {}
        self._wake = asyncio.Event()
        # Which nodes this replica publishes (all, unless replicas share them: shards.py).
        self.owns: Callable[[str], bool] = lambda _node: True
        self.binding_conditions = False  # decided in run() from the server's version
        self.inputs = BusInputs(self, config.driver)  # what the bus says of each node

    def take(self, is_mine: Callable[[str], bool]) -> None:
        """Nodes for which ``is_mine`` just became true: look at them afresh and sync."""
        for node in self.nodes | self.seen | self.published:
            if is_mine(node):
                self.reconciler.forget(node)
                self.mark(node)

    # ---------------------------------------------------------------- state changes

    def set_inventory(self, node: str, inventory: NodeInventory | None) -> None:
        if inventory is None:
            if self._inventories.pop(node, None) is None:
                return
        else:
            data = _ENCODER.encode(inventory)
            if self._inventories.get(node) == data:
                return  # the same inventory again: nothing can change
            self._inventories[node] = data
        self.mark(node)

    def inventory(self, node: str) -> NodeInventory | None:
        data = self._inventories.get(node)
        return None if data is None else _DECODER.decode(data)

    @property
    def nodes(self) -> set[str]:
        """Nodes with an inventory."""
        return set(self._inventories)

    def set_present(self, node: str, registered_at: float | None) -> None:
        """The node's plugin registered (at ``registered_at``) or went away (None)."""
        if self.present.get(node) == registered_at:
            return
        if registered_at is None:
            del self.present[node]
        else:
            self.present[node] = registered_at
        # A plugin that (re)registered may follow a kubelet restart, which deletes
        # the node's slices: look at the API server again rather than trust our notes.
        self.reconciler.forget(node)
        self.mark(node)

    def set_holdings(self, node: str, holdings: Holdings) -> None:
        """What the node's prepared claims hold; only a change of held GPUs marks it."""
        if self.holdings.get(node, NO_HOLDINGS) == holdings:
            return
        if holdings == NO_HOLDINGS:
            del self.holdings[node]
        else:
            self.holdings[node] = holdings
        self.mark(node)

    def mark(self, node: str) -> None:
        self._dirty.setdefault(node, time.monotonic())
        self._wake.set()

    def wanted(self, node: str) -> NodeInventory | None:
        registered = self.config.force_registered or node in self.present
        return self.inventory(node) if registered else None

    # ---------------------------------------------------------------- syncing

    async def sync_node(self, node: str) -> None:
        """Bring one node's slices in line; errors are logged and counted, never raised."""
        if not self.owns(node):
            return  # another replica's (it was marked before the lease moved, or by a watch)
        inventory = self.wanted(node)
        try:
            contents = None if inventory is None else self._render(inventory)
        except RenderError as exc:
            metrics.INVALID_INVENTORIES.labels(reason="render").inc()
            log.warning(
                "inventory cannot be published; the node's slices stay as they are",
                extra={"node": node, "reason": str(exc)},
            )
            return
        if contents is None and node not in self.published and node not in self.seen:
            return  # nothing of ours can exist for it
        digest = fingerprint(contents)
        if self.reconciler.is_current(node, digest):
            return
        try:
            result = await self.reconciler.sync(node, contents, digest=digest)
        except (NodeNotFound, SyncFailed) as exc:
            reason = "node-missing" if isinstance(exc, NodeNotFound) else "api"
            metrics.SYNC_FAILURES.labels(reason=reason).inc()
            log.warning("sync failed; retrying later", extra={"node": node, "error": str(exc)})
            asyncio.get_running_loop().call_later(self.config.retry_failed_s, self.mark, node)
            return
        if contents is None:
            self.published.discard(node)
            self.seen.discard(node)
        else:
            self.published.add(node)
        metrics.PUBLISHED_NODES.set(len(self.published))
        trace.get_current_span().set_attributes(
            {"gpudra.slices.created": result.created, "gpudra.slices.updated": result.updated,
             "gpudra.slices.deleted": result.deleted, "gpudra.pool.generation": result.generation}
        )  # fmt: skip
        if result.writes:
            log.info(
                "slices synced",
                extra={
                    "node": node,
                    "slices_created": result.created,
                    "slices_updated": result.updated,
                    "slices_deleted": result.deleted,
                    "generation": result.generation,
                },
            )

    def _render(self, inventory: NodeInventory) -> list[SliceContent] | None:
        if self.config.driver == cd.CD_DRIVER:
            gates = self.config.render.gates
            contents = render_domain_contents(inventory, gates)
            if contents is not None and self.binding_conditions:
                contents = [
                    SliceContent(cd.with_binding_conditions(c.devices or []), c.shared_counters)
                    for c in contents
                ]
            if contents is None:
                log.warning(
                    "no compute-domain pool for the node: it cannot serve the driver",
                    extra={"node": inventory.node, "reason": domainnode.refusal(inventory, gates)},
                )
            return contents
        holdings = self.holdings.get(inventory.node, NO_HOLDINGS)
        return render_contents(inventory, self.config.render, holdings)

    async def work(self) -> None:
        """One worker: take a dirty node nobody else is syncing, sync it, repeat."""
        while True:
            node = next((n for n in self._dirty if n not in self._busy), None)
            if node is None:
                self._wake.clear()
                await self._wake.wait()
                continue
            since = self._dirty.pop(node)
            self._busy.add(node)
            try:
                with _tracer.start_as_current_span(
                    "publisher.reconcile", attributes={tracing.ATTR_NODE: node}
                ):  # a trace per node sync: render, compare, API writes
                    await self.sync_node(node)
            except Exception:  # a bug must cost one node a retry, never the service
                metrics.SYNC_FAILURES.labels(reason="internal").inc()
                log.exception("sync crashed; retrying later", extra={"node": node})
                asyncio.get_running_loop().call_later(self.config.retry_failed_s, self.mark, node)
            finally:
                self._busy.discard(node)
                self._replay_events(node)
                if self._dirty:
                    self._wake.set()
            elapsed = time.monotonic() - since
            metrics.SYNC_SECONDS.observe(elapsed)
            if self.on_synced is not None:
                self.on_synced(node, elapsed)

    async def settle(self, timeout: float = 30.0) -> None:
        """Wait until no node is dirty or being synced (tests and the benchmark)."""
        deadline = time.monotonic() + timeout
        while self._dirty or self._busy:
            if time.monotonic() > deadline:
                raise TimeoutError(f"nodes still dirty: {sorted(self._dirty)[:5]}")
            await asyncio.sleep(0.005)

    # ---------------------------------------------------------------- resync and watch

    async def resync(self) -> str:
        """List every slice of the driver, mark each node to check; return the list's RV."""
        listing = await self.api.slice_nodes()
        self.reconciler.deleted.clear()  # events before this listing no longer matter
        self.reconciler.retry_list_attributes()  # the server may store lists by now
        nodes = listing.nodes
        try:
            uids = await self.api.node_uids()
        except ApiError as exc:  # a chart that grants no list: one GET per node, as before
            log.warning("listing Nodes failed; reading each one", extra={"error": str(exc)})
            uids = {}
        self.seen |= nodes
        for node in nodes | self.nodes:
            self.reconciler.forget(node)
        self.reconciler.learn(self.nodes - nodes, uids)
        for node in nodes | self.nodes:
            self.mark(node)
        return listing.resource_version

    async def relist(self) -> str:
        """:meth:`resync` until it works, backing off between failures."""
        backoff = Backoff()
        while True:
            try:
                return await self.resync()
            except ApiError as exc:
                metrics.API_RETRIES.labels(reason=str(exc.status)).inc()
                log.warning("listing slices failed", extra={"error": str(exc)})
                await backoff.sleep()

    async def watch_slices(self, resource_version: str) -> None:
        """Follow slice changes; an expired watch (410) starts over from a fresh list."""

        async def on_event(event: WatchEvent) -> str:
            self.on_slice_event(event)
            return event.resource_version

        await watch_forever(
            "resourceslices", self.api.watch, resource_version, on_event, self.relist
        )

    def on_slice_event(self, event: WatchEvent) -> None:
        if event.type == "BOOKMARK":
            return
        if event.node in self._busy:  # likely our own write: judge once the sync recorded it
            self._events_while_busy.setdefault(event.node, []).append(event)
        elif event.node:
            self._judge(event)

    def _replay_events(self, node: str) -> None:
        for event in self._events_while_busy.pop(node, []):
            self._judge(event)

    def _judge(self, event: WatchEvent) -> None:
        if event.type == "DELETED":
            if event.name in self.reconciler.deleted:
                self.reconciler.deleted.discard(event.name)
                return  # our own delete coming back
            self.reconciler.written.pop(event.name, None)
        elif self.reconciler.written.get(event.name) == event.resource_version:
            return  # our own write coming back
        self.seen.add(event.node)
        self.reconciler.forget(event.node)
        self.mark(event.node)

    async def _server_minor(self) -> int:
        backoff = Backoff()
        while True:
            try:
                return await self.api.server_minor()
            except ApiError as exc:
                log.warning("API server version unknown; retrying", extra={"error": str(exc)})
                await backoff.sleep()

    async def resync_forever(self) -> None:
        while True:
            await asyncio.sleep(self.config.resync_s)
            try:
                await self.relist()
            except Exception:
                log.exception("periodic resync crashed")

    async def run(self, bus: Bus) -> None:
        """Serve until cancelled."""
        if self.config.kube_minor is None:
            self.config.kube_minor = await self._server_minor()
        if self.config.driver == cd.CD_DRIVER:
            mode, minor = self.config.binding_conditions, self.config.kube_minor
            self.binding_conditions = claimstatus.wanted(mode, minor)
            extra = {"on": self.binding_conditions, "mode": mode, "kube_minor": minor}
            log.info("binding conditions on channel devices", extra=extra)
        render = self.config.render
        self.config.render = RenderOptions(
            gates=render.gates,
            kube_minor=self.config.kube_minor,
            extra_non_fatal_xids=render.extra_non_fatal_xids,
            shares=render.shares,
        )
        log.info(
            "publisher starting",
            extra={
                "kube_minor": self.config.kube_minor,
                "gates": render.gates.spec(),
                "force_registered": self.config.force_registered,
            },
        )
        lists = render.gates.enabled(featuregates.DRA_LIST_TYPE_ATTRIBUTES)
        if lists and not self.config.render.list_attributes:
            metrics.LIST_ATTRIBUTES_REFUSED.set(1)
            log.warning(
                "DRAListTypeAttributes is on, but the API server has no list-type attributes "
                "(they exist from Kubernetes 1.36): numaNode is published as an int",
                extra={"kube_minor": self.config.kube_minor},
            )
        async with asyncio.TaskGroup() as group:
            group.create_task(self.inputs.follow_inventory(bus))
            group.create_task(self.inputs.follow_presence(bus))
            group.create_task(self.inputs.follow_prepared(bus))
            await self.inputs.loaded()  # the first resync knows what is stale
            rv = await self.relist()
            heap.settle("inputs loaded and slices listed")
            for _ in range(self.config.workers):
                group.create_task(self.work())
            group.create_task(self.watch_slices(rv))
            group.create_task(self.resync_forever())
