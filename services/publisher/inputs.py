"""The publisher's inputs on the bus: KV ``inventory``, ``presence`` and ``prepared``.

Each is followed by one watch that gives every current value first: :meth:`BusInputs.
loaded` says when all three have (so the first resync knows what is stale). Reading
each key on its own and then watching read everything twice: 5,000 nodes' inventories
(16-18 KB each) again while the first publish wrote. A watch that ends or fails is
started again after a pause. A value that does not decode, or that is stored under
another node's key, is logged, counted and skipped: one bad value never stops a watch.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from typing import Protocol

from services.core.bus import subjects
from services.core.bus.client import Bus, KvUpdate
from services.core.kit.backoff import Backoff
from services.core.model.schemas import (
    NodeInventory,
    NodePreparedDevices,
    PluginPresence,
)
from services.publisher import metrics
from services.publisher.render import Holdings

log = logging.getLogger(__name__)


class NodeSink(Protocol):
    """What the inputs change: the publisher's view of each node."""

    # Told every inventory change (the clique labeler, when it is on).
    on_inventory: Callable[[str, NodeInventory | None], None] | None

    def set_inventory(self, node: str, inventory: NodeInventory | None) -> None: ...

    def set_present(self, node: str, registered_at: float | None) -> None: ...

    def set_holdings(self, node: str, holdings: Holdings) -> None: ...


class BusInputs:
    """Feeds a :class:`NodeSink` from the bus, for the slices of ``driver``."""

    def __init__(self, sink: NodeSink, driver: str) -> None:
        self.sink = sink
        self._driver_token = subjects.escape_token(driver)
        # Set once each watch has given every value its bucket held when it began.
        self._current = {name: asyncio.Event() for name in ("inventory", "presence", "prepared")}

    async def loaded(self) -> None:
        """Until every current inventory, presence and prepared record has been applied."""
        for current in self._current.values():
            await current.wait()

    async def follow_inventory(self, bus: Bus) -> None:
        """Every inventory change; the bus skips (logs, counts) values that do not decode."""

        async def follow() -> None:
            async for update in bus.watch_kv(
                subjects.INVENTORY_BUCKET, NodeInventory, current=self._current["inventory"]
            ):
                try:
                    self.apply_inventory(update)
                except Exception:  # one bad update must never stop the stream
                    metrics.INVALID_INVENTORIES.labels(reason="handler").inc()
                    log.exception("failed to apply an inventory update", extra={"key": update.key})

        await _forever("inventory watch", follow)

    async def follow_presence(self, bus: Bus) -> None:
        async def follow() -> None:
            async for update in bus.watch_kv(
                subjects.PRESENCE_BUCKET, PluginPresence, current=self._current["presence"]
            ):
                self.apply_presence(update)

        await _forever("presence watch", follow)

    async def follow_prepared(self, bus: Bus) -> None:
        async def follow() -> None:
            async for update in bus.watch_kv(
                subjects.PREPARED_BUCKET, NodePreparedDevices, current=self._current["prepared"]
            ):
                self.apply_prepared(update)

        await _forever("prepared watch", follow)

    def apply_prepared(self, update: KvUpdate[NodePreparedDevices]) -> None:
        try:
            node = subjects.unescape_token(update.key)
        except ValueError:
            node = ""  # not a key any node escapes to
        stored_for = node if update.value is None else update.value.node
        if not node or stored_for != node:
            metrics.INVALID_INVENTORIES.labels(reason="prepared-node-mismatch").inc()
            log.warning(
                "skipping prepared devices stored under another node's key",
                extra={"key": update.key, "node": stored_for},
            )
            return
        self.sink.set_holdings(node, Holdings.of(update.value))

    def apply_inventory(self, update: KvUpdate[NodeInventory]) -> None:
        node = subjects.unescape_token(update.key)
        if update.value is not None and update.value.node != node:
            metrics.INVALID_INVENTORIES.labels(reason="node-mismatch").inc()
            log.warning(
                "skipping an inventory stored under another node's key",
                extra={"key": update.key, "node": update.value.node},
            )
            return
        self.sink.set_inventory(node, update.value)
        if self.sink.on_inventory is not None:
            self.sink.on_inventory(node, update.value)

    def apply_presence(self, update: KvUpdate[PluginPresence]) -> None:
        node_token, _, driver_token = update.key.partition(".")
        if driver_token == self._driver_token:
            registered_at = None if update.value is None else update.value.registered_at
            self.sink.set_present(subjects.unescape_token(node_token), registered_at)


async def _forever(what: str, follow: Callable[[], Awaitable[None]]) -> None:
    """Run a KV watch; when it ends or fails (NATS trouble), start it again after a pause.

    A restarted watch replays current values first; unchanged ones are no-ops.
    """
    backoff = Backoff()
    while True:
        started = time.monotonic()
        try:
            await follow()
            log.warning(f"{what} ended; starting it again")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.warning(f"{what} failed; starting it again", extra={"error": str(exc)})
        if time.monotonic() - started > 60:
            backoff.reset()
        await backoff.sleep()
