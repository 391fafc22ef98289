"""The allocator's spans: each lifecycle event and each explanation, in the claim's trace.

Every span is a root of the claim's trace (``tracing.claim_span``) with the
claim's identity, its node and devices, the GPUs behind them (as the event
names them: ``DeviceRef.gpu_uuid`` and a MIG device's own ``uuid``, which the
watcher's ``DeviceIndex`` reads from the ResourceSlices) and
``gpudra.outcome``. An explanation is ``pending``; its reason is a span
event, so a trace shows why the pod waits where it waited.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from services.core.model.schemas import ClaimRef, DeviceRef
from services.core.telemetry import tracing

_tracer = tracing.tracer("gpudra.allocator")


def gpu_uuids(devices: Sequence[DeviceRef]) -> list[str]:
    """The physical GPUs behind ``devices`` (a MIG device adds its own UUID), as the
    events name them (:class:`~services.allocator.watcher.hardware.DeviceIndex`)."""
    found: list[str] = []
    for d in devices:
        for uuid in (d.gpu_uuid, d.uuid):
            if uuid and uuid not in found:
                found.append(uuid)
    return found


@contextmanager
def event_span(
    event: str, ref: ClaimRef, node: str, devices: Sequence[DeviceRef]
) -> Iterator[Span]:
    """``allocator.claim.<event>``: publishing one lifecycle event (a PRODUCER span)."""
    attributes: dict[str, AttributeValue] = {
        **tracing.claim_attributes(ref, node),
        tracing.ATTR_EVENT: event,
    }
    if devices:
        attributes[tracing.ATTR_DEVICES] = [d.device for d in devices]
    if gpus := gpu_uuids(devices):
        attributes[tracing.ATTR_GPU_UUIDS] = gpus
    with tracing.claim_span(
        _tracer, f"allocator.claim.{event}", ref.uid, kind=SpanKind.PRODUCER,
        attributes=attributes, parent=context.get_current(),  # under an explanation's span
    ) as span:  # fmt: skip
        yield span


@contextmanager
def explain_span(ref: ClaimRef, waited: float) -> Iterator[Span]:
    """``allocator.explain``: why a claim's pod still waits."""
    attributes = {**tracing.claim_attributes(ref, ""), "gpudra.claim.waited_s": waited}
    with tracing.claim_span(_tracer, "allocator.explain", ref.uid, attributes=attributes) as span:
        yield span


def pending(span: Span, reason: str, status: str, message: str) -> None:
    """The explanation as a ``pending`` span event; the span's outcome is ``pending``."""
    span.add_event(
        "pending", {"gpudra.pending.reason": reason, "gpudra.pending.status": status,
                    "gpudra.pending.message": message},
    )  # fmt: skip
    tracing.finish(span, outcome=tracing.PENDING)
