"""Claim events on their way to the ``CLAIMS`` stream, from one background task.

The preparer answers the kubelet first and tells the stream afterwards: an
event is queued here (:meth:`EventSink.emit` never waits) and sent until the
stream stores it, so auditing never adds to the kubelet's latency and loses no
event of an operation the preparer answered. One sink may serve both drivers'
services (one stream of claim events per node).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from dataclasses import dataclass

from prometheus_client import Counter

from services.core.bus.claimtrail import ClaimTrail
from services.core.bus.client import Bus
from services.core.bus.failures import unavailable
from services.core.kit.backoff import Backoff
from services.core.model.schemas import ClaimEvent

log = logging.getLogger(__name__)

EVENTS = Counter(
    "gpudra_preparer_claim_events_total",
    "Claim events: emitted, published (stored by the CLAIMS stream), retried (sent again "
    "after JetStream did not acknowledge them), dropped (refused by the stream, or still "
    "unsent at shutdown).",
    ["result"],
)

RETRY_LIMIT_S = 2.0  # longest wait between two attempts to store claim events


class EventSink:
    """Publishes claim events in order from one background task, each until it is stored.

    Events wait ``linger`` seconds, then go out together: the events of
    different claims concurrently, those of one claim one after the other,
    because each is numbered after the claim's previous one
    (:class:`~services.core.bus.claimtrail.ClaimTrail`). The order of :meth:`emit`
    is kept per claim.

    A publish that JetStream does not acknowledge (the stream's leader died
    and the cluster is electing another, quorum is lost, the server restarts,
    the connection is reconnecting) is sent again, with backoff, until it is:
    the audit trail loses no event of a claim operation the preparer answered,
    however long the outage (while the process lives). Every event carries a
    ``Nats-Msg-Id`` unique to this emission (claim uid, event, this process's
    instance id, a counter), so that sending one again after an ack that was
    lost on the way stores nothing twice. Events after a failed one wait: a
    later batch never overtakes an earlier one.
    """

    def __init__(self, bus: Bus, linger: float = 0.02, batch: int = 256) -> None:
        self.bus = bus
        self.trail = ClaimTrail(bus)
        self.linger = linger
        self.batch = batch
        self.instance = uuid.uuid4().hex[:16]  # a restarted preparer's ids never collide
        self._seq = itertools.count(1)
        self._queue: asyncio.Queue[_Pending | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None
        self.unsent = 0  # emitted, not stored yet

    def start(self) -> None:
        self._task = asyncio.create_task(self._send_batches())

    def emit(self, event: ClaimEvent, headers: dict[str, str] | None = None) -> None:
        msg_id = f"{event.claim.uid}/{event.event}/{self.instance}-{next(self._seq)}"
        self._queue.put_nowait(_Pending(event, msg_id, headers or {}))
        self.unsent += 1
        EVENTS.labels("emitted").inc()

    async def _send_batches(self) -> None:
        closing = False
        while not closing:
            first = await self._queue.get()
            if first is not None and self._queue.qsize() < self.batch:
                await asyncio.sleep(self.linger)
            items = [first]
            while not self._queue.empty() and len(items) < self.batch:
                items.append(self._queue.get_nowait())
            closing = None in items
            await self._publish([item for item in items if item is not None])

    async def _publish(self, items: list[_Pending]) -> None:
        """Every one of ``items`` stored (or refused for good), claims side by side."""
        by_claim: dict[str, list[_Pending]] = {}
        for item in items:
            by_claim.setdefault(item.event.claim.uid, []).append(item)
        await asyncio.gather(*(self._publish_claim(events) for events in by_claim.values()))

    async def _publish_claim(self, items: list[_Pending]) -> None:
        """One claim's events in order, each until it is stored. An event the stream
        will never take (e.g. one over its size limit) is dropped and logged."""
        backoff = Backoff(first=0.05, limit=RETRY_LIMIT_S)
        for item in items:
            while True:
                try:
                    await self.trail.append(item.event, item.msg_id, item.headers)
                except Exception as exc:
                    if unavailable(exc):
                        EVENTS.labels("retried").inc()
                        log.warning(
                            "claim event not stored yet; sending it again",
                            extra={"event": item.msg_id, "error": f"{type(exc).__name__}: {exc}"},
                        )
                        await backoff.sleep()
                        continue
                    EVENTS.labels("dropped").inc()
                    log.error(
                        "claim event refused by the stream; dropped",
                        extra={"event": item.msg_id, "uid": item.event.claim.uid,
                               "error": f"{type(exc).__name__}: {exc}"},
                    )  # fmt: skip
                else:
                    EVENTS.labels("published").inc()
                self.unsent -= 1
                break

    async def close(self, timeout: float = 5.0) -> None:
        """Flush what is queued; past ``timeout`` what is left is dropped (and counted)."""
        if self._task is None:
            return
        self._queue.put_nowait(None)
        try:
            await asyncio.wait_for(self._task, timeout)
        except TimeoutError:
            EVENTS.labels("dropped").inc(self.unsent)
            log.error(
                "claim events not stored at shutdown (the bus did not acknowledge them)",
                extra={"events": self.unsent, "timeout_s": timeout},
            )


@dataclass(frozen=True)
class _Pending:
    event: ClaimEvent
    msg_id: str  # Nats-Msg-Id: the stream stores one copy however often it is sent
    headers: dict[str, str]  # trace context
