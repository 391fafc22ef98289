"""One kubelet call -> one NATS request to the node's preparer -> one result per claim.

The kubelet retries a claim that is missing from the response and discards the
whole response on an RPC error, so whatever goes wrong on the way (no
preparer, a late reply, a reply that does not decode) becomes an error on each
claim, and every claim the kubelet asked about gets an entry.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from services.core.bus import subjects
from services.core.bus.client import Bus
from services.core.bus.failures import RequestFailed, RequestTimeout
from services.core.kit.backoff import Backoff
from services.core.model import nvidia
from services.core.model.schemas import ClaimRef, ClaimResult, NodeReply, NodeRequest, SchemaError
from services.core.telemetry import tracing
from services.kubeletplugin import metrics

log = logging.getLogger(__name__)
_tracer = tracing.tracer(__name__)

Operation = Literal["prepare", "unprepare"]


@dataclass(frozen=True)
class Timing:
    """How long to wait for the preparer.

    ``default`` applies when the kubelet sent no deadline; with a deadline the
    front stops waiting ``margin`` earlier (at most 10% of what is left), so
    the per-claim errors still reach the kubelet in time.

    ``no_preparer``: how long (within that) a request nobody listens to is sent
    again. A preparer whose NATS server died is reconnecting to another one
    and subscribes again in well under a second; a call made meanwhile waits
    for it instead of failing (and the pod waiting for the kubelet's backoff).
    """

    default: float = 45.0
    margin: float = 0.5
    no_preparer: float = 3.0

    def budget(self, remaining: float | None) -> float:
        if remaining is None:
            return self.default
        return min(self.default, remaining - min(self.margin, 0.1 * remaining))


class Forwarder:
    def __init__(
        self,
        bus: Bus,
        node: str,
        timing: Timing | None = None,
        tracer: trace.Tracer | None = None,
        driver: str = nvidia.DRIVER_NAME,
    ) -> None:
        """``driver``: whose claims these are; each driver's preparer has its own subjects."""
        self.bus = bus
        self.node = node
        self.timing = timing or Timing()
        self.tracer = tracer or _tracer
        self._names = {op: _Names.of(op, node, driver) for op in ("prepare", "unprepare")}

    async def prepare(
        self, claims: Sequence[ClaimRef], remaining: float | None, parent: Context | None = None
    ) -> dict[str, ClaimResult]:
        """``remaining``: seconds until the kubelet's deadline; ``parent``: its trace context."""
        return await self._forward("prepare", claims, remaining, parent)

    async def unprepare(
        self, claims: Sequence[ClaimRef], remaining: float | None, parent: Context | None = None
    ) -> dict[str, ClaimResult]:
        return await self._forward("unprepare", claims, remaining, parent)

    async def _forward(
        self,
        op: Operation,
        claims: Sequence[ClaimRef],
        remaining: float | None,
        parent: Context | None,
    ) -> dict[str, ClaimResult]:
        started = time.perf_counter()
        results, send = screen_claims(claims)
        if send:
            results.update(await self._traced(op, send, remaining, parent))
        metrics.CALLS.labels(op).inc()
        metrics.FORWARD_SECONDS.labels(op).observe(time.perf_counter() - started)
        for result in results.values():
            metrics.CLAIM_RESULTS.labels(op, "error" if result.error else "ok").inc()
        return results

    async def _traced(
        self, op: Operation, send: list[ClaimRef], remaining: float | None, parent: Context | None
    ) -> dict[str, ClaimResult]:
        """One CLIENT span per claim, in the claim's own trace: the claim's half of the
        NATS request (the preparer's SERVER span is the other), named and attributed
        as OpenTelemetry's messaging conventions say, with the kubelet's call
        (``rpc.method``) and what it got. Its context goes to the preparer in
        ``traceparents``. One span, not a gRPC server span around a client span:
        each costs this process about 100 us of CPU.

        The kubelet's own context (``parent``) becomes a link: its call may carry
        several claims, and each claim's spans belong to that claim's trace.
        """
        names = self._names[op]
        links = tracing.link_to(parent, "kubelet") if parent is not None else []
        spans = [
            tracing.start_claim_span(
                self.tracer, names.send, c.uid, kind=SpanKind.CLIENT,
                attributes={**names.send_attributes, **tracing.claim_attributes(c, self.node)},
                links=links,
            )
            for c in send
        ]  # fmt: skip
        traceparents = {
            c.uid: tp for c, s in zip(send, spans, strict=True) if (tp := tracing.traceparent(s))
        }
        replies: dict[str, ClaimResult] = {}
        try:
            replies = await self._request(op, send, self.timing.budget(remaining), traceparents)
        finally:
            for claim, span in zip(send, spans, strict=True):
                _finish(span, replies.get(claim.uid))
        return replies

    async def _request(
        self, op: Operation, claims: list[ClaimRef], budget: float, traceparents: dict[str, str]
    ) -> dict[str, ClaimResult]:
        """Send one request; map every failure to an error on each claim."""
        if budget <= 0:
            return _each(claims, f"{op} not attempted: the kubelet's deadline leaves no time")
        subject = self._names[op].subject
        request = NodeRequest(
            node=self.node, claims=claims, deadline=time.time() + budget, traceparents=traceparents
        )
        try:
            reply = await self._send(op, subject, request, budget)
        except RequestTimeout:
            reason = f"the preparer of node {self.node!r} did not answer within {budget:.1f}s"
        except RequestFailed:
            reason = f"no preparer is serving node {self.node!r} (nobody listens on {subject})"
        except SchemaError as exc:
            reason = f"the preparer's reply could not be decoded: {exc}"
        except Exception as exc:  # the bus itself failed; the kubelet still gets an answer
            log.exception("bus request failed", extra={"subject": subject})
            reason = f"NATS request on {subject} failed: {type(exc).__name__}: {exc}"
        else:
            return {c.uid: _result_for(reply, c.uid) for c in claims}
        log.warning(f"{op} failed for every claim", extra={"reason": reason, "claims": len(claims)})
        return _each(claims, f"{op} failed: {reason}")

    async def _send(
        self, op: Operation, subject: str, request: NodeRequest, budget: float
    ) -> NodeReply:
        """The request, sent again while nobody listens (up to ``Timing.no_preparer``)."""
        started = time.monotonic()
        # Half the budget at most: the last try must have time to hear "nobody
        # listens" rather than time out and blame a preparer that is not there.
        patience = min(self.timing.no_preparer, budget / 2)
        backoff = Backoff(first=0.05, limit=0.5)
        left = budget
        while True:
            try:
                return await self.bus.request(subject, request, NodeReply, timeout=left)
            except RequestTimeout:
                raise  # the preparer may still be working on it: never sent twice
            except RequestFailed:
                if time.monotonic() - started + backoff.delay >= patience:
                    raise
                metrics.NO_PREPARER_RETRIES.labels(op).inc()
                await backoff.sleep()
            left = budget - (time.monotonic() - started)


def screen_claims(claims: Sequence[ClaimRef]) -> tuple[dict[str, ClaimResult], list[ClaimRef]]:
    """Split the kubelet's list into answers known now and claims to send.

    A claim without UID, namespace or name gets an error under its UID (the
    response map's key). A UID listed twice is sent once when both entries
    agree; when they name different claims, that UID gets an error and is not
    sent, because a single response entry could not answer both.
    """
    results: dict[str, ClaimResult] = {}
    first: dict[str, ClaimRef] = {}
    for claim in claims:
        missing = [f for f in ("uid", "namespace", "name") if not getattr(claim, f)]
        if missing:
            results[claim.uid] = ClaimResult(
                error=f"claim {claim.namespace}/{claim.name} (uid {claim.uid!r}): "
                f"empty {', '.join(missing)}"
            )
        elif claim.uid in first and first[claim.uid] != claim:
            other = first[claim.uid]
            results[claim.uid] = ClaimResult(
                error=f"claim uid {claim.uid} is listed for both "
                f"{other.namespace}/{other.name} and {claim.namespace}/{claim.name}"
            )
        else:
            first.setdefault(claim.uid, claim)
    send = [c for uid, c in first.items() if uid not in results]
    return results, send


def _result_for(reply: NodeReply, uid: str) -> ClaimResult:
    result = reply.claims.get(uid)
    if result is None:
        return ClaimResult(error=f"the preparer returned no result for claim {uid}")
    return result


def _each(claims: list[ClaimRef], error: str) -> dict[str, ClaimResult]:
    return {c.uid: ClaimResult(error=error) for c in claims}


def _finish(span: Span, result: ClaimResult | None) -> None:
    """What the kubelet gets for this claim, on its span; then end it."""
    if result is None:
        tracing.finish(span, "no result (the call was cancelled)")
    else:
        if result.devices:
            span.set_attributes(
                {
                    tracing.ATTR_DEVICES: tuple(d.device_name for d in result.devices),
                    tracing.ATTR_CDI_IDS: tuple(
                        i for d in result.devices for i in d.cdi_device_ids
                    ),
                }
            )
        tracing.finish(span, result.error)
    span.end()


@dataclass(frozen=True)
class _Names:
    """Span name, subject and messaging attributes of one operation, built once."""

    subject: str
    send: str
    send_attributes: dict[str, AttributeValue]

    @classmethod
    def of(cls, op: Operation, node: str, driver: str) -> _Names:
        subject = (subjects.node_prepare if op == "prepare" else subjects.node_unprepare)(
            node, driver
        )
        template = subjects.node_operation_template(op, driver)
        attributes = tracing.messaging_attributes("send", subject, template)
        attributes.update({"rpc.system": "grpc", "rpc.method": f"Node{op.capitalize()}Resources"})
        return cls(
            subject=subject,
            send=tracing.messaging_span_name("send", template),
            send_attributes=attributes,
        )
