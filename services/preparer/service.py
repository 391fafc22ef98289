"""The preparer on the bus: answers ``dra.node.<node>.prepare`` / ``.unprepare``.

Each request carries the claims of one kubelet call; every claim gets an entry
in the reply (a per-claim error never hides another claim's success). Each
claim operation is a span linked to the claim's anchor and emits lifecycle
events to the ``CLAIMS`` stream after the reply is on its way, so auditing
never adds to the kubelet's latency.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable

from opentelemetry import trace
from opentelemetry.trace import Status, StatusCode
from prometheus_client import Counter, Histogram

from services.core import limits, subjects, tracing
from services.core.access import Identity, Role
from services.core.bus import Bus
from services.core.schemas import (
    ClaimEvent,
    ClaimEventName,
    ClaimRef,
    ClaimResult,
    NodeReply,
    NodeRequest,
)
from services.preparer.engine import Engine, Outcome
from services.preparer.holdings import HoldingsPublisher

log = logging.getLogger(__name__)
ACTOR = "preparer"

OPERATIONS = Counter(
    "gpudra_preparer_claims_total", "Claim operations by kind and outcome.", ["op", "outcome"]
)
DURATION = Histogram(
    "gpudra_preparer_claim_seconds",
    "Time to prepare or unprepare one claim.",
    ["op"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

HOLDINGS_SETTLE = 0.05  # seconds between KV writes of what prepared claims hold


class EventSink:
    """Publishes claim events in order from one background task; failures are logged.

    Events wait ``linger`` seconds, then go out together, pipelined: one
    socket write and one wake-up for the acks of the whole batch instead of a
    round trip per event. The batch keeps the order of :meth:`emit` (one
    connection's messages reach the stream in the order they were sent).
    """

    def __init__(self, bus: Bus, linger: float = 0.02, batch: int = 256) -> None:
        self.bus = bus
        self.linger = linger
        self.batch = batch
        self._queue: asyncio.Queue[tuple[str, ClaimEvent] | None] = asyncio.Queue()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        self._task = asyncio.create_task(self._run())

    def emit(self, subject: str, event: ClaimEvent) -> None:
        self._queue.put_nowait((subject, event))

    async def _run(self) -> None:
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

    async def _publish(self, items: list[tuple[str, ClaimEvent]]) -> None:
        results = await asyncio.gather(
            *(self.bus.publish(subject, event) for subject, event in items),
            return_exceptions=True,
        )
        for (subject, event), result in zip(items, results, strict=True):
            if isinstance(result, Exception):
                log.warning(
                    "could not publish claim event",
                    extra={"subject": subject, "uid": event.claim.uid, "error": str(result)},
                )

    async def close(self, timeout: float = 5.0) -> None:
        if self._task is None:
            return
        self._queue.put_nowait(None)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._task, timeout)


class PreparerService:
    def __init__(
        self, bus: Bus, engine: Engine, node: str, tracer: trace.Tracer | None = None
    ) -> None:
        self.tracer = tracer or tracing.tracer("gpudra.preparer")
        self.bus = bus
        self.engine = engine
        self.node = node
        self.events = EventSink(bus)
        self.holdings = HoldingsPublisher(bus, node, engine.store)
        self._holdings_due: asyncio.TimerHandle | None = None

    async def start(self) -> None:
        self.events.start()
        self.holdings.start()
        front = Identity(Role.FRONT, self.node)  # the only one whose requests we answer
        await self.bus.serve(
            subjects.node_prepare(self.node), NodeRequest, self.on_prepare, sender=front
        )
        await self.bus.serve(
            subjects.node_unprepare(self.node), NodeRequest, self.on_unprepare, sender=front
        )

    async def close(self) -> None:
        """Stop taking requests, let the running ones answer, then flush their events."""
        await self.bus.stop_serving()
        if self._holdings_due is not None:
            self._holdings_due.cancel()
        await self.holdings.close()
        await self.events.close()

    async def on_prepare(self, request: NodeRequest, headers: dict[str, str]) -> NodeReply:
        return await self._handle(
            "prepare", request, headers, self.engine.prepare, "prepare.requested", "prepared"
        )

    async def on_unprepare(self, request: NodeRequest, headers: dict[str, str]) -> NodeReply:
        return await self._handle(
            "unprepare",
            request,
            headers,
            self.engine.unprepare,
            "unprepare.requested",
            "unprepared",
        )

    async def _handle(
        self,
        op: str,
        request: NodeRequest,
        headers: dict[str, str],
        run: Callable[[ClaimRef], Awaitable[Outcome]],
        requested: ClaimEventName,
        succeeded: ClaimEventName,
    ) -> NodeReply:
        if len(request.claims) > limits.MAX_CLAIMS_PER_REQUEST:
            return self._refuse_oversized(op, request)
        uids = [c.uid for c in request.claims]
        with self.tracer.start_as_current_span(
            f"preparer.{op}",
            context=tracing.extract(headers),
            links=tracing.claim_links(uids),
            attributes={tracing.ATTR_NODE: self.node, "claims": len(uids)},
        ):
            outcomes = await asyncio.gather(
                *(self._one(op, request, ref, run, requested, succeeded) for ref in request.claims)
            )
        if any(not o.error for o in outcomes):
            self._holdings_changed()
        return NodeReply(
            claims={ref.uid: result for ref, result in zip(request.claims, outcomes, strict=True)}
        )

    def _refuse_oversized(self, op: str, request: NodeRequest) -> NodeReply:
        """A call naming more claims than any real pod: refused whole, before any work."""
        error = (
            f"{op} refused: the request names {len(request.claims)} claims; gpudra takes "
            f"at most {limits.MAX_CLAIMS_PER_REQUEST} in one kubelet call"
        )
        OPERATIONS.labels(op, "refused").inc()
        log.warning("oversized request refused", extra={"op": op, "claims": len(request.claims)})
        return NodeReply(claims={ref.uid: ClaimResult(error=error) for ref in request.claims})

    def _holdings_changed(self) -> None:
        """Announce holdings once per ``HOLDINGS_SETTLE``, not after every call.

        A burst of prepares and unprepares becomes one KV write of where it
        ended; the preparer itself never relies on the record (it checks
        conflicts against its checkpoint), only the publisher's view lags.
        """
        if self._holdings_due is None:
            self._holdings_due = asyncio.get_running_loop().call_later(
                HOLDINGS_SETTLE, self._announce_holdings
            )

    def _announce_holdings(self) -> None:
        self._holdings_due = None
        self.holdings.changed()

    async def _one(
        self,
        op: str,
        request: NodeRequest,
        ref: ClaimRef,
        run: Callable[[ClaimRef], Awaitable[Outcome]],
        requested: ClaimEventName,
        succeeded: ClaimEventName,
    ) -> ClaimResult:
        with self.tracer.start_as_current_span(
            f"claim.{op}",
            links=tracing.claim_links([ref.uid]),
            attributes=tracing.claim_attributes(ref, self.node),
        ) as span:
            trace_id = tracing.current_trace_id()
            self._emit(requested, ref, trace_id=trace_id)
            started = time.perf_counter()
            if request.node != self.node:
                outcome = Outcome(
                    error=f"request for node {request.node!r} reached the preparer of {self.node!r}"
                )
            else:
                try:
                    outcome = await run(ref)
                except Exception as exc:  # a bug must fail one claim, never the service
                    log.exception("claim operation failed unexpectedly", extra={"uid": ref.uid})
                    outcome = Outcome(
                        error=f"claim {ref.namespace}/{ref.name}: internal error: {exc}"
                    )
            elapsed = time.perf_counter() - started
            DURATION.labels(op).observe(elapsed)
            OPERATIONS.labels(op, "error" if outcome.error else "ok").inc()
            if outcome.error:
                span.set_status(Status(StatusCode.ERROR, outcome.error))
                log.info(f"{op} failed", extra={"uid": ref.uid, "error": outcome.error})
            failed: ClaimEventName = "prepare.failed" if op == "prepare" else "unprepare.failed"
            self._emit(
                failed if outcome.error else succeeded,
                ref,
                outcome=outcome,
                duration_ms=elapsed * 1000,
                trace_id=trace_id,
            )
            return ClaimResult(devices=outcome.devices, error=outcome.error)

    def _emit(
        self,
        event: ClaimEventName,
        ref: ClaimRef,
        *,
        outcome: Outcome | None = None,
        duration_ms: float | None = None,
        trace_id: str = "",
    ) -> None:
        self.events.emit(
            subjects.claim_event(self.node, event),
            ClaimEvent(
                event=event,
                claim=ref,
                node=self.node,
                actor=ACTOR,
                devices=outcome.refs() if outcome else [],
                outcome="error" if outcome is not None and outcome.error else "ok",
                error=outcome.error if outcome else "",
                duration_ms=duration_ms,
                trace_id=trace_id,
            ),
        )
