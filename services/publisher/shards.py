"""Publisher replicas sharing the nodes: shard leases in the bus's ``publishers`` bucket.

Nodes fall into ``count`` shards (sha256 of the node name). A replica publishes
a node only while it holds the lease of the node's shard: the KV key
``shard.<n>`` with the replica's id as value, created with compare-and-set
(``create`` fails while another holds it) and renewed with compare-and-set on
its revision. The bucket's max age is the lease TTL, so the lease of a replica
that stops renewing (killed, partitioned) vanishes from the server ``ttl``
seconds after its last renewal, and another replica takes it.

No node is published by two replicas: a replica counts a lease valid only
until ``ttl - renew`` after it *sent* the renewal the server accepted, i.e.
it stops a full renewal period before the server could hand the shard to
anyone else; losing a compare-and-set drops the shard at once.

Balance: each replica announces itself (``member.<id>``, renewed with the
leases) and holds at most ``ceil(count / members)`` shards; one over that
releases the rest (deleting with compare-and-set), one under it takes shards
nobody renewed for ``ttl``. A dead replica's shards are taken within about
``ttl + renew`` seconds.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import math
import random
import time
from collections.abc import Callable

from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from services.core.bus import retention, subjects
from services.core.bus.client import Bus
from services.core.kit import supervisor
from services.publisher.tuning import DEFAULT_SHARDS

log = logging.getLogger(__name__)


def shard_of(node: str, count: int) -> int:
    return int.from_bytes(hashlib.sha256(node.encode()).digest()[:8], "big") % count


class Shards:
    """This replica's shard leases; :meth:`owns` says whether it may publish a node."""

    def __init__(
        self,
        bus: Bus,
        replica: str,
        *,
        count: int = DEFAULT_SHARDS,
        ttl: float | None = None,
        on_gain: Callable[[set[int]], None] | None = None,
    ) -> None:
        # The TTL is the bucket's max age (one place: services.core.bus.retention).
        ttl = ttl or retention.limits(subjects.PUBLISHERS_BUCKET).max_age_s
        if count < 1 or ttl <= 0:
            raise ValueError("shards need count >= 1 and a positive TTL (KV_PUBLISHERS max age)")
        self.bus = bus
        self.replica = replica
        self.token = subjects.escape_token(replica)
        self.count = count
        self.ttl = ttl
        self.renew = ttl / 4
        self.on_gain = on_gain
        self.held: dict[int, tuple[int, float]] = {}  # shard -> (revision, valid until)
        self._seen: dict[str, tuple[bytes, float]] = {}  # key -> (value, when last written)

    def shard(self, node: str) -> int:
        return shard_of(node, self.count)

    def owns(self, node: str) -> bool:
        lease = self.held.get(self.shard(node))
        return lease is not None and time.monotonic() < lease[1]

    def members(self) -> int:
        now = time.monotonic()
        live = {
            k
            for k, (_, at) in self._seen.items()
            if k.startswith("member.") and now - at < self.ttl
        }
        live.add(f"member.{self.token}")
        return len(live)

    async def run(self) -> None:
        """Hold a fair share of the leases until cancelled (then release them)."""
        kv = await self.bus.kv(subjects.PUBLISHERS_BUCKET)
        watcher = asyncio.create_task(self._watch())
        try:
            # Announce, and watch a renewal period before taking anything: replicas
            # that start together then see each other and split the shards at once.
            await kv.put(f"member.{self.token}", b"")
            await asyncio.sleep(self.renew)
            while True:
                started = time.monotonic()
                await self.round(kv)
                await asyncio.sleep(max(0.0, self.renew - (time.monotonic() - started)))
        finally:
            await supervisor.cancel_and_wait([watcher])
            await self._release_all(kv)

    async def round(self, kv: KeyValue) -> None:
        """Announce, renew, then release or take shards toward a fair share."""
        await kv.put(f"member.{self.token}", b"")
        for shard, (revision, _) in list(self.held.items()):
            sent = time.monotonic()
            try:
                new = await kv.update(_key(shard), self.replica.encode(), last=revision)
            except (KeyWrongLastSequenceError, KeyNotFoundError):
                self.held.pop(shard, None)
                log.warning("lost a shard lease", extra={"shard": shard})
                continue
            except Exception as exc:  # the bus is down: the lease runs out on its own
                log.warning("could not renew a shard lease", extra={"error": str(exc)})
                continue
            self.held[shard] = (int(new), sent + self.ttl - self.renew)
        target = math.ceil(self.count / self.members())
        for shard in sorted(self.held)[target:]:
            revision, _ = self.held.pop(shard)  # stop publishing it before letting go
            with contextlib.suppress(Exception):
                await kv.delete(_key(shard), last=revision)
        gained: set[int] = set()
        now = time.monotonic()
        free = [s for s in range(self.count) if s not in self.held and self._free(s, now)]
        random.shuffle(free)
        for shard in free[: max(0, target - len(self.held))]:
            sent = time.monotonic()
            try:
                revision = await kv.create(_key(shard), self.replica.encode())
            except KeyWrongLastSequenceError:
                continue  # someone was faster, or the server has not expired it yet
            self.held[shard] = (int(revision), sent + self.ttl - self.renew)
            gained.add(shard)
        if gained:
            log.info(
                "took shard leases",
                extra={"shards": sorted(gained), "held": len(self.held), "target": target},
            )
            if self.on_gain is not None:
                self.on_gain(gained)

    def _free(self, shard: int, now: float) -> bool:
        seen = self._seen.get(_key(shard))
        return seen is None or now - seen[1] >= self.ttl

    async def _watch(self) -> None:
        async for entry in self.bus.kv_entries(subjects.PUBLISHERS_BUCKET):
            if entry.value is None:
                self._seen.pop(entry.key, None)
            else:
                self._seen[entry.key] = (entry.value, time.monotonic())

    async def _release_all(self, kv: KeyValue) -> None:
        held, self.held = self.held, {}
        for shard, (revision, _) in held.items():
            with contextlib.suppress(Exception):
                await kv.delete(_key(shard), last=revision)
        with contextlib.suppress(Exception):
            await kv.delete(f"member.{self.token}")


def _key(shard: int) -> str:
    return f"shard.{shard}"
