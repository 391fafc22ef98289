"""The allocator's spans: each lifecycle event and each explanation, in the claim's trace.

Every span is a root of the claim's trace (``tracing.claim_span``) with the
claim's identity, its node and devices, the GPUs behind them (looked up in the
ResourceSlices the watcher caches: the ``uuid`` and ``parentUUID`` device
attributes) and ``gpudra.outcome``. An explanation is ``pending``; its reason
is a span event, so a trace shows why the pod waits where it waited.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager

from opentelemetry import context
from opentelemetry.trace import Span, SpanKind
from opentelemetry.util.types import AttributeValue

from services.core import nvidia, tracing
from services.core.resource import ResourceSlice
from services.core.schemas import ClaimRef, DeviceRef

_tracer = tracing.tracer("gpudra.allocator")


class GpuIndex:
    """(pool, device) -> GPU UUIDs, rebuilt only when the slice cache changed."""

    def __init__(self) -> None:
        self._version = -1
        self._uuids: dict[tuple[str, str], list[str]] = {}

    def lookup(
        self, version: int, slices: Iterable[ResourceSlice], devices: Sequence[DeviceRef]
    ) -> list[str]:
        if version != self._version:
            self._uuids = dict(_index(slices))
            self._version = version
        found: list[str] = []
        for d in devices:
            for uuid in self._uuids.get((d.pool, d.device), []):
                if uuid not in found:
                    found.append(uuid)
        return found


def _index(slices: Iterable[ResourceSlice]) -> Iterator[tuple[tuple[str, str], list[str]]]:
    for s in slices:
        if s.spec.driver != nvidia.DRIVER_NAME:
            continue
        for device in s.spec.devices or []:
            attrs = device.attributes or {}
            uuids = [
                str(a.value())
                for key in (nvidia.ATTR_PARENT_UUID, nvidia.ATTR_UUID)
                if (a := attrs.get(key)) is not None and a.string
            ]
            yield (s.spec.pool.name, device.name), uuids


@contextmanager
def event_span(
    event: str, ref: ClaimRef, node: str, devices: Sequence[DeviceRef], gpus: list[str]
) -> Iterator[Span]:
    """``allocator.claim.<event>``: publishing one lifecycle event (a PRODUCER span)."""
    attributes: dict[str, AttributeValue] = {
        **tracing.claim_attributes(ref, node),
        tracing.ATTR_EVENT: event,
    }
    if devices:
        attributes[tracing.ATTR_DEVICES] = [d.device for d in devices]
    if gpus:
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
