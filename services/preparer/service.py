"""The preparer on the bus: answers ``dra.node.<node>.prepare`` / ``.unprepare``.

Each request carries the claims of one kubelet call; every claim gets an entry
in the reply (a per-claim error never hides another claim's success). A claim
goes one way: watched (witness.py opens its span and tells that it was asked),
handed to the engine once, and its outcome told on the way out (metrics, span,
log line, claim event). Whatever keeps the engine from answering becomes the
claim's error here, in one place.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Protocol

from opentelemetry import trace

from services.core.bus import subjects
from services.core.bus.access import Identity, Role
from services.core.bus.client import Bus
from services.core.kit import limits
from services.core.model import nvidia
from services.core.model.refusal import ClaimRefused
from services.core.model.schemas import (
    ClaimRef,
    ClaimResult,
    NodeReply,
    NodeRequest,
    PreparedDevice,
)
from services.core.telemetry import tracing
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.claims import check_identity, describe
from services.preparer.devicestatus import DeviceStatusWriter
from services.preparer.eventsink import EventSink
from services.preparer.holdings import HoldingsPublisher
from services.preparer.witness import OPERATIONS, Op, Outcome, Witness

log = logging.getLogger(__name__)

HOLDINGS_SETTLE = 0.05  # seconds between KV writes of what prepared claims hold


class ClaimEngine(Protocol):
    """What the service needs of a driver's engine (the GPU one, the ComputeDomain one).

    Each operation runs under the claim's lock in the engine; an expected failure
    is a :class:`ClaimRefused` whose message says why, anything else a bug.
    """

    @property
    def store(self) -> CheckpointStore: ...

    async def prepare(self, ref: ClaimRef, deadline: float | None = None) -> list[PreparedDevice]:
        """The claim's devices for the kubelet; ``deadline``: the kubelet's, in unix time."""
        ...

    async def unprepare(self, ref: ClaimRef) -> None: ...


class PreparerService:
    def __init__(
        self,
        bus: Bus,
        engine: ClaimEngine,
        node: str,
        tracer: trace.Tracer | None = None,
        *,
        driver: str = nvidia.DRIVER_NAME,
        events: EventSink | None = None,
    ) -> None:
        """``driver``: whose claims (its own subjects); ``events``: a sink shared with
        another driver's service (one stream of claim events per node). Only the GPU
        driver's claims hold devices the publisher must withdraw (holdings)."""
        self.tracer = tracer or tracing.tracer("gpudra.preparer")
        self.bus = bus
        self.engine = engine
        self.node = node
        self.driver = driver
        self._own_events = events is None
        self.events = events or EventSink(bus)
        self.witness = Witness(self.tracer, node, driver, self.events, engine.store)
        self.holdings = (
            HoldingsPublisher(bus, node, engine.store) if driver == nvidia.DRIVER_NAME else None
        )
        self._holdings_due: asyncio.TimerHandle | None = None
        # status.devices of the claims (GPU driver only), told with the holdings
        self.device_status: DeviceStatusWriter | None = None
        self.idle = asyncio.Event()  # set while no kubelet call is being answered
        self.idle.set()
        self._in_flight = 0

    async def start(self) -> None:
        if self._own_events:
            self.events.start()
        if self.holdings is not None:
            self.holdings.start()
        if self.device_status is not None:
            self.device_status.start()
        front = Identity(Role.FRONT, self.node)  # the only one whose requests we answer
        await self.bus.serve(
            subjects.node_prepare(self.node, self.driver),
            NodeRequest,
            self.on_prepare,
            sender=front,
        )
        await self.bus.serve(
            subjects.node_unprepare(self.node, self.driver),
            NodeRequest,
            self.on_unprepare,
            sender=front,
        )

    async def close(self) -> None:
        """Stop taking requests, let the running ones answer, then flush their events."""
        await self.bus.stop_serving()
        if self._holdings_due is not None:
            self._holdings_due.cancel()
        if self.holdings is not None:
            await self.holdings.close()
        if self.device_status is not None:
            await self.device_status.close()
        if self._own_events:
            await self.events.close()

    async def on_prepare(self, request: NodeRequest, headers: dict[str, str]) -> NodeReply:
        return await self._answer("prepare", request)

    async def on_unprepare(self, request: NodeRequest, headers: dict[str, str]) -> NodeReply:
        return await self._answer("unprepare", request)

    async def _answer(self, op: Op, request: NodeRequest) -> NodeReply:
        """Every claim of the kubelet's call served side by side, each on its own."""
        if len(request.claims) > limits.MAX_CLAIMS_PER_REQUEST:
            return self._refuse_oversized(op, request)
        self._in_flight += 1
        self.idle.clear()
        try:
            results = await asyncio.gather(
                *(self._serve_claim(op, request, ref) for ref in request.claims)
            )
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self.idle.set()
        if any(not r.error for r in results):
            self._holdings_changed()
        return NodeReply(
            claims={ref.uid: result for ref, result in zip(request.claims, results, strict=True)}
        )

    def _refuse_oversized(self, op: Op, request: NodeRequest) -> NodeReply:
        """A call naming more claims than any real pod: refused whole, before any work."""
        error = (
            f"{op} refused: the request names {len(request.claims)} claims; gpudra takes "
            f"at most {limits.MAX_CLAIMS_PER_REQUEST} in one kubelet call"
        )
        OPERATIONS.labels(op, "refused").inc()
        log.warning("oversized request refused", extra={"op": op, "claims": len(request.claims)})
        return NodeReply(claims={ref.uid: ClaimResult(error=error) for ref in request.claims})

    async def _serve_claim(self, op: Op, request: NodeRequest, ref: ClaimRef) -> ClaimResult:
        """One claim, one way: watched on the way in, the engine asked once, the outcome
        told on the way out (witness.py), all inside the claim's SERVER span."""
        with self.witness.watching(op, ref, request.traceparents.get(ref.uid, "")) as watch:
            outcome = await self._outcome(op, request, ref)
            return self.witness.told(watch, outcome)

    async def _outcome(self, op: Op, request: NodeRequest, ref: ClaimRef) -> Outcome:
        """The engine's answer, or the claim's error named by the claim: a request for
        another node, an identity that could escape into a path or a subject, a refusal
        (:class:`ClaimRefused`), or a bug (logged as one; it never fails the service)."""
        if request.node != self.node:
            return Outcome(
                error=f"request for node {request.node!r} reached the preparer of {self.node!r}"
            )
        try:
            check_identity(ref)
            if op == "unprepare":
                await self.engine.unprepare(ref)
                return Outcome()
            return Outcome(devices=await self.engine.prepare(ref, deadline=request.deadline))
        except ClaimRefused as exc:
            return Outcome(error=prefixed(ref, str(exc)))
        except Exception as exc:  # a bug must fail one claim, never the service
            log.exception("claim operation failed unexpectedly", extra={"uid": ref.uid})
            return Outcome(error=f"claim {ref.namespace}/{ref.name}: internal error: {exc}")

    def _holdings_changed(self) -> None:
        """Announce holdings once per ``HOLDINGS_SETTLE``, not after every call.

        A burst of prepares and unprepares becomes one KV write of where it
        ended; the preparer itself never relies on the record (it checks
        conflicts against its checkpoint), only the publisher's view lags.
        """
        if self.holdings is None:
            return
        if self._holdings_due is None:
            self._holdings_due = asyncio.get_running_loop().call_later(
                HOLDINGS_SETTLE, self._announce_holdings
            )

    def _announce_holdings(self) -> None:
        self._holdings_due = None
        if self.holdings is not None:
            self.holdings.changed()
        if self.device_status is not None:  # after the reply, with the burst it ended
            self.device_status.changed()


def prefixed(ref: ClaimRef, message: str) -> str:
    """Every per-claim error starts with the claim it is about."""
    who = f"claim {describe(ref)}"
    return message if message.startswith(who) else f"{who}: {message}"
