"""The preparer on the bus: answers ``dra.node.<node>.prepare`` / ``.unprepare``.

Each request carries the claims of one kubelet call; every claim gets an entry
in the reply (a per-claim error never hides another claim's success). Each
claim operation is a span in the claim's own trace (the NATS hop's SERVER side,
with what the claim holds and the outcome) and emits lifecycle
events to the ``CLAIMS`` stream after the reply is on its way (eventsink.py), so
auditing never adds to the kubelet's latency.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry import trace
from opentelemetry.trace import SpanKind
from opentelemetry.util.types import AttributeValue
from prometheus_client import Counter, Histogram

from services.core.bus import subjects
from services.core.bus.access import Identity, Role
from services.core.bus.claimtrail import instance_name
from services.core.bus.client import Bus
from services.core.kit import limits
from services.core.model import nvidia
from services.core.model.schemas import (
    ClaimEvent,
    ClaimEventName,
    ClaimRef,
    ClaimResult,
    DeviceRef,
    NodeReply,
    NodeRequest,
)
from services.core.telemetry import metrics, tracing
from services.preparer.checkpoint import ClaimEntry
from services.preparer.checkpointstore import CheckpointStore
from services.preparer.devicestatus import DeviceStatusWriter
from services.preparer.eventsink import EventSink
from services.preparer.holdings import HoldingsPublisher
from services.preparer.spanfacts import claim_facts
from services.preparer.transaction import Outcome

log = logging.getLogger(__name__)
ACTOR = "preparer"
INSTANCE = instance_name()

OPERATIONS = Counter(
    "gpudra_preparer_claims_total", "Claim operations by kind and outcome.", ["op", "outcome"]
)
DURATION = Histogram(
    "gpudra_preparer_claim_seconds",
    "Time to prepare or unprepare one claim (exemplars: the operation's trace id).",
    ["op"],
    buckets=(0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
)

HOLDINGS_SETTLE = 0.05  # seconds between KV writes of what prepared claims hold


class ClaimEngine(Protocol):
    """What the service needs of a driver's engine (the GPU one, the ComputeDomain one)."""

    @property
    def store(self) -> CheckpointStore: ...

    async def prepare(self, ref: ClaimRef, deadline: float | None = None) -> Outcome: ...

    async def unprepare(self, ref: ClaimRef) -> Outcome: ...


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
        self.holdings = (
            HoldingsPublisher(bus, node, engine.store) if driver == nvidia.DRIVER_NAME else None
        )
        self._names = {op: _Names.of(op, node, driver) for op in ("prepare", "unprepare")}
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
        async def prepare(ref: ClaimRef) -> Outcome:
            return await self.engine.prepare(ref, deadline=request.deadline)

        return await self._serve_request(
            "prepare", request, headers, prepare, "prepare.requested", "prepared"
        )

    async def on_unprepare(self, request: NodeRequest, headers: dict[str, str]) -> NodeReply:
        return await self._serve_request(
            "unprepare",
            request,
            headers,
            self.engine.unprepare,
            "unprepare.requested",
            "unprepared",
        )

    async def _serve_request(
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
        self._in_flight += 1
        self.idle.clear()
        try:
            outcomes = await asyncio.gather(
                *(
                    self._serve_claim(op, request, ref, run, requested, succeeded)
                    for ref in request.claims
                )
            )
        finally:
            self._in_flight -= 1
            if not self._in_flight:
                self.idle.set()
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
        if self.holdings is None:
            return
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
        if self.holdings is not None:
            self.holdings.changed()
        if self.device_status is not None:  # after the reply, with the burst it ended
            self.device_status.changed()

    async def _serve_claim(
        self,
        op: str,
        request: NodeRequest,
        ref: ClaimRef,
        run: Callable[[ClaimRef], Awaitable[Outcome]],
        requested: ClaimEventName,
        succeeded: ClaimEventName,
    ) -> ClaimResult:
        """One SERVER span in the claim's trace: the NATS hop's other half, parent of
        the steps, with the claim, what it holds and the outcome (one span, not two:
        each span costs about 30 us of this process's CPU)."""
        names = self._names[op]
        with tracing.claim_span(
            self.tracer, names.process, ref.uid, kind=SpanKind.SERVER,
            attributes={**names.process_attributes, **tracing.claim_attributes(ref, self.node)},
            parent=tracing.remote_parent(request.traceparents.get(ref.uid, "")),
        ) as span, tracing.operation(span):  # fmt: skip
            trace_id = tracing.current_trace_id()
            headers = tracing.headers_of(span)
            self._emit(requested, ref, trace_id=trace_id, headers=headers)
            before = self.engine.store.claims.get(ref.uid)  # what an unprepare undoes
            held = held_devices(before) if before is not None else []  # gone after unprepare
            started = time.perf_counter()
            outcome = await self._outcome(request, ref, run)
            elapsed = time.perf_counter() - started
            DURATION.labels(op).observe(elapsed, metrics.trace_exemplar(trace_id))
            OPERATIONS.labels(op, "error" if outcome.error else "ok").inc()
            facts = claim_facts(self.engine.store.claims.get(ref.uid) or before)
            if facts:
                span.set_attributes(facts)
            tracing.finish(span, outcome.error)
            _log(op, ref, outcome, elapsed, facts)
            failed: ClaimEventName = "prepare.failed" if op == "prepare" else "unprepare.failed"
            self._emit(
                failed if outcome.error else succeeded,
                ref,
                outcome=outcome,
                devices=held if op == "unprepare" else self._held(ref.uid) or outcome.refs(),
                duration_ms=elapsed * 1000,
                trace_id=trace_id,
                headers=headers,
            )
            return ClaimResult(devices=outcome.devices, error=outcome.error)

    async def _outcome(
        self, request: NodeRequest, ref: ClaimRef, run: Callable[[ClaimRef], Awaitable[Outcome]]
    ) -> Outcome:
        if request.node != self.node:
            return Outcome(
                error=f"request for node {request.node!r} reached the preparer of {self.node!r}"
            )
        try:
            return await run(ref)
        except Exception as exc:  # a bug must fail one claim, never the service
            log.exception("claim operation failed unexpectedly", extra={"uid": ref.uid})
            return Outcome(error=f"claim {ref.namespace}/{ref.name}: internal error: {exc}")

    def _held(self, uid: str) -> list[DeviceRef]:
        """The devices the checkpoint says the claim holds, with their hardware."""
        entry = self.engine.store.claims.get(uid)
        return held_devices(entry) if entry is not None else []

    def _emit(
        self,
        event: ClaimEventName,
        ref: ClaimRef,
        *,
        outcome: Outcome | None = None,
        devices: list[DeviceRef] | None = None,
        duration_ms: float | None = None,
        trace_id: str = "",
        headers: dict[str, str] | None = None,
    ) -> None:
        headers = headers or {}  # the claim span's trace context
        self.events.emit(
            ClaimEvent(
                event=event,
                claim=ref,
                node=self.node,
                actor=ACTOR,
                instance=INSTANCE,
                devices=devices or [],
                outcome="error" if outcome is not None and outcome.error else "ok",
                error=outcome.error if outcome else "",
                duration_ms=duration_ms,
                trace_id=trace_id,
                traceparent=headers.get("traceparent", ""),
            ),
            headers,
        )


def _log(
    op: str, ref: ClaimRef, outcome: Outcome, elapsed: float, facts: Mapping[str, Any]
) -> None:
    """One line per claim operation, in the claim's trace (the log carries its id)."""
    where = {"uid": ref.uid, "claim": f"{ref.namespace}/{ref.name}", "ms": round(elapsed * 1000, 2)}
    if outcome.error:
        log.info(f"{op} failed", extra={**where, "error": outcome.error})
    else:
        devices = facts.get(tracing.ATTR_DEVICES, [])
        log.info(f"{op} done", extra={**where, "devices": devices})


@dataclass(frozen=True)
class _Names:
    """Span name and messaging attributes of one operation on one node, built once."""

    process: str
    process_attributes: dict[str, AttributeValue]

    @classmethod
    def of(cls, op: str, node: str, driver: str = nvidia.DRIVER_NAME) -> _Names:
        subject = (subjects.node_prepare if op == "prepare" else subjects.node_unprepare)(
            node, driver
        )
        template = subjects.node_operation_template(op, driver)
        return cls(
            process=tracing.messaging_span_name("process", template),
            process_attributes=tracing.messaging_attributes("process", subject, template),
        )


def held_devices(entry: ClaimEntry) -> list[DeviceRef]:
    """A checkpoint entry's devices as an event names them: CDI ids, GPU UUID, PCI address."""
    return [
        DeviceRef(
            request=",".join(d.requests),
            pool=d.pool,
            device=d.name,
            cdi_device_ids=d.cdi_device_ids,
            gpu_uuid=d.gpu_uuid,
            pci_bus_id=d.pci_bus_id or (d.vfio.pci_bus_id if d.vfio else ""),
            uuid=d.mig.uuid if d.mig is not None else "",
        )
        for d in entry.devices
    ]
